"""``allocsim fidelity DUMP``: XLA's own buffer assignment against allocsim's plan and the
online allocators, on the same buffers.

An XLA dump (:mod:`allocsim.traces.formats.xla.dump`) gives every logical buffer of a module
with its live range, and XLA's packing of them into allocations. The question: would the
``offline`` plan — a plan of XLA's kind (global decreasing-size best fit over known lifetimes,
:mod:`allocsim.sim.questions.offline`), with XLA's alignment — need more than XLA's temp
allocation for the buffers that allocation holds? Exit status 0 when it needs no more, 1 when
it needs more. Beside it: peak live bytes (the lower bound no packing beats), the same for the
whole module (arguments, outputs, temps and constants against the sum of XLA's allocations),
and the peak reserved bytes each online policy (``bfc``, ``best-fit``, ``pytorch``, ``cupy``)
reaches replaying the same buffers on a simulated device — what a runtime allocator would
hold if it had to serve XLA's buffers one by one instead of one planned temp allocation.

:func:`xla_fidelity` returns an :class:`XlaFidelityReport`: one screen of text
(:meth:`XlaFidelityReport.text`) or one JSON object (:meth:`XlaFidelityReport.to_json_dict`,
schema 1, ``sim/output/schemas/xla-fidelity.schema.json``; no wall-clock figures).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from allocsim.policies import format_size
from allocsim.sim.kernel.device import DeviceProfile, resolve_device
from allocsim.sim.kernel.engine import replay
from allocsim.sim.questions.offline import plan_offline
from allocsim.traces.formats.xla.dump import FORMAT_NAME, role_trace
from allocsim.traces.model import Trace

__all__ = ["DEFAULT_POLICIES", "SCHEMA_VERSION", "XlaFidelityReport", "is_xla_dump_trace",
           "xla_fidelity"]

SCHEMA_VERSION = 1
DEFAULT_POLICIES = ("bfc", "best-fit", "pytorch", "cupy")
_TEMP = ("temp",)
_MODULE = ("argument", "output", "temp", "constant")


def is_xla_dump_trace(trace: Trace) -> bool:
    """True for a trace read from an XLA dump (what ``fidelity`` dispatches on)."""
    return trace.metadata.get("format") == FORMAT_NAME and "xla" in trace.metadata


@dataclass
class Scope:
    """One set of buffers: XLA's bytes for them, the plan's, and the lower bound."""

    buffers: int
    xla_bytes: int
    plan_bytes: int
    peak_live: int

    def to_json_dict(self) -> dict[str, int]:
        return {"buffers": self.buffers, "xla_bytes": self.xla_bytes,
                "plan_bytes": self.plan_bytes, "peak_live": self.peak_live}


@dataclass
class PolicyNeed:
    """What one online policy reserved replaying a scope's buffers."""

    policy: str
    temp_peak_reserved: int
    temp_completed: bool
    temp_device_mallocs: int
    module_peak_reserved: int
    module_completed: bool

    def to_json_dict(self) -> dict[str, Any]:
        return {"policy": self.policy,
                "temp": {"peak_reserved": self.temp_peak_reserved,
                         "completed": self.temp_completed,
                         "device_mallocs": self.temp_device_mallocs},
                "module": {"peak_reserved": self.module_peak_reserved,
                           "completed": self.module_completed}}


@dataclass
class XlaFidelityReport:
    """XLA's assignment against the plan and the policies (see the module docstring)."""

    trace: str
    source: str
    module: str
    platform: str
    alignment: int
    device: DeviceProfile
    values: int
    shared_values: int
    left_out: dict[str, int]
    xla: dict[str, int]
    temp: Scope
    whole: Scope
    policies: list[PolicyNeed]
    notes: list[str] = field(default_factory=list)

    @property
    def plan_within_xla(self) -> bool:
        return self.temp.plan_bytes <= self.temp.xla_bytes

    @property
    def exit_status(self) -> int:
        """0 when the plan needs no more than XLA's temp allocation, else 1."""
        return 0 if self.plan_within_xla else 1

    def to_json_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, "trace": self.trace, "source": self.source,
                "module": self.module, "platform": self.platform,
                "alignment": self.alignment,
                "device": {"name": self.device.label, "capacity": self.device.capacity,
                           "granularity": self.device.granularity},
                "values": self.values, "shared_values": self.shared_values,
                "left_out": dict(self.left_out), "xla": dict(self.xla),
                "temp": self.temp.to_json_dict(), "module_totals": self.whole.to_json_dict(),
                "policies": [p.to_json_dict() for p in self.policies],
                "plan_within_xla": self.plan_within_xla, "notes": list(self.notes),
                "exit_status": self.exit_status}

    def text(self) -> str:
        """One screen."""
        t, w = self.temp, self.whole
        lines = [f"XLA fidelity of {self.module} ({self.platform}; {self.values:,} values, "
                 f"{self.shared_values:,} sharing another's bytes)",
                 f"  temp buffers ({t.buffers:,}: what XLA's temp allocation holds)",
                 f"    XLA temp allocation     {_bytes(t.xla_bytes)}",
                 f"    offline plan            {_bytes(t.plan_bytes)}   "
                 f"{_versus(t.plan_bytes, t.xla_bytes)}",
                 f"    peak live (lower bound) {_bytes(t.peak_live)}",
                 f"  whole module ({w.buffers:,} buffers: arguments, outputs, temps, constants)",
                 f"    XLA allocations         {_bytes(w.xla_bytes)}",
                 f"    offline plan            {_bytes(w.plan_bytes)}   "
                 f"{_versus(w.plan_bytes, w.xla_bytes)}",
                 f"    peak live (lower bound) {_bytes(w.peak_live)}",
                 f"  online policies, peak reserved replaying the same buffers on "
                 f"{self.device.label} (granularity {format_size(self.device.granularity)}):"]
        width = max([len(p.policy) for p in self.policies] + [6])
        lines.append(f"    {'policy':<{width}}  {'temp buffers':>14}  {'whole module':>14}")
        for p in self.policies:
            on_temp = _reserved(p.temp_peak_reserved, p.temp_completed)
            on_module = _reserved(p.module_peak_reserved, p.module_completed)
            lines.append(f"    {p.policy:<{width}}  {on_temp:>14}  {on_module:>14}")
        for note in self.notes:
            lines.append(f"  note  {note}")
        if self.plan_within_xla:
            lines.append("result: the offline plan needs no more than XLA's temp allocation "
                         "(exit 0)")
        else:
            lines.append(f"result: the offline plan needs "
                         f"{format_size(t.plan_bytes - t.xla_bytes)} more than XLA's temp "
                         "allocation (exit 1)")
        return "\n".join(lines)


def _bytes(n: int) -> str:
    return f"{format_size(n):>10} ({n:,} B)"


def _versus(ours: int, theirs: int) -> str:
    if ours == theirs:
        return "= XLA"
    word = "less" if ours < theirs else "more"
    share = f", {abs(ours - theirs) / theirs:.1%}" if theirs else ""
    return f"{format_size(abs(ours - theirs))} {word} than XLA{share}"


def _reserved(n: int, completed: bool) -> str:
    return format_size(n) if completed else "OOM"


def _scope(trace: Trace, xla_bytes: int, alignment: int) -> Scope:
    plan = plan_offline(trace, alignment)
    return Scope(buffers=len(plan.sizes), xla_bytes=xla_bytes, plan_bytes=plan.heap_size,
                 peak_live=plan.peak_live)


def xla_fidelity(trace: Trace, *, device: DeviceProfile | None = None,
                 policies: tuple[str, ...] | list[str] = DEFAULT_POLICIES) -> XlaFidelityReport:
    """Compare XLA's assignment of an imported dump module with the offline plan and the
    online ``policies`` on ``device`` (default: the default profile)."""
    xla = trace.metadata["xla"]
    device = device or resolve_device()
    alignment = int(xla["alignment"])
    temp_trace = role_trace(trace, _TEMP)
    module_trace = role_trace(trace, _MODULE)
    temp = _scope(temp_trace, int(xla["temp_bytes"]), alignment)
    whole = _scope(module_trace, int(xla["total_bytes"]), alignment)
    needs = []
    for spec in policies:
        on_temp = replay(temp_trace, spec, device)
        on_module = replay(module_trace, spec, device)
        needs.append(PolicyNeed(on_temp.policy, on_temp.peak_reserved, on_temp.completed,
                                on_temp.device_mallocs, on_module.peak_reserved,
                                on_module.completed))
    notes = [f"plan alignment {alignment} B (XLA's on {xla['platform']}); times are schedule "
             "positions, so there is no slowdown to weigh"]
    left = {k: v for k, v in xla["left_out"].items() if v}
    if left:
        notes.append("left out of the buffers: "
                     + ", ".join(f"{v} {k.replace('_', ' ')} values" for k, v in left.items()))
    if xla.get("overlap_merges"):
        notes.append(f"{xla['overlap_merges']} value pairs sharing bytes at other offsets "
                     "merged")
    if temp.buffers == 0:
        notes.append("XLA placed every temporary in an argument's or output's bytes: the temp "
                     "allocation is empty")
    return XlaFidelityReport(
        trace=trace.name, source=str(trace.metadata.get("source", "")), module=xla["module"],
        platform=xla["platform"], alignment=alignment, device=device,
        values=int(xla["values"]), shared_values=int(xla["shared_values"]),
        left_out=dict(xla["left_out"]),
        xla={k: int(xla[k]) for k in ("argument_bytes", "output_bytes", "alias_bytes",
                                      "temp_bytes", "constant_bytes", "total_bytes")},
        temp=temp, whole=whole, policies=needs, notes=notes)
