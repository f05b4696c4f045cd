"""How faithfully the ``tpu`` model reproduces a TPU runtime's own records, call by call.

A TPU profile (``jax.profiler`` on a TPU; :mod:`allocsim.traces.formats.xla.xplane`) holds one
record per allocation and free with the HBM offset the runtime chose (``addr``), the bytes it
took (``allocation_bytes``) and its running total (``bytes_allocated``). :func:`tpu_fidelity`
replays the records through :class:`~allocsim.policies.tpu.TpuRuntimeAllocator` on the
profile's own HBM (``bytes_limit``, the runtime's 26,624 B at the top) and checks, for every
record: the offset, the size, and bytes in use after it (the model's plus what the runtime
held before the first record). The first record that differs is reported with the rule that
decided it in the model.

Start state: a recording that begins on a fresh runtime (``allocsim validate --backend jax``,
experiments/tpu/chip_probe.py) is compared from its first record. A recording started
mid-run holds buffers allocated before it: those it frees are placed where their frees say
before the first record (``place_at``); those it never frees are not in any record, so the
holes around them are unknown — the report says how many bytes were live before the recording
and that placements may differ for that reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from allocsim.policies.tpu import V5E_RUNTIME_BYTES, TpuRuntimeAllocator
from allocsim.sim.kernel.device import SimulatedDevice
from allocsim.sim.kernel.device_profile import DeviceProfile
from allocsim.traces.allocator_records import check_allocator_records
from allocsim.traces.model import OP_ALLOC, Trace, TraceError

__all__ = ["TpuFidelity", "is_tpu_recording", "tpu_fidelity"]

RULES = {
    "alloc": "best fit: the smallest free block that holds the request (highest address among "
             "equals, the bottom block last), the buffer at the block's top end; compaction "
             "when no block holds it (policies/tpu.py best_fit, malloc, compact)",
    "free": "a freed buffer merges with its free neighbours (policies/tpu.py free)",
}


def is_tpu_recording(trace: Trace) -> bool:
    """True for a TPU runtime's profile (its frees carry no sizes: the xplane reader marks
    it ``memory_runtime: tpu``)."""
    return trace.metadata.get("memory_runtime") == "tpu"


@dataclass
class TpuFidelity:
    """Records matched (offset, size and bytes in use), the first divergence, and notes."""

    name: str
    total: int = 0
    matched: int = 0
    by_field: dict[str, int] = field(default_factory=lambda: {"address": 0, "size": 0,
                                                               "in_use": 0})
    first_divergence: dict[str, Any] | None = None
    compactions: int = 0
    compaction_moved_bytes: int = 0
    live_before: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.total > 0 and self.matched == self.total

    def as_dict(self) -> dict[str, Any]:
        return {"schema": 1, "kind": "tpu", "trace": self.name, "model": "tpu",
                "records": self.total,
                "matched": self.matched, "by_field": dict(self.by_field),
                "exact": self.exact, "first_divergence": self.first_divergence,
                "compactions": self.compactions,
                "compaction_moved_bytes": self.compaction_moved_bytes,
                "live_before_recording": self.live_before, "notes": list(self.notes)}

    def lines(self) -> list[str]:
        """The report as text, one finding per line."""
        out = [f"{self.name}: tpu model vs the TPU runtime's records: {self.matched:,}/"
               f"{self.total:,} matched (address {self.by_field['address']:,}, size "
               f"{self.by_field['size']:,}, bytes in use {self.by_field['in_use']:,})"]
        if self.compactions:
            out.append(f"  compactions in the model: {self.compactions} "
                       f"({self.compaction_moved_bytes:,} bytes moved)")
        div = self.first_divergence
        if div is not None:
            out.append(f"  first divergence at record {div['record']:,} (trace event "
                       f"{div['event']:,}, {div['action']} of {div['bytes']:,} B): runtime at "
                       f"{div['recorded']['address']:#x} in use {div['recorded']['in_use']:,}, "
                       f"model at " + ("-" if div['model']['address'] is None
                                       else f"{div['model']['address']:#x}")
                       + f" in use {div['model']['in_use']:,}")
            out.append(f"  rule: {div['rule']}")
        out += [f"  note: {note}" for note in self.notes]
        return out


def _limit(trace: Trace, refs: list[dict[str, Any]]) -> int:
    limit = trace.metadata.get("bfc_memory_limit")
    if isinstance(limit, int) and limit > 0:
        return limit
    first = refs[0]
    return int(first["available"]) + int(first["reserved"]) + int(first["in_use"])


def tpu_fidelity(trace: Trace, *, runtime_bytes: int = V5E_RUNTIME_BYTES) -> TpuFidelity:
    """Replay a TPU profile's records through the ``tpu`` model (module docstring)."""
    refs = trace.metadata.get("reference_events")
    source = str(trace.metadata.get("source", trace.name))
    if not is_tpu_recording(trace) or not refs:
        raise TraceError("not a TPU runtime's profile (its memory records carry no TPU "
                         "frees); a TPU profile comes from jax.profiler on a TPU",
                         source=source)
    refs = check_allocator_records(trace)
    report = TpuFidelity(trace.name)
    limit = _limit(trace, refs)
    profile = DeviceProfile(f"tpu ({limit:,} B)", limit, granularity=512, map_granularity=512,
                            source=f"the profile's own bytes_limit ({source})")
    model = TpuRuntimeAllocator(SimulatedDevice(profile).view(0), runtime_bytes=runtime_bytes)
    first = refs[0]
    signed = int(first["chunk"]) if first["action"] == "alloc" else -int(first["chunk"])
    held_before = int(first["in_use"]) - signed          # runtime bytes + buffers live before
    report.live_before = max(0, held_before - runtime_bytes)
    handles: dict[int, int] = {}
    prologue = int(trace.metadata.get("prologue_events", 0))
    if prologue:
        report.notes.append(f"{prologue:,} buffers were allocated before the recording; they "
                            "are placed where their frees put them")
    ops, ids, sizes = trace.op, trace.id, trace.size
    first_event = int(refs[0]["event"])
    free_addr = {int(ids[int(r["event"])]): int(r["addr"]) for r in refs
                 if r["action"] == "free"}
    for event in range(first_event):                       # the prologue
        buffer = int(ids[event])
        if int(ops[event]) == OP_ALLOC and buffer in free_addr:
            handle = model.place_at(free_addr[buffer], int(sizes[event]))
            if handle is not None:
                handles[buffer] = handle
    unseen = report.live_before - model.bytes_in_use
    if unseen > 0:
        report.notes.append(f"{unseen:,} bytes were live before the recording in buffers it "
                            "never frees: their places are unknown, so the model's holes may "
                            "differ from the runtime's until they would be freed")
    for k, ref in enumerate(refs):
        event = int(ref["event"])
        buffer = int(ids[event])
        size = int(ref["chunk"])
        if ref["action"] == "alloc":
            handle = model.malloc(size)
            where = None if handle is None else model.hbm_offset(handle)
            if handle is not None:
                handles[buffer] = handle
        else:
            handle = handles.pop(buffer, None)
            where = None if handle is None else model.hbm_offset(handle)
            if handle is not None:
                model.free(handle)
        in_use = model.bytes_in_use + runtime_bytes + max(0, unseen)
        checks = {"address": where == int(ref["addr"]), "size": handle is not None,
                  "in_use": in_use == int(ref["in_use"])}
        for key, ok in checks.items():
            report.by_field[key] += ok
        report.total += 1
        if all(checks.values()):
            report.matched += 1
        elif report.first_divergence is None:
            report.first_divergence = {
                "record": k, "event": event, "action": ref["action"], "bytes": size,
                "recorded": {"address": int(ref["addr"]), "in_use": int(ref["in_use"])},
                "model": {"address": where, "in_use": in_use},
                "rule": RULES[ref["action"]] if handle is not None else
                "the model refused (OOM: the free total is short) or lost the buffer"}
    report.compactions = model.num_compactions
    report.compaction_moved_bytes = model.compaction_moved_bytes
    return report
