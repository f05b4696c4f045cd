"""Chunks of device memory linked by address, with a best-fit index over the free ones.

The shared machinery of the coalescing allocators (BFC, preallocate, best-fit), in the spirit of
bfc_allocator.h's Chunk and Bin: memory arrives in regions; a region is cut into chunks that
tile it exactly; a chunk is either in use (handed to a caller) or free. Each chunk is one
:class:`~allocsim.policies.chunk_records.Chunk` (named fields: size, neighbours, free-index
key, address, request; policies/chunk_records.py also holds the dict views the checks and
tests read), its neighbours linked in a circle through the region's sentinel, so that malloc
and free read and write fields and touch the address → chunk dict only to find a chunk, add
a split's rest or drop a merged one (:class:`~allocsim.policies.chunk_policy.ChunkPolicy`'s
malloc and free, in policies/chunk_policy.py).

Invariants, kept by every method here and asserted by :meth:`ChunkMap.check`:
- the chunks of a region tile it: each chunk's ``next`` starts where it ends, the last one ends
  at the region's end; chunks never link across regions (GPU regions never merge);
- no two neighbouring chunks are both free (freeing coalesces immediately);
- a chunk is in :attr:`ChunkMap.free_index` exactly when it is free, under the key it holds
  (``key``; 0 while it is in use).

Best-fit index (:class:`FreeIndex`, the models' one binned index): BFC's own structure
here — 21 bins by size class, each a plain sorted list of (size, address) keys; search
bin(rounded), then the first chunk of the next non-empty bin. That finds the smallest fitting
chunk overall, lowest address on ties. tests/test_bfc.py checks it against a literal walk;
benchmarks/replay.py chose plain lists per bin over a SortedList of all free chunks
(and over exact-size buckets, which real traces' ever-changing remainder sizes defeat).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import (
    Callable,
    Collection,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    MutableSet,
    Sequence,
)
from itertools import pairwise

from allocsim.policies.base import fail, require
from allocsim.policies.chunk_records import (
    ADDRESS_MASK,
    KEY_SHIFT,
    NONE,
    Chunk,
    InUseView,
    RequestedView,
    SlotView,
    TailView,
    ring_of,
)

NUM_BINS = 21           # BFC's bins: [256·2^b, 256·2^(b+1)), the last one open-ended


# Bin by bit length: BIN[n.bit_length()] == min(20, floor(log2(max(n, 256) >> 8))), one list
# lookup instead of arithmetic on the hot path.
BIN = [max(0, min(NUM_BINS - 1, bits - 9)) for bits in range(128)]


def bin_for_size(nbytes: int) -> int:
    """BFC's BinNumForSize: min(20, floor(log2(max(n, 256) >> 8)))."""
    return BIN[nbytes.bit_length()]


class FreeIndex:
    """The models' one binned index: free chunks under keys ``size << shift | tie`` (so keys
    order as ``(size, tie)``), in size-class bins, each a plain list of keys in ascending order,
    with a bitmask of the non-empty bins. BFC's, preallocate's and best-fit's free chunks
    (tie = the address, BFC's 21 bins of :data:`BIN`; :class:`ChunkMap`), the stream-ordered
    pool's (policies/cuda_async.py, the same) and CuPy's arenas (tie = the creation id above
    the address, a bin per size bit length; policies/cupy_pool.py) are each one of these;
    native/src/sorted_bins.hpp is its twin. The bins are a layout: the order of the keys is
    the rule, and any bin table monotone in size gives the same answers.

    Costs, k = free chunks in the bin touched: :meth:`add` and :meth:`remove` O(log k)
    bisection + O(k) list insertion/deletion (a memmove in C; O(1) when appending the largest
    key); :meth:`best_key` O(log k) bisection plus an O(1) bitmask jump to the next non-empty
    bin; :meth:`pop_best_fit` that plus the O(k) deletion. Plain lists with C ``bisect`` beat one
    big SortedList here because bins stay small in real traces; the worst case (one bin with
    10^5 free chunks) costs a memmove of ~1 MB per operation.
    """

    __slots__ = ("bin_of_bits", "bins", "nonempty", "owner", "shift")

    def __init__(self, shift: int = KEY_SHIFT, bin_of_bits: Sequence[int] = BIN,
                 owner: str = "FreeIndex") -> None:
        self.shift = shift                  # keys are size << shift | tie
        self.bin_of_bits = bin_of_bits      # bin number by the size's bit length
        self.owner = owner                  # what check() names
        self.bins: list[list[int]] = [[] for _ in range(max(bin_of_bits) + 1)]
        self.nonempty = 0   # bit b set <=> bins[b] has a chunk

    def __len__(self) -> int:
        """Number of free chunks. O(number of bins)."""
        return sum(len(keys) for keys in self.bins)

    def add(self, size: int, tie: int) -> int:
        """Index free chunk ``tie`` (its address, or what orders equal sizes) of ``size``
        bytes; returns its key."""
        number = self.bin_of_bits[size.bit_length()]
        keys = self.bins[number]
        key = size << self.shift | tie
        if not keys:
            self.nonempty |= 1 << number
            keys.append(key)
        elif key > keys[-1]:
            keys.append(key)
        else:
            insort(keys, key)
        return key

    def remove(self, size: int, tie: int) -> None:
        """Take free chunk ``tie`` of ``size`` bytes out; KeyError if it is not indexed."""
        number = self.bin_of_bits[size.bit_length()]
        keys = self.bins[number]
        key = size << self.shift | tie
        position = bisect_left(keys, key)
        if position == len(keys) or keys[position] != key:
            raise KeyError(f"no free chunk of {size} bytes at {tie:#x}")
        del keys[position]
        if not keys:
            self.nonempty &= ~(1 << number)

    def best_key(self, rounded: int) -> int:
        """The key of the smallest free chunk ≥ ``rounded``, lowest tie first (0: none fits;
        keys order as ``(size, tie)``): search bin(rounded), then the first chunk of the next
        non-empty bin above it. The chunk stays indexed."""
        number = self.bin_of_bits[rounded.bit_length()]
        keys = self.bins[number]
        if keys:
            position = bisect_left(keys, rounded << self.shift)
            if position < len(keys):
                return keys[position]
        above = self.nonempty >> (number + 1)
        if not above:
            return 0
        return self.bins[number + (above & -above).bit_length()][0]

    def best_fit(self, rounded: int) -> tuple[int, int] | None:
        """:meth:`best_key` as ``(address, size)``, None when nothing fits."""
        key = self.best_key(rounded)
        return (key & ADDRESS_MASK, key >> self.shift) if key else None

    def pop_best_fit(self, rounded: int) -> int:
        """:meth:`best_key`, and the chunk found leaves the index (one search, not two). Returns
        its key (``size << shift | tie``; no tuple is made), 0 when nothing fits."""
        number = self.bin_of_bits[rounded.bit_length()]
        keys = self.bins[number]
        if keys:
            position = bisect_left(keys, rounded << self.shift)
            if position < len(keys):
                key = keys.pop(position)
                if not keys:
                    self.nonempty &= ~(1 << number)
                return key
        above = self.nonempty >> (number + 1)
        if not above:
            return 0
        number += (above & -above).bit_length()
        keys = self.bins[number]
        key = keys.pop(0)
        if not keys:
            self.nonempty &= ~(1 << number)
        return key

    def drop(self, dropped: Callable[[int], bool]) -> None:
        """Take out every key for which ``dropped(key)`` is true; it is called once per key,
        bin by bin, in ascending order of keys (CuPy's free_all_blocks releases as it goes).
        O(n)."""
        for number, keys in enumerate(self.bins):
            if not keys:
                continue
            kept = [key for key in keys if not dropped(key)]
            if len(kept) != len(keys):
                self.bins[number] = kept
                if not kept:
                    self.nonempty &= ~(1 << number)

    def largest(self) -> int:
        """Size of the largest free chunk (0 if none). O(1)."""
        if not self.nonempty:
            return 0
        return self.bins[self.nonempty.bit_length() - 1][-1] >> self.shift

    def keys(self) -> Iterator[tuple[int, int]]:
        """Every free chunk as ``(size, tie)``, bin by bin. O(n)."""
        shift = self.shift
        tie_mask = (1 << shift) - 1
        for keys in self.bins:
            for key in keys:
                yield key >> shift, key & tie_mask

    def check(self) -> None:
        """Assert: each bin strictly ascending (no chunk twice), each key in the bin of its
        size, and the bitmask set exactly for the non-empty bins. O(n)."""
        owner = self.owner
        require(self.nonempty >> len(self.bins) == 0, f"{owner}: bitmask has bits beyond the bins")
        for number, keys in enumerate(self.bins):
            require(bool(self.nonempty >> number & 1) == bool(keys),
                    f"{owner}: bitmask bit {number} disagrees with the bin's emptiness")
            for before, key in pairwise(keys):
                if before >= key:
                    fail(f"{owner}: bin {number} not strictly ascending at {key:#x}")
            for key in keys:
                size = key >> self.shift
                if size <= 0 or self.bin_of_bits[size.bit_length()] != number:
                    fail(f"{owner}: a chunk of {size} bytes sits in bin {number}")


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
    """The chunks of all regions a policy holds: one Chunk each in :attr:`record`, keyed by
    address, linked in each region's ring. Every method states its
    cost: n = chunks, k = free chunks in the FreeIndex bin touched (see :class:`FreeIndex`).

    :attr:`size`, :attr:`prev`, :attr:`next` (address → size / neighbour's address, NONE at a
    region's ends), :attr:`in_use` (addresses), :attr:`tail` (region end → last chunk) and
    :attr:`requested` (in-use address → its request) are live views of the chunks, for
    checks, reports and tests; writing through them changes the chunks (only a test
    corrupting the map on purpose does)."""

    def __init__(self) -> None:
        self.record: dict[int, Chunk] = {}      # chunk address -> its chunk
        self.ring: dict[int, Chunk] = {}        # region base -> the region's ring
        self.regions: dict[int, int] = {}       # region base -> region size
        self.free_index = FreeIndex()           # the free chunks (see module docstring)
        self.strays: set[int] = set()           # marked in use through the view, no chunk
        self.spare: list[Chunk] = []            # chunks merges and removed regions dropped,
                                                # for splits and new regions to reuse
        self.size: MutableMapping[int, int] = SlotView(self, "size")
        self.prev: MutableMapping[int, int] = SlotView(self, "prev")
        self.next: MutableMapping[int, int] = SlotView(self, "next")
        self.in_use: MutableSet[int] = InUseView(self)
        self.tail: MutableMapping[int, int] = TailView(self)
        self.requested: MutableMapping[int, int] = RequestedView(self)

    # -- regions ---------------------------------------------------------------------
    def add_region(self, base: int, nbytes: int) -> None:
        """A new region becomes one free chunk. O(log k + k)."""
        chunk = ring_of(nbytes, base, self.spare)
        self.regions[base] = nbytes
        self.ring[base] = chunk.prev
        self.record[base] = chunk
        self.free_index.add(nbytes, base)

    def grow_region(self, base: int, extra: int) -> None:
        """Extend region ``base`` in place by ``extra`` bytes at its end (memory mapped behind
        it); the new space coalesces with a free last chunk. O(log k + k)."""
        end = base + self.regions[base]
        ring = self.ring[base]
        last = ring.prev
        self.regions[base] += extra
        if last.key:
            self.free_index.remove(last.size, last.address)
            last.size += extra
            last.key = last.size << KEY_SHIFT | last.address
            self.free_index.add(last.size, last.address)
        else:
            chunk = Chunk(extra, last, ring, extra << KEY_SHIFT | end, end, 0)
            last.next = ring.prev = self.record[end] = chunk
            self.free_index.add(extra, end)

    def shrink_region(self, base: int, nbytes: int) -> None:
        """Cut ``nbytes`` off the end of region ``base``, whose last chunk must be free and at
        least that large (memory about to be unmapped). O(log k + k)."""
        ring = self.ring[base]
        last = ring.prev
        size, address = last.size, last.address
        if not last.key or size < nbytes or nbytes >= self.regions[base]:
            raise ValueError("only free space at the end of a region, short of all of it, can go")
        self.regions[base] -= nbytes
        self.free_index.remove(size, address)
        if size == nbytes:
            before = last.prev
            del self.record[address]
            before.next = ring
            ring.prev = before
        else:
            last.size = size - nbytes
            last.key = (size - nbytes) << KEY_SHIFT | address
            self.free_index.add(size - nbytes, address)

    def last_chunk(self, base: int) -> tuple[int, int, bool]:
        """``(address, size, in_use)`` of the last chunk of region ``base``. O(1)."""
        last = self.ring[base].prev
        return last.address, last.size, not last.key

    def region_is_free(self, base: int) -> bool:
        """True when the region is one free chunk. O(1)."""
        chunk = self.record[base]
        return bool(chunk.key) and chunk.next is self.ring[base]

    def remove_region(self, base: int) -> int:
        """Forget a wholly free region; returns its size. O(log k + k)."""
        if not self.region_is_free(base):
            raise ValueError(f"region {base:#x} still has chunks in use")
        nbytes = self.regions.pop(base)
        # The region's one chunk and its ring (pointing at each other, nothing else) become
        # spare chunks: the next region's ring (ring_of) or a split's rest is made of them.
        chunk = self.record.pop(base)
        self.free_index.remove(chunk.size, base)
        self.spare += (chunk, self.ring.pop(base))
        return nbytes

    # -- handing out, splitting and giving back ------------------------------------------
    def best_fit(self, rounded: int) -> tuple[int, int] | None:
        """``(address, size)`` of the smallest free chunk ≥ ``rounded``, lowest address on
        ties; None when nothing fits. O(log k) bisection + an O(1) jump between bins."""
        return self.free_index.best_fit(rounded)

    def free_chunk_holding(self, address: int, nbytes: int) -> tuple[int, int] | None:
        """``(start, size)`` of the free chunk that holds ``[address, address + nbytes)``,
        or None. O(chunks of its region)."""
        base = self.region_of(address)
        if base is None:
            return None
        ring = self.ring[base]
        chunk = ring.next
        while chunk is not ring:
            start, size = chunk.address, chunk.size
            if chunk.key and start <= address and address + nbytes <= start + size:
                return start, size
            chunk = chunk.next
        return None

    def take(self, address: int, chunk_size: int, rounded: int, split: bool,
             requested: int = 0) -> int:
        """Hand out free chunk ``address`` (still in the free index) to a caller who asked for
        ``requested`` bytes, split to ``rounded`` bytes with ``split`` (:meth:`split`); returns
        the size handed out. ChunkPolicy's malloc takes the same steps after its best-fit pop
        and its split rule. O(log k + k)."""
        self.free_index.remove(chunk_size, address)
        chunk = self.record[address]
        chunk.key = 0
        chunk.requested = requested
        if split:
            self.split(chunk, rounded)
        return int(chunk.size)

    def split(self, chunk: Chunk, rounded: int) -> None:
        """BFC's SplitChunk: chunk ``chunk`` (in use, out of the free index) keeps its low
        ``rounded`` bytes and the rest, if any, becomes a free chunk after it. The chunk after a
        free chunk is never free (invariant), so the rest needs no merge. O(1), plus O(log k +
        k) to index the rest."""
        rest_size = chunk.size - rounded
        if not rest_size:
            return
        rest = chunk.address + rounded
        after = chunk.next
        chunk.size = rounded
        key = self.free_index.add(rest_size, rest)
        spare = self.spare
        if spare:                       # a chunk a merge dropped, reused (no allocation)
            piece = spare.pop()
            piece.size, piece.prev, piece.next = rest_size, chunk, after
            piece.key, piece.address = key, rest
        else:
            piece = Chunk(rest_size, chunk, after, key, rest, 0)
        self.record[rest] = chunk.next = after.prev = piece

    def give_back(self, address: int) -> int:
        """Free chunk ``address``: merge with the next chunk if free, then the previous one
        (BFC's order); returns the freed chunk's size before merging. O(1) link updates plus
        one FreeIndex remove per merged neighbour and one add, each O(log k + k)."""
        record = self.record
        chunk = record[address]
        if chunk.key:
            raise KeyError(f"chunk {address:#x} is not in use")
        freed = size = chunk.size
        after = chunk.next
        if after.key:                                  # merge the next chunk into this one
            self.free_index.remove(after.size, after.address)
            self.spare.append(record.pop(after.address))
            size += after.size
            after = after.next
            chunk.next = after
            after.prev = chunk
        before = chunk.prev
        if before.key:                                 # merge this one into the previous
            self.free_index.remove(before.size, before.address)
            self.spare.append(record.pop(address))
            size += before.size
            chunk, address = before, before.address
            chunk.next = after
            after.prev = chunk
        chunk.size = size
        chunk.key = size << KEY_SHIFT | address
        self.free_index.add(size, address)
        return freed

    # -- views -----------------------------------------------------------------------
    def largest_free(self) -> int:
        """Size of the largest free chunk (0 if none). O(1)."""
        return self.free_index.largest()

    def chunks(self) -> Iterator[tuple[int, int, bool]]:
        """Every chunk as ``(address, size, in_use)``, region by region in address order. O(n)."""
        for base in sorted(self.regions):
            ring = self.ring[base]
            chunk = ring.next
            while chunk is not ring:
                yield chunk.address, chunk.size, not chunk.key
                chunk = chunk.next

    def region_of(self, address: int) -> int | None:
        """Base of the region holding ``address``, or None. O(regions)."""
        for base, nbytes in self.regions.items():
            if base <= address < base + nbytes:
                return base
        return None

    def check(self) -> None:
        """Assert the module docstring's invariants: the chunks tile their regions (links,
        contiguity, no strays); each region's ring closes its circle (its PREV, the tail, is
        the region's last chunk); every chunk sits at its own address; in-use chunks exist;
        no two neighbouring chunks are both free; the free index holds exactly the free chunks,
        at their sizes, each chunk's ``key`` being its key there, and is itself well formed.
        O(n log n)."""
        self.free_index.check()
        self.check_layout()
        record = self.record
        for address, chunk in record.items():
            after = chunk.next
            if chunk.key and after.key:
                fail(f"ChunkMap: neighbouring free chunks {address:#x} and {after.address:#x} "
                     "not merged")
        free = sorted((c.size, a) for a, c in record.items() if c.key)
        indexed = sorted(self.free_index.keys())
        if free != indexed:
            missing = sorted(set(free) - set(indexed))[:3]
            extra = sorted(set(indexed) - set(free))[:3]
            fail(f"ChunkMap: the free index is not the free chunks (free but not indexed: "
                 f"{missing}; indexed but not free: {extra})")
        for address, chunk in record.items():
            if chunk.key and chunk.key != chunk.size << KEY_SHIFT | address:
                fail(f"ChunkMap: free chunk {address:#x}'s key is not its free-index key")

    def check_layout(self) -> None:
        """The layout part of :meth:`check`, for a policy that keeps its own free indexes over
        these chunks (the stream-ordered pool): the chunks tile their regions, each region's
        ring closes its circle and is a sentinel, every chunk sits at its own address, no
        in-use chunk is a stray. O(n log n)."""
        record = self.record
        check_tiling(self.regions, {a: c.size for a, c in record.items()},
                     {a: c.prev.address for a, c in record.items()},
                     {a: c.next.address for a, c in record.items()})
        require(self.ring.keys() == self.regions.keys(), "ChunkMap: a ring per region")
        for base, nbytes in self.regions.items():
            ring = self.ring[base]
            last = ring.prev
            if (last.next is not ring or last.address + last.size != base + nbytes
                    or ring.next is not record[base]):
                fail(f"ChunkMap: tail of region {base:#x} is not its last chunk (its ring is "
                     "broken)")
            require(ring.size == 0 and ring.key == 0 and ring.address == NONE,
                    f"ChunkMap: region {base:#x}'s ring is not a sentinel")
        for address, chunk in record.items():
            if chunk.address != address:
                fail(f"ChunkMap: the chunk at {address:#x} says it is at {chunk.address:#x}")
        require(not self.strays, f"ChunkMap: {len(self.strays)} in-use chunks are in no region")

