"""Chunks of device memory linked by address, with a best-fit index over the free ones.

The shared machinery of the coalescing allocators (BFC, preallocate, best-fit), in the spirit of
bfc_allocator.h's Chunk and Bin: memory arrives in regions; a region is cut into chunks that
tile it exactly; a chunk is either in use (handed to a caller) or free.

Invariants, kept by every method here and asserted by :meth:`ChunkMap.check`:
- the chunks of a region tile it: each chunk's ``next`` starts where it ends, the last one ends
  at the region's end; chunks never link across regions (GPU regions never merge);
- no two neighbouring chunks are both free (freeing coalesces immediately);
- a chunk is in :attr:`ChunkMap.free_index` exactly when it is free.

Best-fit index (:class:`FreeIndex`): BFC's own structure — 21 bins by size class, each a plain
sorted list of (size, address) keys; search bin(rounded), then the first chunk of the next
non-empty bin. That finds the smallest fitting chunk overall, lowest address on ties.
tests/test_bfc.py checks it against a literal walk; experiments/bench_replay.py chose plain
lists per bin over a SortedList of all free chunks (and over exact-size buckets, which real
traces' ever-changing remainder sizes defeat).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Collection, Iterable, Iterator, Mapping
from itertools import pairwise

from allocsim.policies.base import fail, require

NONE = -1

# A free chunk's key: size << KEY_SHIFT | address, so that integer order is (size, address)
# order and a key decodes without a lookup (size = key >> KEY_SHIFT, address = key &
# ADDRESS_MASK). Device addresses stay below 2**52. FreeIndex packs and unpacks keys, and so do
# the hot paths that write its operations out (ChunkMap.allocate/give_back, cuda-async's
# sync=free take and give-back), each held to FreeIndex's own methods by a test.
KEY_SHIFT = 52
ADDRESS_MASK = (1 << KEY_SHIFT) - 1
NUM_BINS = 21           # BFC's bins: [256·2^b, 256·2^(b+1)), the last one open-ended


# Bin by bit length: BIN[n.bit_length()] == min(20, floor(log2(max(n, 256) >> 8))), one list
# lookup instead of arithmetic on the hot path.
BIN = [max(0, min(NUM_BINS - 1, bits - 9)) for bits in range(128)]


def bin_for_size(nbytes: int) -> int:
    """BFC's BinNumForSize: min(20, floor(log2(max(n, 256) >> 8)))."""
    return BIN[nbytes.bit_length()]


class FreeIndex:
    """Free chunks in BFC's 21 size-class bins, each a plain list of keys in ascending order,
    with a bitmask of the non-empty bins.

    Costs, k = free chunks in the bin touched: :meth:`add` and :meth:`remove` O(log k)
    bisection + O(k) list insertion/deletion (a memmove in C; O(1) when appending the largest
    key); :meth:`best_fit` O(log k) bisection plus an O(1) bitmask jump to the next non-empty
    bin; :meth:`pop_best_fit` that plus the O(k) deletion. Plain lists with C ``bisect`` beat one
    big SortedList here because bins stay small in real traces; the worst case (one bin with
    10^5 free chunks) costs a memmove of ~1 MB per operation.
    """

    def __init__(self) -> None:
        self.bins: list[list[int]] = [[] for _ in range(NUM_BINS)]
        self.nonempty = 0   # bit b set <=> bins[b] has a chunk

    def __len__(self) -> int:
        """Number of free chunks. O(number of bins)."""
        return sum(len(keys) for keys in self.bins)

    def add(self, size: int, address: int) -> None:
        """Index free chunk ``address`` of ``size`` bytes."""
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
        """Take free chunk ``address`` of ``size`` bytes out; KeyError if it is not indexed."""
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

    def pop_best_fit(self, rounded: int) -> tuple[int, int] | None:
        """:meth:`best_fit`, and the chunk found leaves the index (one search, not two)."""
        number = BIN[rounded.bit_length()]
        keys = self.bins[number]
        if keys:
            position = bisect_left(keys, rounded << KEY_SHIFT)
            if position < len(keys):
                key = keys.pop(position)
                if not keys:
                    self.nonempty &= ~(1 << number)
                return key & ADDRESS_MASK, key >> KEY_SHIFT
        above = self.nonempty >> (number + 1)
        if not above:
            return None
        number += (above & -above).bit_length()
        keys = self.bins[number]
        key = keys.pop(0)
        if not keys:
            self.nonempty &= ~(1 << number)
        return key & ADDRESS_MASK, key >> KEY_SHIFT

    def largest(self) -> int:
        """Size of the largest free chunk (0 if none). O(1)."""
        if not self.nonempty:
            return 0
        return self.bins[self.nonempty.bit_length() - 1][-1] >> KEY_SHIFT

    def keys(self) -> Iterator[tuple[int, int]]:
        """Every free chunk as ``(size, address)``, bin by bin. O(n)."""
        for keys in self.bins:
            for key in keys:
                yield key >> KEY_SHIFT, key & ADDRESS_MASK

    def check(self) -> None:
        """Assert: each bin strictly ascending (no chunk twice), each key in the bin of its
        size, addresses below 2**52, and the bitmask set exactly for the non-empty bins. O(n)."""
        require(self.nonempty >> NUM_BINS == 0, "FreeIndex: bitmask has bits beyond the bins")
        for number, keys in enumerate(self.bins):
            require(bool(self.nonempty >> number & 1) == bool(keys),
                    f"FreeIndex: bitmask bit {number} disagrees with the bin's emptiness")
            for before, key in pairwise(keys):
                if before >= key:
                    fail(f"FreeIndex: bin {number} not strictly ascending at {key:#x}")
            for key in keys:
                size = key >> KEY_SHIFT
                if size <= 0 or BIN[size.bit_length()] != number:
                    fail(f"FreeIndex: a chunk of {size} bytes sits in bin {number}")


def walk_chunks(bases: Iterable[int], size_of: Mapping[int, int], next_of: Mapping[int, int],
                in_use: Collection[int]) -> Iterator[tuple[int, int, bool]]:
    """Every chunk of the regions starting at ``bases``, as ``(address, size, in_use)``, region
    by region in address order, following ``next_of`` links. O(n). Shared by every policy that
    keeps chunks linked by address (ChunkMap, the CuPy pool, the stream-ordered pool)."""
    for base in sorted(bases):
        address = base
        while address != NONE:
            yield address, size_of[address], address in in_use
            address = next_of[address]


def check_tiling(regions: Mapping[int, int], size_of: Mapping[int, int],
                 prev_of: Mapping[int, int], next_of: Mapping[int, int],
                 none: int = NONE) -> dict[int, int]:
    """Assert that linked chunks tile their regions exactly and nothing else: from each
    region's base the ``next`` links visit chunks that each start where the one before ends,
    with ``prev`` links mirroring them, and the last one ends at the region's end; regions do
    not overlap; every chunk known to ``size_of``/``prev_of``/``next_of`` is in some region.
    ``none`` marks "no neighbour". Returns ``{chunk: its region's base}``. O(n log n)."""
    home: dict[int, int] = {}
    end_before = -1
    for base in sorted(regions):
        end = base + regions[base]
        require(base >= end_before, f"regions overlap at {base:#x}")
        end_before = end
        require(prev_of.get(base, 0) == none, f"region {base:#x}: first chunk has a prev link")
        address, previous = base, none
        while address != none:
            if address in home:
                fail(f"region {base:#x}: chunk {address:#x} reached twice (a link cycle)")
            if address not in size_of or address not in prev_of or address not in next_of:
                fail(f"region {base:#x}: chunk {address:#x} lacks its size or links")
            if prev_of[address] != previous:
                fail(f"region {base:#x}: chunk {address:#x}'s prev link is not the chunk "
                     "before it")
            size = size_of[address]
            if size <= 0:
                fail(f"region {base:#x}: chunk {address:#x} has size {size}")
            home[address] = base
            following = next_of[address]
            if following != none and following != address + size:
                fail(f"region {base:#x}: chunk {address:#x}+{size} is not followed by the chunk "
                     f"at its end (next is {following:#x})")
            if following == none and address + size != end:
                fail(f"region {base:#x}: its chunks end at {address + size:#x}, not at its end "
                     f"{end:#x}")
            previous, address = address, following
    for name, table in (("size", size_of), ("prev", prev_of), ("next", next_of)):
        if len(table) != len(home):
            strays = sorted(set(table) - set(home))[:3]
            fail(f"{name} table holds {len(table)} chunks, the regions {len(home)} "
                 f"(strays: {[hex(a) for a in strays]})")
    return home


class ChunkMap:
    """The chunks of all regions a policy holds. Every method states its cost: n = chunks,
    k = free chunks in the FreeIndex bin touched (see :class:`FreeIndex`)."""

    def __init__(self) -> None:
        self.size: dict[int, int] = {}          # chunk address -> chunk size
        self.prev: dict[int, int] = {}          # chunk address -> previous chunk in region, or NONE
        self.next: dict[int, int] = {}          # chunk address -> next chunk in region, or NONE
        self.in_use: set[int] = set()           # addresses of chunks handed out
        self.free_index = FreeIndex()           # the free chunks (see module docstring)
        self.regions: dict[int, int] = {}       # region base -> region size
        self.tail: dict[int, int] = {}          # region end -> last chunk of that region
        # Bound once: the free-index calls of hand_out and give_back, the hot path.
        self._index_add = self.free_index.add
        self._index_remove = self.free_index.remove

    # -- regions ---------------------------------------------------------------------
    def add_region(self, base: int, nbytes: int) -> None:
        """A new region becomes one free chunk. O(log k + k)."""
        self.regions[base] = nbytes
        self.size[base] = nbytes
        self.prev[base] = NONE
        self.next[base] = NONE
        self.tail[base + nbytes] = base
        self.free_index.add(nbytes, base)

    def grow_region(self, base: int, extra: int) -> None:
        """Extend region ``base`` in place by ``extra`` bytes at its end (memory mapped behind
        it); the new space coalesces with a free last chunk. O(log k + k)."""
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
        least that large (memory about to be unmapped). O(log k + k)."""
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
        """Forget a wholly free region; returns its size. O(log k + k)."""
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
        ties; None when nothing fits. O(log k) bisection + an O(1) jump between bins."""
        return self.free_index.best_fit(rounded)

    def take(self, address: int, chunk_size: int, rounded: int, split: bool) -> int:
        """Hand out free chunk ``address`` (still in the free index): :meth:`hand_out` after
        taking it out of the index. O(log k + k)."""
        self._index_remove(chunk_size, address)
        return self.hand_out(address, chunk_size, rounded, split)

    def hand_out(self, address: int, chunk_size: int, rounded: int, split: bool) -> int:
        """Hand out free chunk ``address``, already out of the free index (as
        :meth:`FreeIndex.pop_best_fit` leaves it); with ``split`` the caller keeps the low
        ``rounded`` bytes and the rest becomes a free chunk. Returns the size handed out.
        O(1), plus O(log k + k) to index the rest of a split."""
        self.in_use.add(address)
        if not split or chunk_size == rounded:
            return chunk_size
        rest = address + rounded
        rest_size = chunk_size - rounded
        next_of = self.next
        after = next_of[address]
        self.size[address] = rounded
        self.size[rest] = rest_size
        self.prev[rest] = address
        next_of[rest] = after
        next_of[address] = rest
        if after != NONE:
            self.prev[after] = rest
        else:
            self.tail[rest + rest_size] = rest
        # The chunk after a free chunk is never free (invariant), so no merge is needed here.
        self._index_add(rest_size, rest)
        return rounded

    # -- the hot path, written out ----------------------------------------------------
    # :meth:`allocate` is FreeIndex.pop_best_fit then :meth:`hand_out`, and :meth:`give_back`
    # is :meth:`give_back_general`, with the FreeIndex bin searches, insertions and deletions
    # written inline (one Python call per malloc and per free instead of three to five; the
    # bins, keys and bitmask exactly as FreeIndex keeps them). The same decisions and the same
    # state: tests/test_chunk_fast_path.py holds each to its general composition on random
    # workloads, after every step.
    def allocate(self, rounded: int, max_slack: int) -> tuple[int, int] | None:
        """Take the smallest free chunk ≥ ``rounded`` (lowest address on ties) out of the
        index and hand it out, split when it is ≥ 2·``rounded`` or its slack is ≥
        ``max_slack`` (BFC's ShouldSplitChunk; 0 splits always). Returns ``(address, size
        handed out)`` or None when nothing fits. O(log k + k)."""
        index = self.free_index
        bins = index.bins
        number = BIN[rounded.bit_length()]
        keys = bins[number]
        position = bisect_left(keys, rounded << KEY_SHIFT) if keys else 0
        if position < len(keys):
            key = keys.pop(position)
        else:
            above = index.nonempty >> (number + 1)
            if not above:
                return None
            number += (above & -above).bit_length()
            keys = bins[number]
            key = keys.pop(0)
        if not keys:
            index.nonempty &= ~(1 << number)
        address = key & ADDRESS_MASK
        chunk_size = key >> KEY_SHIFT
        self.in_use.add(address)
        rest_size = chunk_size - rounded
        if not rest_size or (chunk_size < 2 * rounded and rest_size < max_slack):
            return address, chunk_size
        # hand_out's split: the caller keeps the low end, the rest becomes a free chunk.
        rest = address + rounded
        size_of, next_of = self.size, self.next
        after = next_of[address]
        size_of[address] = rounded
        size_of[rest] = rest_size
        self.prev[rest] = address
        next_of[rest] = after
        next_of[address] = rest
        if after != NONE:
            self.prev[after] = rest
        else:
            self.tail[rest + rest_size] = rest
        # FreeIndex.add(rest_size, rest)
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
        return address, rounded

    def give_back(self, address: int) -> int:
        """:meth:`give_back_general` with the free-index updates written out."""
        in_use = self.in_use
        in_use.remove(address)
        size_of, next_of, prev_of = self.size, self.next, self.prev
        index = self.free_index
        bins = index.bins
        freed = size_of[address]
        size = freed
        after = next_of[address]
        if after != NONE and after not in in_use:
            merged_size = size_of.pop(after)
            # FreeIndex.remove(merged_size, after): the key is there (a free chunk).
            number = BIN[merged_size.bit_length()]
            keys = bins[number]
            del keys[bisect_left(keys, merged_size << KEY_SHIFT | after)]
            if not keys:
                index.nonempty &= ~(1 << number)
            size += merged_size
            del prev_of[after]
            after = next_of.pop(after)
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

    # -- the general path ------------------------------------------------------------
    def give_back_general(self, address: int) -> int:
        """Free chunk ``address``: merge with the next chunk if free, then the previous one
        (BFC's order); returns the freed chunk's size before merging. O(1) link updates plus
        one FreeIndex remove per merged neighbour and one add, each O(log k + k)."""
        in_use = self.in_use
        in_use.remove(address)
        size_of, next_of, prev_of = self.size, self.next, self.prev
        freed = size_of[address]
        size = freed
        after = next_of[address]
        if after != NONE and after not in in_use:
            merged_size = size_of.pop(after)
            self._index_remove(merged_size, after)
            size += merged_size
            del prev_of[after]
            after = next_of.pop(after)
            next_of[address] = after
            if after != NONE:
                prev_of[after] = address
        before = prev_of[address]
        if before != NONE and before not in in_use:
            before_size = size_of[before]
            self._index_remove(before_size, before)
            del size_of[address], prev_of[address], next_of[address]
            address = before
            size += before_size
            next_of[address] = after
            if after != NONE:
                prev_of[after] = address
        size_of[address] = size
        if after == NONE:
            self.tail[address + size] = address
        self._index_add(size, address)
        return freed

    # -- views -----------------------------------------------------------------------
    def largest_free(self) -> int:
        """Size of the largest free chunk (0 if none). O(1)."""
        return self.free_index.largest()

    def chunks(self) -> Iterator[tuple[int, int, bool]]:
        """Every chunk as ``(address, size, in_use)``, region by region in address order. O(n)."""
        return walk_chunks(self.regions, self.size, self.next, self.in_use)

    def region_chunks(self, base: int) -> Iterator[int]:
        """The chunk addresses of region ``base`` in address order. O(chunks of the region)."""
        address = base
        while address != NONE:
            yield address
            address = self.next[address]

    def check(self) -> None:
        """Assert the module docstring's invariants: the chunks tile their regions (links,
        contiguity, no strays); ``tail`` names each region's last chunk; in-use chunks exist;
        no two neighbouring chunks are both free; the free index holds exactly the free chunks,
        at their sizes, and is itself well formed. O(n log n)."""
        self.free_index.check()
        check_tiling(self.regions, self.size, self.prev, self.next)
        require(len(self.tail) == len(self.regions), "ChunkMap: tail has an entry per region")
        for base, nbytes in self.regions.items():
            last = self.tail.get(base + nbytes)
            if last is None or self.next.get(last) != NONE:
                fail(f"ChunkMap: tail of region {base:#x} is not its last chunk")
        strays = self.in_use - self.size.keys()
        require(not strays, f"ChunkMap: {len(strays)} in-use chunks are in no region")
        for address, after in self.next.items():
            if after != NONE and address not in self.in_use and after not in self.in_use:
                fail(f"ChunkMap: neighbouring free chunks {address:#x} and {after:#x} not merged")
        free = sorted((self.size[a], a) for a in self.size if a not in self.in_use)
        indexed = sorted(self.free_index.keys())
        if free != indexed:
            missing = sorted(set(free) - set(indexed))[:3]
            extra = sorted(set(indexed) - set(free))[:3]
            fail(f"ChunkMap: the free index is not the free chunks (free but not indexed: "
                 f"{missing}; indexed but not free: {extra})")
