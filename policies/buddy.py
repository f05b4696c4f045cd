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
"""

from __future__ import annotations

from collections.abc import Iterator

from allocsim.policies.base import DeviceMemory, Param, Policy, PolicyStats

MAX_ORDERS = 64


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


class BuddyAllocator(Policy):
    name = "buddy"
    description = "binary buddy system (Knuth): power-of-two blocks split by halves, buddies merge"
    PARAMS = {
        "min_block": Param("size", 512, "smallest block (a power of two)"),
        "arena": Param("size", 64 << 20, "arena taken from the device (a power of two)"),
        "release": Param("bool", False, "cudaFree an arena as soon as it is wholly free"),
    }

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

    def order_of(self, size: int) -> int:
        """k such that min_block << k is the block for a request of ``size`` bytes."""
        return max(0, (size - 1).bit_length() - self.min_bits)

    # -- allocation (algorithm R) ----------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> int | None:
        if size <= 0:
            return None
        order = (size - 1).bit_length() - self.min_bits
        if order < 0:
            order = 0
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

    def stats(self) -> PolicyStats:
        largest = self.min_block << (self.nonempty.bit_length() - 1) if self.nonempty else 0
        return PolicyStats(
            num_allocs=self.num_allocs, num_frees=self.num_frees, num_ooms=self.num_ooms,
            bytes_in_use=self.bytes_in_use, peak_bytes_in_use=self.peak_bytes_in_use,
            bytes_requested=sum(self.requested.values()), pool_bytes=self.pool_bytes,
            peak_pool_bytes=self.peak_pool_bytes, largest_free_block=largest,
            free_blocks=sum(len(blocks) for blocks in self.free_lists))
