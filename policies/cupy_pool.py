"""CuPy's default memory pool (``cupy.get_default_memory_pool()``), rule for rule.

Followed: cupy/cupy cupy/cuda/memory.pyx as restructured by cupy/cupy#9437 (the ``_Arena``
holding a ``std::set<pair<size_t, uintptr_t>>`` of free chunks; earlier releases kept one Python
``set`` per exact size, ``(size − 1) // 512``, and popped an arbitrary element of the smallest
non-empty fitting bin — the same size choice, a different tie choice). Functions named below
are that file's.

- ``_round_size``: every request rounds up to a multiple of ALLOCATION_UNIT_SIZE = 512.
  ``_malloc``: a 0-byte request returns ``MemoryPointer(Memory(0), 0)``, a null pointer that never
  touches the pool; here ``malloc(0)`` returns None without counting an OOM (the engine skips
  0-byte events anyway).
- ``_get_stream_identifier`` / ``_arena``: free chunks live in one arena per stream. A chunk keeps
  the arena of the stream whose allocation created its cudaMalloc'd block (``_Chunk.arena``;
  ``split`` hands the remainder the same arena), and ``free`` returns it to that arena, so a
  whole cudaMalloc'd block belongs to one stream for life: memory freed on stream 1 never serves
  stream 0 until ``free_all_blocks`` returns the block to the device.
- ``_Arena.get_chunk``: ``index.lower_bound((size, 0))`` — the smallest free chunk with
  size ≥ request in that stream's arena; among equal sizes the lowest ``_Chunk`` *Python object
  address*. Object addresses are not device addresses and no model can reproduce them; this
  model breaks ties by the chunk object's creation order (older first), a stable stand-in for
  ``id()``: like the real key it does not change while the chunk object lives, the remainder of
  a split is a new (younger) object, and a merge keeps the lower chunk's object
  (``try_merge_chunk``). Device address is NOT the tie-break (the source does not support it).
- ``_Chunk.split``: a larger chunk is ALWAYS split (no threshold); the allocation keeps the low
  offset and the remainder is inserted without merging (its next neighbour cannot be free).
- ``_Arena.try_merge_chunk`` / ``insert_chunk``: on free, merge with the next chunk while it is
  free, then with the previous one; only chunks of the same cudaMalloc'd block are linked, so
  blocks never merge.
- ``_malloc`` → ``_try_malloc`` on a miss: cudaMalloc for exactly the rounded size (no
  growth policy, no minimum). Limit (``_try_block_total_bytes``): with limit L ≠ 0, a request
  > L raises OutOfMemoryError at once; if total_bytes + size > L, ``free_all_blocks()`` and check
  again, then ``gc.collect()`` + ``free_all_blocks()`` and check again, then OutOfMemoryError
  (this limit retry came with cupy/cupy#7679; older releases raised at once). Device refusal
  (cudaErrorMemoryAllocation): ``free_all_blocks()`` and retry, then ``gc.collect()`` ×2 +
  ``free_all_blocks()`` and retry, then OutOfMemoryError — three cudaMalloc attempts in all.
  The simulation has no Python garbage, so the second free_all_blocks finds nothing new, but the
  third device attempt is still made (and counted as a failed device malloc).
- ``free_all_blocks`` / ``_Arena.free_all``: cudaFree every free chunk that is a whole
  cudaMalloc'd block (``prev is None and next is None``), in every arena; split blocks stay.
- ``set_limit(size=, fraction=)``: size and fraction are exclusive; fraction in [0, 1] means
  ``fraction × total device memory`` (``memGetInfo``'s total, i.e. capacity), truncated to
  bytes; 0 disables the limit. The limit counts total_bytes (cached free blocks included).
- ``used_bytes`` = sum of in-use chunk sizes (rounded), ``total_bytes`` = bytes held in
  cudaMalloc'd blocks, ``free_bytes`` = total − used, ``n_free_blocks`` = free chunks in all
  arenas. Policy ``empty_cache()`` = ``free_all_blocks()``.

Not modelled: memory hooks, the pending-free list used when another thread holds the arena lock
(single-threaded replay always takes the lock), CUPY_GPU_MEMORY_LIMIT (use the parameters), and
the non-pooled allocators. reference/allocators.md §4 says a limit hit triggers the
free_all_blocks retry without noting that a request larger than the limit fails at once, and
describes v14.1+ ties only as "Python object address".

Costs (k = free chunks in the arena bin touched, bins by size bit length): malloc is an
O(log k) bisection in bin(rounded), else an O(1) bitmask jump to the next non-empty bin, plus an
O(k) list deletion and, for a split, an O(log k + k) insertion; free is O(1) link updates plus
one O(log k + k) arena update per merged neighbour and one for the freed chunk.
``free_all_blocks`` is O(free chunks); ``check()`` O(n log n).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from itertools import pairwise
from typing import ClassVar

from allocsim.policies.base import (
    DeviceMemory,
    Param,
    Policy,
    PolicyStats,
    check_live_chunks,
    fail,
    params_of,
    require,
)
from allocsim.policies.chunks import check_tiling, walk_chunks

ALLOCATION_UNIT_SIZE = 512
NONE = -1

# A free chunk's key orders by (size, creation id), the model of CuPy's (size, id(chunk)); the
# device address rides in the low bits so a key decodes without a lookup.
SIZE_SHIFT = 104
CID_SHIFT = 52
ADDRESS_MASK = (1 << CID_SHIFT) - 1
NUM_BINS = 65           # bin b holds sizes with bit length b: [2^(b-1), 2^b); sizes are
                        # int64 requests rounded up to 512, so at most 2^63 (bit length 64)


def round_size(nbytes: int) -> int:
    """CuPy's ``_round_size``: up to a multiple of 512 (0 stays 0)."""
    return -(-nbytes // ALLOCATION_UNIT_SIZE) * ALLOCATION_UNIT_SIZE


class _Arena:
    """The free chunks of one stream: sorted key lists binned by size bit length, plus a
    bitmask of non-empty bins. The smallest key ≥ (size, 0) is CuPy's ``lower_bound``.
    add/remove: O(log k) bisection + O(k) list insertion/deletion; largest: O(1)."""

    __slots__ = ("bins", "nonempty")

    def __init__(self) -> None:
        self.bins: list[list[int]] = [[] for _ in range(NUM_BINS)]
        self.nonempty = 0

    def add(self, key: int, size: int) -> None:
        number = size.bit_length()
        keys = self.bins[number]
        if not keys:
            self.nonempty |= 1 << number
            keys.append(key)
        elif key > keys[-1]:
            keys.append(key)
        else:
            insort(keys, key)

    def remove(self, key: int, size: int) -> None:
        number = size.bit_length()
        keys = self.bins[number]
        del keys[bisect_left(keys, key)]
        if not keys:
            self.nonempty &= ~(1 << number)

    def keys(self) -> Iterator[int]:
        for keys in self.bins:
            yield from keys

    def __len__(self) -> int:
        return sum(len(keys) for keys in self.bins)

    def largest(self) -> int:
        if not self.nonempty:
            return 0
        return self.bins[self.nonempty.bit_length() - 1][-1] >> SIZE_SHIFT

    def check(self) -> None:
        """Assert: each bin strictly ascending, each key in the bin of its size's bit length,
        the bitmask set exactly for the non-empty bins."""
        require(self.nonempty >> NUM_BINS == 0, "CuPy arena: bitmask has bits beyond the bins")
        for number, keys in enumerate(self.bins):
            require(bool(self.nonempty >> number & 1) == bool(keys),
                    f"CuPy arena: bitmask bit {number} disagrees with the bin's emptiness")
            for before, key in pairwise(keys):
                if before >= key:
                    fail(f"CuPy arena: bin {number} not strictly ascending")
            for key in keys:
                if (key >> SIZE_SHIFT).bit_length() != number:
                    fail(f"CuPy arena: a chunk of {key >> SIZE_SHIFT} bytes sits in bin {number}")


class CuPyPoolAllocator(Policy):
    name = "cupy"
    capacity_use = "limit; unless fraction"   # set_limit(fraction=) caps at fraction × capacity
    description = "CuPy MemoryPool: 512 B rounding, per-stream best fit, always split"
    def __init__(self, device: DeviceMemory, limit: int = 0, fraction: float = 0.0) -> None:
        super().__init__(device)
        self.size_of: dict[int, int] = {}       # chunk address -> size
        self.prev_of: dict[int, int] = {}       # chunk address -> previous chunk in block / NONE
        self.next_of: dict[int, int] = {}       # chunk address -> next chunk in block / NONE
        self.cid_of: dict[int, int] = {}        # chunk address -> creation id (object identity)
        self.in_use: dict[int, _Arena] = {}     # chunk address in use -> its arena
        self.requested: dict[int, int] = {}     # chunk address in use -> requested bytes
        self.held: dict[int, int] = {}          # cudaMalloc'd block base -> bytes
        self.arenas: dict[int, _Arena] = {}     # stream -> arena
        self._next_cid = 0
        self._total_bytes = 0
        self._limit = 0
        self.peak_bytes_in_use = 0
        self.peak_total_bytes = 0
        self.set_limit(size=limit or None, fraction=fraction or None)

    PARAMS: ClassVar[dict[str, Param]] = params_of(
        __init__,
        limit=("size", "set_limit(size=): cap on total_bytes; 0 = no limit"),
        fraction=("float", "set_limit(fraction=): cap = fraction × capacity"),
    )

    # -- CuPy's public pool API ------------------------------------------------------
    def set_limit(self, size: int | None = None, fraction: float | None = None) -> None:
        """SingleDeviceMemoryPool.set_limit: ``size`` bytes or ``fraction`` × capacity; neither
        (or 0) removes the limit."""
        if size is None:
            if fraction is None:
                size = 0
            else:
                if not 0 <= fraction <= 1:
                    raise ValueError(f"memory limit fraction out of range: {fraction}")
                size = int(fraction * self.device.capacity)
        elif fraction is not None:
            raise ValueError("size and fraction cannot be specified at one time")
        if size < 0:
            raise ValueError(f"memory limit size out of range: {size}")
        self._limit = int(size)

    def get_limit(self) -> int:
        return self._limit

    def used_bytes(self) -> int:
        return self.bytes_in_use

    def total_bytes(self) -> int:
        return self._total_bytes

    def free_bytes(self) -> int:
        return self._total_bytes - self.bytes_in_use

    def n_free_blocks(self) -> int:
        return sum(len(arena) for arena in self.arenas.values())

    def free_all_blocks(self, stream: int | None = None) -> None:
        """cudaFree every free chunk that is a whole block, in all arenas or one stream's."""
        arenas = self.arenas.values() if stream is None else [self.arenas.get(stream)]
        prev_of, next_of = self.prev_of, self.next_of
        for arena in arenas:
            if arena is None or not arena.nonempty:
                continue
            for number, keys in enumerate(arena.bins):
                if not keys:
                    continue
                kept = []
                for key in keys:
                    address = key & ADDRESS_MASK
                    if prev_of[address] != NONE or next_of[address] != NONE:
                        kept.append(key)
                        continue
                    nbytes = self.size_of.pop(address)
                    del prev_of[address], next_of[address], self.cid_of[address]
                    del self.held[address]
                    self._total_bytes -= nbytes
                    self.device.release(address)
                if len(kept) != len(keys):
                    arena.bins[number] = kept
                    if not kept:
                        arena.nonempty &= ~(1 << number)

    # -- allocation ------------------------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> int | None:
        if size <= 0:
            return None
        rounded = -(-size // ALLOCATION_UNIT_SIZE) * ALLOCATION_UNIT_SIZE
        arena = self.arenas.get(stream)
        if arena is None:
            arena = self.arenas[stream] = _Arena()
        # _Arena.get_chunk: the smallest key ≥ (rounded, 0).
        number = rounded.bit_length()
        keys = arena.bins[number]
        key = 0
        if keys:
            position = bisect_left(keys, rounded << SIZE_SHIFT)
            if position < len(keys):
                key = keys[position]
                del keys[position]
                if not keys:
                    arena.nonempty &= ~(1 << number)
        if not key:
            above = arena.nonempty >> (number + 1)
            if above:
                number += (above & -above).bit_length()
                keys = arena.bins[number]
                key = keys[0]
                del keys[0]
                if not keys:
                    arena.nonempty &= ~(1 << number)
        size_of = self.size_of
        if key:
            address = key & ADDRESS_MASK
            chunk_size = key >> SIZE_SHIFT
            if chunk_size != rounded:
                # _Chunk.split: the caller keeps the low end; the rest is a new chunk object.
                rest = address + rounded
                rest_size = chunk_size - rounded
                next_of = self.next_of
                after = next_of[address]
                size_of[address] = rounded
                size_of[rest] = rest_size
                self.prev_of[rest] = address
                next_of[rest] = after
                next_of[address] = rest
                if after != NONE:
                    self.prev_of[after] = rest
                cid = self._next_cid
                self._next_cid = cid + 1
                self.cid_of[rest] = cid
                arena.add((rest_size << SIZE_SHIFT) | (cid << CID_SHIFT) | rest, rest_size)
        else:
            grown = self._try_malloc(rounded)
            if grown is None:
                self.num_ooms += 1
                return None
            address = grown
            size_of[address] = rounded
            self.prev_of[address] = NONE
            self.next_of[address] = NONE
            self.cid_of[address] = self._next_cid
            self._next_cid += 1
        self.in_use[address] = arena
        self.requested[address] = size
        self.bytes_in_use += rounded
        if self.bytes_in_use > self.peak_bytes_in_use:
            self.peak_bytes_in_use = self.bytes_in_use
        self.num_allocs += 1
        return address

    def _fits_limit(self, rounded: int) -> bool:
        return self._total_bytes + rounded <= self._limit

    def _try_malloc(self, rounded: int) -> int | None:
        """SingleDeviceMemoryPool._try_malloc: the limit check with its two free_all_blocks
        retries, then cudaMalloc with its two free_all_blocks retries. None = OutOfMemoryError."""
        if self._limit:
            if rounded > self._limit:
                return None
            if not self._fits_limit(rounded):
                self.free_all_blocks()
                if not self._fits_limit(rounded):
                    self.free_all_blocks()          # after gc.collect(): nothing new here
                    if not self._fits_limit(rounded):
                        return None
        self._total_bytes += rounded
        reserve = self.device.reserve
        base = reserve(rounded)
        if base is None:
            self.free_all_blocks()
            base = reserve(rounded)
            if base is None:
                self.free_all_blocks()              # after gc.collect() ×2: nothing new here
                base = reserve(rounded)
                if base is None:
                    self._total_bytes -= rounded
                    return None
        self.held[base] = rounded
        if self._total_bytes > self.peak_total_bytes:
            self.peak_total_bytes = self._total_bytes
        return base

    def free(self, address: int) -> None:
        arena = self.in_use.pop(address)
        del self.requested[address]
        in_use = self.in_use
        size_of, next_of, prev_of, cid_of = self.size_of, self.next_of, self.prev_of, self.cid_of
        size = size_of[address]
        self.bytes_in_use -= size
        self.num_frees += 1
        # _Arena.try_merge_chunk: the next chunk if free (this chunk object survives) ...
        after = next_of[address]
        if after != NONE and after not in in_use:
            merged = after
            merged_size = size_of.pop(merged)
            arena.remove((merged_size << SIZE_SHIFT) | (cid_of.pop(merged) << CID_SHIFT) | merged,
                         merged_size)
            size += merged_size
            after = next_of.pop(merged)
            del prev_of[merged]
            next_of[address] = after
            if after != NONE:
                prev_of[after] = address
        # ... then the previous chunk if free (the previous chunk's object survives).
        before = prev_of[address]
        if before != NONE and before not in in_use:
            before_size = size_of[before]
            arena.remove((before_size << SIZE_SHIFT) | (cid_of[before] << CID_SHIFT) | before,
                         before_size)
            del size_of[address], prev_of[address], next_of[address], cid_of[address]
            address = before
            size += before_size
            next_of[address] = after
            if after != NONE:
                prev_of[after] = address
        size_of[address] = size
        arena.add((size << SIZE_SHIFT) | (cid_of[address] << CID_SHIFT) | address, size)

    def empty_cache(self) -> None:
        self.free_all_blocks()

    # -- views -----------------------------------------------------------------------
    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        return walk_chunks(self.held, self.size_of, self.next_of, self.in_use)

    def check(self) -> None:
        """Assert: the chunks tile their cudaMalloc'd blocks (links, contiguity, no strays);
        every chunk has a creation id, all distinct and already issued, and a size that is a
        multiple of 512; each arena is well formed and holds exactly the free chunks, each once,
        under its (size, creation id, address) key; all chunks of one block belong to one arena
        (the arena of a free chunk, ``in_use``'s arena of a chunk in use); no two neighbouring
        chunks are both free; total_bytes = the blocks' sum, within the limit; used bytes,
        requests and allocs − frees agree with a recount; peaks ≥ current values."""
        size_of = self.size_of
        block_of = check_tiling(self.held, size_of, self.prev_of, self.next_of)
        require(self.cid_of.keys() == size_of.keys(), "CuPy: creation ids are not the chunks'")
        cids = list(self.cid_of.values())
        require(len(set(cids)) == len(cids), "CuPy: two chunks share a creation id")
        require(max(cids, default=-1) < self._next_cid, "CuPy: a creation id not yet issued")
        for address, size in size_of.items():
            if size % ALLOCATION_UNIT_SIZE:
                fail(f"CuPy: chunk {address:#x} of {size} bytes is not a multiple of 512")
        strays = self.in_use.keys() - size_of.keys()
        require(not strays, f"CuPy: {len(strays)} chunks in use are in no block")
        arena_of: dict[int, _Arena] = dict(self.in_use)
        for arena in self.arenas.values():
            arena.check()
            for key in arena.keys():
                address = key & ADDRESS_MASK
                if address in arena_of:
                    fail(f"CuPy: chunk {address:#x} is free in an arena and in use, or free twice")
                size = key >> SIZE_SHIFT
                if (size_of.get(address) != size
                        or (key >> CID_SHIFT) & ADDRESS_MASK != self.cid_of[address]):
                    fail(f"CuPy: arena key of chunk {address:#x} disagrees with its size or id")
                arena_of[address] = arena
        require(len(arena_of) == len(size_of), "CuPy: a free chunk is in no arena")
        owner: dict[int, _Arena] = {}
        for address, base in block_of.items():
            if owner.setdefault(base, arena_of[address]) is not arena_of[address]:
                fail(f"CuPy: the chunks of block {base:#x} belong to two arenas")
        for address, after in self.next_of.items():
            if after != NONE and address not in self.in_use and after not in self.in_use:
                fail(f"CuPy: neighbouring free chunks {address:#x} and {after:#x} not merged")
        require(self._total_bytes == sum(self.held.values()),
                "CuPy: total_bytes is not the blocks' sum")
        require(not self._limit or self._total_bytes <= self._limit,
                "CuPy: total_bytes over the limit")
        check_live_chunks("CuPy", self, self.requested, self.in_use, size_of)
        require(self.peak_bytes_in_use >= self.bytes_in_use, "CuPy: peak_bytes_in_use < current")
        require(self.peak_total_bytes >= self._total_bytes, "CuPy: peak_total_bytes < current")

    def stats(self) -> PolicyStats:
        return PolicyStats(
            num_allocs=self.num_allocs, num_frees=self.num_frees, num_ooms=self.num_ooms,
            bytes_in_use=self.bytes_in_use, peak_bytes_in_use=self.peak_bytes_in_use,
            bytes_requested=sum(self.requested.values()), pool_bytes=self._total_bytes,
            peak_pool_bytes=self.peak_total_bytes,
            largest_free_block=max((a.largest() for a in self.arenas.values()), default=0),
            free_blocks=self.n_free_blocks())
