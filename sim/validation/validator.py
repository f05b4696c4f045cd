"""The validator: replay a trace on real memory and measure how far the simulation was from it.

``allocsim compare`` names a winner from a simulation; this module checks that simulation
against reality. It replays the same trace event by event through a *backend* and, after every
event, compares what was measured with what the simulator (:mod:`allocsim.sim.kernel.engine` on a
:class:`~allocsim.sim.kernel.device.SimulatedDevice`, exactly as ``compare`` runs it) says: reserved bytes,
the event of the first OOM, device-call counts and their time, and — where the policy object
itself drives the memory — whether any two live blocks ever overlapped.

Backends (``BACKENDS``):

- ``host``: the policy object drives a :class:`HostDevice` whose ``reserve``/``map`` hand out
  numpy buffers behind fake addresses. Every live block is filled with a pattern unique to its
  allocation and checked when freed and at the end, so an overlapping or out-of-region
  placement shows up as corrupted data. The host device counts like the simulated one, so
  reserved bytes must agree byte for byte. Runs anywhere; it tests the validator and the
  policies' placement, not a GPU.
- ``policy``: the same on a GPU through CuPy (:class:`CupyDevice`): ``reserve`` is cudaMalloc,
  ``map`` is CUDA virtual memory (cuMemCreate/cuMemMap through ``libcuda`` with ctypes),
  patterns are written and checked by two small CUDA kernels, and device memory in use is
  read with cudaMemGetInfo after every event.
- ``cupy-pool``: CuPy's own MemoryPool replays the trace; ``used_bytes()``/``total_bytes()``
  after every event against the ``cupy`` model, byte for byte.
- ``cupy-raw``: cudaMalloc/cudaFree per buffer against ``on-demand``.
- ``cupy-async``: CuPy's MemoryAsyncPool (cudaMallocAsync) against ``cuda-async``.
- ``torch``: ``torch.cuda.caching_allocator_alloc``/``_delete`` against the ``pytorch`` model,
  ``memory_reserved()``/``memory_allocated()`` after every event, byte for byte.

CuPy (and torch) are imported only inside the GPU backends: importing this module never needs
them. Without a GPU every GPU backend raises :class:`NoGPUError`, one line, which the CLI
prints as ``allocsim: error: ...`` with exit status 2.

Where the pieces live: :mod:`allocsim.sim.validation.real_memory` (errors, block patterns, the call log,
:class:`HostDevice`), :mod:`allocsim.sim.validation.cuda_device` (:class:`CupyDevice`, CUDA virtual memory),
:mod:`allocsim.sim.validation.calibrate` (``allocsim calibrate``); this module drives a replay, runs the backends,
builds the report, and adds ``allocsim validate`` to the CLI (:func:`add_validate_parser`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.policies import PolicySpec, PolicySpecError, format_size, parse_policy, parse_size
from allocsim.policies.registry import alloc_conf_spec
from allocsim.policies.units import round_up
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice, resolve_device
from allocsim.sim.kernel.engine import ProcessReplay
from allocsim.sim.kernel.results import RunResult
from allocsim.sim.validation.cuda_device import CUDA_ERROR_MEMORY_ALLOCATION, CudaVMM, CupyDevice
from allocsim.sim.validation.real_memory import (
    CallLog,
    Corruption,
    HostDevice,
    Measured,
    NoGPUError,
    ValidatorError,
    _one_line,
    _require_gpu,
    count_pattern_errors,
    fill_pattern,
    pattern_word,
)
from allocsim.traces.model import OP_ALLOC, Trace

MiB = 1 << 20
GiB = 1 << 30
REPORT_SCHEMA = 1

# -- backends ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backend:
    """One way of replaying a trace for real, and what it is compared with."""

    name: str
    description: str
    model: str | None      # the policy spec it is compared against; None = the user's policy
    exact: bool            # reserved bytes must agree byte for byte after every event
    gpu: bool


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("host", "the policy object on host memory (numpy buffers), pattern-checked",
            None, True, False),
    Backend("policy", "the policy object on a GPU through CuPy: cudaMalloc / CUDA virtual "
            "memory, pattern-checked, cudaMemGetInfo after every event", None, False, True),
    Backend("cupy-pool", "CuPy's MemoryPool vs the cupy model", "cupy", True, True),
    Backend("cupy-raw", "cudaMalloc/cudaFree per buffer (CuPy, no pool) vs on-demand",
            "on-demand", False, True),
    Backend("cupy-async", "CuPy's MemoryAsyncPool (cudaMallocAsync) vs cuda-async",
            "cuda-async", False, True),
    Backend("torch", "PyTorch's CUDA caching allocator vs the pytorch model", "pytorch", True,
            True),
)}
DEFAULT_BACKEND = "policy"



@dataclass
class Simulated:
    """The simulator's side: the RunResult ``compare`` reports, and per-event arrays."""

    result: RunResult
    reserved: np.ndarray
    used: np.ndarray
    calls: int
    failed_calls: int
    cost_s: float
    call_events: np.ndarray


def _after_each_event(events: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """A value logged at some events, carried forward: its value after every event 0..n-1."""
    if not len(events):
        return np.zeros(n, dtype=np.int64)
    position = np.searchsorted(events, np.arange(n), side="right") - 1
    return np.where(position >= 0, values[np.maximum(position, 0)], 0).astype(np.int64)


def simulate(trace: Trace, spec: PolicySpec, profile: DeviceProfile) -> Simulated:
    """Replay ``trace`` through ``spec`` exactly as ``allocsim compare`` does, keeping the
    reserved bytes (from the device-call log) and bytes in use after every event."""
    run = ProcessReplay(trace, spec, SimulatedDevice(profile))
    # The engine samples bytes in use sparsely for its timeline; every event is wanted here.
    run.sample_every = 1
    run.advance(run.n)
    result = run.result(profile.name)
    events = np.asarray(run.call_events, dtype=np.int64)
    reserved = _after_each_event(events, np.asarray(run.call_reserved, dtype=np.int64), run.n)
    used = np.zeros(run.n, dtype=np.int64)
    if run.samples:
        at = np.asarray([s[0] for s in run.samples], dtype=np.int64)
        used = _after_each_event(at, np.asarray([s[1] for s in run.samples], dtype=np.int64),
                                 run.n)
    view = run.view
    return Simulated(result=result, reserved=reserved, used=used,
                     calls=view.mallocs + view.frees, failed_calls=view.failed_mallocs,
                     cost_s=view.cost_s, call_events=events)



def _event_columns(trace: Trace) -> tuple[list[int], list[int], list[int], list[int]]:
    """op, id, size (frees carry their alloc's) and stream of every event, as Python lists:
    the replay loops index them once per event, and list indexing is the fastest there is."""
    return (trace.op.tolist(), trace.id.tolist(), trace.matched_sizes().tolist(),
            trace.stream.tolist())


def drive(trace: Trace, spec: PolicySpec, device: Any, *, patterns: bool = True,
          device_used: Callable[[], int] | None = None) -> Measured:
    """Replay ``trace`` with the policy object of ``spec`` drawing from ``device`` (a
    :class:`HostDevice` or :class:`CupyDevice`), with the engine's semantics (an allocation
    that fails is an OOM and its free is skipped; sizes ≤ 0 are skipped), writing and
    checking patterns, and reading the device's reserved bytes after every event."""
    policy = spec.build(device)
    n = len(trace)
    ops, ids, sizes, streams = _event_columns(trace)
    reserved = np.zeros(n, dtype=np.int64)
    used_by_device = np.zeros(n, dtype=np.int64) if device_used is not None else None
    live: dict[int, tuple[int, int, int | None]] = {}   # id -> (address, size, pattern key)
    measured = Measured(reserved=reserved, device_used=used_by_device, pattern_checked=patterns)
    key = 0
    try:
        for i in range(n):
            device.event = i
            if ops[i] == OP_ALLOC:
                size = sizes[i]
                if size > 0:
                    address = policy.malloc(size, streams[i])
                    if address is None:
                        measured.ooms += 1
                        if measured.first_oom_event is None:
                            measured.first_oom_event = i
                    else:
                        key += 1
                        slot: int | None = key
                        if patterns and not device.fill(address, size, key):
                            measured.corruptions.append(Corruption(
                                i, ids[i], address, size, "out of region",
                                "the block is not wholly inside memory the policy holds"))
                            slot = None    # never written, so never checked
                        live[ids[i]] = (address, size, slot)
            else:
                entry = live.pop(ids[i], None)
                if entry is not None:
                    address, size, slot = entry
                    if patterns and slot is not None:
                        _check_block(device, measured, i, ids[i], address, size, slot)
                    policy.free(address)
            reserved[i] = device.measured_reserved()
            if used_by_device is not None and device_used is not None:
                used_by_device[i] = device_used()
        if patterns:
            for buffer_id, (address, size, slot) in live.items():
                if slot is not None:
                    _check_block(device, measured, n, buffer_id, address, size, slot)
    finally:
        # Calls made while cleaning up are not part of the replay: keep the log up to here.
        replayed = len(device.log)
        device.event = n
        _give_everything_back(policy, live)
    for problem in getattr(device, "problems", []):
        measured.corruptions.append(Corruption(-1, -1, 0, 0, "device misuse", problem))
    measured.calls = device.log.head(replayed)
    return measured


def _check_block(device: Any, measured: Measured, event: int, buffer_id: int, address: int,
                 size: int, key: int) -> None:
    measured.blocks_checked += 1
    bad = device.check(address, size, key)
    if bad:
        what = ("out of region" if bad < 0 else "overwritten")
        detail = ("the block is no longer inside memory the policy holds" if bad < 0 else
                  f"{bad:,} words of its pattern were overwritten (another block overlaps it)")
        measured.corruptions.append(Corruption(event, buffer_id, address, size, what, detail))


def _give_everything_back(policy: Any, live: dict) -> None:
    """Free what is still live and empty the policy's cache, so the device's memory goes back
    (a real GPU is shared by the next backend). A broken policy may fail here: ignored, the
    device's close() releases what it holds regardless."""
    try:
        for address, _, _ in live.values():
            policy.free(address)
        policy.empty_cache()
    except Exception:
        pass


# -- the report ----------------------------------------------------------------------------


@dataclass
class Metric:
    """One figure, simulated next to measured."""

    name: str
    unit: str                 # bytes | event | calls | s | count
    simulated: float | int | None
    measured: float | int | None

    @property
    def difference(self) -> float | int | None:
        if self.simulated is None or self.measured is None:
            return None
        return self.measured - self.simulated

    def to_json_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "simulated": self.simulated,
                "measured": self.measured, "difference": self.difference}


@dataclass
class Check:
    """A pass/fail criterion of a backend (``ok`` None: reported, not judged)."""

    name: str
    ok: bool | None
    detail: str


@dataclass
class ErrorStats:
    """|measured − simulated| of a per-event series."""

    max_abs: int
    mean_abs: float
    events_compared: int
    mismatched_events: int
    first_mismatch_event: int | None

    @classmethod
    def of(cls, simulated: np.ndarray, measured: np.ndarray, where: np.ndarray | None = None
           ) -> ErrorStats:
        error = np.abs(measured.astype(np.int64) - simulated.astype(np.int64))
        mismatch = np.flatnonzero(error)
        chosen = error if where is None else error[where]
        return cls(max_abs=int(chosen.max()) if len(chosen) else 0,
                   mean_abs=round(float(chosen.mean()), 3) if len(chosen) else 0.0,
                   events_compared=len(chosen), mismatched_events=len(mismatch),
                   first_mismatch_event=int(mismatch[0]) if len(mismatch) else None)


def _changes(values: np.ndarray | None) -> list[list[int]] | None:
    """A per-event series as ``[[event, value], ...]`` at the events where it changes: exact,
    and small (it changes only at device calls)."""
    if values is None:
        return None
    values = np.asarray(values, dtype=np.int64)
    if not len(values):
        return []
    at = np.flatnonzero(np.diff(values, prepend=values[0] - 1))
    return [[int(i), int(values[i])] for i in at]


def _expand(changes: list[list[int]] | None, n: int) -> np.ndarray | None:
    if changes is None:
        return None
    if not changes:
        return np.zeros(n, dtype=np.int64)
    pairs = np.asarray(changes, dtype=np.int64)
    return _after_each_event(pairs[:, 0], pairs[:, 1], n)


@dataclass
class ValidationReport:
    """Simulated vs measured for one trace, one policy, one backend."""

    backend: str
    policy: str                    # the policy spec simulated (and, for host/policy, driven)
    trace: dict[str, Any]
    device: str                    # what ran it: a GPU's name, or "host"
    profile: dict[str, Any]        # the simulated device: name, capacity, granularities
    versions: dict[str, str]
    date: str
    metrics: list[Metric]
    reserved_error: ErrorStats     # at events where either side made a device call
    used_error: ErrorStats | None
    tolerance_bytes: int | None
    checks: list[Check]
    pattern_checked: bool
    blocks_checked: int
    corruptions: int
    first_corruption: str | None
    calls: dict[str, Any]
    simulated: dict[str, Any]      # the RunResult as ``compare`` reports it
    sim_reserved: np.ndarray
    measured_reserved: np.ndarray
    sim_used: np.ndarray | None = None
    measured_used: np.ndarray | None = None
    device_used: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)
    corruption_kinds: dict[str, int] = field(default_factory=dict)   # kind -> count

    @property
    def passed(self) -> bool:
        return all(check.ok is not False for check in self.checks)

    @property
    def events(self) -> int:
        return len(self.sim_reserved)

    def metric(self, name: str) -> Metric:
        return next(m for m in self.metrics if m.name == name)

    # -- output ----------------------------------------------------------------------
    def to_json_dict(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "kind": "allocsim-validation",
            "backend": self.backend,
            "policy": self.policy,
            "passed": self.passed,
            "trace": self.trace,
            "device": self.device,
            "profile": self.profile,
            "versions": self.versions,
            "date": self.date,
            "checks": [asdict(c) for c in self.checks],
            "metrics": [m.to_json_dict() for m in self.metrics],
            "reserved_error": asdict(self.reserved_error),
            "used_error": None if self.used_error is None else asdict(self.used_error),
            "tolerance_bytes": self.tolerance_bytes,
            "patterns": {"checked": self.pattern_checked, "blocks_checked": self.blocks_checked,
                         "corruptions": self.corruptions, "kinds": dict(self.corruption_kinds),
                         "first_corruption": self.first_corruption},
            "calls": self.calls,
            "simulated": self.simulated,
            "notes": list(self.notes),
            "series": {
                "events": self.events,
                "sim_reserved": _changes(self.sim_reserved),
                "measured_reserved": _changes(self.measured_reserved),
                "sim_used": _changes(self.sim_used),
                "measured_used": _changes(self.measured_used),
                "device_used": _changes(self.device_used),
            },
        }

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> ValidationReport:
        """Read a report back (e.g. to re-plot it)."""
        series = data["series"]
        n = int(series["events"])
        return cls(
            backend=data["backend"], policy=data["policy"], trace=data["trace"],
            device=data["device"], profile=data["profile"], versions=data["versions"],
            date=data["date"], metrics=[Metric(m["name"], m["unit"], m["simulated"],
                                               m["measured"]) for m in data["metrics"]],
            reserved_error=ErrorStats(**data["reserved_error"]),
            used_error=None if data["used_error"] is None else ErrorStats(**data["used_error"]),
            tolerance_bytes=data["tolerance_bytes"],
            checks=[Check(**c) for c in data["checks"]],
            pattern_checked=data["patterns"]["checked"],
            blocks_checked=data["patterns"]["blocks_checked"],
            corruptions=data["patterns"]["corruptions"],
            first_corruption=data["patterns"]["first_corruption"],
            calls=data["calls"], simulated=data["simulated"],
            sim_reserved=_expand(series["sim_reserved"], n),
            measured_reserved=_expand(series["measured_reserved"], n),
            sim_used=_expand(series["sim_used"], n),
            measured_used=_expand(series["measured_used"], n),
            device_used=_expand(series["device_used"], n), notes=data.get("notes", []),
            corruption_kinds=data["patterns"].get("kinds", {}))

    def _rows(self) -> list[list[str]]:
        rows = []
        for m in self.metrics:
            rows.append([m.name, _show(m.simulated, m.unit), _show(m.measured, m.unit),
                         _show(m.difference, m.unit, signed=True)])
        err = self.reserved_error
        rows.append(["reserved after each device call: max |error|", "", "",
                     _show(err.max_abs, "bytes")])
        rows.append(["reserved after each device call: mean |error|", "", "",
                     _show(err.mean_abs, "bytes")])
        if self.used_error is not None:
            rows.append(["in use after each event: max |error|", "", "",
                         _show(self.used_error.max_abs, "bytes")])
        if self.pattern_checked:
            rows.append(["pattern corruptions", "0", f"{self.corruptions:,}",
                         f"{self.corruptions:,}"])
        return rows

    def headline(self) -> str:
        trace = self.trace
        return (f"validate {self.policy} on {trace.get('name')} ({trace.get('events', 0):,} "
                f"events), backend {self.backend} on {self.device}; simulated device "
                f"{self.profile.get('name')} ({format_size(self.profile.get('capacity', 0))})")

    def verdict(self) -> str:
        failed = [c for c in self.checks if c.ok is False]
        if not failed:
            return "PASS: " + "; ".join(c.detail for c in self.checks if c.ok)
        return "FAIL: " + "; ".join(f"{c.name}: {c.detail}" for c in failed)

    def text(self) -> str:
        """What ``allocsim validate`` prints."""
        from allocsim.sim.output.tables import format_table
        table = format_table(self._rows(), ["metric", "simulated", "measured", "difference"])
        lines = [self.headline(), "", table, ""]
        if self.first_corruption:
            lines.append(f"first corruption: {self.first_corruption}")
        lines += [f"note: {note}" for note in self.notes]
        lines.append(self.verdict())
        return "\n".join(lines)

    def markdown(self) -> str:
        """A short Markdown table of the figures, with the verdict."""
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        out = [f"### {self.policy} on `{self.trace.get('name')}` — backend `{self.backend}`", "",
               f"{self.device}; simulated device {self.profile.get('name')}, "
               f"{format_size(self.profile.get('capacity', 0))}; {versions}; {self.date}", "",
               "| metric | simulated | measured | difference |", "|---|---:|---:|---:|"]
        # A "|" inside a cell (as in |error|) would end the cell: escape it.
        out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
                for row in self._rows()]
        out.append("")
        if self.first_corruption:
            out.append(f"First corruption: {self.first_corruption}")
        out.append(f"**{self.verdict()}**")
        return "\n".join(out) + "\n"

    def plot(self, path: str | Path) -> Path:
        """Simulated vs measured reserved bytes over the trace's events (and the difference)."""
        from allocsim.sim.output.figures import pyplot
        plt = pyplot()
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True,
                                          gridspec_kw={"height_ratios": [3, 1.3]})
        x = np.arange(self.events)
        top.step(x, self.sim_reserved / GiB, where="post", lw=1.6, label="simulated reserved")
        top.step(x, self.measured_reserved / GiB, where="post", lw=1.0, ls="--",
                 label="measured reserved")
        if self.device_used is not None and self.backend != "policy":
            top.step(x, self.device_used / GiB, where="post", lw=0.7, alpha=0.7,
                     label="device in use (cudaMemGetInfo)")
        oom = self.metric("first OOM event")
        for value, colour, label in ((oom.simulated, "red", "simulated first OOM"),
                                     (oom.measured, "purple", "measured first OOM")):
            if value is not None:
                top.axvline(value, color=colour, ls=":", lw=1, label=label)
        top.set_ylabel("GiB")
        top.legend(fontsize=7, loc="upper right")
        top.set_title(self.headline(), fontsize=8, loc="left")
        bottom.step(x, (self.measured_reserved - self.sim_reserved) / MiB, where="post",
                    lw=0.9, color="black")
        bottom.axhline(0, color="grey", lw=0.5)
        bottom.set_ylabel("measured − sim (MiB)", fontsize=8)
        bottom.set_xlabel("event")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return Path(path)

    def stem(self) -> str:
        return _slug(f"{self.trace.get('name', 'trace')}-{self.backend}-{self.policy}")

    def write(self, out_dir: str | Path, stem: str | None = None) -> list[Path]:
        """``STEM.json``, ``STEM.md`` and ``STEM.png`` into ``out_dir``; the paths written."""
        from allocsim.sim.output.files import write_json
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        stem = stem or self.stem()
        json_path, md_path, png_path = (out / f"{stem}.json", out / f"{stem}.md",
                                        out / f"{stem}.png")
        write_json(self.to_json_dict(), json_path)
        md_path.write_text(self.markdown())
        self.plot(png_path)
        return [json_path, md_path, png_path]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "report"


def _show(value: float | int | None, unit: str, *, signed: bool = False) -> str:
    if value is None:
        return "-"
    sign = "+" if signed and value > 0 else ""
    if unit == "bytes":
        return sign + format_size(value)
    if unit == "s":
        return f"{sign}{value * 1e3:.4g} ms"
    if isinstance(value, float):
        return f"{sign}{value:.6g}"
    return f"{sign}{value:,}"


def _versions_host() -> dict[str, str]:
    return {"numpy": np.__version__, "python": platform.python_version(),
            "platform": platform.platform()}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def build_report(backend: Backend, spec: PolicySpec, trace: Trace, profile: DeviceProfile,
                 simulated: Simulated, measured: Measured, *, device_name: str,
                 versions: dict[str, str], tolerance_bytes: int | None) -> ValidationReport:
    """Line the two sides up, compute the errors, and judge the backend's criteria."""
    from allocsim.sim.questions.compare import trace_facts
    n = len(trace)
    sim_events = simulated.call_events
    measured_events = np.asarray(measured.calls.event, dtype=np.int64)
    if not measured.calls_exact:
        # Calls seen only indirectly: compare wherever the measured reserved bytes moved.
        measured_events = np.flatnonzero(np.diff(measured.reserved, prepend=0))
    at_calls = np.unique(np.concatenate([sim_events, measured_events]).clip(0, max(n - 1, 0)))
    at_calls = at_calls[at_calls < n] if n else at_calls[:0]
    reserved_error = ErrorStats.of(simulated.reserved, measured.reserved, at_calls)
    used_error = (ErrorStats.of(simulated.used, measured.used) if measured.used is not None
                  else None)
    result = simulated.result
    measured_peak = int(measured.reserved.max()) if n else 0
    metrics = [
        Metric("peak reserved", "bytes", result.peak_reserved, measured_peak),
        Metric("final reserved", "bytes", result.final_reserved,
               int(measured.reserved[-1]) if n else 0),
        Metric("first OOM event", "event", result.first_oom_event, measured.first_oom_event),
        Metric("OOMs", "count", result.ooms, measured.ooms),
        Metric("device calls", "calls", simulated.calls,
               measured.call_count if measured.call_count is not None
               else measured.calls.succeeded),
        Metric("failed device calls", "calls", simulated.failed_calls, measured.calls.failed),
        Metric("device-call time", "s", round(simulated.cost_s, 9),
               round(measured.calls.total_s, 9)),
    ]
    if measured.used is not None:
        metrics.insert(1, Metric("peak in use", "bytes", int(simulated.used.max()) if n else 0,
                                 int(measured.used.max()) if n else 0))
    checks: list[Check] = []
    same_oom = result.first_oom_event == measured.first_oom_event
    checks.append(Check("first OOM event", same_oom,
                        f"first OOM at the same event ({_event_text(result.first_oom_event)})"
                        if same_oom else
                        f"simulated {_event_text(result.first_oom_event)}, measured "
                        f"{_event_text(measured.first_oom_event)}"))
    if backend.exact:
        checks.append(_identical_check("reserved", "reserved", "differs", reserved_error, n))
        if used_error is not None:
            checks.append(_identical_check("in use", "bytes in use", "differ", used_error, n))
    elif tolerance_bytes is not None:
        ok = reserved_error.max_abs <= tolerance_bytes
        judged: bool | None = ok if backend.name == "cupy-raw" else None
        checks.append(Check(
            "reserved within granularity", judged,
            f"reserved within {format_size(tolerance_bytes)} (the measured granularity) after "
            f"every device call" if ok else
            f"reserved off by up to {format_size(reserved_error.max_abs)} "
            f"(mean {format_size(reserved_error.mean_abs)}), more than the measured "
            f"granularity {format_size(tolerance_bytes)}"))
    if measured.pattern_checked:
        ok = not measured.corruptions
        kinds = ", ".join(f"{count:,} {kind}" for kind, count in
                          _kinds(measured.corruptions).items())
        checks.append(Check("patterns", ok,
                            f"no pattern corruption in {measured.blocks_checked:,} blocks"
                            if ok else f"{len(measured.corruptions):,} corruptions ({kinds}), "
                                       f"first: {measured.corruptions[0]}"))
    notes = list(measured.notes)
    if not measured.calls_exact:
        notes.append("device calls and their time were observed indirectly by this backend "
                     "(see the notes above); compare counts with care")
    return ValidationReport(
        backend=backend.name, policy=str(spec), trace=trace_facts(trace), device=device_name,
        profile={"name": profile.name, "capacity": profile.capacity,
                 "granularity": profile.granularity, "map_granularity": profile.map_granularity,
                 "costs_source": profile.costs.source},
        versions=versions, date=_now(), metrics=metrics, reserved_error=reserved_error,
        used_error=used_error, tolerance_bytes=tolerance_bytes, checks=checks,
        pattern_checked=measured.pattern_checked, blocks_checked=measured.blocks_checked,
        corruptions=len(measured.corruptions),
        first_corruption=str(measured.corruptions[0]) if measured.corruptions else None,
        calls={"simulated": {"calls": simulated.calls, "failed": simulated.failed_calls,
                             "time_s": round(simulated.cost_s, 9),
                             "costs": profile.costs.source},
               "measured": measured.calls.summary(), "measured_exact": measured.calls_exact},
        simulated=result.to_json_dict(), sim_reserved=simulated.reserved,
        measured_reserved=measured.reserved,
        sim_used=simulated.used if measured.used is not None else None,
        measured_used=measured.used, device_used=measured.device_used, notes=notes,
        corruption_kinds=_kinds(measured.corruptions))


def _kinds(corruptions: list[Corruption]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for corruption in corruptions:
        counts[corruption.kind] = counts.get(corruption.kind, 0) + 1
    return counts


def _identical_check(name: str, subject: str, differ: str, error: Any, events: int) -> Check:
    """The byte-for-byte check of one measured series against the simulated one."""
    ok = error.mismatched_events == 0
    return Check(name, ok, f"{subject} identical after all {events:,} events" if ok else
                 f"{subject} {differ} after {error.mismatched_events:,} events, first at event "
                 f"{error.first_mismatch_event}, by up to {format_size(error.max_abs)}")


def _event_text(event: int | None) -> str:
    return "none" if event is None else f"event {event:,}"




def _cuda_version(number: int) -> str:
    return f"{number // 1000}.{number % 1000 // 10}"


def _gpu_facts(cp: Any) -> tuple[str, dict[str, str]]:
    """The GPU's name and the versions a report records."""
    rt = cp.cuda.runtime
    device_id = int(rt.getDevice())
    name = rt.getDeviceProperties(device_id)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    versions = {"cupy": cp.__version__, "cuda_runtime": _cuda_version(rt.runtimeGetVersion()),
                "cuda_driver_api": _cuda_version(rt.driverGetVersion())}
    driver = _nvidia_driver_version()
    if driver:
        versions["nvidia_driver"] = driver
    versions.update({"numpy": np.__version__, "python": platform.python_version()})
    return name, versions


def _nvidia_driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return out.strip().splitlines()[0] if out.strip() else None
    except Exception:
        return None


def _probe_granularity(rt: Any) -> int | None:
    """How cudaMemGetInfo moves for one cudaMalloc of 2 MiB + 1 byte, less the 2 MiB asked:
    the quantum in which the device's real usage is seen. None if it did not move."""
    rt.deviceSynchronize()
    before = int(rt.memGetInfo()[0])
    ptr = rt.malloc(2 * MiB + 1)
    after = int(rt.memGetInfo()[0])
    rt.free(ptr)
    moved = before - after
    if moved <= 0:
        return None
    return moved - 2 * MiB if moved > 2 * MiB + 1 else moved


_PROFILE_BY_GPU_NAME = (("h200", "h200-141g"), ("h100", "h100-80g"), ("a100", "a100-80g"),
                        ("4090", "rtx4090-24g"), ("t4", "t4-16g"))


def _profile_for_gpu(name: str, total: int) -> DeviceProfile | None:
    """The built-in profile of the GPU called ``name`` (an A100 with under 60 GB is the 40 GB
    one), or None: so that a report does not say a100-80g when an H200 ran it."""
    lowered = name.lower()
    for needle, profile_name in _PROFILE_BY_GPU_NAME:
        if re.search(rf"\b{needle}\b", lowered):
            if profile_name == "a100-80g" and total < 60 * GiB:
                profile_name = "a100-40g"
            return resolve_device(profile_name)
    return None


def _gpu_profile(cp: Any, profile: DeviceProfile) -> DeviceProfile:
    """The simulated device for a GPU run without --capacity: the memory free right now (so
    both sides can run out at the same point)."""
    free = int(cp.cuda.runtime.memGetInfo()[0])
    return profile.with_capacity(free // profile.granularity * profile.granularity)


def _stream_map(streams: Iterable[int], make: Callable[[], Any], default: Any) -> dict[int, Any]:
    """Trace stream ids -> real streams: the lowest on the default stream, others new."""
    ordered = sorted(set(streams))
    return {s: (default if index == 0 else make()) for index, s in enumerate(ordered)}


def _run_policy_gpu(trace: Trace, spec: PolicySpec, profile: DeviceProfile,
                    patterns: bool, capacity_given: bool) -> tuple[Measured, DeviceProfile]:
    cp = _require_gpu()
    device_name, versions = _gpu_facts(cp)
    granularity = _probe_granularity(cp.cuda.runtime)
    device = CupyDevice(cp, profile)
    try:
        if not capacity_given:
            # What is free once the pattern kernels and their counter are in place.
            profile = _gpu_profile(cp, profile)
            device.capacity = profile.capacity
        device.start()
        measured = drive(trace, spec, device, patterns=patterns)
    finally:
        device.close()
    measured.device_name, measured.versions = device_name, versions
    measured.granularity = granularity
    measured.notes.append("measured reserved = drop of cudaMemGetInfo's free bytes since the "
                          "start (the whole device: other processes' use shows up too)")
    if len(trace.streams()) > 1:
        measured.notes.append("the policy object sees the trace's stream ids; no real streams "
                              "are used by this backend")
    return measured, profile


def _run_cupy_pool(trace: Trace, profile: DeviceProfile, capacity: int | None) -> Measured:
    cp = _require_gpu()
    rt = cp.cuda.runtime
    device_name, versions = _gpu_facts(cp)
    log = CallLog()
    state = {"event": -1}

    # CuPy's pool calls its allocator for every device malloc and frees through the memory
    # object it returned: wrapping both counts and times every real cudaMalloc/cudaFree.
    def device_malloc(size: int, device_id: int) -> int:
        start = time.perf_counter_ns()
        try:
            ptr = int(rt.malloc(size))
        except rt.CUDARuntimeError:
            log.add(state["event"], "malloc", size, False, time.perf_counter_ns() - start)
            raise
        log.add(state["event"], "malloc", size, True, time.perf_counter_ns() - start)
        return ptr

    def device_free(ptr: int, device_id: int) -> None:
        start = time.perf_counter_ns()
        rt.free(ptr)
        log.add(state["event"], "free", 0, True, time.perf_counter_ns() - start)

    allocator = getattr(cp.cuda.memory, "PythonFunctionAllocator", None)
    notes = []
    if allocator is not None:
        pool = cp.cuda.MemoryPool(allocator(device_malloc, device_free).malloc)
        exact_calls = True
    else:
        pool = cp.cuda.MemoryPool()
        exact_calls = False
        notes.append("this CuPy has no PythonFunctionAllocator: device calls inferred from "
                     "changes of total_bytes(), untimed")
    if capacity is not None:
        pool.set_limit(size=capacity)
    streams = _stream_map(trace.streams(), lambda: cp.cuda.Stream(non_blocking=True),
                          cp.cuda.Stream.null)
    oom_error = cp.cuda.memory.OutOfMemoryError

    def alloc(size: int, stream: int) -> Any:
        with streams[stream]:
            try:
                return pool.malloc(size)
            except oom_error:
                return None

    measured = _replay_allocator(trace, alloc, lambda handle: None,
                                 reserved=pool.total_bytes, used=pool.used_bytes,
                                 device_used=_mem_used(rt), state=state)
    pool.free_all_blocks()
    measured.calls = log.before(len(trace)) if exact_calls else _inferred_calls(measured.reserved)
    measured.calls_exact = exact_calls
    measured.device_name, measured.versions = device_name, versions
    measured.notes += notes + ["measured reserved = MemoryPool.total_bytes(), in use = "
                               "used_bytes(); device_used = cudaMemGetInfo"]
    return measured


def _run_cupy_raw(trace: Trace, profile: DeviceProfile) -> Measured:
    cp = _require_gpu()
    rt = cp.cuda.runtime
    device_name, versions = _gpu_facts(cp)
    granularity = _probe_granularity(rt)
    log = CallLog()
    state = {"event": -1, "held": 0}

    def alloc(size: int, stream: int) -> Any:
        start = time.perf_counter_ns()
        taken = round_up(size, profile.granularity)
        # CuPy with no pool has no limit: the profile's capacity is enforced here, by the
        # simulated device's rule, so a --capacity below the GPU's memory OOMs alike.
        if state["held"] + taken > profile.capacity:
            log.add(state["event"], "malloc", size, False, time.perf_counter_ns() - start)
            return None
        try:
            ptr = int(rt.malloc(size))
        except rt.CUDARuntimeError as err:
            if err.status != CUDA_ERROR_MEMORY_ALLOCATION:
                raise
            log.add(state["event"], "malloc", size, False, time.perf_counter_ns() - start)
            return None
        log.add(state["event"], "malloc", size, True, time.perf_counter_ns() - start)
        state["held"] += taken
        return (ptr, taken)

    def free(handle: Any) -> None:
        ptr, taken = handle
        start = time.perf_counter_ns()
        rt.free(ptr)
        log.add(state["event"], "free", taken, True, time.perf_counter_ns() - start)
        state["held"] -= taken

    used = _mem_used(rt)
    measured = _replay_allocator(trace, alloc, free, reserved=used, used=None, device_used=None,
                                 state=state)
    measured.calls = log.before(len(trace))
    measured.device_name, measured.versions = device_name, versions
    measured.granularity = granularity
    measured.notes.append("measured reserved = drop of cudaMemGetInfo's free bytes since the "
                          "start (the whole device: other processes' use shows up too)")
    return measured


def _run_cupy_async(trace: Trace, profile: DeviceProfile, spec: PolicySpec) -> Measured:
    cp = _require_gpu()
    rt = cp.cuda.runtime
    device_name, versions = _gpu_facts(cp)
    try:
        pool = cp.cuda.MemoryAsyncPool()
    except Exception as err:
        raise ValidatorError(f"backend cupy-async: MemoryAsyncPool unavailable "
                             f"({_one_line(err)})") from None
    pool.free_all_blocks()
    streams = _stream_map(trace.streams(), lambda: cp.cuda.Stream(non_blocking=True),
                          cp.cuda.Stream.null)
    oom_error = cp.cuda.memory.OutOfMemoryError
    state = {"event": -1}

    def alloc(size: int, stream: int) -> Any:
        with streams[stream]:
            try:
                return pool.malloc(size)
            except oom_error:
                return None

    # The cuda-async model says when the program synchronises (a trace records none):
    # sync=free (its default) after every free, sync=none never. The replay does the same.
    sync_after_free = dict(spec.resolved().params).get("sync", "free") == "free"
    measured = _replay_allocator(trace, alloc, lambda handle: None, reserved=pool.total_bytes,
                                 used=pool.used_bytes, device_used=_mem_used(rt), state=state,
                                 after_free=rt.deviceSynchronize if sync_after_free else None)
    pool.free_all_blocks()
    measured.calls = _inferred_calls(measured.reserved)
    measured.calls_exact = False
    measured.device_name, measured.versions = device_name, versions
    measured.notes += [
        "measured reserved = the pool's cudaMemPoolAttrReservedMemCurrent (total_bytes()), in "
        "use = UsedMemCurrent; the driver's pool is opaque, so device calls are inferred from "
        "changes of reserved and are untimed",
        ("the device is synchronised after every free (the model's sync=free), so the pool "
         "applies its release threshold then" if sync_after_free else
         "no synchronisation between events (the model's sync=none): memory freed "
         "asynchronously goes back only at the driver's own synchronisation points"),
        "MemoryAsyncPool's set_limit is a release threshold, not a limit: --capacity is not "
        "enforced on the real pool"]
    return measured


def _require_torch() -> Any:
    """torch, once it has been seen to reach a CUDA device; else a one-line error."""
    try:
        import torch
    except ImportError:
        raise ValidatorError("backend torch needs PyTorch with CUDA (torch is not installed)"
                             ) from None
    if not torch.cuda.is_available():
        raise NoGPUError(f"no CUDA GPU visible (torch {torch.__version__}: "
                         f"torch.cuda.is_available() is false): allocsim validate needs one "
                         f"except with --backend host")
    return torch


def _run_torch(trace: Trace, profile: DeviceProfile, capacity: int | None) -> Measured:
    torch = _require_torch()
    device = torch.cuda.current_device()
    name = torch.cuda.get_device_name(device)
    versions = {"torch": torch.__version__, "torch_cuda": str(torch.version.cuda),
                "numpy": np.__version__, "python": platform.python_version()}
    driver = _nvidia_driver_version()
    if driver:
        versions["nvidia_driver"] = driver
    conf = torch_alloc_conf()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    base_reserved = torch.cuda.memory_reserved(device)
    base_allocated = torch.cuda.memory_allocated(device)
    total = torch.cuda.mem_get_info(device)[1]
    if capacity is not None:
        # allowed = (size_t)(fraction × total): the half byte keeps truncation at capacity.
        torch.cuda.set_per_process_memory_fraction(min(1.0, (capacity + 0.5) / total), device)
    streams = _stream_map(trace.streams(), lambda: torch.cuda.Stream(device),
                          torch.cuda.current_stream(device))
    oom_error = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    state = {"event": -1}

    def alloc(size: int, stream: int) -> Any:
        try:
            return torch.cuda.caching_allocator_alloc(size, device, streams[stream])
        except oom_error:
            return None

    def free(ptr: Any) -> None:
        torch.cuda.caching_allocator_delete(ptr)

    stats_before = torch.cuda.memory_stats(device)
    stats_after: dict[str, Any] = {}
    try:
        measured = _replay_allocator(
            trace, alloc, free,
            reserved=lambda: torch.cuda.memory_reserved(device) - base_reserved,
            used=lambda: torch.cuda.memory_allocated(device) - base_allocated,
            device_used=lambda: total - torch.cuda.mem_get_info(device)[0], state=state,
            timed=True,
            before_cleanup=lambda: stats_after.update(torch.cuda.memory_stats(device)))
    finally:
        if capacity is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()
    calls = measured.calls
    if "num_device_alloc" in stats_after:
        # Real counts from the allocator's own stats; the time is that of the events that
        # made them (an upper bound: it includes the allocator's bookkeeping).
        count = (stats_after["num_device_alloc"] - stats_before.get("num_device_alloc", 0)
                 + stats_after["num_device_free"] - stats_before.get("num_device_free", 0))
        inferred = _inferred_calls(measured.reserved)
        measured.notes.append(f"device calls from memory_stats(): {count:,} "
                              f"(num_device_alloc + num_device_free)")
        if len(inferred) != count:
            measured.notes.append(f"{len(inferred):,} events moved memory_reserved()")
        measured.call_count = int(count)
    measured.calls = calls
    measured.calls_exact = False
    measured.device_name, measured.versions = name, versions
    measured.notes.append("measured reserved = torch.cuda.memory_reserved(), in use = "
                          "memory_allocated(); device-call time = wall time of the events "
                          "that changed memory_reserved() (an upper bound)")
    if conf:
        measured.notes.append(f"{conf[0]}={conf[1]}: the real allocator's settings (the "
                              f"pytorch model was given the same unless --policy said otherwise)")
    return measured


def _mem_used(rt: Any) -> Callable[[], int]:
    """Device bytes in use since now, from cudaMemGetInfo."""
    rt.deviceSynchronize()
    baseline = int(rt.memGetInfo()[0])
    return lambda: baseline - int(rt.memGetInfo()[0])


def _inferred_calls(reserved: np.ndarray) -> CallLog:
    """A call log guessed from where reserved bytes moved (one call per move, untimed)."""
    log = CallLog()
    previous = 0
    for event in np.flatnonzero(np.diff(reserved, prepend=0)):
        value = int(reserved[event])
        log.add(int(event), "malloc" if value > previous else "free", abs(value - previous),
                True, 0)
        previous = value
    return log


def _replay_allocator(trace: Trace, alloc: Callable[[int, int], Any],
                      free: Callable[[Any], None], *, reserved: Callable[[], int],
                      used: Callable[[], int] | None, device_used: Callable[[], int] | None,
                      state: dict, timed: bool = False,
                      before_cleanup: Callable[[], None] | None = None,
                      after_free: Callable[[], None] | None = None) -> Measured:
    """Replay ``trace`` through a real allocator: ``alloc(size, stream)`` returns a handle
    (None on OOM), dropping the handle (or ``free(handle)``) frees it. Reads reserved/used
    after every event. With ``timed``, the wall time of every event that moved reserved is
    logged as a call (for allocators whose device calls cannot be hooked). ``before_cleanup``
    runs once the replay is over, before what is still live is freed; ``after_free`` after
    every free of the replay."""
    n = len(trace)
    ops, ids, sizes, streams = _event_columns(trace)
    out_reserved = np.zeros(n, dtype=np.int64)
    out_used = np.zeros(n, dtype=np.int64) if used is not None else None
    out_device = np.zeros(n, dtype=np.int64) if device_used is not None else None
    measured = Measured(reserved=out_reserved, used=out_used, device_used=out_device)
    live: dict[int, Any] = {}
    log = CallLog()
    previous = 0
    try:
        for i in range(n):
            state["event"] = i
            start = time.perf_counter_ns()
            if ops[i] == OP_ALLOC:
                if sizes[i] > 0:
                    got = alloc(sizes[i], streams[i])
                    if got is None:
                        measured.ooms += 1
                        if measured.first_oom_event is None:
                            measured.first_oom_event = i
                    else:
                        live[ids[i]] = got
                    got = None    # no stray reference may keep a pooled block alive
            elif ids[i] in live:
                free(live[ids[i]])
                # Dropping the last reference is the free for CuPy's pools: it happens here.
                del live[ids[i]]
                if after_free is not None:
                    after_free()
            elapsed = time.perf_counter_ns() - start
            now = reserved()
            out_reserved[i] = now
            if timed and now != previous:
                log.add(i, "malloc" if now > previous else "free", abs(now - previous), True,
                        elapsed)
            previous = now
            if out_used is not None and used is not None:
                out_used[i] = used()
            if out_device is not None and device_used is not None:
                out_device[i] = device_used()
    finally:
        if before_cleanup is not None:
            before_cleanup()
        # The clean-up's device calls are logged as event n: callers keep those before it.
        state["event"] = n
        for handle in live.values():
            free(handle)
        live.clear()
    measured.calls = log
    return measured


# -- validate ------------------------------------------------------------------------------


def _resolve_profile(device_profile: DeviceProfile | str | Path | None) -> DeviceProfile:
    if isinstance(device_profile, DeviceProfile):
        return device_profile
    if device_profile is not None and (str(device_profile).endswith(".json")
                                       or Path(str(device_profile)).is_file()):
        return resolve_device(profile_file=device_profile)
    return resolve_device(None if device_profile is None else str(device_profile))


def _resolve_spec(backend: Backend, policy: str | PolicySpec | None) -> PolicySpec:
    text = policy if policy is not None else backend.model
    if text is None:
        raise ValidatorError(f"backend {backend.name} replays a policy object: give one with "
                             f"--policy (e.g. --policy bfc)")
    try:
        return parse_policy(text)
    except PolicySpecError as err:
        if policy is None:
            raise ValidatorError(
                f"backend {backend.name} compares against the {backend.model!r} policy model, "
                f"which this installation does not have ({err})") from None
        raise


def torch_alloc_conf() -> tuple[str, str] | None:
    """The allocator settings PyTorch reads from this process's environment: (variable, value)
    of PYTORCH_ALLOC_CONF, else of the older PYTORCH_CUDA_ALLOC_CONF, else None."""
    for variable in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        value = os.environ.get(variable, "").strip()
        if value:
            return variable, value
    return None


def _torch_model_spec(backend: Backend, capped: bool) -> PolicySpec:
    """The ``pytorch`` model with the settings the real caching allocator has here."""
    conf = torch_alloc_conf()
    if conf is None:
        spec = _resolve_spec(backend, None)
    else:
        try:
            spec = alloc_conf_spec(conf[1])
        except PolicySpecError as err:
            raise ValidatorError(f"{conf[0]}={conf[1]}: the pytorch model cannot take these "
                                 f"settings ({err})") from None
    if capped:
        spec = parse_policy(f"{spec},per_process_memory_fraction=1.0" if ":" in str(spec)
                            else f"{spec}:per_process_memory_fraction=1.0")
    return spec


def _load_trace(trace: Trace | str | Path) -> Trace:
    if isinstance(trace, Trace):
        return trace
    from allocsim.traces import formats
    from allocsim.traces.bundled import load_default_trace
    return load_default_trace() if str(trace) == "default" else formats.load(trace)


def validate(trace: Trace | str | Path, policy_spec: str | PolicySpec | None = None,
             backend: str = "host", device_profile: DeviceProfile | str | Path | None = None,
             capacity: int | str | None = None, *, patterns: bool = True) -> ValidationReport:
    """Replay ``trace`` through ``backend`` and the simulator; the report compares them.

    ``policy_spec`` is the policy simulated (and, for ``host``/``policy``, the object that
    drives the memory); the allocator backends default to their model (``cupy``,
    ``on-demand``, ``cuda-async``, ``pytorch``). ``device_profile`` is a profile, a profile
    name or a profile JSON file (default: the default profile); ``capacity`` overrides its
    size. On a GPU without ``capacity`` the simulated device gets the memory free at the
    start. Raises :class:`NoGPUError` for a GPU backend without a GPU and
    :class:`ValidatorError` (one line) for other mistakes.
    """
    if backend not in BACKENDS:
        raise ValidatorError(f"unknown backend {backend!r}; backends: {', '.join(BACKENDS)}")
    chosen = BACKENDS[backend]
    spec = _resolve_spec(chosen, policy_spec)
    profile = _resolve_profile(device_profile)
    size = None if capacity is None else parse_size(capacity)
    if size is not None and size != profile.capacity:
        profile = profile.with_capacity(size)
    if policy_spec is None and chosen.name == "torch":
        # The model is configured as the real allocator of this process is: by the allocator
        # settings in its environment, and, with a capacity, capped by its own setting
        # (set_per_process_memory_fraction: allowed = C), checked before any device call, so
        # the model fails the same way (no device call).
        spec = _torch_model_spec(chosen, capped=size is not None)
    elif policy_spec is None and size is not None and chosen.name == "cupy-pool":
        spec = _resolve_spec(chosen, f"cupy:limit={size}")     # pool.set_limit(size=capacity)
    trace = _load_trace(trace)
    if len(trace.processes()) > 1:
        raise ValidatorError(f"{trace.name}: the validator replays one process, and this trace "
                             f"has {len(trace.processes())}; extract one first")
    tolerance: int | None = None
    if chosen.name == "host":
        measured = drive(trace, spec, HostDevice(profile), patterns=patterns)
        measured.device_name = f"host ({platform.machine() or 'cpu'}, numpy buffers)"
        measured.versions = _versions_host()
        measured.notes.append("host backend: numpy buffers stand in for device memory; it "
                              "checks placements and the validator, not a GPU")
    else:
        cp = _require_gpu() if chosen.name != "torch" else None
        if device_profile is None:
            # No profile asked for: the built-in one of this GPU, if there is one.
            profile = _default_gpu_profile(cp) or profile
            if size is not None:
                profile = profile.with_capacity(size)
        if size is None and chosen.name != "policy":
            # No capacity given: simulate the memory that is free on the GPU right now.
            profile = _gpu_profile(cp, profile) if cp is not None else _torch_profile(profile)
        if chosen.name == "policy":
            measured, profile = _run_policy_gpu(trace, spec, profile, patterns,
                                                capacity_given=size is not None)
        elif chosen.name == "cupy-pool":
            measured = _run_cupy_pool(trace, profile, size)
        elif chosen.name == "cupy-raw":
            measured = _run_cupy_raw(trace, profile)
        elif chosen.name == "cupy-async":
            measured = _run_cupy_async(trace, profile, spec)
        else:
            measured = _run_torch(trace, profile, size)
        tolerance = measured.granularity
    simulated = simulate(trace, spec, profile)
    return build_report(chosen, spec, trace, profile, simulated, measured,
                        device_name=measured.device_name, versions=measured.versions,
                        tolerance_bytes=tolerance)


def _default_gpu_profile(cp: Any) -> DeviceProfile | None:
    try:
        if cp is not None:
            rt = cp.cuda.runtime
            name = rt.getDeviceProperties(int(rt.getDevice()))["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
            return _profile_for_gpu(name, int(rt.memGetInfo()[1]))
        import torch
        return _profile_for_gpu(torch.cuda.get_device_name(),
                                int(torch.cuda.mem_get_info()[1]))
    except Exception:
        return None


def _torch_profile(profile: DeviceProfile) -> DeviceProfile:
    torch = _require_torch()
    free = int(torch.cuda.mem_get_info()[0])
    return profile.with_capacity(free // profile.granularity * profile.granularity)


def validate_results(results: str | Path, backend: str = DEFAULT_BACKEND, *,
                     capacity: int | str | None = None,
                     device_profile: DeviceProfile | str | Path | None = None,
                     policy: str | None = None, patterns: bool = True) -> ValidationReport:
    """Validate the winner of a ``compare`` results.json on the trace it names.

    The trace is read from ``trace.source``, which must be a file — except for a bundled trace
    (``allocsim compare`` with no trace records its generator as the source), found by name and
    checked by its event and allocation counts; a file whose counts differ from the compared
    trace's is refused (it changed since). The simulated device is the
    one the comparison used (its name, capacity and granularities), unless ``device_profile``
    or ``capacity`` say otherwise. ``policy`` overrides the winner (e.g. to validate the
    runner-up). The allocator backends validate their own model, not the winner.
    """
    path = Path(results)
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise ValidatorError(f"{results}: cannot read: {err.strerror or err}") from None
    except ValueError as err:
        raise ValidatorError(f"{results}: not JSON: {err}") from None
    if isinstance(data, list):
        if len(data) != 1:
            raise ValidatorError(f"{results}: holds {len(data)} comparisons; validate one trace "
                                 f"at a time")
        data = data[0]
    if not isinstance(data, dict) or "results" not in data or "trace" not in data:
        raise ValidatorError(f"{results}: not an allocsim compare results file")
    chosen = policy or data.get("winner")
    if BACKENDS.get(backend, BACKENDS["host"]).model is not None and policy is None:
        chosen = None   # the allocator backends compare against their own model
    elif not chosen:
        raise ValidatorError(f"{results}: the comparison has no winner "
                             f"({data.get('reason', 'no reason given')}); pick one with --policy")
    facts = data["trace"]
    source = str(facts.get("source", ""))
    if not source or not Path(source).is_file():
        bundled = _bundled_match(facts)
        if bundled is None:
            raise ValidatorError(f"{results}: the compared trace's source {source!r} is not a "
                                 f"file (a generated trace?); run allocsim validate TRACE "
                                 f"--policy {chosen or 'P'} instead")
        source = str(bundled)
    trace = _load_trace(source)
    for key, value in (("events", len(trace)), ("allocs", trace.n_allocs)):
        if key in facts and int(facts[key]) != value:
            raise ValidatorError(f"{results}: {source} has {value:,} {key}, the compared trace "
                                 f"had {int(facts[key]):,}: the file changed since")
    profile = (_resolve_profile(device_profile) if device_profile is not None
               else _profile_from_results(data.get("device") or {}))
    if capacity is None and device_profile is None and BACKENDS.get(backend) is not None \
            and BACKENDS[backend].gpu:
        capacity = profile.capacity
    return validate(trace, chosen, backend, profile, capacity, patterns=patterns)


def _bundled_match(facts: dict[str, Any]) -> Path | None:
    """The bundled trace a comparison ran on (``allocsim compare`` with no trace records the
    generator as its source, not the file): same name, events and allocations."""
    from allocsim.traces.bundled import bundled_path
    path = bundled_path(f"{facts.get('name', '')}.npz")
    if not path.is_file():
        return None
    trace = _load_trace(path)
    if len(trace) != int(facts.get("events", -1)) or trace.n_allocs != int(facts.get("allocs", -1)):
        return None
    return path


def _profile_from_results(device: dict[str, Any]) -> DeviceProfile:
    """The comparison's device: its named profile (for the costs), with the recorded sizes."""
    name = str(device.get("name") or "")
    try:
        profile = resolve_device(name.split("@")[0] or None)
    except ValueError:
        profile = DeviceProfile(name or "results-device", int(device.get("capacity") or 0),
                                source="from a compare results.json (costs: defaults)")
    from dataclasses import replace
    return replace(profile, name=name or profile.name,
                   capacity=int(device.get("capacity") or profile.capacity),
                   granularity=int(device.get("granularity") or profile.granularity),
                   map_granularity=int(device.get("map_granularity") or profile.map_granularity))


# -- CLI -----------------------------------------------------------------------------------


def add_validate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``validate`` to an argparse subparsers object (sets ``func``)."""
    p = subparsers.add_parser(
        "validate", help="replay a trace on real memory and compare with the simulation",
        description="Replay TRACE through a backend and through the simulator and compare "
                    "them after every event. RESULTS.json (from compare --out) validates its "
                    "winner on the trace it names. Exit status: 0 all checks passed, 1 a check "
                    "failed, 2 an error (no GPU, bad arguments).")
    p.add_argument("input", help="trace file ('default' = the bundled trace), or a compare "
                                 "results.json")
    p.add_argument("--policy", metavar="SPEC",
                   help="the policy to validate (backends host and policy; required with a "
                        "trace); for the allocator backends, the model to compare with "
                        "(default: " + ", ".join(f"{b.name}: {b.model}" for b in
                                                 BACKENDS.values() if b.model) + ")")
    p.add_argument("--backend", default=DEFAULT_BACKEND, choices=list(BACKENDS),
                   help=f"what replays the trace (default {DEFAULT_BACKEND}; host needs no GPU)")
    p.add_argument("--capacity", help="device capacity, e.g. 24GiB (default: the profile's; on "
                                      "a GPU, the memory free at the start)")
    p.add_argument("--device", help="device profile for the simulation (see allocsim devices)")
    p.add_argument("--device-profile", help="a device-profile JSON file (from allocsim calibrate)")
    p.add_argument("--no-patterns", action="store_true",
                   help="do not write and check block patterns (faster, no overlap check)")
    p.add_argument("--out", help="directory for the report: JSON, Markdown and a PNG figure")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_validate)
    return p


def cmd_validate(args: argparse.Namespace) -> int:
    profile: DeviceProfile | str | None = None
    if args.device_profile:
        profile = resolve_device(profile_file=args.device_profile)
    elif args.device:
        profile = resolve_device(args.device)
    patterns = not args.no_patterns
    if args.input.lower().endswith(".json"):
        report = validate_results(args.input, args.backend, capacity=args.capacity,
                                  device_profile=profile, policy=args.policy, patterns=patterns)
    else:
        if args.policy is None and BACKENDS[args.backend].model is None:
            raise ValidatorError(f"--policy is required with a trace for backend "
                                 f"{args.backend} (or give a compare results.json)")
        report = validate(args.input, args.policy, args.backend, profile, args.capacity,
                          patterns=patterns)
    if args.out:
        written = report.write(args.out)
        if not args.json:
            print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    if args.json:
        json.dump(report.to_json_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(report.text())
    return 0 if report.passed else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m allocsim.sim.validation.validator validate|calibrate ...``: the two commands on their own, with
    the allocsim CLI's error convention (one line, exit 2)."""
    parser = argparse.ArgumentParser(prog="allocsim", description="Validate and calibrate.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_validate_parser(sub)
    from allocsim.sim.validation.calibrate import add_calibrate_parser
    add_calibrate_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:      # ValidatorError, NoGPUError, TraceError, PolicySpecError
        print(f"allocsim: error: {_one_line(err)}", file=sys.stderr)
    except OSError as err:
        print(f"allocsim: error: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)
    return 2


__all__ = [
    "BACKENDS",
    "Backend",
    "CallLog",
    "Check",
    "Corruption",
    "CudaVMM",
    "CupyDevice",
    "ErrorStats",
    "HostDevice",
    "Measured",
    "Metric",
    "NoGPUError",
    "Simulated",
    "ValidationReport",
    "ValidatorError",
    "add_validate_parser",
    "cmd_validate",
    "count_pattern_errors",
    "drive",
    "fill_pattern",
    "main",
    "pattern_word",
    "simulate",
    "validate",
    "validate_results",
]

if __name__ == "__main__":
    sys.exit(main())
