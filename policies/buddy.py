"""The binary buddy system (Knowlton 1965; Knuth, TAOCP vol. 1 §2.5, algorithms R and S).

A classic policy beyond best fit, to show the interface holds for it:

- a request takes a block of 2^k bytes, the smallest power of two ≥ max(size, min_block);
- memory comes in arenas of ``arena`` bytes (a power of two), cudaMalloc'd on demand; a block
  larger than an arena gets an arena of its own, of exactly its (power-of-two) size;
- allocation (algorithm R): take a free block of the smallest order j ≥ k that has one,
  splitting it in halves down to order k; each split leaves the upper half free (the
  "buddy"); the caller keeps the low half. With no free block of any order ≥ k, a new arena
  is reserved and split the same way;
- free (algorithm S): while the block's buddy — at ``base + ((address − base) XOR size)``
  inside the same arena — is free and of the same order, merge them; a merged arena is one free
  block again;
- free lists are LIFO stacks per order (Knuth's AVAIL[k]); a dict per order keeps them
  (address → arena base), so "is my buddy free at this order?" is one lookup and ``popitem``
  takes the most recently freed block, as Knuth's list head does.

Memory kept: with ``release=false`` (the default) arenas are kept once wholly free, and
``empty_cache()`` returns them; with ``release=true`` an arena goes back to the device the
moment it is wholly free. When the device refuses a new arena, this model (not Knuth) first
returns wholly free arenas and asks again, then asks for halves of the arena down to the block
size — so a small device still serves small blocks.

Every block is a power of two: internal fragmentation up to ~50% by design; that, and
buddies that cannot merge because a neighbour that is not their buddy is free, are what the
policy shows against best fit.

Costs (orders are at most 64): malloc is O(1) to find the smallest non-empty order ≥ k (a
bitmask), O(1) ``popitem`` and O(j − k) splits; free is O(root − k) buddy lookups, each one
dict probe; a new arena or a release adds one device call. ``blocks()`` and ``check()`` are
O(n).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from allocsim.policies.base import (
    DeviceMemory,
    NativeTwin,
    Param,
    Policy,
    PolicyStats,
    fail,
    params_of,
    require,
)

MAX_ORDERS = 64


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


class BuddyAllocator(Policy):
    name = "buddy"
    capacity_use = "limit"         # never reads it; on a refusal: free arenas, then halves
    native = NativeTwin("buddy", "buddy.hpp")
    description = "binary buddy system (Knuth): power-of-two blocks split by halves, buddies merge"
    def __init__(self, device: DeviceMemory, min_block: int = 512, arena: int = 64 << 20,
                 release: bool = False) -> None:
        super().__init__(device)
        if not _is_power_of_two(min_block):
            raise ValueError(f"min_block must be a power of two, got {min_block}")
        if not _is_power_of_two(arena) or arena < min_block:
            raise ValueError(f"arena must be a power of two ≥ min_block, got {arena}")
        self.min_block = int(min_block)
        self.min_bits = self.min_block.bit_length() - 1     # log2(min_block)
        self.arena = int(arena)
        self.release = release
        # free[k]: free blocks of min_block << k bytes, address -> arena base (LIFO by insertion).
        self.free_lists: list[dict[int, int]] = [{} for _ in range(MAX_ORDERS)]
        self.nonempty = 0                        # bit k set <=> free_lists[k] is not empty
        self.in_use: dict[int, tuple[int, int]] = {}   # address -> (order, arena base)
        self.requested: dict[int, int] = {}
        self.arenas: dict[int, int] = {}         # arena base -> its order (root block)
        self.pool_bytes = 0
        self.peak_pool_bytes = 0
        self.peak_bytes_in_use = 0

    PARAMS: ClassVar[dict[str, Param]] = params_of(
        __init__,
        min_block=("size", "smallest block (a power of two)"),
        arena=("size", "arena taken from the device (a power of two)"),
        release=("bool", "cudaFree an arena as soon as it is wholly free"),
    )

    def order_of(self, size: int) -> int:
        """k such that min_block << k is the block for a request of ``size`` bytes."""
        return max(0, (size - 1).bit_length() - self.min_bits)

    # -- allocation (algorithm R) ----------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> int | None:
        if size <= 0:
            return None
        order = self.order_of(size)
        above = self.nonempty >> order
        if above:
            j = order + (above & -above).bit_length() - 1
        else:
            j = self._new_arena(order)
            if j < 0:
                self.num_ooms += 1
                return None
        free_lists = self.free_lists
        blocks = free_lists[j]
        address, base = blocks.popitem()
        if not blocks:
            self.nonempty &= ~(1 << j)
        min_block = self.min_block
        while j > order:               # split: keep the low half, free the upper one
            j -= 1
            free_lists[j][address + (min_block << j)] = base
            self.nonempty |= 1 << j
        self.in_use[address] = (order, base)
        self.requested[address] = size
        self.bytes_in_use += min_block << order
        if self.bytes_in_use > self.peak_bytes_in_use:
            self.peak_bytes_in_use = self.bytes_in_use
        self.num_allocs += 1
        return address

    def _new_arena(self, order: int) -> int:
        """Reserve an arena that holds a block of ``order``; it becomes one free block. Returns
        its order, or -1 if the device refuses even a block-sized one."""
        block = self.min_block << order
        nbytes = max(self.arena, block)
        base = self.device.reserve(nbytes)
        if base is None and self._release_free_arenas():
            base = self.device.reserve(nbytes)
        while base is None and nbytes > block:
            nbytes >>= 1
            base = self.device.reserve(nbytes)
        if base is None:
            return -1
        root = nbytes.bit_length() - 1 - self.min_bits
        self.arenas[base] = root
        self.free_lists[root][base] = base
        self.nonempty |= 1 << root
        self.pool_bytes += nbytes
        if self.pool_bytes > self.peak_pool_bytes:
            self.peak_pool_bytes = self.pool_bytes
        return root

    # -- free (algorithm S) ----------------------------------------------------------
    def free(self, address: int) -> None:
        order, base = self.in_use.pop(address)
        del self.requested[address]
        min_block = self.min_block
        self.bytes_in_use -= min_block << order
        self.num_frees += 1
        root = self.arenas[base]
        free_lists = self.free_lists
        while order < root:
            size = min_block << order
            buddy = base + ((address - base) ^ size)
            blocks = free_lists[order]
            if buddy not in blocks:
                break
            del blocks[buddy]
            if not blocks:
                self.nonempty &= ~(1 << order)
            if buddy < address:
                address = buddy
            order += 1
        if order == root and self.release:
            self._drop_arena(base)
            return
        free_lists[order][address] = base
        self.nonempty |= 1 << order

    def _drop_arena(self, base: int) -> None:
        root = self.arenas.pop(base)
        self.pool_bytes -= self.min_block << root
        self.device.release(base)

    def _release_free_arenas(self) -> bool:
        """cudaFree every wholly free arena (one free block at its base of its root order)."""
        released = False
        for base, root in list(self.arenas.items()):
            blocks = self.free_lists[root]
            if base in blocks:
                del blocks[base]
                if not blocks:
                    self.nonempty &= ~(1 << root)
                self._drop_arena(base)
                released = True
        return released

    def empty_cache(self) -> None:
        self._release_free_arenas()

    # -- views -----------------------------------------------------------------------
    def free_block_orders(self) -> dict[int, int]:
        """Every free block as address -> order."""
        return {address: order
                for order, blocks in enumerate(self.free_lists) for address in blocks}

    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        free = self.free_block_orders()
        for base in sorted(self.arenas):
            end = base + (self.min_block << self.arenas[base])
            address = base
            while address < end:
                if address in self.in_use:
                    size, used = self.min_block << self.in_use[address][0], True
                else:
                    size, used = self.min_block << free[address], False
                yield address, size, used
                address += size

    def check(self) -> None:
        """Assert: the blocks of each arena (in use, or in the free list of their order, both
        naming that arena) tile it, each aligned to its own size; no block is listed twice or
        outside an arena; the bitmask is set exactly for the non-empty orders; no free block's
        buddy is free at the same order (algorithm S merged them); with ``release`` no arena is
        wholly free; pool_bytes, bytes_in_use and allocs − frees agree with a recount; every
        block holds its request; peaks ≥ current values."""
        min_block = self.min_block
        for order, blocks in enumerate(self.free_lists):
            require(bool(self.nonempty >> order & 1) == bool(blocks),
                    f"buddy: bitmask bit {order} disagrees with the free list's emptiness")
        require(self.nonempty >> MAX_ORDERS == 0, "buddy: bitmask has bits beyond the orders")
        free = self.free_block_orders()
        require(len(free) == sum(len(blocks) for blocks in self.free_lists),
                "buddy: a block is in the free lists of two orders")
        seen = 0
        for base, root in self.arenas.items():
            end = base + (min_block << root)
            address = base
            while address < end:
                if address in self.in_use:
                    order, home = self.in_use[address]
                    if address in free:
                        fail(f"buddy: block {address:#x} is both in use and free")
                elif address in free:
                    order, home = free[address], self.free_lists[free[address]][address]
                    buddy = base + ((address - base) ^ (min_block << order))
                    if order < root and self.free_lists[order].get(buddy) == base:
                        fail(f"buddy: free buddies {address:#x} and {buddy:#x} of order {order} "
                             "not merged")
                    if self.release and order == root:
                        fail(f"buddy: wholly free arena {base:#x} kept with release=true")
                else:
                    fail(f"buddy: arena {base:#x} has no block at {address:#x}")
                size = min_block << order
                if home != base or (address - base) % size or address + size > end:
                    fail(f"buddy: block {address:#x} of order {order} is not a block of arena "
                         f"{base:#x}")
                seen += 1
                address += size
        require(seen == len(free) + len(self.in_use), "buddy: blocks listed outside any arena")
        require(self.requested.keys() == self.in_use.keys(),
                "buddy: the requested table is not the blocks in use")
        for address, size in self.requested.items():
            if not 0 < size <= min_block << self.in_use[address][0]:
                fail(f"buddy: block {address:#x} holds less than its request of {size}")
        require(self.pool_bytes == sum(min_block << root for root in self.arenas.values()),
                "buddy: pool_bytes is not the arenas' sum")
        require(self.bytes_in_use == sum(min_block << order for order, _ in self.in_use.values()),
                "buddy: bytes_in_use is not the blocks in use")
        require(self.num_allocs - self.num_frees == len(self.in_use),
                "buddy: allocs − frees is not the number of live blocks")
        require(self.peak_bytes_in_use >= self.bytes_in_use, "buddy: peak_bytes_in_use < current")
        require(self.peak_pool_bytes >= self.pool_bytes, "buddy: peak_pool_bytes < current")

    def native_numbers(self) -> dict[str, Any] | None:
        """BuddyConfig (native/src/buddy.hpp): the smallest block, the arena, release."""
        return {"min_block": self.min_block, "arena": self.arena, "release": bool(self.release)}

    def stats(self) -> PolicyStats:
        largest = self.min_block << (self.nonempty.bit_length() - 1) if self.nonempty else 0
        return PolicyStats(
            num_allocs=self.num_allocs, num_frees=self.num_frees, num_ooms=self.num_ooms,
            bytes_in_use=self.bytes_in_use, peak_bytes_in_use=self.peak_bytes_in_use,
            bytes_requested=sum(self.requested.values()), pool_bytes=self.pool_bytes,
            peak_pool_bytes=self.peak_pool_bytes, largest_free_block=largest,
            free_blocks=sum(len(blocks) for blocks in self.free_lists))
