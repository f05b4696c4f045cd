"""Chunks of device memory linked by address, with a best-fit index over the free ones.

The shared machinery of the coalescing allocators (BFC, preallocate, best-fit), in the spirit of
bfc_allocator.h's Chunk and Bin: memory arrives in regions; a region is cut into chunks that
tile it exactly; a chunk is either in use (handed to a caller) or free.

Invariants, kept by every method here:
- the chunks of a region tile it: each chunk's ``next`` starts where it ends, the last one ends
  at the region's end; chunks never link across regions (GPU regions never merge);
- no two neighbouring chunks are both free (freeing coalesces immediately);
- a chunk is in :attr:`ChunkMap.free_index` exactly when it is free.

Best-fit index (:class:`FreeIndex`): BFC's own structure — 21 bins by size class, each ordered
by (size, address); search bin(rounded), then the first chunk of the next non-empty bin. That
finds the smallest fitting chunk overall, lowest address on ties. tests/test_bfc.py checks it
against a literal walk; experiments/bench_replay.py chose plain lists per bin over a
SortedList of all free chunks (and over exact-size buckets, which real traces' ever-changing
remainder sizes defeat).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator

NONE = -1


KEY_SHIFT = 52          # key = size << 52 | address; device addresses stay below 2**52
NUM_BINS = 21           # BFC's bins: [256·2^b, 256·2^(b+1)), the last one open-ended


# Bin by bit length: BIN[n.bit_length()] == min(20, floor(log2(max(n, 256) >> 8))), one list
# lookup instead of arithmetic on the hot path.
BIN = [max(0, min(NUM_BINS - 1, bits - 9)) for bits in range(128)]


def bin_for_size(nbytes: int) -> int:
    """BFC's BinNumForSize: min(20, floor(log2(max(n, 256) >> 8)))."""
    return BIN[nbytes.bit_length()]


class FreeIndex:
    """Free chunks in BFC's 21 size-class bins, each a plain list of keys in ascending order.

    Costs (k = free chunks in the bin touched): add/remove O(log k) search + O(k) memmove in C;
    best_fit O(log k) plus a bitmask jump to the next non-empty bin. Plain lists with C
    ``bisect`` beat one big SortedList by ~3x here because bins stay small in real traces;
    the worst case (one bin with 10^5 free chunks) costs a memmove of ~1 MB per operation.
    """

    def __init__(self) -> None:
        self.bins: list[list[int]] = [[] for _ in range(NUM_BINS)]
        self.nonempty = 0   # bit b set <=> bins[b] has a chunk

    def __len__(self) -> int:
        return sum(len(keys) for keys in self.bins)

    def add(self, size: int, address: int) -> None:
        number = BIN[size.bit_length()]
        keys = self.bins[number]
        key = size << KEY_SHIFT | address
        if not keys:
            self.nonempty |= 1 << number
            keys.append(key)
        elif key > keys[-1]:
            keys.append(key)
        else:
            insort(keys, key)

    def remove(self, size: int, address: int) -> None:
        number = BIN[size.bit_length()]
        keys = self.bins[number]
        key = size << KEY_SHIFT | address
        position = bisect_left(keys, key)
        if position == len(keys) or keys[position] != key:
            raise KeyError(f"no free chunk of {size} bytes at {address:#x}")
        del keys[position]
        if not keys:
            self.nonempty &= ~(1 << number)

    def best_fit(self, rounded: int) -> tuple[int, int] | None:
        """``(address, size)`` of the smallest free chunk ≥ ``rounded``, lowest address first:
        search bin(rounded), then the first chunk of the next non-empty bin above it."""
        number = BIN[rounded.bit_length()]
        keys = self.bins[number]
        if keys:
            position = bisect_left(keys, rounded << KEY_SHIFT)
            if position < len(keys):
                key = keys[position]
                return key & ADDRESS_MASK, key >> KEY_SHIFT
        above = self.nonempty >> (number + 1)
        if not above:
            return None
        key = self.bins[number + (above & -above).bit_length()][0]
        return key & ADDRESS_MASK, key >> KEY_SHIFT

    def largest(self) -> int:
        if not self.nonempty:
            return 0
        return self.bins[self.nonempty.bit_length() - 1][-1] >> KEY_SHIFT

    def keys(self) -> Iterator[tuple[int, int]]:
        """Every free chunk as ``(size, address)``, bin by bin."""
        for keys in self.bins:
            for key in keys:
                yield key >> KEY_SHIFT, key & ADDRESS_MASK


ADDRESS_MASK = (1 << KEY_SHIFT) - 1


def walk_chunks(bases, size_of: dict[int, int], next_of: dict[int, int],
                in_use) -> Iterator[tuple[int, int, bool]]:
    """Every chunk of the regions starting at ``bases``, as ``(address, size, in_use)``, region
    by region in address order, following ``next_of`` links. O(n). Shared by every policy that
    keeps chunks linked by address (ChunkMap, the CuPy pool, the stream-ordered pool)."""
    for base in sorted(bases):
        address = base
        while address != NONE:
            yield address, size_of[address], address in in_use
            address = next_of[address]


class ChunkMap:
    """The chunks of all regions a policy holds. Every method states its cost (n = chunks)."""

    def __init__(self) -> None:
        self.size: dict[int, int] = {}          # chunk address -> chunk size
        self.prev: dict[int, int] = {}          # chunk address -> previous chunk in region, or NONE
        self.next: dict[int, int] = {}          # chunk address -> next chunk in region, or NONE
        self.in_use: set[int] = set()           # addresses of chunks handed out
        self.free_index = FreeIndex()           # the free chunks (see module docstring)
        self.regions: dict[int, int] = {}       # region base -> region size
        self.tail: dict[int, int] = {}          # region end -> last chunk of that region

    # -- regions ---------------------------------------------------------------------
    def add_region(self, base: int, nbytes: int) -> None:
        """A new region becomes one free chunk. O(log n)."""
        self.regions[base] = nbytes
        self.size[base] = nbytes
        self.prev[base] = NONE
        self.next[base] = NONE
        self.tail[base + nbytes] = base
        self.free_index.add(nbytes, base)

    def grow_region(self, base: int, extra: int) -> None:
        """Extend region ``base`` in place by ``extra`` bytes at its end (memory mapped behind
        it); the new space coalesces with a free last chunk. O(log n)."""
        end = base + self.regions[base]
        last = self.tail.pop(end)
        self.regions[base] += extra
        if last not in self.in_use:
            self.free_index.remove(self.size[last], last)
            self.size[last] += extra
            self.free_index.add(self.size[last], last)
            self.tail[end + extra] = last
        else:
            self.size[end] = extra
            self.prev[end] = last
            self.next[end] = NONE
            self.next[last] = end
            self.tail[end + extra] = end
            self.free_index.add(extra, end)

    def shrink_region(self, base: int, nbytes: int) -> None:
        """Cut ``nbytes`` off the end of region ``base``, whose last chunk must be free and at
        least that large (memory about to be unmapped). O(log n)."""
        end = base + self.regions[base]
        last = self.tail[end]
        size = self.size[last]
        if last in self.in_use or size < nbytes or nbytes >= self.regions[base]:
            raise ValueError("only free space at the end of a region, short of all of it, can go")
        del self.tail[end]
        self.regions[base] -= nbytes
        self.free_index.remove(size, last)
        if size == nbytes:
            before = self.prev.pop(last)
            del self.size[last], self.next[last]
            self.next[before] = NONE
            self.tail[end - nbytes] = before
        else:
            self.size[last] = size - nbytes
            self.free_index.add(size - nbytes, last)
            self.tail[end - nbytes] = last

    def last_chunk(self, base: int) -> tuple[int, int, bool]:
        """``(address, size, in_use)`` of the last chunk of region ``base``. O(1)."""
        last = self.tail[base + self.regions[base]]
        return last, self.size[last], last in self.in_use

    def region_is_free(self, base: int) -> bool:
        """True when the region is one free chunk. O(1)."""
        return base not in self.in_use and self.next[base] == NONE

    def remove_region(self, base: int) -> int:
        """Forget a wholly free region; returns its size. O(log n)."""
        if not self.region_is_free(base):
            raise ValueError(f"region {base:#x} still has chunks in use")
        nbytes = self.regions.pop(base)
        del self.tail[base + nbytes]
        self.free_index.remove(self.size.pop(base), base)
        del self.prev[base], self.next[base]
        return nbytes

    # -- allocation ------------------------------------------------------------------
    def best_fit(self, rounded: int) -> tuple[int, int] | None:
        """``(address, size)`` of the smallest free chunk ≥ ``rounded``, lowest address on
        ties; None when nothing fits. O(1) for an exact size, else O(log n)."""
        return self.free_index.best_fit(rounded)

    def take(self, address: int, chunk_size: int, rounded: int, split: bool) -> int:
        """Hand out free chunk ``address``; with ``split`` the caller keeps the low ``rounded``
        bytes and the rest becomes a free chunk. Returns the size handed out. O(log k).

        The free-index updates are FreeIndex.remove/add written out in place: this runs once
        per allocation and the calls cost more than the work.
        """
        index = self.free_index
        bins = index.bins
        number = BIN[chunk_size.bit_length()]
        keys = bins[number]
        key = chunk_size << KEY_SHIFT | address
        position = bisect_left(keys, key)
        if position == len(keys) or keys[position] != key:
            raise KeyError(f"no free chunk of {chunk_size} bytes at {address:#x}")
        del keys[position]
        if not keys:
            index.nonempty &= ~(1 << number)
        self.in_use.add(address)
        if not split or chunk_size == rounded:
            return chunk_size
        rest = address + rounded
        rest_size = chunk_size - rounded
        after = self.next[address]
        self.size[address] = rounded
        self.size[rest] = rest_size
        self.prev[rest] = address
        self.next[rest] = after
        self.next[address] = rest
        if after != NONE:
            self.prev[after] = rest
        else:
            self.tail[rest + rest_size] = rest
        # The chunk after a free chunk is never free (invariant), so no merge is needed here.
        number = BIN[rest_size.bit_length()]
        keys = bins[number]
        key = rest_size << KEY_SHIFT | rest
        if not keys:
            index.nonempty |= 1 << number
            keys.append(key)
        elif key > keys[-1]:
            keys.append(key)
        else:
            insort(keys, key)
        return rounded

    def give_back(self, address: int) -> int:
        """Free chunk ``address``: merge with the next chunk if free, then the previous one
        (BFC's order); returns the freed chunk's size before merging. O(log k).

        Free-index updates written out in place, as in :meth:`take`.
        """
        in_use = self.in_use
        in_use.remove(address)
        size_of, next_of, prev_of = self.size, self.next, self.prev
        index = self.free_index
        bins = index.bins
        freed = size_of[address]
        size = freed
        after = next_of[address]
        if after != NONE and after not in in_use:
            merged = after
            merged_size = size_of.pop(merged)
            number = BIN[merged_size.bit_length()]
            keys = bins[number]
            del keys[bisect_left(keys, merged_size << KEY_SHIFT | merged)]
            if not keys:
                index.nonempty &= ~(1 << number)
            size += merged_size
            after = next_of.pop(merged)
            del prev_of[merged]
            next_of[address] = after
            if after != NONE:
                prev_of[after] = address
        before = prev_of[address]
        if before != NONE and before not in in_use:
            before_size = size_of[before]
            number = BIN[before_size.bit_length()]
            keys = bins[number]
            del keys[bisect_left(keys, before_size << KEY_SHIFT | before)]
            if not keys:
                index.nonempty &= ~(1 << number)
            del size_of[address], prev_of[address], next_of[address]
            address = before
            size += before_size
            next_of[address] = after
            if after != NONE:
                prev_of[after] = address
        size_of[address] = size
        if after == NONE:
            self.tail[address + size] = address
        number = BIN[size.bit_length()]
        keys = bins[number]
        key = size << KEY_SHIFT | address
        if not keys:
            index.nonempty |= 1 << number
            keys.append(key)
        elif key > keys[-1]:
            keys.append(key)
        else:
            insort(keys, key)
        return freed

    # -- views -----------------------------------------------------------------------
    def largest_free(self) -> int:
        """Size of the largest free chunk (0 if none). O(log n)."""
        return self.free_index.largest()

    def chunks(self) -> Iterator[tuple[int, int, bool]]:
        """Every chunk as ``(address, size, in_use)``, region by region in address order. O(n)."""
        return walk_chunks(self.regions, self.size, self.next, self.in_use)

    def region_chunks(self, base: int) -> Iterator[int]:
        address = base
        while address != NONE:
            yield address
            address = self.next[address]
