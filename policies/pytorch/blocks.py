"""PyTorch caching allocator: blocks, segments and the free lists per pool.

:class:`BlockPools` is the allocator's memory as CUDACachingAllocator.cpp's
DeviceCachingAllocator keeps it: every block (:class:`~allocsim.policies.pytorch.records.Block`,
by address in :attr:`BlockPools.block_map`), every segment (:class:`Segment`, by base), and per
(stream, pool) key — ``stream << 1 | small`` — one free list: a plain sorted list of
``size << 52 | address`` keys, PyTorch's BlockPool ordered by (stream, size, address). With
garbage collection on it also keeps each free block's stamp (its pool's search count when it
entered the free list). Blocks tile their segment through their prev/next links (None at the
segment's ends). It holds no counter (policies/pytorch/stats.py's DeviceStats) and no setting
but whether garbage collection stamps blocks; its steps cost O(log k) bisection + O(k) list
insertion/deletion (k = free blocks of the pool), and :meth:`BlockPools.check` asserts its
invariants. The address-keyed tables ``size``, ``prev``, ``next``, ``pool_key``, ``requested``
and ``unmapped`` are views of the blocks, for check()'s readers and the tests.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import MutableMapping, MutableSet
from itertools import pairwise

from allocsim.policies.base import fail, require
from allocsim.policies.chunks import check_tiling
from allocsim.policies.pytorch.records import (
    UNMAPPED,
    Block,
    BlockMap,
    RequestedView,
    SlotView,
    UnmappedView,
)
from allocsim.policies.pytorch.settings import K_MIN_BLOCK_SIZE

SHIFT = 52                           # free-list key = size << 52 | address (addresses < 2**52)
MASK = (1 << SHIFT) - 1


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


class BlockPools:
    """Blocks, segments, free lists and garbage-collection stamps (module docstring)."""

    def __init__(self, gc_on: bool) -> None:
        # Blocks (allocated, free, unmapped), keyed by address, neighbours linked.
        self.block_map = BlockMap()
        self.record = self.block_map.record
        # The same blocks as address-keyed tables (views: a write through one changes them).
        blocks = self.block_map
        self.size: MutableMapping[int, int] = SlotView(blocks, "size")
        self.prev: MutableMapping[int, int] = SlotView(blocks, "prev")    # 0 = none (first)
        self.next: MutableMapping[int, int] = SlotView(blocks, "next")    # 0 = none (last)
        self.pool_key: MutableMapping[int, int] = SlotView(blocks, "pool_key")
        self.requested: MutableMapping[int, int] = RequestedView(blocks)   # allocated -> request
        self.unmapped: MutableSet[int] = UnmappedView(blocks)             # expandable only
        # Free mapped blocks per pool key, as sorted keys size << 52 | address.
        self.free_lists: dict[int, list[int]] = {}
        self.segment_map: dict[int, Segment] = {}                 # base -> segment
        # Garbage collection's clock: get_free_block calls per pool kind ([large, small]), and
        # each free block's reading of it when it entered its free list (only with GC on).
        self.gc_on = gc_on
        self.gc_searches = [0, 0]
        self.gc_stamps: dict[int, int] = {}

    # -- the free lists ------------------------------------------------------------------
    def free_list(self, pool_key: int) -> list[int]:
        """The free list of ``pool_key``, made empty on first use."""
        keys = self.free_lists.get(pool_key)
        if keys is None:
            keys = self.free_lists[pool_key] = []
        return keys

    def insert_free(self, block: Block) -> None:
        """BlockPool::insert_into_blocks: into the free list, stamped with the search count."""
        pool_key = block.pool_key
        insort(self.free_list(pool_key), block.size << SHIFT | block.address)
        if self.gc_on:
            self.gc_stamps[block.address] = self.gc_searches[pool_key & 1]

    def remove_free(self, block: Block) -> None:
        keys = self.free_lists[block.pool_key]
        del keys[bisect_left(keys, block.size << SHIFT | block.address)]

    def forget(self, block: Block) -> None:
        """The block is no more (merged into a neighbour, or its segment went back)."""
        address = block.address
        del self.record[address]
        self.gc_stamps.pop(address, None)

    def new_segment(self, segment: Segment) -> Block:
        """The segment's one block, free and mapped (the caller unmaps it or hands it out)."""
        base = segment.base
        self.segment_map[base] = segment
        block = self.record[base] = Block(segment.size, None, None, segment.pool_key, 0, base)
        return block

    def lay_out(self, base: int, pool_key: int, sizes: list[int]) -> list[Block]:
        """Blocks of ``sizes`` from ``base`` on, linked in order, in pool ``pool_key``, free and
        mapped and in no free list (the first replaces the block at ``base``)."""
        record = self.record
        blocks: list[Block] = []
        previous: Block | None = None
        address = base
        for size in sizes:
            block = record[address] = Block(size, previous, None, pool_key, 0, address)
            if previous is not None:
                previous.next = block
            blocks.append(block)
            previous = block
            address += size
        return blocks

    # -- invariants -----------------------------------------------------------------------
    def _links(self, field: str) -> dict[int, int]:
        """Block address → its prev or next neighbour's address (0 = none), as a plain dict."""
        return {address: 0 if getattr(block, field) is None else getattr(block, field).address
                for address, block in self.record.items()}

    def check(self) -> None:
        """Assert the block invariants: every block sits at its own address and links only to
        blocks of the table; blocks tile their segments (links, contiguity, no strays) and
        carry their segment's pool key; allocated blocks are mapped and hold their request;
        each free list is strictly ascending and holds exactly the free mapped blocks of its
        pool, at their sizes; no two neighbouring blocks are both free and mapped (free_block
        merged them); garbage-collection stamps exist for every free block exactly when GC is
        on. O(n log n)."""
        record = self.record
        for address, block in record.items():
            if block.address != address:
                fail(f"pytorch: the block at {address:#x} says it is at {block.address:#x}")
            for link in block.prev, block.next:
                if link is not None and record.get(link.address) is not link:
                    fail(f"pytorch: block {address:#x} links to a block not in the table")
        segment_of = check_tiling({b: s.size for b, s in self.segment_map.items()},
                                  {a: block.size for a, block in record.items()},
                                  self._links("prev"), self._links("next"), none=0)
        require(all(block.pool_key is not None for block in record.values()),
                "pytorch: a block lacks its pool key")
        for address, base in segment_of.items():
            block = record[address]
            if block.pool_key != self.segment_map[base].pool_key:
                fail(f"pytorch: block {address:#x} is in a pool not its segment's")
            if block.size % K_MIN_BLOCK_SIZE:
                fail(f"pytorch: block {address:#x} is not a multiple of 512 bytes")
        for address in self.block_map.strays:
            fail(f"pytorch: allocated block {address:#x} is unknown or unmapped")
        for address, block in record.items():
            requested = block.requested
            if requested and requested != UNMAPPED and not 0 < requested <= block.size:
                fail(f"pytorch: block {address:#x} holds less than its request of {requested}")
        free = {a for a, block in record.items() if not block.requested}
        listed: set[int] = set()
        for pool_key, keys in self.free_lists.items():
            for before, key in pairwise(keys):
                if before >= key:
                    fail(f"pytorch: free list of pool {pool_key} is not strictly ascending")
            for key in keys:
                address = key & MASK
                if address not in free or address in listed:
                    fail(f"pytorch: free list of pool {pool_key} holds {address:#x}, not a "
                         "free mapped block or listed twice")
                block = record[address]
                if block.size != key >> SHIFT or block.pool_key != pool_key:
                    fail(f"pytorch: free-list key of {address:#x} disagrees with its size "
                         "or pool")
                listed.add(address)
        if listed != free:
            fail(f"pytorch: {len(free - listed)} free blocks are in no free list")
        for address in free:
            after = record[address].next
            if after is not None and not after.requested:
                fail(f"pytorch: neighbouring free blocks {address:#x} and {after.address:#x} "
                     "not merged")
        if self.gc_on:
            for address in free:
                stamp = self.gc_stamps.get(address)
                pool_key = record[address].pool_key
                if stamp is None or pool_key is None or stamp > self.gc_searches[pool_key & 1]:
                    fail(f"pytorch: free block {address:#x} lacks a valid GC stamp")
        else:
            require(not self.gc_stamps, "pytorch: GC stamps kept with garbage collection off")
