"""The state at the start of a PyTorch memory snapshot's trace, rebuilt backwards.

Recording usually starts mid-run. Like MemoryViz.js's ``MemoryView.simulate_memory``, the
state at the start is rebuilt by undoing the trace backwards from the final ``segments``:
``alloc`` deletes the block, ``free_completed`` restores it as free-requested,
``free_requested`` clears that, ``segment_alloc`` / ``segment_map`` remove memory,
``segment_free`` / ``segment_unmap`` restore it (merging neighbours for expandable segments).
Every block live then becomes an alloc of the Trace's prologue (see
``allocsim.traces.formats.torch_snapshot.entries``), so every free matches an alloc; the segments at
the start, with their blocks laid out, go to ``metadata["initial_segments"]``.

A block live at the start and freed during the recording has no rounded size in the file (its
``free_completed`` entry gives the requested bytes). It is laid out at the smallest size it can
have, the request rounded to 512 B, and marked ``size_inferred``; how much more it took is the
allocator's split rule (should_split, with the recorded settings), which this package does not
copy: :mod:`allocsim.sim.questions.fidelity.start` applies the policy's own. What the file
proves is handed over with the block: ``carved_at``, the lowest address the recording hands out
between the block and the next block live at the start while the block is still live.
PyTorch's allocator carves a request from the front of a free block, so the free space after
the block begins there: the block ends at ``carved_at``.

Entries that contradict the rest of the file are counted in ``problems`` by name, never raised:
a recording can be cut mid-update.
"""

from __future__ import annotations

import bisect
import collections
from typing import Any, NamedTuple

from allocsim.traces.formats.torch_snapshot.entries import StreamIds
from allocsim.traces.formats.torch_snapshot.shape import (
    ACTIVE_STATES,
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
    blocks, freed_at = _undo_blocks(entries, _final_blocks(segments), problems)
    start_segments = _undo_segments(entries, segments, problems)
    carving = _Carving(entries, freed_at)
    initial, inferred = _initial_segments(start_segments, blocks, streams, carving, problems)
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
                 problems: collections.Counter[str]) -> tuple[dict[int, Block], dict[int, int]]:
    """The blocks live at the start: MemoryView.simulate_memory run back to before entry 0;
    and, for those freed in the recording, the index of their ``free_completed`` entry."""
    blocks = dict(final)
    freed_at: dict[int, int] = {}
    for index in range(len(entries) - 1, -1, -1):
        e = entries[index]
        if e.addr is None:          # oom and snapshot markers: no block
            continue
        if e.action == "alloc":
            if blocks.pop(e.addr, None) is None:
                problems["allocs_of_blocks_not_live_later"] += 1
            freed_at.pop(e.addr, None)
        elif e.action == "free_completed":
            # Its rounded size is not in the entry; None marks it for inference.
            blocks[e.addr] = Block(e.addr, None, e.size, e.stream, True)
            freed_at[e.addr] = index
        elif e.action == "free_requested":
            block = blocks.get(e.addr)
            if block is None:
                problems["free_requests_of_unknown_blocks"] += 1
            else:
                blocks[e.addr] = block._replace(pending=False)
    return blocks, freed_at


class _Carving:
    """Where the recording hands out memory: per address, the first ``alloc`` entry there."""

    def __init__(self, entries: list[Entry], freed_at: dict[int, int]) -> None:
        first: dict[int, int] = {}
        for index, e in enumerate(entries):
            if e.action == "alloc" and e.addr is not None and e.addr not in first:
                first[e.addr] = index
        self.first = first
        self.addresses = sorted(first)
        self.freed_at = freed_at

    def lowest_after(self, block: int, end: int) -> int | None:
        """The lowest address in ``(block, end)`` handed out while the start block at
        ``block`` is live (before its ``free_completed``), or None."""
        until = self.freed_at.get(block)
        if until is None:
            return None
        addresses = self.addresses
        for k in range(bisect.bisect_right(addresses, block), len(addresses)):
            addr = addresses[k]
            if addr >= end:
                return None
            if self.first[addr] < until:
                return addr
        return None


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
                      carving: _Carving, problems: collections.Counter[str]
                      ) -> tuple[list[dict[str, Any]], int]:
    """The segment list at the start, blocks laid out in each (inactive gaps filled in).

    Blocks restored from a ``free_completed`` have no known rounded size: they are laid out
    at the 512-rounded request, marked ``size_inferred``, with ``carved_at`` where the
    recording proves their end (see the module docstring).
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
            evidence: dict[str, Any] = {}
            if size is None:
                inferred += 1
                size = rounded_size(b.requested)
                evidence["size_inferred"] = True
                carved = carving.lowest_after(b.addr, b.addr + room)
                if carved is not None:
                    evidence["carved_at"] = carved
            if size > room or b.addr < cursor:
                problems["initial_blocks_overlapping"] += 1
                size = max(0, min(size, room))
            out.append(_block_dict(b.addr, size, b.requested,
                                   "active_pending_free" if b.pending else "active_allocated")
                       | evidence)
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
