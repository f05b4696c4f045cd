"""PyTorch caching allocator: its state in and out, as memory_snapshot() shows it.

:meth:`Snapshots.seed` lays out a recorded segment list before the first malloc (a snapshot
recorded mid-run); :meth:`Snapshots.segments` and :meth:`Snapshots.memory_stats` report the
state in torch.cuda.memory_snapshot()'s and memory_stats()'s shapes; ``blocks`` and ``stats``
are the Policy views. All O(n) in the blocks held (seed: in the blocks recorded).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from allocsim.policies.base import PolicyStats
from allocsim.policies.pytorch_blocks import SHIFT, Segment
from allocsim.policies.pytorch_oom import ReleasePath
from allocsim.policies.pytorch_settings import K_SMALL_BUFFER, NO_LIMIT


class Snapshots(ReleasePath):
    """Seeding from and reporting in memory_snapshot()'s terms."""

    def seed(self, segments: Iterable[dict[str, Any]]) -> dict[int, int]:
        """Start from a recorded state instead of an empty cache (a snapshot recorded mid-run).

        ``segments`` have the shape of :meth:`segments` (and of memory_snapshot()'s, as the
        snapshot importer writes them to ``metadata["initial_segments"]``): ``address``,
        ``total_size``, ``stream`` (small id), ``segment_type``, ``blocks`` of ``{address, size,
        requested_size, state}`` tiling the segment. Each segment is taken from the device with
        one ``reserve`` (so the device counts it; its address is the device's), its blocks are
        laid out at the same offsets: ``active_*`` blocks become allocated blocks (requested
        bytes = requested_size, or size when that is 0), ``inactive`` ones cached free blocks,
        touching ones joined as free_block would have. Returns ``{recorded block address: this
        model's address}`` of the active blocks, so a caller can ``free`` them later.

        Only on a fresh allocator; expandable segments (and an expandable-segments model) are
        refused with ValueError, as are blocks that do not tile their segment and segments the
        device cannot hold.
        """
        if self.num_allocs or self.segment_map:
            raise ValueError("seed() needs a fresh allocator (no malloc before it)")
        if self.expandable:
            raise ValueError("seeding an expandable-segments allocator is not modelled")
        mapping: dict[int, int] = {}
        for seg in sorted(segments, key=lambda s: int(s["address"])):
            if seg.get("is_expandable"):
                raise ValueError(f"segment {int(seg['address']):#x} is an expandable segment; "
                                 "seeding those is not modelled")
            recorded = int(seg["address"])
            total = int(seg["total_size"])
            pieces: list[list[int]] = []        # [offset, size, requested or -1 when free]
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
                elif pieces and pieces[-1][2] < 0:
                    pieces[-1][1] += size
                else:
                    pieces.append([address - recorded, size, -1])
            if cursor != recorded + total:
                raise ValueError(f"segment {recorded:#x}: its blocks cover {cursor - recorded} "
                                 f"of its {total} bytes")
            kind = seg.get("segment_type")
            small = kind == "small" if kind in ("small", "large") else total <= K_SMALL_BUFFER
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
        base, pool_key = segment.base, segment.pool_key
        split = len(pieces) > 1
        previous = 0
        for offset, size, _ in pieces:
            address = base + offset
            self._size[address] = size
            self._prev[address] = previous
            self._next[address] = 0
            self._home[address] = pool_key
            if previous:
                self._next[previous] = address
            previous = address
        for offset, size, requested in pieces:
            address = base + offset
            if requested < 0:
                self._insert_free(address)
                if split:
                    self.inactive_split += 1
                    self.inactive_split_total += 1
                    self.inactive_split_bytes += size
                    self.inactive_split_bytes_total += size
                continue
            mapping[recorded + offset] = address
            self._req[address] = requested
            self.bytes_in_use += size
            self.allocated_total += size
            self.requested += requested
            self.requested_total += requested
            self.num_allocs += 1
            if size >= self.max_split_size:
                self._oversize_allocation()
        self.peak_bytes_in_use = max(self.peak_bytes_in_use, self.bytes_in_use)
        self.peak_requested = max(self.peak_requested, self.requested)
        self.peak_allocations = max(self.peak_allocations, self.num_allocs - self.num_frees)
        self.peak_inactive_split = max(self.peak_inactive_split, self.inactive_split)
        self.peak_inactive_split_bytes = max(self.peak_inactive_split_bytes,
                                             self.inactive_split_bytes)
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

    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        """Every block of memory held from the device, in address order. Unmapped address
        space of expandable segments is not memory held, so it is left out."""
        unmapped = self._unmapped
        for base in sorted(self.segment_map):
            for address in self._chain(base):
                if address not in unmapped:
                    yield address, self._size[address], address in self._req

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
            for address in self._chain(base):
                if address in self._unmapped:
                    current = None
                    continue
                if current is None:
                    current = {"address": address, "total_size": 0, "allocated_size": 0,
                               "active_size": 0, "requested_size": 0, "stream": segment.stream,
                               "segment_type": "small" if segment.small else "large",
                               "is_expandable": segment.expandable, "blocks": []}
                    result.append(current)
                size = self._size[address]
                requested = self._req.get(address)
                current["total_size"] += size
                if requested is not None:
                    current["allocated_size"] += size
                    current["active_size"] += size
                    current["requested_size"] += requested
                current["blocks"].append({
                    "address": address, "size": size,
                    "requested_size": requested if requested is not None else 0,
                    "state": "active_allocated" if requested is not None else "inactive"})
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
            split = not segment.expandable and self._next[segment.base] != 0
            for address in self._chain(segment.base):
                if address in self._unmapped:
                    continue
                size = self._size[address]
                counts["reserved_bytes"] += size
                if address in self._req:
                    counts["allocation"] += 1
                    counts["allocated_bytes"] += size
                    counts["requested_bytes"] += self._req[address]
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
