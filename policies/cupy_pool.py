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
the non-pooled allocators. In cupy/cuda/memory.pyx a limit hit triggers the free_all_blocks
retry, except that a request larger than the limit fails at once; v14.1+ breaks ties between
equal free chunks by the chunk object's address.

Layout: each chunk is one CuPyChunk (policies/cupy_records.py: size, neighbours, arena key
while free, address, request, arena, creation id above the address, with the dict views the
checks and tests read), its neighbours linked as chunks, a block's ends linked to the pool's
end chunk where CuPy has None; one dict maps an address to its chunk. Free chunks live in one
arena per stream, each the models' one binned index (policies/chunks.py's
:class:`~allocsim.policies.chunks.FreeIndex`) under keys (size, creation id, address), binned
by size bit length. malloc and free read and write chunk fields, go through the arena's own
methods (``pop_best_fit``, ``add``, ``remove``), and touch the address → chunk dict only to
find a chunk, add a split's rest or a new block, or drop a merged chunk.

Costs (k = free chunks in the arena bin touched, bins by size bit length): malloc is an
O(log k) bisection in bin(rounded), else an O(1) bitmask jump to the next non-empty bin, plus an
O(k) list deletion and, for a split, an O(log k + k) insertion; free is O(1) link updates plus
one O(log k + k) arena update per merged neighbour and one for the freed chunk.
``free_all_blocks`` is O(free chunks); ``check()`` O(n log n).
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
    check_live_chunks,
    fail,
    params_of,
    require,
)
from allocsim.policies.chunks import FreeIndex, check_tiling
from allocsim.policies.cupy_records import (
    ADDRESS_MASK,
    CID_SHIFT,
    NONE,
    SIZE_SHIFT,
    CuPyChunk,
    InUseView,
    RequestedView,
    SlotView,
    end_chunk,
    tie,
)
from allocsim.policies.limit_window import LimitWindow

ALLOCATION_UNIT_SIZE = 512
NUM_BINS = 65           # bin b holds sizes with bit length b: [2^(b-1), 2^b); sizes are
                        # int64 requests rounded up to 512, so at most 2^63 (bit length 64)


def round_size(nbytes: int) -> int:
    """CuPy's ``_round_size``: up to a multiple of 512 (0 stays 0)."""
    return -(-nbytes // ALLOCATION_UNIT_SIZE) * ALLOCATION_UNIT_SIZE


# An arena's bins: one per size bit length (the bins are a layout; the keys' order is the rule).
BIT_LENGTH_BINS = tuple(range(NUM_BINS))
TIE_MASK = (1 << SIZE_SHIFT) - 1   # a key's tie: its creation id above its address


def new_arena() -> FreeIndex:
    """_Arena: one stream's free chunks, the smallest key ≥ (size, 0) CuPy's ``lower_bound``
    (:meth:`FreeIndex.pop_best_fit`, its get_chunk)."""
    return FreeIndex(SIZE_SHIFT, BIT_LENGTH_BINS, "CuPy arena")


class CuPyPoolAllocator(Policy):
    name = "cupy"
    capacity_use = "limit; unless fraction"   # set_limit(fraction=) caps at fraction × capacity
    native = NativeTwin("cupy", "cupy_pool.hpp")
    description = "CuPy MemoryPool: 512 B rounding, per-stream best fit, always split"
    def __init__(self, device: DeviceMemory, limit: int = 0, fraction: float = 0.0) -> None:
        super().__init__(device)
        self.record: dict[int, CuPyChunk] = {}  # chunk address -> its chunk (cupy_records)
        self.end = end_chunk()                  # every block's ends link here (CuPy: None)
        self.held: dict[int, int] = {}          # cudaMalloc'd block base -> bytes
        self.arenas: dict[int, FreeIndex] = {}  # stream -> arena (new_arena)
        # The chunks as the dicts they once were (views: writes change the records), for
        # check(), min-capacity's repeat check and the tests; malloc and free read the records.
        self.size_of = SlotView(self, "size")   # chunk address -> size
        self.prev_of = SlotView(self, "prev")   # chunk address -> previous chunk in block / NONE
        self.next_of = SlotView(self, "next")   # chunk address -> next chunk in block / NONE
        self.cid_of = SlotView(self, "tie")     # chunk address -> creation id (object identity)
        self.in_use = InUseView(self)           # chunk address in use -> its arena
        self.requested = RequestedView(self)    # chunk address in use -> requested bytes
        self.strays: dict[int, object] = {}     # in_use entries written for no chunk (check())
        self._next_cid = 0
        # Chunk objects free's merges dropped, for malloc's splits to reuse (a class
        # instantiation costs more than writing the fields; the chunk's age is its tie's id).
        self._spare: list[CuPyChunk] = []
        self._total_bytes = 0
        self._limit = 0
        # Every limit under which the limit checks would have decided alike so far
        # (min-capacity resumes runs at nearby capacities by it; a limit of 0 checks nothing).
        self.limit_window = LimitWindow()
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
        record, end = self.record, self.end

        def released(key: int) -> bool:
            """cudaFree the free chunk of ``key`` if it is a whole block (it leaves the arena)."""
            address = key & ADDRESS_MASK
            chunk = record[address]
            if chunk.prev is not end or chunk.next is not end:
                return False
            del record[address], self.held[address]
            self._total_bytes -= chunk.size
            self.device.release(address)
            return True

        for arena in arenas:
            if arena is not None and arena.nonempty:
                arena.drop(released)

    # -- allocation ------------------------------------------------------------------
    # malloc and free over the chunks (cupy_records' CuPyChunk) and the arenas' methods.
    # Invariants they keep (check() asserts them): a chunk is in its ``arena``'s bin of
    # its size's bit length exactly while free, under the key its ``key`` holds (size <<
    # SIZE_SHIFT | tie; 0 while in use); the chunk after or before a free chunk is never free
    # (free merges at once); a block's chunks all share one arena, so a free neighbour is in
    # the freed chunk's arena; a block's ends link to the end chunk, in use for ever.
    def malloc(self, size: int, stream: int = 0) -> int | None:
        if size <= 0:
            return None
        rounded = round_size(size)
        arena = self.arenas.get(stream)
        if arena is None:
            arena = self.arenas[stream] = new_arena()
        key = arena.pop_best_fit(rounded)                  # _Arena.get_chunk
        if not key:
            return self._malloc_block(size, rounded, arena)
        address = key & ADDRESS_MASK
        record = self.record
        chunk = record[address]
        chunk.key = 0
        chunk.requested = size
        rest_size = chunk.size - rounded
        if rest_size:
            # _Chunk.split: the caller keeps the low end; the rest is a new (younger) chunk
            # object of the same arena, free at once without merging (the chunk after a free
            # chunk is never free).
            rest = address + rounded
            after = chunk.next
            chunk.size = rounded
            cid = self._next_cid
            self._next_cid = cid + 1
            low = cid << CID_SHIFT | rest                   # its TIE
            key = arena.add(rest_size, low)                 # rest_size << SIZE_SHIFT | low
            spare = self._spare
            if spare:
                piece = spare.pop()
                piece.size = rest_size
                piece.prev = chunk
                piece.next = after
                piece.key = key
                piece.address = rest
                piece.requested = 0
                piece.arena = arena
                piece.tie = low
            else:
                piece = CuPyChunk(rest_size, chunk, after, key, rest, 0, arena, low)
            record[rest] = chunk.next = after.prev = piece
        in_use = self.bytes_in_use + rounded
        self.bytes_in_use = in_use
        if in_use > self.peak_bytes_in_use:
            self.peak_bytes_in_use = in_use
        self.num_allocs += 1
        return address

    def _malloc_block(self, size: int, rounded: int, arena: FreeIndex) -> int | None:
        """malloc's miss (no free chunk fits in ``arena``): a new block of exactly ``rounded``
        bytes through :meth:`_try_malloc`, one chunk in use, of ``arena``, or None (an OOM)."""
        address = self._try_malloc(rounded)
        if address is None:
            self.num_ooms += 1
            return None
        cid = self._next_cid
        self._next_cid = cid + 1
        end = self.end
        self.record[address] = CuPyChunk(rounded, end, end, 0, address, size, arena,
                                         tie(cid, address))
        in_use = self.bytes_in_use + rounded
        self.bytes_in_use = in_use
        if in_use > self.peak_bytes_in_use:
            self.peak_bytes_in_use = in_use
        self.num_allocs += 1
        return address

    def _fits_limit(self, rounded: int) -> bool:
        fits = self._total_bytes + rounded <= self._limit
        self.limit_window.at_least(self._total_bytes + rounded, fits)
        return fits

    def _try_malloc(self, rounded: int) -> int | None:
        """SingleDeviceMemoryPool._try_malloc: the limit check with its two free_all_blocks
        retries, then cudaMalloc with its two free_all_blocks retries. None = OutOfMemoryError."""
        if self._limit:
            self.limit_window.at_least(rounded, rounded <= self._limit)
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
        """Return chunk ``address`` to its arena (KeyError unless it is in use), merged with
        its free neighbours: _Arena.try_merge_chunk then insert_chunk, each free neighbour's
        key read from its record."""
        record = self.record
        chunk = record[address]
        size, before, after = chunk.size, chunk.prev, chunk.next
        arena, low = chunk.arena, chunk.tie
        if chunk.key:
            raise KeyError(f"chunk {address:#x} is not in use")
        self.bytes_in_use -= size
        self.num_frees += 1
        # _Arena.try_merge_chunk: the next chunk if free (this chunk object survives) ...
        key = after.key
        if key:
            merged = after.size
            arena.remove(merged, key & TIE_MASK)
            self._spare.append(record.pop(after.address))
            size += merged
            after = chunk.next = after.next
            after.prev = chunk
        # ... then the previous chunk if free (the previous chunk's object survives).
        key = before.key
        if key:
            merged = before.size
            arena.remove(merged, key & TIE_MASK)
            self._spare.append(record.pop(address))
            size += merged
            chunk, low = before, before.tie
            chunk.next = after
            after.prev = chunk
        chunk.size = size
        chunk.key = arena.add(size, low)

    def empty_cache(self) -> None:
        self.free_all_blocks()

    # -- views -----------------------------------------------------------------------
    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        end = self.end
        for base in sorted(self.held):
            chunk = self.record[base]
            while chunk is not end:
                yield chunk.address, chunk.size, not chunk.key
                chunk = chunk.next

    def check(self) -> None:
        """Assert: the chunks tile their cudaMalloc'd blocks (links, contiguity, no strays);
        every chunk sits at its own address and the end chunk is a sentinel; every chunk has
        a creation id, all distinct and already issued, its ``tie`` being that id above its
        address, and a size that is a multiple of 512;
        each arena is well formed and holds exactly the free chunks, each once, in its own
        ``arena``, under its (size, creation id, address) key, the key its ``key`` holds; all
        chunks of one block belong to one arena; no two neighbouring chunks are both free;
        total_bytes = the blocks' sum, within the limit; used bytes, requests and allocs − frees
        agree with a recount; peaks ≥ current values."""
        record = self.record
        size_of = {a: c.size for a, c in record.items()}
        block_of = check_tiling(self.held, size_of,
                                {a: c.prev.address for a, c in record.items()},
                                {a: c.next.address for a, c in record.items()})
        for address, chunk in record.items():
            if chunk.address != address:
                fail(f"CuPy: the record at {address:#x} says it is at {chunk.address:#x}")
        end = self.end
        require(end.size == 0 and end.key == 0 and end.address == NONE,
                "CuPy: the end record is not a sentinel")
        cid_of = {a: c.tie >> CID_SHIFT for a, c in record.items() if c.tie is not None}
        require(cid_of.keys() == size_of.keys(), "CuPy: creation ids are not the chunks'")
        for address in cid_of:
            if record[address].tie & ADDRESS_MASK != address:
                fail(f"CuPy: chunk {address:#x}'s TIE does not end in its address")
        cids = list(cid_of.values())
        require(len(set(cids)) == len(cids), "CuPy: two chunks share a creation id")
        require(max(cids, default=-1) < self._next_cid, "CuPy: a creation id not yet issued")
        for address, size in size_of.items():
            if size % ALLOCATION_UNIT_SIZE:
                fail(f"CuPy: chunk {address:#x} of {size} bytes is not a multiple of 512")
        require(not self.strays, f"CuPy: {len(self.strays)} chunks in use are in no block")
        in_use = {a: c.arena for a, c in record.items() if not c.key}
        seen = set(in_use)
        for arena in self.arenas.values():
            arena.check()
            for size, low in arena.keys():
                key = size << SIZE_SHIFT | low
                address = low & ADDRESS_MASK
                if address in seen:
                    fail(f"CuPy: chunk {address:#x} is free in an arena and in use, or free twice")
                free = record.get(address)
                if (free is None or free.size != key >> SIZE_SHIFT
                        or cid_of.get(address) != (key >> CID_SHIFT) & ADDRESS_MASK):
                    fail(f"CuPy: arena key of chunk {address:#x} disagrees with its size or id")
                if free.key != key:
                    fail(f"CuPy: free chunk {address:#x}'s key is not its arena key")
                if free.arena is not arena:
                    fail(f"CuPy: free chunk {address:#x} sits in an arena not its own")
                seen.add(address)
        require(len(seen) == len(record), "CuPy: a free chunk is in no arena")
        owner: dict[int, object] = {}
        for address, base in block_of.items():
            arena = record[address].arena
            if owner.setdefault(base, arena) is not arena:
                fail(f"CuPy: the chunks of block {base:#x} belong to two arenas")
        for address, chunk in record.items():
            after = chunk.next
            if chunk.key and after.key:
                fail(f"CuPy: neighbouring free chunks {address:#x} and {after.address:#x} "
                     "not merged")
        require(self._total_bytes == sum(self.held.values()),
                "CuPy: total_bytes is not the blocks' sum")
        require(not self._limit or self._total_bytes <= self._limit,
                "CuPy: total_bytes over the limit")
        check_live_chunks("CuPy", self, dict(self.requested), in_use, size_of)
        require(self.peak_bytes_in_use >= self.bytes_in_use, "CuPy: peak_bytes_in_use < current")
        require(self.peak_total_bytes >= self._total_bytes, "CuPy: peak_total_bytes < current")

    def native_numbers(self) -> dict[str, Any] | None:
        """CuPyConfig (native/src/cupy_pool.hpp): the allocation unit and the limit."""
        return {"unit": ALLOCATION_UNIT_SIZE, "limit": self.get_limit()}

    def stats(self) -> PolicyStats:
        requested = sum(c.requested for c in self.record.values() if not c.key)
        return PolicyStats(
            num_allocs=self.num_allocs, num_frees=self.num_frees, num_ooms=self.num_ooms,
            bytes_in_use=self.bytes_in_use, peak_bytes_in_use=self.peak_bytes_in_use,
            bytes_requested=requested, pool_bytes=self._total_bytes,
            peak_pool_bytes=self.peak_total_bytes,
            largest_free_block=max((a.largest() for a in self.arenas.values()), default=0),
            free_blocks=self.n_free_blocks())
