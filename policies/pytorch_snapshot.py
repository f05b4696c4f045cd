"""PyTorch caching allocator: its state in and out, as memory_snapshot() shows it.

:meth:`Snapshots.seed` lays out a recorded segment list before the first malloc (a snapshot
recorded mid-run: cudaMalloc'd segments, or the mapped ranges of expandable segments, each
(stream, pool)'s in one virtual range); :meth:`Snapshots.segments` and
:meth:`Snapshots.memory_stats` report the state in torch.cuda.memory_snapshot()'s and
memory_stats()'s shapes; ``blocks`` and ``stats`` are the Policy views. All O(n) in the
blocks held (seed: in the blocks recorded).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable, Iterator
from typing import Any

from allocsim.policies.base import PolicyStats
from allocsim.policies.pytorch_blocks import SHIFT, Segment
from allocsim.policies.pytorch_oom import ReleasePath
from allocsim.policies.pytorch_records import ADDRESS, NEXT, REQ, SIZE, UNMAPPED
from allocsim.policies.pytorch_settings import (
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    NO_LIMIT,
)

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


class Snapshots(ReleasePath):
    """Seeding from and reporting in memory_snapshot()'s terms."""

    def seed(self, segments: Iterable[dict[str, Any]]) -> dict[int, int]:
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
        if self.num_allocs or self.segment_map:
            raise ValueError("seed() needs a fresh allocator (no malloc before it)")
        ordered = sorted(segments, key=lambda s: int(s["address"]))
        for seg in ordered:
            if bool(seg.get("is_expandable")) != self.expandable:
                raise ValueError(
                    f"segment {int(seg['address']):#x} is "
                    f"{'an' if seg.get('is_expandable') else 'not an'} expandable segment and "
                    f"this model {'uses' if self.expandable else 'does not use'} expandable "
                    "segments (all segments are one kind)")
        mapping: dict[int, int] = {}
        if self.expandable:
            self._seed_ranges(ordered, mapping)
            return mapping
        for seg in ordered:
            recorded, total, pieces = _pieces(seg)
            small = segment_is_small(seg)
            base = self.device.reserve(total)
            if base is None:
                raise ValueError(f"the device cannot hold the recorded segment {recorded:#x} "
                                 f"({total} bytes)")
            self._seed_segment(Segment(base, total, int(seg.get("stream", 0)), small, False),
                               pieces, recorded, mapping)
        return mapping

    def _seed_segment(self, segment: Segment, pieces: list[list[int]], recorded: int,
                      mapping: dict[int, int]) -> None:
        """Lay out one seeded segment's blocks and count them as malloc/free would have."""
        self._new_segment(segment)
        blocks = self._link(segment.base, segment.pool_key, pieces)
        split = len(pieces) > 1
        for (offset, size, requested), block in zip(pieces, blocks, strict=True):
            if requested < 0:
                self._insert_free(block)
                if split:
                    self.inactive_split += 1
                    self.inactive_split_total += 1
                    self.inactive_split_bytes += size
                    self.inactive_split_bytes_total += size
                continue
            self._seed_allocated(block, requested, recorded + offset, mapping)
        self._seed_peaks()
        self._reserved_change(segment.size)
        self.num_segments += 1
        self.segments_total += 1
        self.peak_segments = max(self.peak_segments, self.num_segments)
        if segment.size >= self.max_split_size:
            self.oversize_segments += 1
            self.oversize_segments_total += 1
            self.peak_oversize_segments = max(self.peak_oversize_segments,
                                              self.oversize_segments)
        self.num_device_alloc += 1

    def _seed_ranges(self, ordered: list[dict[str, Any]], mapping: dict[int, int]) -> None:
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
            nbytes = max(self._range_size(page), -(-(cursor - base) // page) * page)
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
            self._seed_range(segment, runs, ranges, recorded_base, mapping)

    def _seed_range(self, segment: Segment, runs: list[list[int]],
                    ranges: list[tuple[int, int]], recorded: int,
                    mapping: dict[int, int]) -> None:
        """Lay out one seeded virtual range (mapped blocks and unmapped space) and count it
        as the map_block calls and mallocs would have."""
        self._new_segment(segment)
        insort(self._es_bases, segment.base)
        blocks = self._link(segment.base, segment.pool_key, runs)
        for (offset, _, requested), block in zip(runs, blocks, strict=True):
            if requested == UNMAPPED_PIECE:
                self._add_unmapped(block)
            elif requested == FREE:
                self._insert_free(block)
            else:
                self._seed_allocated(block, requested, recorded + offset, mapping)
        self._seed_peaks()
        for _, total in ranges:
            self._reserved_change(total)
            self.num_device_alloc += 1

    def _link(self, base: int, pool_key: int, pieces: list[list[int]]) -> list[list]:
        """Blocks at ``base`` + each piece's offset, linked in order, in pool ``pool_key``, free
        and mapped (the first replaces the segment's whole block); their records in order."""
        record = self.block_map.record
        blocks: list[list] = []
        previous: list | None = None
        for offset, size, _ in pieces:
            address = base + offset
            block = record[address] = [size, previous, None, pool_key, 0, address]
            if previous is not None:
                previous[NEXT] = block
            blocks.append(block)
            previous = block
        return blocks

    def _seed_allocated(self, block: list, requested: int, recorded: int,
                        mapping: dict[int, int]) -> None:
        """Count a seeded allocated block as malloc would have."""
        size = block[SIZE]
        mapping[recorded] = block[ADDRESS]
        block[REQ] = requested
        self.bytes_in_use += size
        self.allocated_total += size
        self.requested += requested
        self.requested_total += requested
        self.num_allocs += 1
        if size >= self.max_split_size:
            self._oversize_allocation()

    def _seed_peaks(self) -> None:
        self.peak_bytes_in_use = max(self.peak_bytes_in_use, self.bytes_in_use)
        self.peak_requested = max(self.peak_requested, self.requested)
        self.peak_allocations = max(self.peak_allocations, self.num_allocs - self.num_frees)
        self.peak_inactive_split = max(self.peak_inactive_split, self.inactive_split)
        self.peak_inactive_split_bytes = max(self.peak_inactive_split_bytes,
                                             self.inactive_split_bytes)

    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        """Every block of memory held from the device, in address order. Unmapped address
        space of expandable segments is not memory held, so it is left out."""
        for base in sorted(self.segment_map):
            for block in self.block_map.chain(base):
                if block[REQ] != UNMAPPED:
                    yield block[ADDRESS], block[SIZE], block[REQ] > 0

    def stats(self) -> PolicyStats:
        largest = 0
        count = 0
        for keys in self._free.values():
            if keys:
                count += len(keys)
                largest = max(largest, keys[-1] >> SHIFT)
        return PolicyStats(
            num_allocs=self.num_allocs, num_frees=self.num_frees, num_ooms=self.num_ooms,
            bytes_in_use=self.bytes_in_use, peak_bytes_in_use=self.peak_bytes_in_use,
            bytes_requested=self.requested, pool_bytes=self.pool_bytes,
            peak_pool_bytes=self.peak_pool_bytes, largest_free_block=largest, free_blocks=count)

    def segments(self) -> list[dict[str, Any]]:
        """Like torch.cuda.memory_snapshot()'s segments: one per cudaMalloc'd segment, or per
        contiguous mapped range of an expandable segment, sorted by address. Inactive blocks
        report requested_size 0."""
        result: list[dict[str, Any]] = []
        for base in sorted(self.segment_map):
            segment = self.segment_map[base]
            current: dict[str, Any] | None = None
            for block in self.block_map.chain(base):
                requested = block[REQ]
                if requested == UNMAPPED:
                    current = None
                    continue
                address = block[ADDRESS]
                if current is None:
                    current = {"address": address, "total_size": 0, "allocated_size": 0,
                               "active_size": 0, "requested_size": 0, "stream": segment.stream,
                               "segment_type": "small" if segment.small else "large",
                               "is_expandable": segment.expandable, "blocks": []}
                    result.append(current)
                size = block[SIZE]
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

    def memory_stats(self) -> dict[str, int]:
        """torch.cuda.memory_stats()-style names. The ".all" stats carry current, peak,
        allocated and freed; ".small_pool"/".large_pool" only current (counted from the blocks)."""
        stats: dict[str, int] = {}

        def put(name: str, current: int, peak: int, allocated: int) -> None:
            stats[f"{name}.all.current"] = current
            stats[f"{name}.all.peak"] = peak
            stats[f"{name}.all.allocated"] = allocated
            stats[f"{name}.all.freed"] = allocated - current

        live = self.num_allocs - self.num_frees
        put("allocation", live, self.peak_allocations, self.num_allocs)
        put("active", live, self.peak_allocations, self.num_allocs)
        put("allocated_bytes", self.bytes_in_use, self.peak_bytes_in_use, self.allocated_total)
        put("active_bytes", self.bytes_in_use, self.peak_bytes_in_use, self.allocated_total)
        put("requested_bytes", self.requested, self.peak_requested, self.requested_total)
        put("reserved_bytes", self.pool_bytes, self.peak_pool_bytes, self.reserved_total)
        put("segment", self.num_segments, self.peak_segments, self.segments_total)
        put("inactive_split", self.inactive_split, self.peak_inactive_split,
            self.inactive_split_total)
        put("inactive_split_bytes", self.inactive_split_bytes, self.peak_inactive_split_bytes,
            self.inactive_split_bytes_total)
        names = ("allocation", "allocated_bytes", "requested_bytes", "reserved_bytes", "segment",
                 "inactive_split", "inactive_split_bytes")
        per_pool = {pool: dict.fromkeys(names, 0) for pool in ("small_pool", "large_pool")}
        for segment in self.segment_map.values():
            counts = per_pool["small_pool" if segment.small else "large_pool"]
            if not segment.expandable:
                counts["segment"] += 1
            chain = self.block_map.chain(segment.base)
            split = not segment.expandable and self.block_map.record[segment.base][NEXT] is not None
            for block in chain:
                requested = block[REQ]
                if requested == UNMAPPED:
                    continue
                size = block[SIZE]
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
                stats[f"{name}.{pool}.current"] = value
            stats[f"active.{pool}.current"] = counts["allocation"]
            stats[f"active_bytes.{pool}.current"] = counts["allocated_bytes"]
        for name, current, peak, total in (
                ("oversize_allocations", self.oversize_allocations,
                 self.peak_oversize_allocations, self.oversize_allocations_total),
                ("oversize_segments", self.oversize_segments, self.peak_oversize_segments,
                 self.oversize_segments_total)):
            stats[f"{name}.current"] = current
            stats[f"{name}.peak"] = peak
            stats[f"{name}.allocated"] = total
            stats[f"{name}.freed"] = total - current
        stats["num_alloc_retries"] = self.num_alloc_retries
        stats["num_ooms"] = self.num_ooms
        stats["num_sync_all_streams"] = self.num_sync_all_streams
        stats["num_device_alloc"] = self.num_device_alloc
        stats["num_device_free"] = self.num_device_free
        stats["max_split_size"] = -1 if self.max_split_size == NO_LIMIT else self.max_split_size
        return stats
