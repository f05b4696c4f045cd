"""The validation report: simulated next to measured for one trace, policy and backend.

:func:`build_report` lines the two sides of a replay up
(:class:`~allocsim.sim.validation.replay.Simulated` and
:class:`~allocsim.sim.validation.measured.Measured`), computes the errors and judges the
backend's criteria; :class:`ValidationReport` prints itself (``allocsim validate``), writes
JSON, Markdown and a PNG figure, and reads its JSON back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.policies import PolicySpec, format_size
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.output.figures import save
from allocsim.sim.output.files import safe_stem
from allocsim.sim.output.ownership import MARKDOWN_MARK, guard
from allocsim.sim.validation.backends import Backend
from allocsim.sim.validation.errors import ValidatorError
from allocsim.sim.validation.measured import Corruption, Measured
from allocsim.sim.validation.provenance import now
from allocsim.sim.validation.replay import Simulated, after_each_event
from allocsim.traces.model import Trace

MiB = 1 << 20
GiB = 1 << 30
REPORT_SCHEMA = 1


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
    return after_each_event(pairs[:, 0], pairs[:, 1], n)


def _expand_required(series: dict[str, Any], name: str, n: int) -> np.ndarray:
    values = _expand(series.get(name), n)
    if values is None:
        raise ValidatorError(f"not an allocsim validation report: its {name} series is missing")
    return values


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
            sim_reserved=_expand_required(series, "sim_reserved", n),
            measured_reserved=_expand_required(series, "measured_reserved", n),
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
        return save(fig, path)

    def stem(self) -> str:
        return safe_stem(f"{self.trace.get('name', 'trace')}-{self.backend}-{self.policy}",
                         default="report")

    def write(self, out_dir: str | Path, stem: str | None = None) -> list[Path]:
        """``STEM.json``, ``STEM.md`` and ``STEM.png`` into ``out_dir``; the paths written."""
        from allocsim.sim.output.files import write_json, write_text
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        stem = safe_stem(stem, default="report") if stem else self.stem()
        json_path, md_path, png_path = (out / f"{stem}.json", out / f"{stem}.md",
                                        out / f"{stem}.png")
        guard(json_path, "validate")     # all refused before any is written
        guard(md_path)
        guard(png_path)
        write_json(self.to_json_dict(), json_path, kind="validate")
        write_text(md_path, MARKDOWN_MARK + "\n" + self.markdown())
        self.plot(png_path)
        return [json_path, md_path, png_path]


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
        profile={"name": profile.label, "capacity": profile.capacity,
                 "granularity": profile.granularity, "map_granularity": profile.map_granularity,
                 "costs_source": profile.costs.source},
        versions=versions, date=now(), metrics=metrics, reserved_error=reserved_error,
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

