"""What a PyTorch snapshot trace recorded of the real allocator's decisions, read for fidelity.

The snapshot importer (:mod:`allocsim.traces.formats.torch_snapshot`) keeps the real
allocator's device calls in ``metadata["reference_events"]``, in file order, each with the
index of the trace event it comes before. This module reads them: which entries are compared
(:data:`COMPARED_ACTIONS`), the capacity the recording implies (:func:`snapshot_capacity`),
the recorded entries grouped into episodes that the replay handles as one
(:class:`Episode`, :func:`episodes`), the recording's segments at the end
(:func:`recorded_final_sizes`) and where the expandable segments live at the start begin
(:func:`expandable_range_bases`). The whole method is in
:mod:`allocsim.sim.questions.fidelity.pytorch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from allocsim.errors import UserInputError
from allocsim.policies import format_size
from allocsim.policies.pytorch.settings import K_LARGE_BUFFER, K_SMALL_BUFFER
from allocsim.policies.pytorch.snapshot import segment_is_small
from allocsim.traces.model import OP_ALLOC, Trace

__all__ = [
    "COMPARED_ACTIONS",
    "GROW_ACTIONS",
    "LARGE_CAPACITY",
    "RELEASE_ACTIONS",
    "Episode",
    "FidelityError",
    "apply_segment",
    "check_snapshot_trace",
    "compared_refs",
    "episodes",
    "expandable_range_bases",
    "final_reserved",
    "recorded_final_sizes",
    "reserved_before",
    "snapshot_capacity",
]

LARGE_CAPACITY = 1 << 40                 # "a large device": 1 TiB, never binds
COMPARED_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")
GROW_ACTIONS = ("segment_alloc", "segment_map")
RELEASE_ACTIONS = ("segment_free", "segment_unmap")


class FidelityError(UserInputError):
    """The input cannot be checked (not a snapshot, settings the model cannot take)."""


def check_snapshot_trace(trace: Trace) -> None:
    """Refuse traces that carry no recorded allocator decisions (one line)."""
    meta = trace.metadata
    if meta.get("format") != "torch-snapshot" or "reference_events" not in meta:
        raise FidelityError(f"{trace.name}: not a PyTorch memory snapshot (no recorded "
                            "allocator decisions to compare with); fidelity reads the "
                            "pickle written by torch.cuda.memory._dump_snapshot")
    if len(trace.processes()) > 1:
        raise FidelityError(f"{trace.name}: a snapshot trace has one process")


def compared_refs(trace: Trace) -> list[dict[str, Any]]:
    """The recorded entries that are decisions (``snapshot`` markers are not), in file order."""
    return [r for r in trace.metadata.get("reference_events") or []
            if r.get("action") in COMPARED_ACTIONS]


def snapshot_capacity(trace: Trace, refs: list[dict[str, Any]] | None = None
                      ) -> tuple[int | None, str, int | None]:
    """``(capacity, where it comes from, index of the oom entry used)`` for a snapshot trace:
    reserved bytes at the first oom entry + its device_free, else (None, why, None)."""
    meta = trace.metadata
    refs = refs if refs is not None else compared_refs(trace)
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


# ============================================================================ reserved bytes
def reserved_before(refs: list[dict[str, Any]], initial_reserved: int) -> list[int]:
    """The recorded reserved bytes before each entry (the start segments, then every grow and
    release applied in order)."""
    before: list[int] = []
    reserved = initial_reserved
    for ref in refs:
        before.append(reserved)
        if ref["action"] in GROW_ACTIONS:
            reserved += ref["size"]
        elif ref["action"] in RELEASE_ACTIONS:
            reserved -= ref["size"]
    return before


def final_reserved(initial_reserved: int, refs: list[dict[str, Any]]) -> int:
    """The recorded reserved bytes after the last entry."""
    reserved = initial_reserved
    for ref in refs:
        if ref["action"] in GROW_ACTIONS:
            reserved += ref["size"]
        elif ref["action"] in RELEASE_ACTIONS:
            reserved -= ref["size"]
    return reserved


# ============================================================================ episodes
@dataclass
class Episode:
    """Recorded entries that belong together, before trace event ``event``:
    ``empty_cache`` (an inferred torch.cuda.empty_cache()), ``burst`` (releases right before
    an alloc that then took a new segment: empty_cache() or that alloc's own retry after a
    failed cudaMalloc, decided when the model's state is known), ``oom`` (a failed request
    and its release path) or ``event`` (what trace event ``event`` itself did;
    event == len(trace) means after the last one)."""

    event: int
    kind: str
    entries: list[int]          # indices into the compared reference entries


def episodes(refs: list[dict[str, Any]], ops: list[int], initial_reserved: int,
             capacity: int | None) -> tuple[list[Episode], list[int]]:
    """Split the recorded entries into episodes (see :class:`Episode`), and the recorded
    reserved bytes before each entry. O(entries)."""
    before = reserved_before(refs, initial_reserved)
    found: list[Episode] = []
    k = 0
    while k < len(refs):
        event = refs[k]["event"]
        group = []
        while k < len(refs) and refs[k]["event"] == event:
            group.append(k)
            k += 1
        found += _point_episodes(refs, ops, before, capacity, event, group)
    return found, before


def _point_episodes(refs: list[dict[str, Any]], ops: list[int], before: list[int],
                    capacity: int | None, event: int, group: list[int]) -> list[Episode]:
    """The episodes of the entries ``group``, all recorded before trace event ``event``."""
    found: list[Episode] = []
    # Everything up to an oom entry is that failed request's release path.
    start = 0
    for position, index in enumerate(group):
        if refs[index]["action"] == "oom":
            found.append(Episode(event, "oom", group[start:position + 1]))
            start = position + 1
    tail = group[start:]
    burst = 0
    while burst < len(tail) and refs[tail[burst]]["action"] in RELEASE_ACTIONS:
        burst += 1
    is_alloc = event < len(ops) and ops[event] == OP_ALLOC
    if burst and is_alloc and burst < len(tail) and capacity is not None:
        grow = refs[tail[burst]]
        # A failed cudaMalloc explains the burst (the alloc's own retry path) when the
        # segment would not have fitted next to what was reserved before the burst.
        if grow["action"] in GROW_ACTIONS and before[tail[0]] + grow["size"] > capacity:
            burst = 0
    if burst:
        ambiguous = is_alloc and burst < len(tail) and \
            refs[tail[burst]]["action"] in GROW_ACTIONS
        found.append(Episode(event, "burst" if ambiguous else "empty_cache", tail[:burst]))
    if tail[burst:]:
        found.append(Episode(event, "event", tail[burst:]))
    return found


# ============================================================================ final segments
def apply_segment(ordinary: dict[int, int], segments: list[list[int]], action: str,
                  address: int, size: int) -> None:
    """Forward-apply one recorded segment entry: cudaMalloc'd segments in ``ordinary``
    (address → size), mapped ranges of expandable segments as ``[address, size, 1]`` in
    ``segments``, joined when they touch (as memory_snapshot() reports them). O(segments)."""
    if action == "segment_alloc":
        ordinary[address] = size
    elif action == "segment_free":
        ordinary.pop(address, None)
    elif action == "segment_map":
        _map_range(segments, address, size)
    elif action == "segment_unmap":
        _unmap_range(segments, address, size)


def _map_range(segments: list[list[int]], address: int, size: int) -> None:
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


def _unmap_range(segments: list[list[int]], address: int, size: int) -> None:
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


def recorded_final_sizes(initial: list[dict[str, Any]], refs: list[dict[str, Any]]
                         ) -> list[int]:
    """The sizes of the recording's segments at the end, sorted: the start segments with
    every recorded segment entry applied (the importer derived the start by undoing them
    from the file's final list)."""
    ordinary = {int(s["address"]): int(s["total_size"]) for s in initial
                if not s.get("is_expandable")}
    segments = [[int(s["address"]), int(s["total_size"]), 1] for s in initial
                if s.get("is_expandable")]
    for ref in refs:
        if ref["action"] in GROW_ACTIONS + RELEASE_ACTIONS:
            apply_segment(ordinary, segments, ref["action"], int(ref.get("addr") or 0),
                          int(ref["size"]))
    return sorted([s[1] for s in segments] + list(ordinary.values()))


# ============================================================================ expandable bases
def expandable_range_bases(initial: list[dict[str, Any]], refs: list[dict[str, Any]],
                           ranks: dict[int, int] | None = None) -> dict[tuple[int, bool], int]:
    """``{(stream, small pool): lowest address known to lie in its virtual range}`` for each
    (stream, pool) with expandable segments at the start (``initial``, streams as the
    model numbers them; ``ranks`` maps the small stream ids of ``refs`` to those).

    The lowest address is the lowest of the mapped ranges at the start and of the recorded
    ``segment_map`` entries of that (stream, pool) made while its virtual range lives: a map
    below every mapped page is made at the range's base (find_expandable_block takes the
    lowest unmapped block of the pool, map_block maps from that block's start;
    c10/cuda/CUDACachingAllocator.cpp), which is how the recording reveals unmapped space
    below the ranges at the start. A range lives until its mapped bytes fall to 0: then
    release_cached_blocks releases it (release_expandable_segment) and a later map of that
    (stream, pool) is in a new range. A ``segment_map`` entry names its stream but not its
    pool; the size tells: a small-pool map is one 2 MiB page (small requests are at most
    1 MiB), a large-pool map whole 20 MiB pages; a map that is not whole pages away from the
    range's pages is in another range. An unmap belongs to the range whose mapped pages it
    lies in. O(entries × ranges)."""
    ranks = ranks or {}
    mapped: dict[tuple[int, bool], list[list[int]]] = {}
    for seg in initial:
        if seg.get("is_expandable"):
            key = (int(seg.get("stream", 0)), segment_is_small(seg))
            mapped.setdefault(key, []).append([int(seg["address"]), int(seg["total_size"]), 1])
    lowest = {key: min(r[0] for r in ranges) for key, ranges in mapped.items()}
    for ref in refs:
        action = ref["action"]
        if action not in ("segment_map", "segment_unmap") or not mapped:
            continue
        stream = int(ref.get("stream") or 0)
        stream = ranks.get(stream, stream)
        address, size = int(ref.get("addr") or 0), int(ref["size"])
        if action == "segment_map":
            key = (stream, size % K_LARGE_BUFFER != 0)
            page = K_SMALL_BUFFER if key[1] else K_LARGE_BUFFER
            if key in mapped and (lowest[key] - address) % page == 0:
                lowest[key] = min(lowest[key], address)
                _map_range(mapped[key], address, size)
            continue
        for key, ranges in mapped.items():
            if any(r[0] <= address and address + size <= r[0] + r[1] for r in ranges):
                _unmap_range(ranges, address, size)
                if not ranges:
                    del mapped[key]             # released: later maps are a new range
                break
    return lowest
