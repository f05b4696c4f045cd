"""Several processes on one GPU: ``allocsim share SPEC SPEC ... --device NAME``.

Each SPEC is ``TRACE[:POLICY][@START]``: a trace file (or ``default`` for the bundled one), the
policy that process uses (default ``jax``, i.e. JAX's 75% preallocation), and when it starts in
simulated time (``@2s``, ``@500ms``, ``@100us``; a bare number is seconds). The processes run
concurrently in the simpy engine against one device; each result says whether that process
completed or where it first ran out of memory and what the others held at that moment.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.policies import format_size, parse_policy
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.engine import SharedProcess, SharedRun, run_shared
from allocsim.sim.output.report import format_table
from allocsim.traces.model import Trace

DEFAULT_SHARE_POLICY = "jax"
_UNITS_NS = {"": 1_000_000_000, "s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_START = re.compile(r"^([0-9]*\.?[0-9]+)\s*(s|ms|us|ns)?$")


@dataclass
class ShareSpec:
    """One process of a shared run, as the user wrote it."""

    trace: str
    policy: str
    start_ns: int


def parse_start(text: str) -> int:
    match = _START.match(text.strip())
    if not match:
        raise ValueError(f"bad start time {text!r} (examples: 2s, 500ms, 100us, 0.5)")
    return int(round(float(match.group(1)) * _UNITS_NS[match.group(2) or ""]))


def parse_share_spec(text: str) -> ShareSpec:
    """``TRACE[:POLICY][@START]`` → ShareSpec (the policy is checked here, the trace later)."""
    body, at, start = text.rpartition("@")
    if not at:
        body, start = text, "0"
    trace, colon, policy = body.partition(":")
    if not trace:
        raise ValueError(f"share spec {text!r} names no trace (form: TRACE[:POLICY][@START])")
    policy = policy if colon else DEFAULT_SHARE_POLICY
    parse_policy(policy)
    return ShareSpec(trace, policy, parse_start(start))


def expand_processes(traces: Sequence[Trace], specs: Sequence[ShareSpec]
                     ) -> tuple[list[Trace], list[ShareSpec]]:
    """A trace recorded from several processes (its ``process`` column) becomes one process of
    the shared run per recorded process, each with the spec's policy and start."""
    out_traces: list[Trace] = []
    out_specs: list[ShareSpec] = []
    for trace, spec in zip(traces, specs):
        processes = trace.processes()
        if len(processes) <= 1:
            out_traces.append(trace)
            out_specs.append(spec)
            continue
        for process in processes:
            out_traces.append(trace.for_process(process))
            out_specs.append(ShareSpec(f"{spec.trace}[process {process}]", spec.policy,
                                       spec.start_ns))
    return out_traces, out_specs


def share(traces: Sequence[Trace], specs: Sequence[ShareSpec], device: DeviceProfile) -> SharedRun:
    """Run the processes together; ``traces[i]`` is the loaded trace of ``specs[i]`` (call
    :func:`expand_processes` first for traces recorded from several processes).

    As on a real GPU, a process dies at its first OOM and every process's memory goes back to
    the device when it ends, so what a later process can get depends on who is still running.
    """
    return run_shared([SharedProcess(trace, spec.policy, spec.start_ns, process=index)
                       for index, (trace, spec) in enumerate(zip(traces, specs))], device,
                      stop_on_oom=True)


def share_json(run: SharedRun, specs: Sequence[ShareSpec], device: DeviceProfile) -> dict[str, Any]:
    return {
        "device": {"name": device.name, "capacity": device.capacity},
        "device_peak": run.device_peak,
        "all_completed": all(r.completed for r in run.results),
        "processes": [{"spec": f"{s.trace}:{s.policy}@{s.start_ns}ns", "trace": s.trace,
                       "start_ns": s.start_ns, **r.to_json_dict()}
                      for s, r in zip(specs, run.results)],
    }


def share_text(run: SharedRun, specs: Sequence[ShareSpec], device: DeviceProfile) -> str:
    rows = []
    for index, (spec, result) in enumerate(zip(specs, run.results)):
        if result.completed:
            outcome = "completed"
        else:
            others = ", ".join(f"p{p} held {format_size(b)}"
                               for p, b in sorted((result.first_oom_others or {}).items()))
            outcome = (f"OOM at event {result.first_oom_event:,} asking "
                       f"{format_size(result.first_oom_size or 0)}"
                       + (f" ({others})" if others else ""))
        rows.append([f"p{index}", Path(spec.trace).name, result.policy,
                     f"{spec.start_ns / 1e9:g}s", format_size(result.peak_reserved),
                     format_size(result.peak_allocated), outcome])
    table = format_table(rows, ["proc", "trace", "policy", "start", "peak reserved",
                                "peak allocated", "outcome"], left=(0, 1, 2, 6))
    verdict = ("all processes complete" if all(r.completed for r in run.results)
               else "they cannot share this device as configured")
    return (f"device {device.name}: {format_size(device.capacity)}; peak of all processes "
            f"together {format_size(run.device_peak)}\n\n{table}\n\n{verdict}")


def plot_share(run: SharedRun, specs: Sequence[ShareSpec], device: DeviceProfile,
               path: str | Path) -> Path:
    """Each process's reserved bytes over time, stacked, with the device's capacity."""
    from allocsim.sim.output.report import _pyplot
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ends = [int(r.timeline.time_ns[-1]) for r in run.results if r.timeline is not None and len(r.timeline.time_ns)]
    grid = np.linspace(0, max(ends + [1]), 1000)
    stacked = np.zeros_like(grid)
    for index, (spec, result) in enumerate(zip(specs, run.results)):
        tl = result.timeline
        if tl is None or not len(tl.time_ns):
            continue
        at = np.searchsorted(tl.time_ns, grid, side="right") - 1
        values = np.where((at >= 0) & (grid <= tl.time_ns[-1]), tl.reserved[np.maximum(at, 0)], 0)
        ax.fill_between(grid / 1e9, stacked / (1 << 30), (stacked + values) / (1 << 30), step="post",
                        alpha=0.6, label=f"p{index} {result.policy}"
                        + ("" if result.completed else " (OOM)"))
        stacked = stacked + values
    ax.axhline(device.capacity / (1 << 30), color="red", ls="--", lw=1, label="capacity")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("reserved (GiB)")
    ax.set_title(f"processes sharing {device.name}", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
