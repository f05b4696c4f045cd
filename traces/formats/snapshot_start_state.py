"""The state at the start of a PyTorch memory snapshot's trace, rebuilt backwards.

Recording usually starts mid-run. Like MemoryViz.js's ``MemoryView.simulate_memory``, the
state at the start is rebuilt by undoing the trace backwards from the final ``segments``:
``alloc`` deletes the block, ``free_completed`` restores it as free-requested,
``free_requested`` clears that, ``segment_alloc`` / ``segment_map`` remove memory,
``segment_free`` / ``segment_unmap`` restore it (merging neighbours for expandable segments).
Every block live then becomes an alloc of the Trace's prologue (see
``allocsim.traces.formats.snapshot_entries``), so every free matches an alloc; the segments at
the start, with their blocks laid out, go to ``metadata["initial_segments"]``.

Entries that contradict the rest of the file are counted in ``problems`` by name, never raised:
a recording can be cut mid-update.
"""

from __future__ import annotations

import bisect
import collections
from typing import Any, NamedTuple

from allocsim.traces.formats.snapshot_entries import StreamIds
from allocsim.traces.formats.snapshot_shape import (
    ACTIVE_STATES,
    SMALL_SIZE,
    Block,
    Entry,
    Segment,
    insert_segment,
    map_range,
    rounded_size,
    segment_type_of,
    unmap_range,
)

__all__ = ["StartState", "start_state"]


class StartState(NamedTuple):
    """What was live when recording started."""

    blocks: dict[int, Block]        # address -> block live at the start
    segments: list[dict[str, Any]]  # the segments then, blocks laid out: initial_segments
    inferred: int                   # start blocks whose rounded size had to be inferred


def start_state(entries: list[Entry], segments: list[Segment], streams: StreamIds,
                problems: collections.Counter[str]) -> StartState:
    """The blocks and segments at the start of ``entries``, undone from the final
    ``segments`` (the file's, for the device read); contradictions counted in ``problems``."""
    blocks = _undo_blocks(entries, _final_blocks(segments), problems)
    start_segments = _undo_segments(entries, segments, problems)
    initial, inferred = _initial_segments(start_segments, blocks, streams, problems)
    return StartState(blocks, initial, inferred)


def _final_blocks(segments: list[Segment]) -> dict[int, Block]:
    blocks: dict[int, Block] = {}
    for seg in segments:
        for addr, size, requested, state in seg.blocks:
            if state in ACTIVE_STATES:
                blocks[addr] = Block(addr, size, requested, seg.stream,
                                      state != "active_allocated")
    return blocks


def _undo_blocks(entries: list[Entry], final: dict[int, Block],
                 problems: collections.Counter[str]) -> dict[int, Block]:
    """The blocks live at the start: MemoryView.simulate_memory run back to before entry 0."""
    blocks = dict(final)
    for e in reversed(entries):
        if e.action == "alloc":
            if blocks.pop(e.addr, None) is None:
                problems["allocs_of_blocks_not_live_later"] += 1
        elif e.action == "free_completed":
            # Its rounded size is not in the entry; None marks it for inference.
            blocks[e.addr] = Block(e.addr, None, e.size, e.stream, True)
        elif e.action == "free_requested":
            block = blocks.get(e.addr)
            if block is None:
                problems["free_requests_of_unknown_blocks"] += 1
            else:
                blocks[e.addr] = block._replace(pending=False)
    return blocks


def _undo_segments(entries: list[Entry], final: list[Segment],
                   problems: collections.Counter[str]) -> list[Segment]:
    """The segments at the start, undoing segment events backwards (MemoryViz's
    map_segment / unmap_segment, which merge neighbours only for expandable segments)."""
    segs = sorted((Segment(s.address, s.total_size, s.stream, s.segment_type,
                            s.is_expandable, s.device) for s in final),
                  key=lambda s: s.address)
    for e in reversed(entries):
        if e.action == "segment_alloc":
            at = next((k for k, s in enumerate(segs) if s.address == e.addr), None)
            if at is None:
                problems["segment_allocs_of_unknown_segments"] += 1
            else:
                del segs[at]
        elif e.action == "segment_free":
            insert_segment(segs, Segment(e.addr, e.size, e.stream,
                                           segment_type_of(e.size, False), False, None))
        elif e.action == "segment_unmap":
            map_range(segs, e.addr, e.size, e.stream)
        elif e.action == "segment_map":
            if not unmap_range(segs, e.addr, e.size):
                problems["segment_maps_of_unknown_ranges"] += 1
    return segs


def _initial_segments(segs: list[Segment], blocks: dict[int, Block], streams: StreamIds,
                      problems: collections.Counter[str]) -> tuple[list[dict[str, Any]], int]:
    """The segment list at the start, blocks laid out in each (inactive gaps filled in).

    Blocks restored from a ``free_completed`` have no known rounded size; it is inferred as
    the allocator would have cut it: the 512-rounded request, plus the rest of the room up to
    the next block when that rest is too small for a large-pool split (<= 1 MiB).
    """
    starts = sorted(blocks)
    result = []
    inferred = 0
    placed = 0
    for seg in segs:
        end = seg.address + seg.total_size
        lo = bisect.bisect_left(starts, seg.address)
        hi = bisect.bisect_left(starts, end)
        inside = [blocks[a] for a in starts[lo:hi]]
        placed += len(inside)
        out: list[dict[str, Any]] = []
        cursor = seg.address
        for k, b in enumerate(inside):
            if b.addr > cursor:
                out.append(_block_dict(cursor, b.addr - cursor, 0, "inactive"))
            room = (inside[k + 1].addr if k + 1 < len(inside) else end) - b.addr
            size = b.size
            if size is None:
                inferred += 1
                size = rounded_size(b.requested)
                # A large-pool block keeps a rest of at most 1 MiB unsplit (should_split:
                # remaining > kSmallSize); in an expandable segment any rest of 512 B or more
                # is split off, so the block is exactly its rounded size there.
                if seg.segment_type == "large" and not seg.is_expandable \
                        and 0 < room - size <= SMALL_SIZE:
                    size = room
            if size > room or b.addr < cursor:
                problems["initial_blocks_overlapping"] += 1
                size = max(0, min(size, room))
            out.append(_block_dict(b.addr, size, b.requested,
                                   "active_pending_free" if b.pending else "active_allocated"))
            cursor = max(cursor, b.addr + size)
        if cursor < end:
            out.append(_block_dict(cursor, end - cursor, 0, "inactive"))
        result.append({"address": seg.address, "total_size": seg.total_size,
                       "stream": streams(seg.stream), "segment_type": seg.segment_type,
                       "is_expandable": seg.is_expandable, "blocks": out})
    if placed < len(blocks):
        problems["initial_blocks_outside_segments"] += len(blocks) - placed
    return result, inferred


def _block_dict(address: int, size: int, requested: int, state: str) -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": requested, "state": state}
