"""Does the ``pytorch`` model make the decisions the real allocator made? (``allocsim fidelity``)

What it is for
    A PyTorch memory snapshot records, next to every allocation and free, the real caching
    allocator's own device calls: ``segment_alloc`` / ``segment_free`` (cudaMalloc/cudaFree of
    a segment), ``segment_map`` / ``segment_unmap`` (expandable segments) and ``oom``. The
    snapshot importer (traces/formats/torch_snapshot.py) keeps them, in file order, in
    ``metadata["reference_events"]``, each with the index of the trace event it comes before.
    :func:`fidelity` replays the trace through :class:`~allocsim.policies.pytorch_caching.
    PyTorchCachingAllocator` configured as the recording was, and compares the device calls
    the model makes with the recorded ones: same action, same size (exactly), in the same
    order, at the same place in the trace; then the segment list at the end.

What it follows
    - Settings: the snapshot's ``allocator_settings`` (torch/csrc/cuda/memory_snapshot.cpp,
      ``_memory_snapshot_pickled``: ``PYTORCH_CUDA_ALLOC_CONF`` (the string as set),
      ``max_split_size`` (bytes; -1 / SIZE_MAX = unlimited), ``garbage_collection_threshold``,
      ``expandable_segments``, ``roundup_power2_divisions`` ({"1": d, "2": d, …, "32768": d},
      keyed by interval lower bound in MiB) and host-side keys (``pinned_*``,
      ``release_lock_on_cudamalloc``, ``graph_capture_record_stream_reuse``) that do not place
      device memory). Keys not modelled are listed in the report; files without settings get
      PyTorch's defaults, said so.
    - Capacity: an ``oom`` entry carries ``device_free`` (cudaMemGetInfo at the failure, after
      the allocator released its cache); the process could have held the bytes it had
      reserved then plus that. Without an oom entry the device is large (1 TiB) and never
      binds, said so; ``capacity=`` overrides.
    - Start state: recording usually starts mid-run. The importer rebuilt the segments at the
      start (``initial_segments``) and added every block live then as a synthetic alloc at
      the start of the trace (the *prologue*). The model is seeded with those segments
      (:meth:`PyTorchCachingAllocator.seed`): the prologue's allocs are the recorded active
      blocks, not new segments, and the inactive blocks are cached free blocks.
    - Addresses: the best fit breaks ties by address, so the model's device hands out the
      recorded address for a segment when the model asks for the segment the recording made
      next (same size, range free); otherwise a fresh address above every recorded one.
    - Streams: the importer numbers streams by first appearance; PyTorch orders a pool by
      the raw ``cudaStream_t`` (stream, size, address), which decides the order segments are
      released in, so the model sees streams numbered in raw-handle order.
    - ``empty_cache()``: it leaves no entry of its own, only a burst of ``segment_free`` /
      ``segment_unmap``. A burst that no failed cudaMalloc explains (no ``oom`` follows it,
      and with a known capacity the next recorded segment would still have fitted) is the
      program calling ``torch.cuda.empty_cache()``: it is replayed as one, at that point.
      Where the capacity is unknown, a burst right before an alloc that then takes a new
      segment may also be that alloc's retry after a failed cudaMalloc; the two release the
      same segments unless max_split_size is set (the retry first frees oversize blocks one
      by one), so there, a burst that is not exactly what empty_cache() would release is
      replayed as a failed cudaMalloc: the device refuses memory until as many segments as
      recorded went back. An empty_cache() that released nothing left no trace at all.
    - A recorded ``oom`` is a request that failed, so it is not in the trace: the model gets
      the same (rounded) request there, is expected to fail it too, and (if it does not) gives
      the block straight back.

Counting: ``total`` = recorded segment and oom entries (``snapshot`` markers are not
decisions and are ignored); ``matched`` = those the model made too, aligned within each point
of the trace (difflib's longest matching blocks), so one divergence does not hide every
later match; ``extra`` = calls the model made that the recording did not. The run passes
(exit status 0) when everything matched, nothing extra was made and the final segments agree.

Limits: blocks live when recording started but freed during it have inferred sizes (the
file records requested sizes only; the importer rounds to 512 B and keeps remainders of at
most 1 MiB), so a seeded start can differ from the real one where a block was larger (an
unsplit remainder next to space freed later, or roundup_power2_divisions); expandable
segments at the start are not seeded; record_stream / cross-stream frees, CUDA graph pools
and a memory fraction (not in the file) are not modelled.

Speed: one pass in a plain loop (no per-event allocation, device calls are rare); a
1,000,000-entry snapshot takes well under 30 s, most of it in the importer (measured on one
core: 1,004,319 entries, 670,000 events — import 6-14 s, fidelity 1.6-3 s). The first
divergence's "model segments then" come from a second, deterministic replay stopped there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

import numpy as np

from allocsim.errors import UserInputError
from allocsim.policies import PolicySpec, format_size, parse_policy, parse_size
from allocsim.policies.pytorch_caching import (
    MiB,
    PyTorchCachingAllocator,
    parse_alloc_conf,
    parse_roundup_power2_divisions,
    round_size,
)
from allocsim.sim.cli.common import add_reading_options, load_trace
from allocsim.sim.kernel.device import (
    ADDRESS_BASE,
    RANGE_ALIGN,
    DeviceProfile,
    ProcessDevice,
    SimulatedDevice,
)
from allocsim.traces.model import OP_ALLOC, Trace

__all__ = [
    "COMPARED_ACTIONS",
    "LARGE_CAPACITY",
    "FidelityError",
    "FidelityReport",
    "RecordedOOM",
    "SnapshotSettings",
    "add_fidelity_parser",
    "fidelity",
    "model_at_recorded_oom",
    "recorded_oom",
    "settings_from_snapshot",
    "simulate_snapshot",
    "snapshot_capacity",
]

GiB = 1 << 30
LARGE_CAPACITY = 1 << 40                 # "a large device": 1 TiB, never binds
COMPARED_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")
GROW_ACTIONS = ("segment_alloc", "segment_map")
RELEASE_ACTIONS = ("segment_free", "segment_unmap")
CALL_ACTION = {"malloc": "segment_alloc", "free": "segment_free", "map": "segment_map",
               "unmap": "segment_unmap"}
CONTEXT_EVENTS = 5                       # trace events shown either side of a divergence
SIZE_MAX = (1 << 64) - 1

# allocator_settings keys that only concern the host (pinned memory) or locking: they do not
# change where device memory goes.
_HOST_KEYS = {"pinned_num_register_threads", "release_lock_on_cudamalloc",
              "release_lock_on_hipmalloc", "pinned_use_cuda_host_register",
              "pinned_use_hip_host_register", "pinned_use_background_threads",
              "pinned_reserve_segment_size_mb", "last_allocator_settings"}


class FidelityError(UserInputError):
    """The input cannot be checked (not a snapshot, settings the model cannot take)."""


# ============================================================================ settings
@dataclass
class SnapshotSettings:
    """The ``pytorch`` policy parameters a snapshot's ``allocator_settings`` stand for."""

    params: dict[str, Any]                 # PyTorchCachingAllocator keyword arguments
    spec: PolicySpec
    recorded: dict[str, Any] | None        # the settings as the file has them
    not_modelled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        return {"policy": str(self.spec), "params": self.params, "recorded": self.recorded,
                "not_modelled": self.not_modelled, "notes": self.notes}


def _divisions_text(value: Any) -> str:
    """``roundup_power2_divisions`` as recorded ({"1": d, …} or a 16-list) → the policy's
    ``[1:d;2:d;…]`` list ('' when every interval is 0)."""
    if isinstance(value, dict):
        items = sorted(((int(k), int(v)) for k, v in value.items()), key=lambda kv: kv[0])
    elif isinstance(value, (list, tuple)):
        items = [(1 << k, int(v)) for k, v in enumerate(value)]
    else:
        raise FidelityError(f"allocator_settings: roundup_power2_divisions is {value!r}, "
                            "expected a dict or a list")
    if not any(v for _, v in items):
        return ""
    values = {v for _, v in items}
    if len(values) == 1 and len(items) == 16:
        text = str(values.pop())
        parse_roundup_power2_divisions(text)
        return text
    text = "[" + ";".join(f"{bound}:{divs}" for bound, divs in items) + "]"
    parse_roundup_power2_divisions(text)   # PyTorch's validation (powers of two)
    return text


def _max_split_mb(value: Any, key: str) -> int:
    """Bytes as recorded → MiB for the policy (0 = unlimited: -1 or SIZE_MAX)."""
    value = int(value)
    if value < 0 or value >= (1 << 62) or value == SIZE_MAX:
        return 0
    if value % MiB:
        raise FidelityError(f"allocator_settings: {key} = {value} is not a whole number of MiB")
    return value // MiB


def settings_from_snapshot(recorded: Any) -> SnapshotSettings:
    """Map a snapshot's ``allocator_settings`` onto the ``pytorch`` policy's parameters.

    The structured keys win; keys only the ``PYTORCH_CUDA_ALLOC_CONF`` string carries
    (``max_non_split_rounding_mb``) are taken from it. Host-side keys are dropped, anything
    else is listed as not modelled. A memory fraction is not recorded in snapshots, so
    ``garbage_collection_threshold`` (which acts only with one) stays inactive; said so.
    """
    params: dict[str, Any] = {}
    not_modelled: list[str] = []
    notes: list[str] = []
    if not isinstance(recorded, dict):
        notes.append("the snapshot records no allocator_settings: PyTorch's defaults assumed")
        return SnapshotSettings(params, parse_policy("pytorch"), None, not_modelled, notes)
    conf = str(recorded.get("PYTORCH_CUDA_ALLOC_CONF") or "").strip()
    if conf:
        try:
            from_conf = parse_alloc_conf(conf)
        except ValueError as err:
            not_modelled.append(f"PYTORCH_CUDA_ALLOC_CONF={conf!r} ({err})")
            from_conf = {}
        for key, value in from_conf.items():
            if key == "max_non_split_rounding_mb":
                params[key] = int(value)
    for key, value in recorded.items():
        if key == "PYTORCH_CUDA_ALLOC_CONF":
            continue
        if key == "max_split_size":
            megabytes = _max_split_mb(value, key)
            if megabytes:
                params["max_split_size_mb"] = megabytes
        elif key in ("max_non_split_rounding_size", "max_non_split_rounding_mb"):
            megabytes = int(value) if key.endswith("_mb") else _max_split_mb(value, key)
            if megabytes:
                params["max_non_split_rounding_mb"] = megabytes
        elif key == "garbage_collection_threshold":
            if float(value) > 0:
                params["garbage_collection_threshold"] = float(value)
                notes.append("garbage_collection_threshold acts only with a memory fraction, "
                             "which snapshots do not record: garbage collection stays off")
        elif key == "expandable_segments":
            if bool(value):
                params["expandable_segments"] = True
        elif key == "roundup_power2_divisions":
            text = _divisions_text(value)
            if text:
                params["roundup_power2_divisions"] = text
        elif key in _HOST_KEYS:
            continue
        elif key == "graph_capture_record_stream_reuse":
            if value:
                not_modelled.append(f"{key}={value} (CUDA graph capture is not modelled)")
        else:
            not_modelled.append(f"{key}={value!r}")
    spec_text = "pytorch" + (":" + ",".join(f"{k}={v}" for k, v in params.items())
                             if params else "")
    try:
        spec = parse_policy(spec_text)
        PyTorchCachingAllocator(SimulatedDevice(DeviceProfile("check", GiB)).view(0), **params)
    except ValueError as err:
        raise FidelityError(f"allocator_settings: the model cannot take them: {err}") from None
    return SnapshotSettings(params, spec, dict(recorded), not_modelled, notes)


def settings_record(params: dict[str, Any]) -> dict[str, Any]:
    """The ``allocator_settings`` PyTorch would write for these ``pytorch`` parameters (the
    inverse of :func:`settings_from_snapshot`; used for simulated snapshots)."""
    split = params.get("max_split_size_mb", 0)
    divisions = parse_roundup_power2_divisions(params.get("roundup_power2_divisions", ""))
    return {"PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": split * MiB if split else -1,
            "garbage_collection_threshold": float(params.get("garbage_collection_threshold", 0)),
            "expandable_segments": bool(params.get("expandable_segments", False)),
            "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {str(1 << k): d for k, d in enumerate(divisions)}}


# ============================================================================ the device
class _AddressedView(ProcessDevice):
    """A process view that logs each successful device call with its address, and marks
    virtual-range requests so the device can tell them from cudaMalloc."""

    device: _RecordedAddressDevice

    def reserve(self, nbytes: int) -> int | None:
        base = super().reserve(nbytes)
        if base is not None and self.device.calls is not None:
            self.device.calls.append(("segment_alloc", base, self._ranges[base]))
        return base

    def release(self, base: int) -> None:
        size = self._ranges[base]
        super().release(base)
        self.device.drop(base)
        self.device.pressure -= 1
        if self.device.calls is not None:
            self.device.calls.append(("segment_free", base, size))

    def address_range(self, nbytes: int) -> int:
        self.device.virtual = True
        try:
            base = super().address_range(nbytes)
        finally:
            self.device.virtual = False
        if self.device.calls is not None:
            self.device.calls.append(("address_range", base, nbytes))
        return base

    def map(self, address: int, nbytes: int) -> bool:
        ok = super().map(address, nbytes)
        if ok and self.device.calls is not None:
            self.device.calls.append(("segment_map", address, nbytes))
        return ok

    def unmap(self, address: int, nbytes: int) -> None:
        super().unmap(address, nbytes)
        self.device.pressure -= 1
        if self.device.calls is not None:
            self.device.calls.append(("segment_unmap", address, nbytes))


class _RecordedAddressDevice(SimulatedDevice):
    """A simulated device that hands out recorded addresses when told what comes next.

    ``hints`` are ``(action, address, size)`` of the recorded segments expected now; a
    cudaMalloc of the same size takes the first such address that overlaps nothing held, a
    new virtual range (expandable segments) starts at the first recorded ``segment_map``.
    Everything else gets a fresh address from ``floor`` up (above every recorded address).
    ``calls`` (when a list) logs ``(action, address, size)`` of every successful call.
    """

    def __init__(self, profile: DeviceProfile, floor: int = ADDRESS_BASE) -> None:
        super().__init__(profile)
        self._next_address = max(self._next_address, floor)
        self.hints: list[tuple[str, int, int]] = []
        self.held: dict[int, int] = {}         # ranges handed out and not released
        self._bases: list[int] = []            # their bases, sorted
        self.virtual = False
        self.calls: list[tuple[str, int, int]] | None = None
        self.pressure = 0           # refuse new memory until this many releases happened

    def _take(self, nbytes: int) -> bool:
        return self.pressure <= 0 and super()._take(nbytes)

    def view(self, process: int = 0) -> ProcessDevice:
        if process not in self.views:
            self.views[process] = _AddressedView(self, process)
        return self.views[process]

    def _address_range(self, nbytes: int) -> int:
        want = "segment_map" if self.virtual else "segment_alloc"
        for k, (action, address, size) in enumerate(self.hints):
            if action != want or (want == "segment_alloc" and size != nbytes):
                continue
            if self._unused(address, nbytes):
                del self.hints[k]
                self._hold(address, nbytes)
                return address
        base = super()._address_range(nbytes)
        self._hold(base, nbytes)
        return base

    def _unused(self, address: int, nbytes: int) -> bool:
        """Does ``[address, address + nbytes)`` overlap no range held?"""
        at = bisect_right(self._bases, address)
        if at and self._bases[at - 1] + self.held[self._bases[at - 1]] > address:
            return False
        return at == len(self._bases) or self._bases[at] >= address + nbytes

    def _hold(self, address: int, nbytes: int) -> None:
        self.held[address] = nbytes
        insort(self._bases, address)

    def drop(self, address: int) -> None:
        if self.held.pop(address, None) is not None:
            del self._bases[bisect_left(self._bases, address)]


def _address_floor(addresses: Iterable[int]) -> int:
    top = max(addresses, default=0)
    return max(ADDRESS_BASE, -(-(top + GiB) // RANGE_ALIGN) * RANGE_ALIGN)


# ============================================================================ the recording
@dataclass
class _Episode:
    """Recorded entries that belong together, before trace event ``event``:
    ``empty_cache`` (an inferred torch.cuda.empty_cache()), ``burst`` (releases right before
    an alloc that then took a new segment: empty_cache() or that alloc's own retry after a
    failed cudaMalloc, decided when the model's state is known), ``oom`` (a failed request
    and its release path) or ``event`` (what trace event ``event`` itself did;
    event == len(trace) means after the last one)."""

    event: int
    kind: str
    entries: list[int]          # indices into the compared reference entries


def _apply_segment(ordinary: dict[int, int], segments: list[list[int]], action: str,
                   address: int, size: int) -> None:
    """Forward-apply one recorded segment entry: cudaMalloc'd segments in ``ordinary``
    (address → size), mapped ranges of expandable segments as ``[address, size, 1]`` in
    ``segments``, joined when they touch (as memory_snapshot() reports them)."""
    if action == "segment_alloc":
        ordinary[address] = size
    elif action == "segment_free":
        ordinary.pop(address, None)
    elif action == "segment_map":
        end = address + size
        for seg in segments:
            if seg[2] and seg[0] + seg[1] == address:
                seg[1] += size
                address = seg[0]
                break
        else:
            segments.append([address, size, 1])
        for k, seg in enumerate(segments):
            if seg[2] and seg[0] == end:
                owner = next(s for s in segments if s[2] and s[0] == address)
                owner[1] += seg[1]
                del segments[k]
                break
    elif action == "segment_unmap":
        end = address + size
        for k, seg in enumerate(segments):
            if seg[2] and seg[0] <= address and end <= seg[0] + seg[1]:
                seg_end = seg[0] + seg[1]
                del segments[k]
                if seg[0] < address:
                    segments.append([seg[0], address - seg[0], 1])
                if end < seg_end:
                    segments.append([end, seg_end - end, 1])
                return


def _episodes(refs: list[dict[str, Any]], ops: list[int], initial_reserved: int,
              capacity: int | None) -> tuple[list[_Episode], list[int]]:
    """Split the recorded entries into episodes (see :class:`_Episode`), and the recorded
    reserved bytes before each entry."""
    reserved_before: list[int] = []
    reserved = initial_reserved
    for ref in refs:
        reserved_before.append(reserved)
        if ref["action"] in GROW_ACTIONS:
            reserved += ref["size"]
        elif ref["action"] in RELEASE_ACTIONS:
            reserved -= ref["size"]
    episodes: list[_Episode] = []
    n = len(ops)
    k = 0
    while k < len(refs):
        event = refs[k]["event"]
        group = []
        while k < len(refs) and refs[k]["event"] == event:
            group.append(k)
            k += 1
        # Everything up to an oom entry is that failed request's release path.
        start = 0
        for position, index in enumerate(group):
            if refs[index]["action"] == "oom":
                episodes.append(_Episode(event, "oom", group[start:position + 1]))
                start = position + 1
        tail = group[start:]
        burst = 0
        while burst < len(tail) and refs[tail[burst]]["action"] in RELEASE_ACTIONS:
            burst += 1
        is_alloc = event < n and ops[event] == OP_ALLOC
        if burst and is_alloc and burst < len(tail) and capacity is not None:
            grow = refs[tail[burst]]
            # A failed cudaMalloc explains the burst (the alloc's own retry path) when the
            # segment would not have fitted next to what was reserved before the burst.
            if grow["action"] in GROW_ACTIONS and \
                    reserved_before[tail[0]] + grow["size"] > capacity:
                burst = 0
        if burst:
            ambiguous = is_alloc and burst < len(tail) and \
                refs[tail[burst]]["action"] in GROW_ACTIONS
            episodes.append(_Episode(event, "burst" if ambiguous else "empty_cache",
                                     tail[:burst]))
        if tail[burst:]:
            episodes.append(_Episode(event, "event", tail[burst:]))
    return episodes, reserved_before


# ============================================================================ the report
@dataclass
class FidelityReport:
    """How far the model's device calls follow the recorded ones (see the module docstring)."""

    trace: str
    source: str
    events: int
    policy: str
    settings: dict[str, Any]
    not_modelled: list[str]
    capacity: int
    capacity_source: str
    matched: int
    total: int
    extra: int
    by_action: dict[str, dict[str, int]]
    first_divergence: dict[str, Any] | None
    final_segments_match: bool
    final_segments: dict[str, Any]
    empty_cache_calls: int
    injected_ooms: int
    seeded_segments: int
    seeded_blocks: int
    notes: list[str]
    elapsed_s: float = 0.0

    @property
    def all_matched(self) -> bool:
        return self.matched == self.total and self.extra == 0

    @property
    def exit_status(self) -> int:
        """0 when every recorded call matched, none was extra and the final segments agree."""
        return 0 if self.all_matched and self.final_segments_match else 1

    def to_json_dict(self) -> dict[str, Any]:
        return {"schema": 1, "trace": self.trace, "source": self.source, "events": self.events,
                "policy": self.policy, "settings": self.settings,
                "not_modelled": self.not_modelled, "capacity": self.capacity,
                "capacity_source": self.capacity_source, "matched": self.matched,
                "total": self.total, "extra": self.extra, "by_action": self.by_action,
                "all_matched": self.all_matched, "first_divergence": self.first_divergence,
                "final_segments_match": self.final_segments_match,
                "final_segments": self.final_segments,
                "empty_cache_calls": self.empty_cache_calls,
                "injected_ooms": self.injected_ooms, "seeded_segments": self.seeded_segments,
                "seeded_blocks": self.seeded_blocks, "notes": self.notes,
                "exit_status": self.exit_status}

    def text(self) -> str:
        """One screen."""
        share = f"{self.matched / self.total:.1%}" if self.total else "nothing recorded"
        actions = ", ".join(f"{a} {c['matched']}/{c['recorded']}"
                            for a, c in self.by_action.items() if c["recorded"] or c["matched"])
        lines = [f"fidelity of {self.policy} on {self.trace} ({self.events:,} events)",
                 f"  device      {format_size(self.capacity)} — {self.capacity_source}"]
        if self.not_modelled:
            lines.append("  not modelled: " + "; ".join(self.not_modelled))
        if self.seeded_segments:
            lines.append(f"  start       {self.seeded_segments} recorded segments seeded, "
                         f"{self.seeded_blocks} blocks live in them")
        lines.append(f"  matched     {self.matched:,}/{self.total:,} recorded device calls "
                     f"({share}){': ' + actions if actions else ''}")
        lines.append(f"  extra       {self.extra:,} simulated calls the recording did not make")
        if self.empty_cache_calls or self.injected_ooms:
            lines.append(f"  replayed    {self.empty_cache_calls} inferred empty_cache() calls, "
                         f"{self.injected_ooms} recorded OOM requests")
        final = self.final_segments
        lines.append(f"  final       {'match' if self.final_segments_match else 'DIFFER'}: "
                     f"recorded {final['recorded_count']} segments "
                     f"({format_size(final['recorded_bytes'])}), model {final['model_count']} "
                     f"({format_size(final['model_bytes'])})")
        if not self.final_segments_match:
            lines.append(f"              only recorded: {_sizes_text(final['only_recorded'])}; "
                         f"only model: {_sizes_text(final['only_model'])}")
        for note in self.notes:
            lines.append(f"  note        {note}")
        d = self.first_divergence
        if d is None:
            lines.append("result: every recorded decision reproduced (exit 0)"
                         if self.exit_status == 0 else "result: the final segments differ (exit 1)")
            return "\n".join(lines)
        lines.append(f"result: DIVERGES (exit 1); first divergence before trace event "
                     f"{d['event']:,} ({d['where']}), recorded entry #{d['index']}:")
        lines.append(f"  recorded    {_call_text(d['recorded'])}   [here: "
                     f"{_list_text(d['recorded_here'])}]")
        lines.append(f"  simulated   {_call_text(d['simulated'])}   [here: "
                     f"{_list_text(d['simulated_here'])}]")
        lines.append(f"  reserved    recorded {format_size(d['recorded_reserved'])}, model "
                     f"{format_size(d['model_reserved'])} (before this point)")
        lines.append("  trace around it:")
        for e in d["trace_events"]:
            mark = ">" if e["index"] == d["event"] else " "
            lines.append(f"   {mark}{e['index']:>9,} {e['op']:5s} id {e['id']:<8} "
                         f"{format_size(e['size']):>10s}  stream {e['stream']}  {e['tag'] or ''}")
        lines.append("  model segments then: " + segments_text(d["model_segments"]))
        return "\n".join(lines)


def segments_text(segments: list[dict[str, Any]]) -> str:
    """One line for a :func:`segment_summary` list: counts by pool and size, free space."""
    if not segments:
        return "none"
    total = sum(s["total_size"] for s in segments)
    free = sum(s["total_size"] - s["allocated_size"] for s in segments)
    largest = max(s["largest_free"] for s in segments)
    kinds = Counter((s["segment_type"], s["total_size"]) for s in segments)
    shown = ", ".join(f"{n}×{format_size(size, 0)} {kind}" for (kind, size), n in
                      sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))[:5])
    more = " …" if len(kinds) > 5 else ""
    return (f"{len(segments)} ({format_size(total)}; {format_size(free)} free inside, largest "
            f"free block {format_size(largest)}): {shown}{more}")


def _call_text(call: dict[str, Any] | None) -> str:
    if call is None:
        return "nothing"
    return f"{call['action']} {format_size(call['size'])}"


def _list_text(calls: list[list[Any]]) -> str:
    if not calls:
        return "none"
    shown = ", ".join(f"{a} {format_size(s, 0)}" for a, s in calls[:4])
    return shown + (f", … ({len(calls)})" if len(calls) > 4 else "")


def _sizes_text(sizes: list[int]) -> str:
    if not sizes:
        return "none"
    counts = Counter(sizes)
    return ", ".join(f"{n}×{format_size(s, 0)}" for s, n in sorted(counts.items())[:6])


# ============================================================================ the replay
def stream_ranks(trace: Trace) -> dict[int, int]:
    """Small stream id → rank of its raw ``cudaStream_t`` handle. The importer numbers
    streams by first appearance, but PyTorch orders a pool by the raw handle (stream, size,
    address) — which is what decides the order empty_cache() and the OOM path release
    segments in — so the model gets streams numbered in raw-handle order."""
    handles: dict[int, int] = {}
    for small, raw in (trace.metadata.get("stream_handles") or {}).items():
        try:
            handles[int(small)] = int(raw)
        except (TypeError, ValueError):
            continue
    for small in trace.streams():
        handles.setdefault(small, small)
    order = sorted(handles, key=lambda small: (handles[small], small))
    return {small: rank for rank, small in enumerate(order)}


class _Replay:
    """One replay of a snapshot trace through the seeded model, comparing as it goes."""

    def __init__(self, trace: Trace, settings: SnapshotSettings, capacity: int,
                 refs: list[dict[str, Any]], episodes: list[_Episode]) -> None:
        meta = trace.metadata
        self.trace = trace
        self.refs = refs
        self.episodes = episodes
        self.ranks = stream_ranks(trace)
        initial = [dict(s, stream=self.ranks.get(int(s.get("stream", 0)), int(s.get("stream", 0))))
                   for s in meta.get("initial_segments") or []]
        floor = _address_floor([int(s["address"]) + int(s["total_size"]) for s in initial]
                               + [int(r.get("addr") or 0) + int(r["size"]) for r in refs])
        profile = DeviceProfile("snapshot", capacity, granularity=512)
        self.device = _RecordedAddressDevice(profile, floor)
        self.view = self.device.view(0)
        self.policy: PyTorchCachingAllocator = settings.spec.build(self.view)  # type: ignore
        self.notes: list[str] = []
        self.seeded_segments = 0
        self.seeded_blocks = 0
        self.prologue_map = self._seed(initial, int(meta.get("prologue_events") or 0))
        self.view.log = []
        self.device.hints = []
        # Results.
        self.matched = 0
        self.extra = 0
        self.matched_by_action: Counter = Counter()
        self.empty_cache_calls = 0
        self.injected_ooms = 0
        self.divergence: dict[str, Any] | None = None
        self.divergence_at: tuple[int, int | None] | None = None

    # -- the start state ------------------------------------------------------------
    def _seed(self, initial: list[dict[str, Any]], prologue: int) -> dict[int, int]:
        """Seed the model with the recorded start segments; map prologue event index →
        the model's address of its block."""
        seedable = [s for s in initial if not s.get("is_expandable")]
        if len(seedable) < len(initial):
            self.notes.append(f"{len(initial) - len(seedable)} expandable segments at the start "
                              "are not seeded (not modelled): their live blocks are allocated "
                              "afresh")
        if self.policy.expandable and seedable:
            self.notes.append("the model uses expandable segments but the recording started "
                              "with ordinary segments: not seeded, their live blocks are "
                              "allocated afresh")
            seedable = []
        self.device.hints = [("segment_alloc", int(s["address"]), int(s["total_size"]))
                             for s in sorted(seedable, key=lambda s: int(s["address"]))]
        try:
            mapping = self.policy.seed(seedable) if seedable else {}
        except ValueError as err:
            raise FidelityError(f"cannot start from the recorded segments: {err}") from None
        self.seeded_segments = len(seedable)
        self.seeded_blocks = len(mapping)
        blocks = sorted(mapping)
        requested = {}
        for seg in seedable:
            for block in seg.get("blocks") or []:
                if str(block.get("state", "")).startswith("active"):
                    requested[int(block["address"])] = (int(block.get("requested_size") or 0)
                                                        or int(block["size"]))
        sizes = self.trace.size[:prologue].tolist()
        result: dict[int, int] = {}
        q = 0
        for p in range(prologue):
            if q < len(blocks) and requested[blocks[q]] == sizes[p]:
                result[p] = mapping[blocks[q]]
                q += 1
        unmatched = prologue - len(result)
        if unmatched:
            self.notes.append(f"{unmatched} blocks live at the start lie in no seeded segment: "
                              "allocated afresh")
        return result

    # -- running ----------------------------------------------------------------------
    def run(self, stop: tuple[int, int | None] | None = None) -> None:
        """Replay to the end, or stop just before ``(event, episode index)`` (episode None:
        before trace event ``event`` itself)."""
        trace = self.trace
        ops = trace.op.tolist()
        ids = trace.id.tolist()
        sizes = trace.size.tolist()
        ranks = self.ranks
        streams = [ranks[s] for s in trace.stream.tolist()] if any(
            small != rank for small, rank in ranks.items()) else trace.stream.tolist()
        n = len(ops)
        episodes = self.episodes
        policy, view, device = self.policy, self.view, self.device
        malloc, free = policy.malloc, policy.free
        prologue = self.prologue_map
        live: dict[int, int] = {}
        k = 0
        next_episode = episodes[0].event if episodes else n + 1
        calls = view.calls
        for i in range(n + 1):
            expected: list[int] | None = None
            if i == next_episode:
                expected = []
                while k < len(episodes) and episodes[k].event == i:
                    episode = episodes[k]
                    if episode.kind == "event":
                        expected += episode.entries
                        k += 1
                        break
                    if stop == (i, k):
                        return
                    if episode.kind == "burst" and self._retry_path(episode):
                        # The alloc's own retry after a failed cudaMalloc: the device refuses
                        # new memory until as many segments went back as the recording shows.
                        device.pressure = len(episode.entries)
                        expected += episode.entries
                    else:
                        self._pre_episode(episode, streams)
                    k += 1
                next_episode = episodes[k].event if k < len(episodes) else n + 1
                calls = view.calls
                if not expected:
                    expected = None
            if stop is not None and stop == (i, None):
                return
            if i == n:
                if expected is not None:
                    self._compare(expected, [], i, "end")
                break
            if expected is not None:
                device.hints = [(self.refs[j]["action"], self.refs[j]["addr"] or 0,
                                 self.refs[j]["size"]) for j in expected
                                if self.refs[j]["action"] in GROW_ACTIONS]
            failed = 0
            if ops[i] == OP_ALLOC:
                if i in prologue:
                    live[ids[i]] = prologue[i]
                else:
                    size = sizes[i]
                    if size > 0:
                        address = malloc(size, streams[i])
                        if address is None:
                            failed = size
                        else:
                            live[ids[i]] = address
            else:
                address = live.pop(ids[i], None)
                if address is not None:
                    free(address)
            if view.calls != calls or failed or expected is not None:
                made = view.calls - calls
                calls = view.calls
                simulated = self._simulated(made, failed, streams[i])
                self._compare(expected or [], simulated, i,
                              "alloc" if ops[i] == OP_ALLOC else "free")
                device.hints = []
                device.pressure = 0

    def _retry_path(self, episode: _Episode) -> bool:
        """Is a ``burst`` the alloc's retry path rather than an empty_cache()? Only where
        they differ: max_split_size set (the retry first frees oversize blocks one by one)
        and the burst is not exactly what empty_cache() would release now (every unsplit
        free segment, large pool first, then by stream, size and address)."""
        policy = self.policy
        if policy.expandable or policy.max_split_size >= (1 << 62):
            return False
        unsplit = sorted((seg["segment_type"] == "small", seg["stream"], seg["total_size"],
                          seg["address"]) for seg in policy.segments()
                         if len(seg["blocks"]) == 1 and seg["blocks"][0]["state"] == "inactive")
        recorded = [self.refs[j]["size"] for j in episode.entries]
        return recorded != [size for _, _, size, _ in unsplit]

    def _pre_episode(self, episode: _Episode, streams: list[int]) -> None:
        """Replay an inferred empty_cache() or a recorded failed request."""
        view = self.view
        before = view.calls
        if episode.kind in ("empty_cache", "burst"):
            self.empty_cache_calls += 1
            self.policy.empty_cache()
            self._compare(episode.entries, self._simulated(view.calls - before, 0, 0),
                          episode.event, "empty_cache()")
            return
        oom = self.refs[episode.entries[-1]]
        self.injected_ooms += 1
        self.device.hints = [(self.refs[j]["action"], self.refs[j]["addr"] or 0,
                              self.refs[j]["size"]) for j in episode.entries
                             if self.refs[j]["action"] in GROW_ACTIONS]
        size = max(1, int(oom["size"]))
        stream = int(oom.get("stream") or 0)
        address = self.policy.malloc(size, self.ranks.get(stream, stream))
        simulated = self._simulated(view.calls - before, size if address is None else 0, 0)
        if address is not None:
            self.policy.free(address)      # the program never got it
        self.device.hints = []
        self._compare(episode.entries, simulated, episode.event, "recorded OOM request")

    def _simulated(self, made: int, failed: int, stream: int) -> list[tuple[str, int]]:
        """The last ``made`` device calls (failed ones are not recorded by PyTorch either),
        plus an oom for a failed request of ``failed`` bytes."""
        log = self.view.log
        calls = [(CALL_ACTION[c.kind], c.nbytes) for c in log[len(log) - made:] if c.ok] \
            if made else []
        if failed:
            calls.append(("oom", round_size(failed, self.policy._divisions)))
        if len(log) > 4096:
            del log[:]
        return calls

    def _compare(self, entries: list[int], simulated: list[tuple[str, int]], event: int,
                 where: str) -> None:
        refs = self.refs
        recorded = [(refs[j]["action"], refs[j]["size"]) for j in entries]
        if recorded == simulated:
            self.matched += len(recorded)
            for action, _ in recorded:
                self.matched_by_action[action] += 1
            return
        matcher = SequenceMatcher(None, recorded, simulated, autojunk=False)
        same = 0
        for block in matcher.get_matching_blocks():
            same += block.size
            for action, _ in recorded[block.a:block.a + block.size]:
                self.matched_by_action[action] += 1
        self.matched += same
        self.extra += len(simulated) - same
        if self.divergence is not None:
            return
        position = next(p for p in range(max(len(recorded), len(simulated)))
                        if p >= len(recorded) or p >= len(simulated)
                        or recorded[p] != simulated[p])
        if position < len(entries):
            index = entries[position]
        else:
            index = entries[-1] + 1 if entries else self._next_ref(event)
        ref = refs[index] if position < len(entries) else None
        self.divergence = {
            "index": index, "event": event, "where": where,
            "recorded": None if ref is None else {
                "action": ref["action"], "size": ref["size"], "addr": ref.get("addr"),
                "stream": ref.get("stream"), "time_ns": ref.get("time_ns"),
                **({"device_free": ref.get("device_free")} if ref["action"] == "oom" else {})},
            "simulated": None if position >= len(simulated) else {
                "action": simulated[position][0], "size": simulated[position][1]},
            "episode_start": entries[0] if entries else index,
            "recorded_here": [list(r) for r in recorded],
            "simulated_here": [list(s) for s in simulated],
        }
        episode = next((k for k, e in enumerate(self.episodes)
                        if e.event == event and e.entries == entries and e.kind != "event"),
                       None)
        self.divergence_at = (event, episode)

    def _next_ref(self, event: int) -> int:
        """Index of the first recorded entry at or after trace event ``event``."""
        return next((j for j, r in enumerate(self.refs) if r["event"] >= event), len(self.refs))


def segment_summary(policy: PyTorchCachingAllocator) -> list[dict[str, Any]]:
    """Per model segment: address, size, pool, stream, allocated bytes, block counts and
    its largest free block."""
    out = []
    for seg in policy.segments():
        free = [b["size"] for b in seg["blocks"] if b["state"] == "inactive"]
        out.append({"address": seg["address"], "total_size": seg["total_size"],
                    "segment_type": seg["segment_type"], "stream": seg["stream"],
                    "allocated_size": seg["allocated_size"], "blocks": len(seg["blocks"]),
                    "free_blocks": len(free), "largest_free": max(free, default=0)})
    return out


def _trace_context(trace: Trace, event: int) -> list[dict[str, Any]]:
    lo, hi = max(0, event - CONTEXT_EVENTS), min(len(trace), event + CONTEXT_EVENTS + 1)
    rows = []
    for i in range(lo, hi):
        rows.append({"index": i, "op": "alloc" if trace.op[i] == OP_ALLOC else "free",
                     "id": int(trace.id[i]), "size": int(trace.size[i]),
                     "stream": int(trace.stream[i]), "time_ns": int(trace.time_ns[i]),
                     "tag": trace.tag_name(int(trace.tag[i]))})
    return rows


# ============================================================================ entry point
def snapshot_capacity(trace: Trace, refs: list[dict[str, Any]] | None = None
                      ) -> tuple[int | None, str, int | None]:
    """``(capacity, where it comes from, index of the oom entry used)`` for a snapshot trace:
    reserved bytes at the first oom entry + its device_free, else (None, why, None)."""
    meta = trace.metadata
    refs = refs if refs is not None else [r for r in meta.get("reference_events") or []
                                          if r.get("action") in COMPARED_ACTIONS]
    reserved = sum(int(s["total_size"]) for s in meta.get("initial_segments") or [])
    for index, ref in enumerate(refs):
        if ref["action"] == "oom" and ref.get("device_free") is not None:
            capacity = reserved + int(ref["device_free"])
            return capacity, (f"reserved {format_size(reserved)} + device_free "
                              f"{format_size(int(ref['device_free']))} at the recorded oom "
                              f"(entry #{index})"), index
        if ref["action"] in GROW_ACTIONS:
            reserved += int(ref["size"])
        elif ref["action"] in RELEASE_ACTIONS:
            reserved -= int(ref["size"])
    return None, "no oom entry: a large device (1 TiB) that never binds", None


def check_snapshot_trace(trace: Trace) -> None:
    """Refuse traces that carry no recorded allocator decisions (one line)."""
    meta = trace.metadata
    if meta.get("format") != "torch-snapshot" or "reference_events" not in meta:
        raise FidelityError(f"{trace.name}: not a PyTorch memory snapshot (no recorded "
                            "allocator decisions to compare with); fidelity reads the "
                            "pickle written by torch.cuda.memory._dump_snapshot")
    if len(trace.processes()) > 1:
        raise FidelityError(f"{trace.name}: a snapshot trace has one process")


def fidelity(trace: Trace, *, capacity: int | None = None) -> FidelityReport:
    """Replay a snapshot trace through the ``pytorch`` model as recorded; compare (see the
    module docstring). ``capacity`` overrides the one taken from the recording."""
    started = time.perf_counter()
    check_snapshot_trace(trace)
    meta = trace.metadata
    settings = settings_from_snapshot(meta.get("allocator_settings"))
    all_refs = meta.get("reference_events") or []
    refs = [r for r in all_refs if r.get("action") in COMPARED_ACTIONS]
    markers = len(all_refs) - len(refs)
    recorded_capacity, capacity_source, _ = snapshot_capacity(trace, refs)
    known = recorded_capacity
    if capacity is not None:
        capacity_source = "given" + (f" (the recording implies {format_size(recorded_capacity)})"
                                     if recorded_capacity is not None else "")
        known = capacity
    chosen = known if known is not None else LARGE_CAPACITY
    initial = meta.get("initial_segments") or []
    initial_reserved = sum(int(s["total_size"]) for s in initial)
    episodes, reserved_before = _episodes(refs, trace.op.tolist(), initial_reserved, known)
    replay = _Replay(trace, settings, chosen, refs, episodes)
    replay.run()

    notes = list(settings.notes) + replay.notes
    if markers:
        notes.append(f"{markers} 'snapshot' markers in the recording are not decisions: "
                     "ignored")
    if meta.get("inconsistencies"):
        notes.append("the importer found inconsistencies: " + ", ".join(
            f"{k} {v}" for k, v in meta["inconsistencies"].items()))
    if meta.get("initial_block_sizes_inferred"):
        notes.append(f"{meta['initial_block_sizes_inferred']} start blocks have inferred sizes")
    if len(trace.streams()) > 1:
        notes.append("record_stream / cross-stream frees are not modelled (each free "
                     "completes at once)")

    divergence = replay.divergence
    if divergence is not None:
        event, episode = replay.divergence_at or (divergence["event"], None)
        again = _Replay(trace, settings, chosen, refs, episodes)
        again.run(stop=(event, episode))
        divergence["model_segments"] = segment_summary(again.policy)
        divergence["model_reserved"] = again.view.reserved
        start = divergence.pop("episode_start")
        divergence["recorded_reserved"] = (reserved_before[start] if start < len(refs)
                                           else _final_reserved(initial_reserved, refs))
        divergence["trace_events"] = _trace_context(trace, min(event, len(trace) - 1)) \
            if len(trace) else []

    final = _final_comparison(initial, refs, replay.policy)
    by_action = {action: {"recorded": 0, "matched": 0} for action in COMPARED_ACTIONS}
    for ref in refs:
        by_action[ref["action"]]["recorded"] += 1
    for action, count in replay.matched_by_action.items():
        by_action[action]["matched"] = count
    return FidelityReport(
        trace=trace.name, source=str(meta.get("source", "")), events=len(trace),
        policy=str(settings.spec), settings=settings.to_json_dict(),
        not_modelled=settings.not_modelled, capacity=chosen, capacity_source=capacity_source,
        matched=replay.matched, total=len(refs), extra=replay.extra, by_action=by_action,
        first_divergence=divergence, final_segments_match=final["match"],
        final_segments=final, empty_cache_calls=replay.empty_cache_calls,
        injected_ooms=replay.injected_ooms, seeded_segments=replay.seeded_segments,
        seeded_blocks=replay.seeded_blocks, notes=notes,
        elapsed_s=time.perf_counter() - started)


def _final_reserved(initial_reserved: int, refs: list[dict[str, Any]]) -> int:
    reserved = initial_reserved
    for ref in refs:
        if ref["action"] in GROW_ACTIONS:
            reserved += ref["size"]
        elif ref["action"] in RELEASE_ACTIONS:
            reserved -= ref["size"]
    return reserved


def _final_comparison(initial: list[dict[str, Any]], refs: list[dict[str, Any]],
                      policy: PyTorchCachingAllocator) -> dict[str, Any]:
    """The recording's final segments (the start segments with every recorded segment entry
    applied: the importer derived the start by undoing them from the file's final list)
    against the model's, by count and sizes."""
    ordinary = {int(s["address"]): int(s["total_size"]) for s in initial
                if not s.get("is_expandable")}
    segments = [[int(s["address"]), int(s["total_size"]), 1] for s in initial
                if s.get("is_expandable")]
    for ref in refs:
        if ref["action"] in GROW_ACTIONS + RELEASE_ACTIONS:
            _apply_segment(ordinary, segments, ref["action"], int(ref.get("addr") or 0),
                           int(ref["size"]))
    recorded = sorted([s[1] for s in segments] + list(ordinary.values()))
    model = sorted(s["total_size"] for s in policy.segments())
    only_recorded = list((Counter(recorded) - Counter(model)).elements())
    only_model = list((Counter(model) - Counter(recorded)).elements())
    return {"match": recorded == model, "recorded_count": len(recorded),
            "model_count": len(model), "recorded_bytes": sum(recorded),
            "model_bytes": sum(model), "only_recorded": sorted(only_recorded),
            "only_model": sorted(only_model)}


# ============================================================================ the recorded OOM
@dataclass
class RecordedOOM:
    """The first ``oom`` entry of a snapshot: the request that failed and where."""

    index: int                  # among the compared reference entries
    event: int                  # the trace event it comes before
    request: int                # rounded bytes (PyTorch records the rounded size)
    stream: int
    device_free: int
    recorded_reserved: int      # what the process held then (after its release path)
    capacity: int
    capacity_source: str
    time_ns: int | None
    settings: SnapshotSettings


def recorded_oom(trace: Trace) -> RecordedOOM | None:
    """The snapshot's first recorded OOM, or None when it has none."""
    check_snapshot_trace(trace)
    meta = trace.metadata
    refs = [r for r in meta.get("reference_events") or [] if r.get("action") in COMPARED_ACTIONS]
    capacity, source, index = snapshot_capacity(trace, refs)
    if index is None or capacity is None:
        return None
    ref = refs[index]
    return RecordedOOM(index=index, event=int(ref["event"]), request=int(ref["size"]),
                       stream=int(ref.get("stream") or 0),
                       device_free=int(ref.get("device_free") or 0),
                       recorded_reserved=capacity - int(ref.get("device_free") or 0),
                       capacity=capacity, capacity_source=source, time_ns=ref.get("time_ns"),
                       settings=settings_from_snapshot(meta.get("allocator_settings")))


def model_at_recorded_oom(trace: Trace, oom: RecordedOOM
                          ) -> tuple[PyTorchCachingAllocator, ProcessDevice, list[str], int]:
    """The seeded model replayed as :func:`fidelity` does, stopped just before the recorded
    failed request (its release path not yet run): ``(policy, device view, notes, the
    request's stream as the model numbers it)``."""
    meta = trace.metadata
    refs = [r for r in meta.get("reference_events") or [] if r.get("action") in COMPARED_ACTIONS]
    initial_reserved = sum(int(s["total_size"]) for s in meta.get("initial_segments") or [])
    episodes, _ = _episodes(refs, trace.op.tolist(), initial_reserved, oom.capacity)
    at = next(k for k, e in enumerate(episodes) if e.kind == "oom" and e.entries[-1] == oom.index)
    replay = _Replay(trace, oom.settings, oom.capacity, refs, episodes)
    replay.run(stop=(oom.event, at))
    return replay.policy, replay.view, replay.notes, replay.ranks.get(oom.stream, oom.stream)


# ============================================================================ simulated snapshots
def simulate_snapshot(trace: Trace, policy: str | PolicySpec = "pytorch",
                      profile: DeviceProfile | None = None, *,
                      empty_cache_before: Iterable[int] = ()) -> dict[str, Any]:
    """A PyTorch snapshot dict of ``trace`` as the ``pytorch`` model runs it: the model's
    addresses, its device calls as segment entries, ``oom`` entries for requests it failed
    (dropped from the exported trace, as PyTorch records no alloc for them), final segments
    from :meth:`PyTorchCachingAllocator.segments` and matching ``allocator_settings``.
    ``empty_cache_before`` calls empty_cache() before those event indices (len(trace): at
    the end). Importing it and running :func:`fidelity` must match 100%: the round trip."""
    from allocsim.traces.formats.torch_snapshot import snapshot_of_run

    spec = parse_policy(policy)
    if spec.name != "pytorch":
        raise FidelityError(f"simulate_snapshot models PyTorch's allocator, not {spec.name!r}")
    profile = profile or DeviceProfile("simulated", LARGE_CAPACITY, granularity=512)
    device = _RecordedAddressDevice(profile)
    model: PyTorchCachingAllocator = spec.build(device.view(0))  # type: ignore[assignment]
    device.calls = []
    ops, ids = trace.op.tolist(), trace.id.tolist()
    sizes, streams = trace.size.tolist(), trace.stream.tolist()
    n = len(ops)
    keep = np.ones(n, dtype=bool)
    addresses: dict[int, int] = {}
    events: list[dict[str, Any]] = []
    live: dict[int, int] = {}
    dropped: set[int] = set()
    segment_stream: dict[int, int] = {}         # cudaMalloc'd segment -> its stream
    range_bases: list[int] = []                 # virtual ranges (expandable segments)
    range_info: dict[int, tuple[int, int]] = {}  # base -> (size, stream)
    empties = set(int(i) for i in empty_cache_before)
    kept = 0

    def stream_of(action: str, address: int, stream: int) -> int:
        if action in ("segment_alloc", "segment_free"):
            return segment_stream.setdefault(address, stream)
        at = bisect_right(range_bases, address) - 1
        if at >= 0 and address < range_bases[at] + range_info[range_bases[at]][0]:
            return range_info[range_bases[at]][1]
        return stream

    def flush(stream: int) -> None:
        for action, address, size in device.calls:
            if action == "address_range":
                insort(range_bases, address)
                range_info[address] = (size, stream)
                continue
            events.append({"action": action, "addr": address, "size": size,
                           "stream": stream_of(action, address, stream), "event": kept})
        del device.calls[:]

    for i in range(n + 1):
        if i in empties:
            model.empty_cache()
            flush(0)
        if i == n:
            break
        if ops[i] == OP_ALLOC:
            if sizes[i] <= 0:
                keep[i] = False
                dropped.add(ids[i])
                continue
            address = model.malloc(sizes[i], streams[i])
            flush(streams[i])
            if address is None:
                keep[i] = False
                dropped.add(ids[i])
                events.append({"action": "oom", "addr": 0, "stream": streams[i],
                               "size": round_size(sizes[i], model._divisions),
                               "device_free": device.capacity - device.used, "event": kept})
                continue
            live[ids[i]] = address
            addresses[kept] = address
        else:
            if ids[i] in dropped:
                dropped.discard(ids[i])
                keep[i] = False
                continue
            model.free(live.pop(ids[i]))
            flush(streams[i])
        kept += 1
    exported = trace if keep.all() else trace.select(keep)
    snapshot = snapshot_of_run(exported, addresses, events)
    handles = {}
    for small, raw in (trace.metadata.get("stream_handles") or {}).items():
        try:
            handles[int(small)] = int(raw)
        except (TypeError, ValueError):
            continue
    snapshot["segments"] = [_snapshot_segment(seg, handles) for seg in model.segments()]
    snapshot["allocator_settings"] = settings_record(dict(spec.params))
    return snapshot


def _snapshot_segment(seg: dict[str, Any], handles: dict[int, int]) -> dict[str, Any]:
    blocks = [{"address": b["address"], "size": b["size"], "requested_size": b["requested_size"],
               "state": b["state"], "frames": []} for b in seg["blocks"]]
    return {"device": 0, "address": seg["address"], "total_size": seg["total_size"],
            "allocated_size": seg["allocated_size"], "active_size": seg["active_size"],
            "requested_size": seg["requested_size"],
            "stream": handles.get(seg["stream"], seg["stream"]),
            "segment_type": seg["segment_type"], "segment_pool_id": [0, 0],
            "is_expandable": seg["is_expandable"], "frames": [], "blocks": blocks}


# ============================================================================ the command
def cmd_fidelity(args: argparse.Namespace) -> int:
    """``allocsim fidelity SNAPSHOT``: exit 0 when everything matched, 1 on divergence."""
    trace = load_trace(args.snapshot, args)
    capacity = parse_size(args.capacity) if args.capacity else None
    report = fidelity(trace, capacity=capacity)
    if args.json:
        json.dump(report.to_json_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(report.text())
    return report.exit_status


def add_fidelity_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``fidelity`` to ``allocsim``'s subcommands (sets ``func``)."""
    p = subparsers.add_parser(
        "fidelity", help="replay a PyTorch snapshot through the pytorch model and compare "
                         "its device calls with the recorded ones",
        description="Replays a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) "
                    "through the pytorch model configured as recorded and compares the "
                    "device calls: exit 0 when all match, 1 on divergence.")
    p.add_argument("snapshot", help="snapshot pickle")
    p.add_argument("--capacity", help="device capacity (default: from the recorded oom's "
                                      "device_free, else a large device)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_reading_options(p)
    p.set_defaults(func=cmd_fidelity)
    return p

