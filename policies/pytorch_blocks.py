"""PyTorch caching allocator: blocks, segments and the free lists per pool.

A block is one record (a list, CUDACachingAllocator.cpp's Block: size, the records of its
neighbours, pool key, requested bytes, address — the slots of policies/pytorch_records.py),
kept in :attr:`BlockPools.block_map` by address. Blocks tile their segment through their
prev/next links (None at the segment's ends). Requested bytes say the block's state: the
caller's request while allocated (> 0), 0 while free and mapped, UNMAPPED for unmapped space
of an expandable segment. Each (stream, pool) key — ``stream << 1 | small`` — has one free
list: a plain sorted list of ``size << 52 | address`` keys, PyTorch's BlockPool ordered by
(stream, size, address). :class:`BlockPools` holds that state and every counter of
memory_stats(), keeps the free lists (insert and remove: O(log k) bisection + O(k) list
insertion/deletion, k = free blocks of the pool; the hot path in pytorch_caching.py does the
same inline) and asserts their invariants in :meth:`BlockPools.check`. The address-keyed
tables the blocks were before the records (``_size``, ``_prev``, ``_next``, ``_home``,
``_req``, ``_unmapped``) remain as views of the records, for check()'s readers and the tests.

The counters that only memory_stats() reads (:data:`MEMORY_STATS_ONLY`) can be left out when
nobody will read that report (``memory_stats_kept`` False, set through
PyTorchCachingAllocator.keep_memory_stats before the first malloc): they are then absent from
the object, so a read raises AttributeError instead of returning a stale number. Their current
values could be recounted from the blocks, but their totals and peaks could not, which is why
the choice is made before the run and not when the report is asked for.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import MutableMapping, MutableSet
from itertools import pairwise

from allocsim.policies.base import DeviceMemory, Policy, fail, require
from allocsim.policies.chunks import check_tiling
from allocsim.policies.pytorch_records import (
    ADDRESS,
    HOME,
    NEXT,
    PREV,
    REQ,
    SIZE,
    UNMAPPED,
    BlockMap,
    RequestedView,
    SlotView,
    UnmappedView,
)
from allocsim.policies.pytorch_settings import K_MIN_BLOCK_SIZE

SHIFT = 52                           # free-list key = size << 52 | address (addresses < 2**52)
MASK = (1 << SHIFT) - 1

# Counters that memory_stats() alone reads (not stats(), not the engine), updated at every
# malloc/free by the general path: left out when memory_stats_kept is False (module docstring).
MEMORY_STATS_ONLY = (
    "allocated_total", "peak_requested", "requested_total", "peak_allocations",
    "inactive_split", "peak_inactive_split", "inactive_split_total",
    "inactive_split_bytes", "peak_inactive_split_bytes", "inactive_split_bytes_total",
)


class Segment:
    """One cudaMalloc'd segment, or the whole virtual range of one expandable segment."""

    __slots__ = ("base", "expandable", "page", "pool_key", "size", "small", "stream")

    def __init__(self, base: int, size: int, stream: int, small: bool, expandable: bool,
                 page: int = 0) -> None:
        self.base = base
        self.size = size
        self.stream = stream
        self.small = small
        self.expandable = expandable
        self.page = page
        self.pool_key = stream << 1 | small


class BlockPools(Policy):
    """The allocator's state: blocks, segments, free lists, counters; the bookkeeping steps
    that keep them (off the hot path) and :meth:`check`. The settings below are set by
    PyTorchCachingAllocator.__init__ (pytorch_caching.py) before any call."""

    divisions: list[int]                 # roundup_power2_divisions, 16 entries
    _divisions: list[int] | None         # the same, None when no entry rounds (> 1)
    max_split_size: int                  # bytes; NO_LIMIT when unset
    max_non_split_rounding: int          # bytes
    gc_threshold: float
    expandable: bool
    set_fraction: bool                   # a per-process memory fraction was set
    allowed_memory_maximum: int          # fraction × capacity, or capacity
    _gc_on: bool                         # garbage collection can run

    def __init__(self, device: DeviceMemory) -> None:
        super().__init__(device)
        # Blocks: one record each (allocated, free, unmapped), keyed by address — the slots
        # of pytorch_records.py, neighbours linked as records (None at a segment's ends).
        self.block_map = BlockMap()
        # The same blocks as address-keyed tables (views of the records: check()'s readers
        # and the tests read them; a write through one changes the records).
        blocks = self.block_map
        self._size: MutableMapping[int, int] = SlotView(blocks, SIZE)
        self._prev: MutableMapping[int, int] = SlotView(blocks, PREV)    # 0 = none (first)
        self._next: MutableMapping[int, int] = SlotView(blocks, NEXT)    # 0 = none (last)
        self._home: MutableMapping[int, int] = SlotView(blocks, HOME)    # stream << 1 | small
        self._req: MutableMapping[int, int] = RequestedView(blocks)      # allocated -> request
        self._unmapped: MutableSet[int] = UnmappedView(blocks)           # expandable only
        self._gc_base: dict[int, int] = {}       # free block -> pool's search count at insertion
        # Free mapped blocks per pool key, as sorted keys size << 52 | address.
        self._free: dict[int, list[int]] = {}
        self._unmapped_lists: dict[int, list[int]] = {}   # pool key -> sorted unmapped addresses
        self.segment_map: dict[int, Segment] = {}         # base -> segment
        self._es_bases: list[int] = []                    # sorted bases of expandable segments
        self._gc_calls = [0, 0]                           # get_free_block calls: [large, small]

        # Counters for memory_stats() (PyTorch's names in comments); those of
        # MEMORY_STATS_ONLY exist only while memory_stats_kept (see _keep_memory_stats_only).
        self.memory_stats_kept = True
        self.peak_bytes_in_use = 0                # allocated_bytes.all.peak
        self.allocated_total = 0                  # allocated_bytes.all.allocated
        self.requested = 0                        # requested_bytes.all.current
        self.peak_requested = 0
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

    def _keep_memory_stats_only(self, keep: bool) -> None:
        """Create the MEMORY_STATS_ONLY counters at zero (``keep``), or delete them. Only on a
        fresh allocator: a peak or total missed before cannot be recounted."""
        if keep:
            for name in MEMORY_STATS_ONLY:
                setattr(self, name, 0)
        else:
            for name in MEMORY_STATS_ONLY:
                if hasattr(self, name):
                    delattr(self, name)
        self.memory_stats_kept = keep

    # -- block bookkeeping (off the hot path) ------------------------------------------
    def _remove_free(self, block: list) -> None:
        keys = self._free[block[HOME]]
        del keys[bisect_left(keys, block[SIZE] << SHIFT | block[ADDRESS])]

    def _insert_free(self, block: list) -> None:
        """BlockPool::insert_into_blocks: into the free list, stamped with the search count."""
        pool_key = block[HOME]
        insort(self._free.setdefault(pool_key, []), block[SIZE] << SHIFT | block[ADDRESS])
        if self._gc_on:
            self._gc_base[block[ADDRESS]] = self._gc_calls[pool_key & 1]

    def _forget(self, block: list) -> None:
        address = block[ADDRESS]
        del self.block_map.record[address]
        self._gc_base.pop(address, None)

    def _new_segment(self, segment: Segment) -> list:
        """The segment's one block, free and mapped (the caller unmaps it or hands it out)."""
        base = segment.base
        self.segment_map[base] = segment
        block = self.block_map.record[base] = [segment.size, None, None, segment.pool_key, 0,
                                               base]
        return block

    def _reserved_change(self, nbytes: int) -> None:
        self.pool_bytes += nbytes
        if nbytes > 0:
            self.reserved_total += nbytes
            if self.pool_bytes > self.peak_pool_bytes:
                self.peak_pool_bytes = self.pool_bytes

    def _oversize_allocation(self) -> None:
        self.oversize_allocations += 1
        self.oversize_allocations_total += 1
        if self.oversize_allocations > self.peak_oversize_allocations:
            self.peak_oversize_allocations = self.oversize_allocations

    def _links(self, slot: int) -> dict[int, int]:
        """Block address → its PREV or NEXT neighbour's address (0 = none), as a plain dict."""
        return {address: 0 if block[slot] is None else block[slot][ADDRESS]
                for address, block in self.block_map.record.items()}

    def check(self) -> None:
        """Assert the block invariants: every record sits at its own address and links only
        to the records of the table; blocks tile their segments (links, contiguity, no
        strays) and carry their segment's pool key; allocated blocks are mapped and hold their
        request; each free list is strictly ascending and holds exactly the free mapped blocks
        of its pool, at their sizes; no two neighbouring blocks are both free and mapped
        (free_block merged them); non-expandable segments are mapped whole; garbage-collection
        stamps exist for every free block exactly when GC is on; and every current counter of
        memory_stats() agrees with a recount (allocated, requested, reserved, segments,
        inactive splits, oversize blocks and segments), peaks ≥ current values — those of
        MEMORY_STATS_ONLY when kept, and none of them held (stale) when not. O(n log n)."""
        record = self.block_map.record
        for address, block in record.items():
            if block[ADDRESS] != address:
                fail(f"pytorch: the record at {address:#x} says it is at {block[ADDRESS]:#x}")
            for link in block[PREV], block[NEXT]:
                if link is not None and record.get(link[ADDRESS]) is not link:
                    fail(f"pytorch: block {address:#x} links to a record not in the table")
        segment_of = check_tiling({b: s.size for b, s in self.segment_map.items()},
                                  {a: block[SIZE] for a, block in record.items()},
                                  self._links(PREV), self._links(NEXT), none=0)
        require(all(block[HOME] is not None for block in record.values()),
                "pytorch: a block lacks its pool key")
        for address, base in segment_of.items():
            block = record[address]
            if block[HOME] != self.segment_map[base].pool_key:
                fail(f"pytorch: block {address:#x} is in a pool not its segment's")
            if block[SIZE] % K_MIN_BLOCK_SIZE:
                fail(f"pytorch: block {address:#x} is not a multiple of 512 bytes")
        for address in self.block_map.strays:
            fail(f"pytorch: allocated block {address:#x} is unknown or unmapped")
        for address, block in record.items():
            requested = block[REQ]
            if requested and requested != UNMAPPED and not 0 < requested <= block[SIZE]:
                fail(f"pytorch: block {address:#x} holds less than its request of {requested}")
        free = {a for a, block in record.items() if not block[REQ]}
        listed: set[int] = set()
        for pool_key, keys in self._free.items():
            for before, key in pairwise(keys):
                if before >= key:
                    fail(f"pytorch: free list of pool {pool_key} is not strictly ascending")
            for key in keys:
                address = key & MASK
                if address not in free or address in listed:
                    fail(f"pytorch: free list of pool {pool_key} holds {address:#x}, not a "
                         "free mapped block or listed twice")
                block = record[address]
                if block[SIZE] != key >> SHIFT or block[HOME] != pool_key:
                    fail(f"pytorch: free-list key of {address:#x} disagrees with its size "
                         "or pool")
                listed.add(address)
        if listed != free:
            fail(f"pytorch: {len(free - listed)} free blocks are in no free list")
        for address in free:
            after = record[address][NEXT]
            if after is not None and not after[REQ]:
                fail(f"pytorch: neighbouring free blocks {address:#x} and {after[ADDRESS]:#x} "
                     "not merged")
        if self._gc_on:
            for address in free:
                stamp = self._gc_base.get(address)
                if stamp is None or stamp > self._gc_calls[record[address][HOME] & 1]:
                    fail(f"pytorch: free block {address:#x} lacks a valid GC stamp")
        else:
            require(not self._gc_base, "pytorch: GC stamps kept with garbage collection off")
        self._check_counters(free)

    def _check_counters(self, free: set[int]) -> None:
        blocks = self.block_map.record.values()
        allocated = [block for block in blocks if block[REQ] > 0]
        require(self.bytes_in_use == sum(block[SIZE] for block in allocated),
                f"pytorch: bytes_in_use {self.bytes_in_use} is not the allocated blocks' sum")
        require(self.requested == sum(block[REQ] for block in allocated),
                "pytorch: requested bytes are not the allocated blocks' requests")
        require(self.num_allocs - self.num_frees == len(allocated),
                "pytorch: allocs − frees is not the number of allocated blocks")
        mapped = sum(block[SIZE] for block in blocks if block[REQ] != UNMAPPED)
        require(self.pool_bytes == mapped, f"pytorch: reserved {self.pool_bytes} is not the "
                f"mapped blocks' sum {mapped}")
        plain = [s for s in self.segment_map.values() if not s.expandable]
        require(self.num_segments == len(plain), "pytorch: segment count disagrees")
        require(self.oversize_segments == sum(s.size >= self.max_split_size for s in plain),
                "pytorch: oversize segment count disagrees")
        require(self.oversize_allocations == sum(block[SIZE] >= self.max_split_size
                                                 for block in allocated),
                "pytorch: oversize allocation count disagrees")
        peaks = [(self.bytes_in_use, self.peak_bytes_in_use),
                 (self.pool_bytes, self.peak_pool_bytes), (self.num_segments, self.peak_segments),
                 (self.oversize_allocations, self.peak_oversize_allocations),
                 (self.oversize_segments, self.peak_oversize_segments)]
        held = [name for name in MEMORY_STATS_ONLY if hasattr(self, name)]
        if not self.memory_stats_kept:
            require(not held, f"pytorch: {held} held while memory_stats() is not kept (stale)")
        else:
            require(len(held) == len(MEMORY_STATS_ONLY),
                    "pytorch: a counter of memory_stats() is missing while it is kept")
            chain = self.block_map.chain
            split_free = [block for s in plain if self.block_map.record[s.base][NEXT]
                          for block in chain(s.base) if block[ADDRESS] in free]
            require(self.inactive_split == len(split_free),
                    f"pytorch: inactive_split {self.inactive_split} is not the "
                    f"{len(split_free)} free blocks of split segments")
            require(self.inactive_split_bytes == sum(block[SIZE] for block in split_free),
                    "pytorch: inactive_split_bytes disagrees with the free blocks of split "
                    "segments")
            peaks += [(self.requested, self.peak_requested), (len(allocated),
                                                              self.peak_allocations),
                      (self.inactive_split, self.peak_inactive_split),
                      (self.inactive_split_bytes, self.peak_inactive_split_bytes)]
        for current, peak in peaks:
            if peak < current:
                fail(f"pytorch: a peak ({peak}) below its current value ({current})")
