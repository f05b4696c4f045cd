"""The shape of a PyTorch memory snapshot, checked into typed records.

What it holds
    - PyTorch's names and constants a snapshot is read by: the entry actions, the active block
      states, and the CUDACachingAllocator sizes that decide how blocks and segments are cut.
    - The records the reader works on: :class:`Segment` (with its blocks), :class:`Block`,
      :class:`Entry` (one trace entry) and :class:`Snapshot` (the file), and
      :func:`parse_snapshot`, which checks the unpickled data into them: a dict with
      ``segments``, ``device_traces`` and, in newer files, ``allocator_settings``; or a bare
      list (legacy: the segments only, no trace). Block addresses missing from older files are
      implied, as MemoryViz.js's ``annotate_snapshot`` does: segment address + running sum of
      block sizes; a missing ``requested_size`` falls back to ``history[0]['real_size']``
      (``_memory_viz._block_extra``) or the size.
    - Segment-list operations shared by the backwards rebuild of the start state and the
      writer: :func:`insert_segment`, :func:`map_range` and :func:`unmap_range` (MemoryViz's
      ``map_segment`` / ``unmap_segment``, which merge neighbours only for expandable segments).
      A segment list is kept sorted by address.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeGuard

import numpy as np

from allocsim.traces.model import TraceError

__all__ = [
    "ACTIVE_STATES",
    "ANNOTATION_ACTIONS",
    "BLOCK_ACTIONS",
    "INT64_MAX",
    "INT64_MIN",
    "KNOWN_ACTIONS",
    "MIN_BLOCK_SIZE",
    "REFERENCE_ACTIONS",
    "SEGMENT_ACTIONS",
    "SMALL_BUFFER",
    "Block",
    "Entry",
    "Segment",
    "Snapshot",
    "insert_segment",
    "int_field",
    "is_int",
    "map_range",
    "parse_snapshot",
    "rounded_size",
    "segment_type_of",
    "unmap_range",
]

REFERENCE_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom",
                     "snapshot")
SEGMENT_ACTIONS = REFERENCE_ACTIONS[:4]
BLOCK_ACTIONS = ("alloc", "free_requested", "free_completed")
# Entries that mark a point in the run and carry no allocation (PyTorch's user annotations).
ANNOTATION_ACTIONS = ("user_defined",)
KNOWN_ACTIONS = BLOCK_ACTIONS + REFERENCE_ACTIONS + ANNOTATION_ACTIONS
ACTIVE_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free")

# PyTorch CUDACachingAllocator constants (c10/cuda/CUDACachingAllocator.cpp).
MIN_BLOCK_SIZE = 512          # kMinBlockSize: block sizes are multiples of this
SMALL_BUFFER = 2 << 20        # kSmallBuffer: every small-pool segment is this big

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class Block(NamedTuple):
    """An active block (live, or its free requested but not completed)."""

    addr: int
    size: int | None        # the block's (rounded) size; None where it is not known
    requested: int
    stream: int             # raw handle
    pending: bool           # free requested, not completed


@dataclass
class Segment:
    """A segment (one cudaMalloc, or a mapped range of an expandable segment)."""

    address: int
    total_size: int
    stream: int             # raw handle
    segment_type: str
    is_expandable: bool
    device: int | None
    blocks: list[tuple[int, int, int, str]] = field(default_factory=list)  # addr, size, req, state


class Entry(NamedTuple):
    """One trace entry; ``addr`` is None only for ``oom`` (which has ``device_free``),
    ``snapshot`` markers without one and actions this reader does not know."""

    action: str
    addr: int | None
    size: int
    stream: int             # raw handle
    frames: Any
    device_free: int | None


@dataclass
class Snapshot:
    """The file: final segments, per-device trace entries, settings as recorded."""

    segments: list[Segment]
    device_traces: list[list[Any]]
    allocator_settings: Any
    legacy: bool


def is_int(value: object) -> TypeGuard[int]:
    """An integer, not a bool. Numpy integers pass too (a pickle cannot hold them, the
    unpickler refuses their class, but a simulated run's addresses may be numpy integers);
    where they reach they act as ints: compared, added, used as indices, or passed to int()."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def int_field(obj: dict[Any, Any], key: str, where: str, source: str, *,
              default: Any = None, minimum: int | None = None) -> int:
    """``obj[key]`` (or ``default``) checked to be a 64-bit integer, at least ``minimum``;
    else a one-line :class:`TraceError` naming ``where`` in ``source``."""
    value = obj.get(key, default)
    if not is_int(value):
        shown = "missing" if key not in obj else f"{value!r}"[:40]
        raise TraceError(f"{where}: {key!r} is {shown}, expected an integer", source=source)
    if minimum is not None and value < minimum:
        raise TraceError(f"{where}: {key!r} is {value}, expected at least {minimum}",
                         source=source)
    if not INT64_MIN <= value <= INT64_MAX:
        raise TraceError(f"{where}: {key!r} is {value}, which does not fit in 64 bits",
                         source=source)
    return value


def parse_snapshot(raw: Any, source: str) -> Snapshot:
    """Check the top-level shape: a snapshot dict, or a bare list of segments (legacy)."""
    if isinstance(raw, list):
        return Snapshot(_parse_segments(raw, source), [], None, legacy=True)
    if not isinstance(raw, dict):
        raise TraceError(f"not a PyTorch memory snapshot: the pickle holds a "
                         f"{type(raw).__name__}, expected a dict with 'segments' and "
                         "'device_traces'", source=source)
    if "segments" not in raw and "device_traces" not in raw:
        keys = ", ".join(repr(k) for k in list(raw)[:5]) or "none"
        raise TraceError(f"not a PyTorch memory snapshot: no 'segments' or 'device_traces' "
                         f"(keys: {keys})", source=source)
    traces = raw.get("device_traces", [])
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise TraceError("'device_traces' should be a list with one list of entries per "
                         "device", source=source)
    return Snapshot(_parse_segments(raw.get("segments", []), source), traces,
                    raw.get("allocator_settings"), legacy=False)


def _parse_segments(raw: Any, source: str) -> list[Segment]:
    if not isinstance(raw, list):
        raise TraceError(f"'segments' is a {type(raw).__name__}, expected a list",
                         source=source)
    return [_parse_segment(seg, k, source) for k, seg in enumerate(raw)]


def _parse_segment(seg: Any, k: int, source: str) -> Segment:
    where = f"segments[{k}]"
    if not isinstance(seg, dict):
        raise TraceError(f"{where} is a {type(seg).__name__}, expected a dict", source=source)
    address = int_field(seg, "address", where, source)
    total = int_field(seg, "total_size", where, source, minimum=0)
    stream = int_field(seg, "stream", where, source, default=0)
    expandable = bool(seg.get("is_expandable", False))
    kind = seg.get("segment_type")
    if kind not in ("small", "large"):
        kind = segment_type_of(total, expandable)
    device = seg.get("device")
    blocks_raw = seg.get("blocks", [])
    if not isinstance(blocks_raw, list):
        raise TraceError(f"{where}: 'blocks' should be a list", source=source)
    blocks = []
    addr = address
    for j, b in enumerate(blocks_raw):
        bwhere = f"{where}.blocks[{j}]"
        if not isinstance(b, dict):
            raise TraceError(f"{bwhere} is a {type(b).__name__}, expected a dict",
                             source=source)
        size = int_field(b, "size", bwhere, source, minimum=0)
        state = b.get("state")
        if not isinstance(state, str):
            raise TraceError(f"{bwhere}: 'state' should be a string", source=source)
        # Newer files give each block's address; older ones imply it (MemoryViz does this).
        baddr = b["address"] if is_int(b.get("address")) else addr
        blocks.append((baddr, size, _requested_size(b, size), state))
        addr = baddr + size
    return Segment(address, total, stream, kind, expandable,
                   device if is_int(device) else None, blocks)


def _requested_size(block: dict[Any, Any], size: int) -> int:
    """A block's requested bytes; legacy files keep them in ``history[0]['real_size']``."""
    value = block.get("requested_size")
    if is_int(value) and value > 0:
        return value
    history = block.get("history")
    if isinstance(history, list) and history and isinstance(history[0], dict):
        real = history[0].get("real_size")
        if is_int(real) and real > 0:
            return real
    return size


def segment_type_of(total_size: int, expandable: bool) -> str:
    """Small-pool segments are exactly kSmallBuffer; anything bigger is large-pool."""
    return "small" if total_size <= SMALL_BUFFER and not expandable else "large"



def insert_segment(segs: list[Segment], seg: Segment) -> int:
    at = bisect.bisect_left([s.address for s in segs], seg.address)
    segs.insert(at, seg)
    return at


# Expandable segments map pages of 2 MiB in the small pool and 20 MiB in the large one
# (CUDACachingAllocator.cpp: kSmallBuffer, kLargeBuffer as the segment size of each pool).
EXPANDABLE_LARGE_PAGE = 20 << 20


def map_range(segs: list[Segment], addr: int, size: int, stream: int) -> None:
    """Add a mapped range of an expandable segment, merging touching neighbours. Its pool is
    a touching range's of the same stream (they are one virtual range), else what its size
    allows: only the small pool maps a size that is not whole 20 MiB pages (a whole number of
    20 MiB pages alone is taken as the large pool's: the entry does not say)."""
    kind = "large" if size % EXPANDABLE_LARGE_PAGE == 0 else "small"
    for other in segs:
        if other.is_expandable and other.stream == stream and (
                other.address + other.total_size == addr or addr + size == other.address):
            kind = other.segment_type
            break
    at = insert_segment(segs, Segment(addr, size, stream, kind, True, None))
    if at + 1 < len(segs):
        nxt = segs[at + 1]
        if nxt.is_expandable and addr + size == nxt.address and nxt.stream == stream:
            segs[at].total_size += nxt.total_size
            del segs[at + 1]
    if at > 0:
        prev = segs[at - 1]
        if prev.is_expandable and prev.address + prev.total_size == addr \
                and prev.stream == stream:
            prev.total_size += segs[at].total_size
            del segs[at]


def unmap_range(segs: list[Segment], addr: int, size: int) -> bool:
    """Remove ``[addr, addr + size)`` from the segment holding it (splitting it if needed)."""
    end = addr + size
    at = next((k for k, s in enumerate(segs)
               if s.address <= addr and end <= s.address + s.total_size), None)
    if at is None:
        return False
    seg = segs[at]
    seg_end = seg.address + seg.total_size
    if seg.address == addr:
        seg.address += size
        seg.total_size -= size
        if seg.total_size == 0:
            del segs[at]
    elif seg_end == end:
        seg.total_size -= size
    else:
        seg.total_size = addr - seg.address
        segs.insert(at + 1, Segment(end, seg_end - end, seg.stream, seg.segment_type,
                                     seg.is_expandable, seg.device))
    return True


def rounded_size(requested: int) -> int:
    """CUDACachingAllocator round_size without power-of-two divisions: 512-byte multiples."""
    return max(MIN_BLOCK_SIZE, -(-requested // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE)
