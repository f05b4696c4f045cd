"""PyTorch caching allocator: the counters of memory_stats() (CUDACachingAllocator.cpp's
DeviceStats), one object the allocator's parts count into.

:class:`DeviceStats` holds every counter memory_stats() reports beyond the four every Policy
keeps (allocations, frees, OOMs, bytes in use) and the requested bytes the allocator keeps on
itself: reserved bytes, segments, inactive splits, oversize blocks and segments, retries,
synchronisations, device calls — PyTorch's names in comments. The counters that only
memory_stats() reads (:data:`MEMORY_STATS_ONLY`) can be left out when nobody will read that
report (PyTorchCachingAllocator.keep_memory_stats(False), before the first malloc): they are
then absent from the object, so a read raises AttributeError instead of returning a stale
number. Their current values could be recounted from the blocks, but their totals and peaks
could not, which is why the choice is made before the run and not when the report is asked.
Every method is O(1) but :meth:`DeviceStats.check` (O(blocks)).
"""

from __future__ import annotations

from collections.abc import Iterable

from allocsim.policies.base import fail, require
from allocsim.policies.pytorch.blocks import BlockPools, Segment
from allocsim.policies.pytorch.records import UNMAPPED, Block

# Counters that memory_stats() alone reads (not stats(), not the engine), updated at every
# malloc/free: left out when the report is not kept (module docstring).
MEMORY_STATS_ONLY = (
    "allocated_total", "peak_requested", "requested_total", "peak_allocations",
    "inactive_split", "peak_inactive_split", "inactive_split_total",
    "inactive_split_bytes", "peak_inactive_split_bytes", "inactive_split_bytes_total",
)


class DeviceStats:
    """The counters of memory_stats() that the allocator's parts update (module docstring)."""

    def __init__(self) -> None:
        self.kept = True                          # MEMORY_STATS_ONLY are counted
        self.allocated_total = 0                  # allocated_bytes.all.allocated
        self.peak_requested = 0                   # requested_bytes.all.peak
        self.requested_total = 0
        self.peak_allocations = 0                 # allocation.all.peak
        self.pool_bytes = 0                       # reserved_bytes.all.current
        self.peak_pool_bytes = 0
        self.reserved_total = 0
        self.num_segments = 0                     # segment.all.current (cudaMalloc'd segments)
        self.peak_segments = 0
        self.segments_total = 0
        self.inactive_split = 0                   # free blocks of split segments (not expandable)
        self.peak_inactive_split = 0
        self.inactive_split_total = 0
        self.inactive_split_bytes = 0
        self.peak_inactive_split_bytes = 0
        self.inactive_split_bytes_total = 0
        self.oversize_allocations = 0
        self.peak_oversize_allocations = 0
        self.oversize_allocations_total = 0
        self.oversize_segments = 0
        self.peak_oversize_segments = 0
        self.oversize_segments_total = 0
        self.num_alloc_retries = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

    def keep_report_only(self, keep: bool) -> None:
        """Create the MEMORY_STATS_ONLY counters at zero (``keep``), or delete them. Only on a
        fresh allocator: a peak or total missed before cannot be recounted."""
        for name in MEMORY_STATS_ONLY:
            if keep:
                setattr(self, name, 0)
            elif hasattr(self, name):
                delattr(self, name)
        self.kept = keep

    # -- reserved memory and segments ---------------------------------------------------
    def reserved_change(self, nbytes: int) -> None:
        """Bytes mapped (> 0) or given back (< 0): reserved_bytes."""
        self.pool_bytes += nbytes
        if nbytes > 0:
            self.reserved_total += nbytes
            if self.pool_bytes > self.peak_pool_bytes:
                self.peak_pool_bytes = self.pool_bytes

    def segment_added(self, size: int, oversize: bool) -> None:
        """A cudaMalloc'd segment of ``size`` bytes (oversize: ≥ max_split_size)."""
        self.reserved_change(size)
        self.num_segments += 1
        self.segments_total += 1
        if self.num_segments > self.peak_segments:
            self.peak_segments = self.num_segments
        if oversize:
            self.oversize_segments += 1
            self.oversize_segments_total += 1
            if self.oversize_segments > self.peak_oversize_segments:
                self.peak_oversize_segments = self.oversize_segments
        self.num_device_alloc += 1

    def segment_released(self, size: int, oversize: bool) -> None:
        """A cudaFree'd segment of ``size`` bytes."""
        self.reserved_change(-size)
        self.num_segments -= 1
        if oversize:
            self.oversize_segments -= 1
        self.num_device_free += 1

    def oversize_allocation(self) -> None:
        self.oversize_allocations += 1
        self.oversize_allocations_total += 1
        if self.oversize_allocations > self.peak_oversize_allocations:
            self.peak_oversize_allocations = self.oversize_allocations

    # -- what only memory_stats() reads (only while kept) ----------------------------------
    def count_alloc(self, block_size: int, size: int, requested: int, live: int) -> None:
        """The totals and peaks after an allocation of ``size`` bytes in a block of
        ``block_size`` (``requested`` bytes and ``live`` allocations now)."""
        self.allocated_total += block_size
        if requested > self.peak_requested:
            self.peak_requested = requested
        self.requested_total += size
        if live > self.peak_allocations:
            self.peak_allocations = live

    def inactive_split_grows(self, count: int, nbytes: int) -> None:
        """``count`` more free blocks of split segments, ``nbytes`` more bytes in them."""
        if count:
            current = self.inactive_split + count
            self.inactive_split = current
            self.inactive_split_total += count
            if current > self.peak_inactive_split:
                self.peak_inactive_split = current
        if nbytes:
            current = self.inactive_split_bytes + nbytes
            self.inactive_split_bytes = current
            self.inactive_split_bytes_total += nbytes
            if current > self.peak_inactive_split_bytes:
                self.peak_inactive_split_bytes = current

    def split_on_alloc(self, block: Block, split: bool, rounded: int, remaining: int) -> None:
        """alloc_found_block's change of inactive_split(_bytes) (not for expandable
        segments), before ``block`` is split to ``rounded`` bytes (``split``)."""
        already_split = block.prev is not None or block.next is not None
        if split:
            if already_split:
                self.inactive_split_bytes -= rounded
            else:
                self.inactive_split_grows(1, remaining)
        elif already_split:
            self.inactive_split -= 1
            self.inactive_split_bytes -= block.size

    def split_on_free(self, block: Block, size: int, subsumed_count: int,
                      subsumed_bytes: int) -> None:
        """free_block's net change of inactive_split(_bytes): the neighbours it swallowed stop
        counting; the joined ``block`` counts while its segment is still split."""
        if block.prev is not None or block.next is not None:
            self.inactive_split_grows(0 if subsumed_count else 1, size)
            if subsumed_count == 2:
                self.inactive_split -= 1
        elif subsumed_count:
            self.inactive_split -= subsumed_count
            self.inactive_split_bytes -= subsumed_bytes

    # -- invariants -----------------------------------------------------------------------
    def check(self, pools: BlockPools, bytes_in_use: int, peak_bytes_in_use: int,
              requested: int, live: int, max_split_size: int) -> None:
        """Assert that every current counter agrees with a recount of ``pools``' blocks
        (allocated, requested, reserved, segments, inactive splits, oversize blocks and
        segments), given the allocator's own ``bytes_in_use``, ``requested`` and ``live``
        allocations; peaks ≥ current values; the MEMORY_STATS_ONLY counters held exactly when
        kept. O(blocks)."""
        blocks = pools.block_map.record.values()
        allocated = [block for block in blocks if block.requested > 0]
        require(bytes_in_use == sum(block.size for block in allocated),
                f"pytorch: bytes_in_use {bytes_in_use} is not the allocated blocks' sum")
        require(requested == sum(block.requested for block in allocated),
                "pytorch: requested bytes are not the allocated blocks' requests")
        require(live == len(allocated),
                "pytorch: allocs − frees is not the number of allocated blocks")
        mapped = sum(block.size for block in blocks if block.requested != UNMAPPED)
        require(self.pool_bytes == mapped, f"pytorch: reserved {self.pool_bytes} is not the "
                f"mapped blocks' sum {mapped}")
        plain = [s for s in pools.segment_map.values() if not s.expandable]
        require(self.num_segments == len(plain), "pytorch: segment count disagrees")
        require(self.oversize_segments == sum(s.size >= max_split_size for s in plain),
                "pytorch: oversize segment count disagrees")
        require(self.oversize_allocations == sum(block.size >= max_split_size
                                                 for block in allocated),
                "pytorch: oversize allocation count disagrees")
        peaks = [(bytes_in_use, peak_bytes_in_use),
                 (self.pool_bytes, self.peak_pool_bytes), (self.num_segments, self.peak_segments),
                 (self.oversize_allocations, self.peak_oversize_allocations),
                 (self.oversize_segments, self.peak_oversize_segments)]
        held = [name for name in MEMORY_STATS_ONLY if hasattr(self, name)]
        if not self.kept:
            require(not held, f"pytorch: {held} held while memory_stats() is not kept (stale)")
        else:
            require(len(held) == len(MEMORY_STATS_ONLY),
                    "pytorch: a counter of memory_stats() is missing while it is kept")
            split_free = list(split_free_blocks(pools, plain))
            require(self.inactive_split == len(split_free),
                    f"pytorch: inactive_split {self.inactive_split} is not the "
                    f"{len(split_free)} free blocks of split segments")
            require(self.inactive_split_bytes == sum(block.size for block in split_free),
                    "pytorch: inactive_split_bytes disagrees with the free blocks of split "
                    "segments")
            peaks += [(requested, self.peak_requested), (live, self.peak_allocations),
                      (self.inactive_split, self.peak_inactive_split),
                      (self.inactive_split_bytes, self.peak_inactive_split_bytes)]
        for current, peak in peaks:
            if peak < current:
                fail(f"pytorch: a peak ({peak}) below its current value ({current})")


def split_free_blocks(pools: BlockPools, plain: Iterable[Segment]) -> Iterable[Block]:
    """The free mapped blocks of the split segments among ``plain`` (ordinary segments)."""
    record = pools.block_map.record
    for segment in plain:
        if record[segment.base].next is not None:
            for block in pools.block_map.chain(segment.base):
                if not block.requested:
                    yield block
