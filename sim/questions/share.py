"""Several processes on one GPU: ``allocsim share SPEC SPEC ... --device NAME``.

Each SPEC is ``TRACE[:POLICY][@START]``: a trace file (or ``default`` for the bundled one), the
policy that process uses (default ``jax``, i.e. JAX's 75% preallocation), and when it starts in
simulated time (``@2s``, ``@500ms``, ``@100us``; a bare number is seconds). The processes run
concurrently in the simpy engine against one device; each result says whether that process
completed or where it first ran out of memory and what the others held at that moment.

Each process may also hold memory outside its allocator (:class:`OutsideMemory`, the same for
every process of the command: ``--process-context``, ``--first-step-load``): its own CUDA
context, taken when it starts, and the module images it loads lazily at its first step. Both
count in the device's used and peak bytes (``device_peak``), never in a process's reserved
bytes (what its allocator took); a process the device refuses either fails there, an OOM of
its own (sim/kernel/engine.py's SharedProcess). None by default: the answers are those of a
run without them, byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from allocsim.ascii_numbers import MAX_DIGITS
from allocsim.errors import UserInputError
from allocsim.policies import parse_policy
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.engine import SharedProcess, SharedRun, run_shared
from allocsim.traces.model import Trace

DEFAULT_SHARE_POLICY = "jax"
SHARE_KIND = "allocsim-share"       # the "kind" of every share document (share.json, --json)
_UNITS_NS = {"": 1_000_000_000, "s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_START = re.compile(r"^([0-9]*\.?[0-9]+)\s*(s|ms|us|ns)?$")
# The latest a process's events may fall, start included: a shared run's clock, its timeline and
# share.json's times are int64 nanoseconds, and the device calls' own time comes on top, so
# half of int64's range (146 years) is kept for them.
MAX_END_NS = 1 << 62


@dataclass(frozen=True)
class OutsideMemory:
    """What one process holds outside its allocator, in bytes (resolved once, at the edge):
    ``context_bytes``, its CUDA context, taken when it starts (before its first event);
    ``first_step_bytes``, what it loads lazily when it first runs work (module images, library
    kernels), taken just before event ``first_step_event`` (0: its first event)."""

    context_bytes: int = 0
    first_step_bytes: int = 0
    first_step_event: int = 0

    def __post_init__(self) -> None:
        for name in ("context_bytes", "first_step_bytes", "first_step_event"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserInputError(f"{name} must be a whole number >= 0, got {value!r}")

    def __bool__(self) -> bool:
        return bool(self.context_bytes or self.first_step_bytes)

    def to_json_dict(self) -> dict[str, int]:
        return {"context_bytes": self.context_bytes, "first_step_bytes": self.first_step_bytes,
                "first_step_event": self.first_step_event}


NO_OUTSIDE = OutsideMemory()


@dataclass
class ShareSpec:
    """One process of a shared run, as the user wrote it."""

    trace: str
    policy: str
    start_ns: int
    outside: OutsideMemory = NO_OUTSIDE


def parse_start(text: str) -> int:
    """Nanoseconds in a spec's ``@START`` (``2s``, ``500ms``, ``100us``, ``7ns``; a bare number
    is seconds), exact (no float: ``@9007199254740993ns`` is that many); past
    :data:`MAX_END_NS`, or more digits than any time has, one line."""
    match = _START.match(text.strip())
    if not match:
        raise UserInputError(f"bad start time {_shown(text)} (examples: 2s, 500ms, 100us, 0.5)")
    number = match.group(1)
    if len(number.replace(".", "")) > MAX_DIGITS:
        raise UserInputError(f"start time {_shown(text)}: a number of "
                             f"{len(number.replace('.', '')):,} digits is past any time")
    start_ns = round(Fraction(number) * _UNITS_NS[match.group(2) or ""])
    if start_ns > MAX_END_NS:
        raise UserInputError(f"start time {_shown(text)} is {start_ns:,} ns, past the "
                             f"{MAX_END_NS:,} ns (146 years) a shared run's clock keeps "
                             "(its times are int64 nanoseconds)")
    return start_ns


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:60]) + f"... ({len(text):,} characters)"


def parse_share_spec(text: str) -> ShareSpec:
    """``TRACE[:POLICY][@START]`` → ShareSpec (the policy is checked here, the trace later)."""
    body, at, start = text.rpartition("@")
    if not at:
        body, start = text, "0"
    trace, colon, policy = body.partition(":")
    if not trace:
        raise UserInputError(f"share spec {text!r} names no trace "
                             "(form: TRACE[:POLICY][@START])")
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
                                       spec.start_ns, spec.outside))
    return out_traces, out_specs


def share(traces: Sequence[Trace], specs: Sequence[ShareSpec], device: DeviceProfile) -> SharedRun:
    """Run the processes together; ``traces[i]`` is the loaded trace of ``specs[i]`` (call
    :func:`expand_processes` first for traces recorded from several processes).

    As on a real GPU, a process dies at its first OOM and every process's memory goes back to
    the device when it ends, so what a later process can get depends on who is still running.
    """
    for trace, spec in zip(traces, specs):
        end_ns = spec.start_ns + trace.duration_ns
        if end_ns > MAX_END_NS:
            raise UserInputError(f"{spec.trace}@{spec.start_ns}ns: its last event would fall at "
                                 f"{end_ns:,} ns (the start plus the trace's "
                                 f"{trace.duration_ns:,} ns), past the {MAX_END_NS:,} ns "
                                 "(146 years) a shared run's clock keeps")
    return run_shared([SharedProcess(trace, spec.policy, spec.start_ns, process=index,
                                     context_bytes=spec.outside.context_bytes,
                                     first_step_bytes=spec.outside.first_step_bytes,
                                     first_step_event=spec.outside.first_step_event)
                       for index, (trace, spec) in enumerate(zip(traces, specs))], device,
                      stop_on_oom=True)


def with_outside(specs: Sequence[ShareSpec], outside: OutsideMemory) -> list[ShareSpec]:
    """``specs`` with every process holding ``outside`` beside its allocator."""
    return [replace(spec, outside=outside) for spec in specs]


def share_json(run: SharedRun, specs: Sequence[ShareSpec], device: DeviceProfile) -> dict[str, Any]:
    return {
        "kind": SHARE_KIND,
        "device": {"name": device.label, "capacity": device.capacity},
        "device_peak": run.device_peak,
        "all_completed": all(r.completed for r in run.results),
        "ran_together": run.ran_together(),
        "processes": [{"spec": f"{s.trace}:{s.policy}@{s.start_ns}ns", "trace": s.trace,
                       "start_ns": s.start_ns, "end_ns": end, **r.to_json_dict(),
                       # Only where the process held memory outside its allocator: without
                       # it, the document is what it was before the option existed.
                       **({"outside": {**s.outside.to_json_dict(), "refused": refused}}
                          if s.outside else {})}
                      for s, r, (_, end), refused in zip(specs, run.results, run.spans_ns,
                                                         _refusals(run, len(specs)))],
    }


def _refusals(run: SharedRun, n: int) -> list[str | None]:
    return run.refused_outside or [None] * n
