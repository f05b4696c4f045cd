"""PyTorch caching allocator: the miss path, from a failed search to an OOM.

After get_free_block finds nothing: garbage collection (when a memory fraction and a threshold
are set), alloc_block (a new segment, or mapped pages), release_available_cached_blocks and
release_cached_blocks each followed by another try, then the OOM. Costs: alloc_block is O(1)
plus one device call; release_available_cached_blocks is O(log k) bisection plus O(k) per
block released; release_cached_blocks and garbage collection are O(free blocks) passes (GC
repeats until enough is reclaimed or a pass frees nothing).
"""

from __future__ import annotations

from bisect import bisect_left

from allocsim.policies.pytorch_blocks import MASK, SHIFT, Segment
from allocsim.policies.pytorch_expandable import ExpandableSegments
from allocsim.policies.pytorch_records import ADDRESS, NEXT, PREV, SIZE
from allocsim.policies.pytorch_settings import NO_LIMIT, get_allocation_size


class ReleasePath(ExpandableSegments):
    """malloc's miss path and the release steps it shares with empty_cache()."""

    def _malloc_miss(self, rounded: int, small: bool, stream: int,
                     pool_key: int) -> list | None:
        """Everything after a failed search: GC, alloc_block, then the two release-and-retry
        steps; an OOM when all fail. Returns a block's record, in no free list, as
        get_free_block would."""
        alloc_size = get_allocation_size(rounded)
        if self._gc_on:
            self._garbage_collect_cached_blocks()
        found = self._alloc_block(rounded, small, stream, alloc_size, False)
        if found is None and self._release_available_cached_blocks(rounded, pool_key):
            found = self._alloc_block(rounded, small, stream, alloc_size, False)
        if found is None:
            self._release_cached_blocks()
            found = self._alloc_block(rounded, small, stream, alloc_size, True)
        if found is None:
            self.num_ooms += 1
        return found

    def _alloc_block(self, rounded: int, small: bool, stream: int, alloc_size: int,
                     is_retry: bool) -> list | None:
        """alloc_block: a new segment of ``alloc_size`` (cudaMalloc), or mapped pages; the
        block found, in no free list."""
        if is_retry:
            self.num_alloc_retries += 1
        if self.set_fraction and self.pool_bytes + alloc_size > self.allowed_memory_maximum:
            return None
        if self.expandable:
            return self._try_allocate_expandable_block(stream, small, rounded)
        base = self.device.reserve(alloc_size)
        if base is None:
            return None
        block = self._new_segment(Segment(base, alloc_size, stream, small, False))
        self._reserved_change(alloc_size)
        self.num_segments += 1
        self.segments_total += 1
        if self.num_segments > self.peak_segments:
            self.peak_segments = self.num_segments
        if alloc_size >= self.max_split_size:
            self.oversize_segments += 1
            self.oversize_segments_total += 1
            if self.oversize_segments > self.peak_oversize_segments:
                self.peak_oversize_segments = self.oversize_segments
        self.num_device_alloc += 1
        return block

    def _release_block(self, block: list) -> None:
        """release_block: cudaFree a free whole-segment block (it is in its free list)."""
        address = block[ADDRESS]
        segment = self.segment_map.pop(address)
        size = block[SIZE]
        if segment.size != size or block[PREV] is not None or block[NEXT] is not None:
            raise AssertionError(f"release_block of {address:#x}, which is not a whole segment")
        self._remove_free(block)
        self._forget(block)
        self.device.release(address)
        self._reserved_change(-size)
        self.num_segments -= 1
        if size >= self.max_split_size:
            self.oversize_segments -= 1
        self.num_device_free += 1

    def _release_available_cached_blocks(self, rounded: int, pool_key: int) -> bool:
        """With max_split_size set: free the smallest block ≥ max(rounded, max_split_size) of
        this stream and pool; else oversize blocks from the largest down until that many bytes
        went (those freed stay freed even if it was not enough). Never expandable blocks."""
        max_split = self.max_split_size
        if max_split == NO_LIMIT or self.expandable:
            return False
        keys = self._free[pool_key]
        record = self.block_map.record
        target = max(rounded, max_split)
        position = bisect_left(keys, target << SHIFT)
        if position < len(keys):
            self._release_block(record[keys[position] & MASK])
            return True
        released = 0
        index = position - 1
        while released < target and index >= 0 and keys[index] >> SHIFT >= max_split:
            key = keys[index]
            self._release_block(record[key & MASK])
            released += key >> SHIFT
            index -= 1
        return released >= target

    def _release_cached_blocks(self) -> None:
        """release_cached_blocks: synchronise (counted), then release every unsplit free block
        of the large pool, then of the small pool; expandable segments unmap the whole pages of
        every free block instead, and forget a virtual range left wholly unmapped."""
        self.num_sync_all_streams += 1
        pool_keys = sorted(self._free, key=lambda k: (k & 1, k))    # large pools first
        record = self.block_map.record
        if not self.expandable:
            for pool_key in pool_keys:
                for key in list(self._free[pool_key]):
                    block = record[key & MASK]
                    if block[PREV] is None and block[NEXT] is None:
                        self._release_block(block)
            return
        to_unmap = [key & MASK for pool_key in pool_keys for key in self._free[pool_key]]
        for address in to_unmap:
            unmapped = self._unmap_block(record[address])
            if unmapped is not None and unmapped[PREV] is None and unmapped[NEXT] is None:
                self._release_expandable_segment(unmapped)

    def _garbage_collect_cached_blocks(self) -> None:
        """garbage_collect_cached_blocks: above garbage_collection_threshold × allowed memory,
        release unsplit large-pool blocks whose age ≥ the mean age of such blocks, again with
        the new mean, until the excess is reclaimed or a pass frees nothing."""
        threshold = int(self.gc_threshold * self.allowed_memory_maximum)
        if self.pool_bytes <= threshold or self.expandable:
            return
        target = self.pool_bytes - threshold
        now = self._gc_calls[0]
        record = self.block_map.record
        candidates = [key & MASK for pool_key, keys in self._free.items() if not pool_key & 1
                      for key in keys
                      if record[key & MASK][PREV] is None and record[key & MASK][NEXT] is None]
        age = {address: now - self._gc_base[address] for address in candidates}
        total_age = sum(age.values())
        count = len(candidates)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            kept = []
            for address in candidates:
                if age[address] >= age_threshold:
                    freed = True
                    block = record[address]
                    reclaimed += block[SIZE]
                    total_age -= age[address]
                    count -= 1
                    self._release_block(block)
                else:
                    kept.append(address)
            candidates = kept

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): release_cached_blocks."""
        self._release_cached_blocks()
