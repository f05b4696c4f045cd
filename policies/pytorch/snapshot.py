"""PyTorch caching allocator: its state in and out, as memory_snapshot() shows it.

:class:`Snapshots`, held by the allocator as a field, works on its
:class:`~allocsim.policies.pytorch.blocks.BlockPools` and
:class:`~allocsim.policies.pytorch.stats.DeviceStats`: :meth:`Snapshots.seed` lays out a
recorded segment list before the first malloc (a snapshot recorded mid-run: cudaMalloc'd
segments, or the mapped ranges of expandable segments, each (stream, pool)'s in one virtual
range) and counts it as the mallocs would have; :meth:`Snapshots.segments`,
:meth:`Snapshots.memory_stats` and :meth:`Snapshots.blocks` report the state in
torch.cuda.memory_snapshot()'s, memory_stats()'s and the Policy view's shapes. The
allocator's own counters (bytes in use, requested bytes, allocations) are handed in with each
call as :class:`Allocations`. All O(n) in the blocks held (seed: in the blocks recorded).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from allocsim.policies.base import DeviceMemory
from allocsim.policies.pytorch.blocks import BlockPools, Segment
from allocsim.policies.pytorch.expandable import ExpandableSegments
from allocsim.policies.pytorch.records import UNMAPPED, Block
from allocsim.policies.pytorch.settings import (
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    NO_LIMIT,
)
from allocsim.policies.pytorch.stats import DeviceStats

FREE = -1                  # a seeded piece that is a cached free block
UNMAPPED_PIECE = -2        # a seeded piece that is unmapped space of an expandable segment


def segment_is_small(seg: dict[str, Any]) -> bool:
    """Is a recorded segment (memory_snapshot()'s shape) in the small pool?

    An ordinary segment: its ``segment_type`` says; without one, it is small when it is at
    most kSmallBuffer (2 MiB, what a small-pool cudaMalloc takes). A mapped range of an
    expandable segment: an allocated block in it says (get_pool: a request of at most
    kSmallSize = 1 MiB is small-pool, any larger one large-pool), then a size that is not
    whole 20 MiB pages (small-pool pages are 2 MiB, large-pool 20 MiB), then its
    ``segment_type``; the evidence comes first because a range rebuilt by undoing a
    ``segment_unmap`` has no pool of its own in the file (the entry names none)."""
    kind = seg.get("segment_type")
    total = int(seg["total_size"])
    if seg.get("is_expandable"):
        for block in seg.get("blocks") or ():
            if str(block.get("state", "")).startswith("active"):
                return (int(block.get("requested_size") or 0) or int(block["size"])) \
                    <= K_SMALL_SIZE
        if total % K_LARGE_BUFFER:
            return True
    if kind in ("small", "large"):
        return kind == "small"
    return total <= K_SMALL_BUFFER and not seg.get("is_expandable")


def _pieces(seg: dict[str, Any]) -> tuple[int, int, list[list[int]]]:
    """``(address, total_size, pieces)`` of one recorded segment: ``[offset, size, requested
    bytes or FREE]`` tiling it, touching inactive blocks joined. ValueError when its blocks do
    not tile it."""
    recorded = int(seg["address"])
    total = int(seg["total_size"])
    pieces: list[list[int]] = []
    cursor = recorded
    for block in seg.get("blocks") or [{"size": total, "state": "inactive"}]:
        address = int(block.get("address", cursor))
        size = int(block["size"])
        if address != cursor or size <= 0:
            raise ValueError(f"segment {recorded:#x}: its blocks do not tile it "
                             f"(block at {address:#x}, expected {cursor:#x})")
        cursor += size
        if str(block.get("state", "inactive")).startswith("active"):
            pieces.append([address - recorded, size,
                           int(block.get("requested_size") or 0) or size])
        elif pieces and pieces[-1][2] == FREE:
            pieces[-1][1] += size
        else:
            pieces.append([address - recorded, size, FREE])
    if cursor != recorded + total:
        raise ValueError(f"segment {recorded:#x}: its blocks cover {cursor - recorded} "
                         f"of its {total} bytes")
    return recorded, total, pieces




class Allocations(Protocol):
    """The allocator's own counters (Policy's and its requested bytes), which seeding counts
    into and memory_stats() reports."""

    bytes_in_use: int
    peak_bytes_in_use: int
    requested: int
    num_allocs: int
    num_frees: int
    num_ooms: int


class Snapshots:
    """Seeding from and reporting in memory_snapshot()'s terms, over the allocator's blocks
    and counters (``expandable``: its expandable-segments part, None without them)."""

    def __init__(self, pools: BlockPools, stats: DeviceStats, device: DeviceMemory,
                 expandable: ExpandableSegments | None, max_split_size: int) -> None:
        self.pools = pools
        self.stats = stats
        self.device = device
        self.expandable = expandable
        self.max_split_size = max_split_size

    def seed(self, segments: Iterable[dict[str, Any]], allocs: Allocations) -> dict[int, int]:
        """Start from a recorded state instead of an empty cache (a snapshot recorded mid-run).

        ``segments`` have the shape of :meth:`segments` (and of memory_snapshot()'s, as the
        snapshot importer writes them to ``metadata["initial_segments"]``): ``address``,
        ``total_size``, ``stream`` (small id), ``segment_type``, ``is_expandable``, ``blocks``
        of ``{address, size, requested_size, state}`` tiling the segment. Blocks are laid out
        at the same offsets: ``active_*`` blocks become allocated blocks (requested bytes =
        requested_size, or size when that is 0), ``inactive`` ones cached free blocks,
        touching ones joined as free_block would have. Returns ``{recorded block address:
        this model's address}`` of the active blocks, so a caller can ``free`` them later.

        Ordinary segments: each is taken from the device with one ``reserve`` (so the device
        counts it; its address is the device's).

        Expandable segments (an expandable-segments model; see :meth:`_seed_ranges`):
        memory_snapshot() reports one segment per contiguous mapped range of an
        ExpandableSegment, ``is_expandable`` set, with the blocks inside it; the unmapped
        rest of the virtual range is not reported (CUDACachingAllocator.cpp, snapshot():
        "For expandable segments, we report one segment for each contiguous mapped range of
        memory"; it walks ``block->next`` while ``block->mapped``). The recorded ranges of
        one (stream, pool) are laid out in one virtual range, which is taken from the device
        with one ``address_range`` and mapped with one ``map`` per recorded range; the space
        between and after them is unmapped, as in the recording. An optional
        ``range_base`` on a segment is an address known to lie in the same virtual range
        below its mapped ranges (a later recorded segment_map there: the range starts at
        the lowest such address, see :meth:`_seed_ranges`).

        Only on a fresh allocator, and only segments of the model's kind (all segments are
        one kind: the model does not toggle expandable_segments); otherwise ValueError, as
        for blocks that do not tile their segment, mapped ranges that are not whole pages of
        their virtual range, and segments the device cannot hold.
        """
        if allocs.num_allocs or self.pools.segment_map:
            raise ValueError("seed() needs a fresh allocator (no malloc before it)")
        expandable = self.expandable is not None
        ordered = sorted(segments, key=lambda s: int(s["address"]))
        for seg in ordered:
            if bool(seg.get("is_expandable")) != expandable:
                raise ValueError(
                    f"segment {int(seg['address']):#x} is "
                    f"{'an' if seg.get('is_expandable') else 'not an'} expandable segment and "
                    f"this model {'uses' if expandable else 'does not use'} expandable "
                    "segments (all segments are one kind)")
        mapping: dict[int, int] = {}
        if self.expandable is not None:
            self._seed_ranges(self.expandable, ordered, mapping, allocs)
            return mapping
        for seg in ordered:
            recorded, total, pieces = _pieces(seg)
            small = segment_is_small(seg)
            base = self.device.reserve(total)
            if base is None:
                raise ValueError(f"the device cannot hold the recorded segment {recorded:#x} "
                                 f"({total} bytes)")
            self._seed_segment(Segment(base, total, int(seg.get("stream", 0)), small, False),
                               pieces, recorded, mapping, allocs)
        return mapping

    def _seed_segment(self, segment: Segment, pieces: list[list[int]], recorded: int,
                      mapping: dict[int, int], allocs: Allocations) -> None:
        """Lay out one seeded segment's blocks and count them as malloc/free would have."""
        pools, stats = self.pools, self.stats
        pools.new_segment(segment)
        blocks = pools.lay_out(segment.base, segment.pool_key, [size for _, size, _ in pieces])
        split = len(pieces) > 1
        for (offset, size, requested), block in zip(pieces, blocks, strict=True):
            if requested < 0:
                pools.insert_free(block)
                if split:
                    stats.inactive_split += 1
                    stats.inactive_split_total += 1
                    stats.inactive_split_bytes += size
                    stats.inactive_split_bytes_total += size
                continue
            self._seed_allocated(block, requested, recorded + offset, mapping, allocs)
        self._seed_peaks(allocs)
        stats.segment_added(segment.size, segment.size >= self.max_split_size)

    def _seed_ranges(self, expandable: ExpandableSegments, ordered: list[dict[str, Any]],
                     mapping: dict[int, int], allocs: Allocations) -> None:
        """Seed recorded mapped ranges of expandable segments (sorted by address).

        The rules followed (c10/cuda/CUDACachingAllocator.cpp): each (stream, pool) grows one
        virtual range — find_expandable_block makes a new ExpandableSegment only when no
        unmapped block of that stream's pool (in address order) has room, and a range holds
        1.125 × the device's memory, so short of an OOM there is one — of
        ceil(1.125 × totalGlobalMem / page) pages, 2 MiB pages in the small pool, 20 MiB in
        the large one; ExpandableSegment::map asserts that a range is mapped from a page
        boundary of the range (``ptr() + begin * segment_size_ == range.ptr``) and maps whole
        pages, and unmap releases whole pages only. So the recorded ranges of one
        (stream, pool) lie whole pages apart in one virtual range (checked), and the space
        between them is unmapped address space of that range.

        What a snapshot cannot tell, and what is assumed:
        - Where the virtual range starts. A new range is mapped first at its base (the first
          map_block of find_expandable_block's new block maps from ``es->ptr()``), and the
          lowest pages leave it only through release_cached_blocks; a later map below the
          lowest mapped range is made at the range's base again (find_expandable_block walks
          unmapped blocks in address order, and map_block maps from the unmapped block's
          start, which for the space below every mapped page is the base). So the base is
          the lowest of the recorded ranges and their ``range_base`` (the caller's: the
          lowest later segment_map of the range); where nothing later maps below, the base
          is taken to be the lowest mapped range, and that changes no decision: unmapped
          space below it that nothing maps into is never chosen.
        - How large the range is: 1.125 × the recording device's totalGlobalMem, which the
          file does not hold; this model's capacity is used (the range grows to the whole
          pages that hold every recorded range if those span more). Only a request larger
          than all the unmapped space above the highest mapped page could tell.
        - Whether a pool had a second virtual range (possible only after a request found
          no room in the first, i.e. at an OOM): all ranges of a (stream, pool) are laid out
          in one.
        - The pool of a segment whose ``segment_type`` is missing (:func:`segment_is_small`).

        Each virtual range is one ``address_range`` (in address order of the recorded bases)
        and one ``map`` per recorded range; counted as those map_block calls would have
        (reserved bytes, num_device_alloc), not as cudaMalloc'd segments (the segment and
        inactive_split counts of memory_stats() leave expandable segments out, as PyTorch's
        do). O(blocks + ranges log ranges)."""
        groups: dict[tuple[int, bool], list[dict[str, Any]]] = {}
        for seg in ordered:
            groups.setdefault((int(seg.get("stream", 0)), segment_is_small(seg)), []).append(seg)
        layouts = []
        for (stream, small), group in groups.items():
            page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
            base = min([int(group[0]["address"])] + [int(s["range_base"]) for s in group
                                                    if s.get("range_base") is not None])
            runs: list[list[int]] = []      # [offset, size, requested | FREE | UNMAPPED_PIECE]
            ranges: list[tuple[int, int]] = []          # mapped: (offset, size)
            cursor = base
            for seg in group:
                recorded, total, pieces = _pieces(seg)
                if (recorded - base) % page or total % page:
                    raise ValueError(f"expandable segment {recorded:#x} ({total} bytes) is not "
                                     f"whole {page >> 20} MiB pages of a virtual range "
                                     f"starting at {base:#x}")
                if recorded < cursor:
                    raise ValueError(f"expandable segment {recorded:#x} overlaps the one "
                                     "before it")
                if recorded > cursor:
                    runs.append([cursor - base, recorded - cursor, UNMAPPED_PIECE])
                for offset, size, requested in pieces:
                    if requested == FREE and runs and runs[-1][2] == FREE:
                        runs[-1][1] += size             # touching ranges: free_block joins
                    else:
                        runs.append([recorded - base + offset, size, requested])
                ranges.append((recorded - base, total))
                cursor = recorded + total
            nbytes = max(expandable.range_size(page), -(-(cursor - base) // page) * page)
            if cursor < base + nbytes:
                runs.append([cursor - base, base + nbytes - cursor, UNMAPPED_PIECE])
            layouts.append((base, Segment(0, nbytes, stream, small, True, page), runs, ranges))
        layouts.sort(key=lambda layout: layout[0])
        for recorded_base, segment, runs, ranges in layouts:
            segment.base = self.device.address_range(segment.size)
            for offset, total in ranges:
                if not self.device.map(segment.base + offset, total):
                    raise ValueError(f"the device cannot hold the recorded mapped range "
                                     f"{recorded_base + offset:#x} ({total} bytes)")
            self._seed_range(expandable, segment, runs, ranges, recorded_base, mapping, allocs)

    def _seed_range(self, expandable: ExpandableSegments, segment: Segment,
                    runs: list[list[int]], ranges: list[tuple[int, int]], recorded: int,
                    mapping: dict[int, int], allocs: Allocations) -> None:
        """Lay out one seeded virtual range (mapped blocks and unmapped space) and count it
        as the map_block calls and mallocs would have."""
        expandable.add_range(segment)
        blocks = self.pools.lay_out(segment.base, segment.pool_key, [size for _, size, _ in runs])
        for (offset, _, requested), block in zip(runs, blocks, strict=True):
            if requested == UNMAPPED_PIECE:
                expandable.add_unmapped(block)
            elif requested == FREE:
                self.pools.insert_free(block)
            else:
                self._seed_allocated(block, requested, recorded + offset, mapping, allocs)
        self._seed_peaks(allocs)
        for _, total in ranges:
            self.stats.reserved_change(total)
            self.stats.num_device_alloc += 1

    def _seed_allocated(self, block: Block, requested: int, recorded: int,
                        mapping: dict[int, int], allocs: Allocations) -> None:
        """Count a seeded allocated block as malloc would have."""
        size = block.size
        mapping[recorded] = block.address
        block.requested = requested
        allocs.bytes_in_use += size
        allocs.requested += requested
        allocs.num_allocs += 1
        self.stats.allocated_total += size
        self.stats.requested_total += requested
        if size >= self.max_split_size:
            self.stats.oversize_allocation()

    def _seed_peaks(self, allocs: Allocations) -> None:
        stats = self.stats
        allocs.peak_bytes_in_use = max(allocs.peak_bytes_in_use, allocs.bytes_in_use)
        stats.peak_requested = max(stats.peak_requested, allocs.requested)
        stats.peak_allocations = max(stats.peak_allocations,
                                     allocs.num_allocs - allocs.num_frees)
        stats.peak_inactive_split = max(stats.peak_inactive_split, stats.inactive_split)
        stats.peak_inactive_split_bytes = max(stats.peak_inactive_split_bytes,
                                              stats.inactive_split_bytes)

    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        """Every block of memory held from the device, in address order. Unmapped address
        space of expandable segments is not memory held, so it is left out."""
        pools = self.pools
        for base in sorted(pools.segment_map):
            for block in pools.block_map.chain(base):
                if block.requested != UNMAPPED:
                    yield block.address, block.size, block.requested > 0

    def segments(self) -> list[dict[str, Any]]:
        """Like torch.cuda.memory_snapshot()'s segments: one per cudaMalloc'd segment, or per
        contiguous mapped range of an expandable segment, sorted by address. Inactive blocks
        report requested_size 0."""
        result: list[dict[str, Any]] = []
        for base in sorted(self.pools.segment_map):
            segment = self.pools.segment_map[base]
            current: dict[str, Any] | None = None
            for block in self.pools.block_map.chain(base):
                requested = block.requested
                if requested == UNMAPPED:
                    current = None
                    continue
                address = block.address
                if current is None:
                    current = {"address": address, "total_size": 0, "allocated_size": 0,
                               "active_size": 0, "requested_size": 0, "stream": segment.stream,
                               "segment_type": "small" if segment.small else "large",
                               "is_expandable": segment.expandable, "blocks": []}
                    result.append(current)
                size = block.size
                current["total_size"] += size
                if requested:
                    current["allocated_size"] += size
                    current["active_size"] += size
                    current["requested_size"] += requested
                current["blocks"].append({
                    "address": address, "size": size, "requested_size": requested,
                    "state": "active_allocated" if requested else "inactive"})
        result.sort(key=lambda s: s["address"])
        return result

    def memory_stats(self, allocs: Allocations) -> dict[str, int]:
        """torch.cuda.memory_stats()-style names. The ".all" stats carry current, peak,
        allocated and freed; ".small_pool"/".large_pool" only current (counted from the blocks)."""
        stats = self.stats
        report: dict[str, int] = {}

        def put(name: str, current: int, peak: int, allocated: int) -> None:
            report[f"{name}.all.current"] = current
            report[f"{name}.all.peak"] = peak
            report[f"{name}.all.allocated"] = allocated
            report[f"{name}.all.freed"] = allocated - current

        live = allocs.num_allocs - allocs.num_frees
        put("allocation", live, stats.peak_allocations, allocs.num_allocs)
        put("active", live, stats.peak_allocations, allocs.num_allocs)
        for name in ("allocated_bytes", "active_bytes"):
            put(name, allocs.bytes_in_use, allocs.peak_bytes_in_use, stats.allocated_total)
        put("requested_bytes", allocs.requested, stats.peak_requested, stats.requested_total)
        put("reserved_bytes", stats.pool_bytes, stats.peak_pool_bytes, stats.reserved_total)
        put("segment", stats.num_segments, stats.peak_segments, stats.segments_total)
        put("inactive_split", stats.inactive_split, stats.peak_inactive_split,
            stats.inactive_split_total)
        put("inactive_split_bytes", stats.inactive_split_bytes, stats.peak_inactive_split_bytes,
            stats.inactive_split_bytes_total)
        names = ("allocation", "allocated_bytes", "requested_bytes", "reserved_bytes", "segment",
                 "inactive_split", "inactive_split_bytes")
        per_pool = {pool: dict.fromkeys(names, 0) for pool in ("small_pool", "large_pool")}
        record = self.pools.record
        for segment in self.pools.segment_map.values():
            counts = per_pool["small_pool" if segment.small else "large_pool"]
            if not segment.expandable:
                counts["segment"] += 1
            split = not segment.expandable and record[segment.base].next is not None
            for block in self.pools.block_map.chain(segment.base):
                requested = block.requested
                if requested == UNMAPPED:
                    continue
                size = block.size
                counts["reserved_bytes"] += size
                if requested:
                    counts["allocation"] += 1
                    counts["allocated_bytes"] += size
                    counts["requested_bytes"] += requested
                elif split:
                    counts["inactive_split"] += 1
                    counts["inactive_split_bytes"] += size
        for pool, counts in per_pool.items():
            for name, value in counts.items():
                report[f"{name}.{pool}.current"] = value
            report[f"active.{pool}.current"] = counts["allocation"]
            report[f"active_bytes.{pool}.current"] = counts["allocated_bytes"]
        for name, current, peak, total in (
                ("oversize_allocations", stats.oversize_allocations,
                 stats.peak_oversize_allocations, stats.oversize_allocations_total),
                ("oversize_segments", stats.oversize_segments, stats.peak_oversize_segments,
                 stats.oversize_segments_total)):
            report[f"{name}.current"] = current
            report[f"{name}.peak"] = peak
            report[f"{name}.allocated"] = total
            report[f"{name}.freed"] = total - current
        report["num_alloc_retries"] = stats.num_alloc_retries
        report["num_ooms"] = allocs.num_ooms
        report["num_sync_all_streams"] = stats.num_sync_all_streams
        report["num_device_alloc"] = stats.num_device_alloc
        report["num_device_free"] = stats.num_device_free
        report["max_split_size"] = -1 if self.max_split_size == NO_LIMIT else self.max_split_size
        return report
