"""PyTorch caching allocator: the miss path, from a failed search to an OOM.

After get_free_block finds nothing: garbage collection (when a memory fraction and a threshold
are set), alloc_block (a new segment, or mapped pages), release_available_cached_blocks and
release_cached_blocks each followed by another try, then the OOM. :class:`ReleasePath` is
that part of DeviceCachingAllocator, held by the allocator as a field: it works on the
allocator's :class:`~allocsim.policies.pytorch.blocks.BlockPools`, takes memory from the
device (or mapped pages from its
:class:`~allocsim.policies.pytorch.expandable.ExpandableSegments`) and counts into its
:class:`~allocsim.policies.pytorch.stats.DeviceStats`; empty_cache() is its
:meth:`ReleasePath.release_cached_blocks`. Costs: alloc_block is O(1) plus one device call;
release_available_cached_blocks is O(log k) bisection plus O(k) per block released;
release_cached_blocks and garbage collection are O(free blocks) passes (GC repeats until
enough is reclaimed or a pass frees nothing).
"""

from __future__ import annotations

from bisect import bisect_left

from allocsim.policies.base import DeviceMemory
from allocsim.policies.limit_window import NO_UPPER, LimitWindow
from allocsim.policies.pytorch.blocks import MASK, SHIFT, BlockPools, Segment
from allocsim.policies.pytorch.expandable import ExpandableSegments
from allocsim.policies.pytorch.records import Block
from allocsim.policies.pytorch.settings import NO_LIMIT, get_allocation_size
from allocsim.policies.pytorch.stats import DeviceStats

EXACT_FLOATS = 1 << 53            # below it a float holds every integer


class ReleasePath:
    """malloc's miss path and the release steps it shares with empty_cache(). The settings
    are the allocator's (pytorch/caching.py): ``max_split_size`` (NO_LIMIT when unset), the
    memory fraction's ``allowed_memory_maximum`` (``set_fraction``: one was set) and
    ``gc_threshold`` (garbage collection runs when ``pools.gc_on``)."""

    def __init__(self, pools: BlockPools, stats: DeviceStats, device: DeviceMemory,
                 expandable: ExpandableSegments | None, *, max_split_size: int,
                 set_fraction: bool, allowed_memory_maximum: int, gc_threshold: float) -> None:
        self.pools = pools
        self.stats = stats
        self.device = device
        self.expandable = expandable
        self.max_split_size = max_split_size
        self.set_fraction = set_fraction
        self.allowed_memory_maximum = allowed_memory_maximum
        self.gc_threshold = gc_threshold
        # Every allowed_memory_maximum under which the fraction's cap and garbage collection
        # would have decided alike so far (min-capacity resumes runs at nearby capacities by it).
        self.limit_window = LimitWindow()

    def miss(self, rounded: int, small: bool, stream: int, pool_key: int) -> Block | None:
        """Everything after a failed search: GC, alloc_block, then the two release-and-retry
        steps. Returns a block, in no free list, as get_free_block would; None is an OOM (the
        caller counts it)."""
        alloc_size = get_allocation_size(rounded)
        if self.pools.gc_on:
            self.garbage_collect_cached_blocks()
        found = self.alloc_block(rounded, small, stream, alloc_size, False)
        if found is None and self.release_available_cached_blocks(rounded, pool_key):
            found = self.alloc_block(rounded, small, stream, alloc_size, False)
        if found is None:
            self.release_cached_blocks()
            found = self.alloc_block(rounded, small, stream, alloc_size, True)
        return found

    def alloc_block(self, rounded: int, small: bool, stream: int, alloc_size: int,
                    is_retry: bool) -> Block | None:
        """alloc_block: a new segment of ``alloc_size`` (cudaMalloc), or mapped pages; the
        block found, in no free list."""
        stats = self.stats
        if is_retry:
            stats.num_alloc_retries += 1
        if self.set_fraction:
            fits = stats.pool_bytes + alloc_size <= self.allowed_memory_maximum
            self.limit_window.at_least(stats.pool_bytes + alloc_size, fits)
            if not fits:
                return None
        if self.expandable is not None:
            return self.expandable.try_allocate(stream, small, rounded)
        base = self.device.reserve(alloc_size)
        if base is None:
            return None
        block = self.pools.new_segment(Segment(base, alloc_size, stream, small, False))
        stats.segment_added(alloc_size, alloc_size >= self.max_split_size)
        return block

    def release_block(self, block: Block) -> None:
        """release_block: cudaFree a free whole-segment block (it is in its free list)."""
        address = block.address
        segment = self.pools.segment_map.pop(address)
        size = block.size
        if segment.size != size or block.prev is not None or block.next is not None:
            raise AssertionError(f"release_block of {address:#x}, which is not a whole segment")
        self.pools.remove_free(block)
        self.pools.forget(block)
        self.device.release(address)
        self.stats.segment_released(size, size >= self.max_split_size)

    def release_available_cached_blocks(self, rounded: int, pool_key: int) -> bool:
        """With max_split_size set: free the smallest block ≥ max(rounded, max_split_size) of
        this stream and pool; else oversize blocks from the largest down until that many bytes
        went (those freed stay freed even if it was not enough). Never expandable blocks."""
        max_split = self.max_split_size
        if max_split == NO_LIMIT or self.expandable is not None:
            return False
        keys = self.pools.free_lists[pool_key]
        record = self.pools.record
        target = max(rounded, max_split)
        position = bisect_left(keys, target << SHIFT)
        if position < len(keys):
            self.release_block(record[keys[position] & MASK])
            return True
        released = 0
        index = position - 1
        while released < target and index >= 0 and keys[index] >> SHIFT >= max_split:
            key = keys[index]
            self.release_block(record[key & MASK])
            released += key >> SHIFT
            index -= 1
        return released >= target

    def release_cached_blocks(self) -> None:
        """release_cached_blocks (and torch.cuda.empty_cache()): synchronise (counted), then
        release every unsplit free block of the large pool, then of the small pool; expandable
        segments unmap the whole pages of every free block instead, and forget a virtual range
        left wholly unmapped."""
        self.stats.num_sync_all_streams += 1
        free_lists = self.pools.free_lists
        pool_keys = sorted(free_lists, key=lambda k: (k & 1, k))    # large pools first
        if self.expandable is not None:
            self.expandable.release_cached(pool_keys)
            return
        record = self.pools.record
        for pool_key in pool_keys:
            for key in list(free_lists[pool_key]):
                block = record[key & MASK]
                if block.prev is None and block.next is None:
                    self.release_block(block)

    def garbage_collect_cached_blocks(self) -> None:
        """garbage_collect_cached_blocks: above garbage_collection_threshold × allowed memory,
        release unsplit large-pool blocks whose age ≥ the mean age of such blocks, again with
        the new mean, until the excess is reclaimed or a pass frees nothing."""
        if self.expandable is not None:
            return
        threshold = int(self.gc_threshold * self.allowed_memory_maximum)
        pool_bytes = self.stats.pool_bytes
        if not self._above_gc_threshold(pool_bytes, threshold):
            return
        pools = self.pools
        now = pools.gc_searches[0]
        record = pools.record
        candidates = [key & MASK for pool_key, keys in pools.free_lists.items()
                      if not pool_key & 1 for key in keys
                      if record[key & MASK].prev is None and record[key & MASK].next is None]
        age = {address: now - pools.gc_stamps[address] for address in candidates}
        total_age = sum(age.values())
        count = len(candidates)
        reclaimed = 0
        freed = True
        while self._above_gc_threshold(pool_bytes - reclaimed, threshold) and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            kept = []
            for address in candidates:
                if age[address] >= age_threshold:
                    freed = True
                    block = record[address]
                    reclaimed += block.size
                    total_age -= age[address]
                    count -= 1
                    self.release_block(block)
                else:
                    kept.append(address)
            candidates = kept

    def _above_gc_threshold(self, held: int, threshold: int) -> bool:
        """Whether ``held`` bytes are over garbage collection's threshold, int(gc_threshold ×
        allowed_memory_maximum): collection's every decision against the limit (whether to
        start; whether what it has reclaimed is enough), noted as the decision on
        allowed_memory_maximum it is. The threshold grows with the maximum, so ``held`` is
        over it exactly below the least maximum whose threshold reaches ``held``."""
        above = held > threshold
        self.limit_window.at_least(self._least_maximum_reaching(held), not above)
        return above

    def _least_maximum_reaching(self, held: int) -> int:
        """The least allowed_memory_maximum whose threshold int(gc_threshold × maximum) is at
        least ``held``: found from the quotient and stepped to the exact integer, as the
        threshold is computed (its float product, truncated), which never falls as the maximum
        rises. Past 2**53 (petabytes), where a float no longer holds every integer, NO_UPPER:
        no run's maximum is there."""
        if held <= 0:
            return 0
        share = self.gc_threshold
        estimate = held / share
        if estimate >= EXACT_FLOATS:
            return NO_UPPER
        maximum = int(estimate)
        while int(share * maximum) >= held:
            maximum -= 1
        while int(share * maximum) < held:
            maximum += 1
        return maximum
