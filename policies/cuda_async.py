"""The CUDA stream-ordered pool (cudaMallocAsync / cudaFreeAsync), as JAX and CuPy drive it.

The pool lives in the closed driver: what is documented is modelled, what is not is assumed,
and both are listed below. Sources:

- CUDA Programming Guide, "Stream-Ordered Memory Allocator" (physical page caching, release
  threshold, reuse policies, synchronization API actions) and the driver API reference of
  cuMemPoolTrimTo / cudaMemPoolTrimTo;
- openxla/xla xla/stream_executor/gpu/gpu_cudamallocasync_allocator.cc (JAX's
  XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async; the current copy vendored in tensorflow/tensorflow
  third_party/xla): one compute stream; the pool's release threshold is
  set to pool_size; ``SetStreamAndPreallocateMemory`` allocates and frees pool_size when
  reserve_memory (= preallocate) is set; ``AllocateRaw`` synchronises the stream and retries
  once on CUDA_ERROR_OUT_OF_MEMORY; stats count requested bytes. xla/pjrt/gpu/gpu_helpers.cc
  (CreateCudaAsyncAllocator): pool_size = total memory × memory_fraction;
- cupy/cupy cupy/cuda/memory.pyx ``MemoryAsyncPool``: rounds requests with ``_round_size``
  (512 B), retries after ``stream.synchronize()`` on cudaErrorMemoryAllocation,
  ``free_all_blocks`` = synchronize + ``memPoolTrimTo(pool, 0)``, ``used_bytes`` /
  ``total_bytes`` = cudaMemPoolAttrUsedMemCurrent / ReservedMemCurrent, and — easy to miss —
  its ``set_limit`` sets cudaMemPoolAttrReleaseThreshold: it is not a cap.

Modelled (documented):
- Memory freed to the pool stays reserved; at a synchronisation, if the pool holds more than
  the release threshold, it releases free physical memory (Programming Guide, "Physical Page
  Caching Behavior" and "Synchronization API Actions"). The default threshold is 0 ("by
  default, the allocator tries to minimize the physical memory owned by a pool"); a threshold
  ≥ capacity never releases (CUDA's UINT64_MAX).
- A trim never takes the pool below the threshold: "if the pool has less than minBytesToKeep
  reserved, the TrimTo operation is a no-op. Otherwise the pool will be guaranteed to have at
  least minBytesToKeep bytes reserved after the operation", and it cannot release physical
  memory that backs live allocations ("OS allocations may happen at different granularity
  from the user allocations").
- Memory freed on a stream is reusable at once by that stream; by other streams after a
  synchronisation ("Memory Reuse Policies").
- On an out-of-memory the caller synchronises and retries (XLA's AllocateRaw retries once,
  which the model follows; CuPy's MemoryAsyncPool.malloc retries twice).
- JAX: threshold = fraction × capacity; preallocate takes that much up front and frees it
  into the pool, where it stays (it is not above the threshold).

Assumed (undocumented; each a parameter where it matters):
- Growth: a miss maps one new physical chunk of round_up(request, ``chunk``) bytes, ``chunk``
  = the device's mapping granularity (2 MiB) by default, into a virtual range of its own
  (``address_range`` + ``map``). Chunks never merge and an allocation never spans two chunks.
  A chunk is released (``unmap``) only when wholly free; the newest (highest address) first.
- Placement inside the pool: best fit by (size, address) with immediate coalescing, always
  splitting, the caller keeping the low end; requests round up to ``alignment`` (512 B, as
  CuPy rounds before calling cudaMallocAsync).
- When synchronisations happen (a trace records none): ``sync=free`` (default) — after every
  free, so freed memory is shared by all streams and the threshold is applied after each free
  (an upper bound on releases and re-maps: a program that synchronises once a step releases
  less);
  ``sync=none`` — never, except on an out-of-memory and ``empty_cache()``: freed memory stays
  with its stream (it merges with free neighbours that are its stream's or shared, and the
  result is the stream's; an allocation takes the best fit among its stream's chunks and the
  shared ones) and nothing is released.
- Out of memory: in the retry after the synchronisation, if nothing in the pool fits, the
  driver is assumed to remap its cached physical memory for the request ("more flexibility for
  blocks coalescing and doing memory remapping", XLA's comment): every wholly free chunk is
  released, then the map is tried once more (two device attempts per out-of-memory). Memory
  behind live allocations is never remapped.
- Preallocation happens at the first allocation (as this project's ``preallocate`` policy),
  so the device call shows in the timeline; the pool's stats ignore it (XLA's ClearStats).

Layout: the chunks are policies/chunks.py's (:class:`~allocsim.policies.chunks.ChunkMap`: one
Chunk each, linked in a ring through its region's sentinel; ``key`` 0 while in use), each
mapped physical chunk one region. Free memory any stream may take is ChunkMap's own free index
(``shared``); with ``sync=none`` a stream's own free chunks sit in that stream's FreeIndex, their
owner in ``owner_of`` and each live chunk's stream in ``stream_of``. One malloc and one free
for every setting (:meth:`CudaAsyncAllocator.malloc`, :meth:`~CudaAsyncAllocator.free`), one
step at a time through FreeIndex's own methods and the owner rules; tests/test_fast_paths.py
holds them to the results recorded before the speed work.

Costs (FreeIndex per owner, k = free chunks in the bin touched): malloc is
one O(log k) search of the shared index (and of the stream's own with ``sync=none``) plus an
O(log k + k) removal and, for a split, an insertion; free is O(1) link updates plus one
O(log k + k) index update per merged neighbour and one for the freed chunk; with ``sync=free``
the release threshold costs O(free regions) only when a wholly free chunk exists and the pool is
above it. ``synchronize()`` is O(stream-owned free chunks); ``check()`` O(n log n).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping, MutableSet
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
from allocsim.policies.chunk_records import ADDRESS_MASK, Chunk, ring_of
from allocsim.policies.chunks import KEY_SHIFT, ChunkMap, FreeIndex
from allocsim.policies.limit_window import LimitWindow

SHARED = -(1 << 62)        # owner of free memory any stream may reuse (after a sync)
SYNC_MODES = ("free", "none")


class CudaAsyncAllocator(Policy):
    name = "cuda-async"
    capacity_use = "limit; unless fraction"   # threshold = fraction × capacity when set
    native = NativeTwin("cuda-async", "cuda_async.hpp")
    description = "CUDA stream-ordered pool (cudaMallocAsync): 2 MiB chunks, release threshold"

    def __init__(self, device: DeviceMemory, release_threshold: int = 0, fraction: float = 0.0,
                 preallocate: bool = False, chunk: int = 0, alignment: int = 512,
                 sync: str = "free") -> None:
        super().__init__(device)
        if not 0 <= fraction <= 1:
            raise ValueError(f"fraction must be in [0, 1], got {fraction}")
        if release_threshold and fraction:
            raise ValueError("give release_threshold or fraction, not both")
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, got {sync!r}")
        self.threshold = int(release_threshold) or int(fraction * device.capacity)
        self.chunk = int(chunk) or device.map_granularity
        if self.chunk % device.map_granularity:
            raise ValueError(f"chunk must be a multiple of the device's mapping granularity "
                             f"({device.map_granularity} bytes)")
        if alignment <= 0:
            raise ValueError(f"alignment must be positive, got {alignment}")
        self.alignment = int(alignment)
        self.sync_on_free = sync == "free"
        # Whether there is a threshold at all is a decision of its own, taken here once:
        # min-capacity shares runs only between thresholds both 0 or both not
        # (sim/questions/shared_runs.py's "has limit"), so the window need not note it.
        self._preallocate_pending = preallocate and self.threshold > 0
        # The thresholds under which every decision against it so far went alike (a fraction
        # makes it a share of the capacity): min-capacity resumes a run at another capacity
        # from a saved state of this one while its threshold is inside.
        self.limit_window = LimitWindow()
        self.chunks = ChunkMap()                 # the chunks; each mapped physical chunk a region
        self.regions: dict[int, int] = self.chunks.regions   # region base -> bytes
        self.shared: FreeIndex = self.chunks.free_index      # free memory every stream may take
        self.indexes: dict[int, FreeIndex] = {SHARED: self.shared}
        self.owner_of: dict[int, int] = {}       # sync=none: free chunk -> owner (SHARED/stream)
        self.stream_of: dict[int, int] = {}      # sync=none: chunk in use -> its stream
        self.free_regions: set[int] = set()      # regions that are one shared free chunk
        self.mapped = 0
        self.peak_mapped = 0
        self.peak_bytes_in_use = 0
        # Address-keyed views of the chunks (checks, reports, tests): chunk -> size,
        # -> neighbour's address (NONE at a region's ends), the chunks in use, their requests.
        self.size_of: MutableMapping[int, int] = self.chunks.size
        self.prev_of: MutableMapping[int, int] = self.chunks.prev
        self.next_of: MutableMapping[int, int] = self.chunks.next
        self.in_use: MutableSet[int] = self.chunks.in_use
        self.requested: MutableMapping[int, int] = self.chunks.requested
        self._record = self.chunks.record
        self._ring = self.chunks.ring
        self._spare = self.chunks.spare

    PARAMS: ClassVar[dict[str, Param]] = params_of(
        __init__,
        release_threshold=("size", "bytes the pool keeps at a sync "
                                   "(cudaMemPoolAttrReleaseThreshold); ≥ capacity = never release"),
        fraction=("float", "threshold = fraction × capacity when > 0 (JAX: 0.75)"),
        preallocate=("bool", "take the threshold up front (JAX preallocate)"),
        chunk=("size", "physical growth unit; 0 = the device's mapping granularity"),
        alignment=("size", "allocation sizes round up to this"),
        sync=("str", "when the pool synchronises: free (after each) or none"),
    )

    @property
    def preallocate_pending(self) -> bool:
        """Whether the preallocation (``preallocate`` with a threshold: XLA's
        SetStreamAndPreallocateMemory) is still to come; the first malloc makes it. Read-only:
        the native core and min-capacity's state read it, only the policy changes it."""
        return self._preallocate_pending

    # -- allocation ----------------------------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> int | None:
        if size <= 0:
            return None
        if self._preallocate_pending:
            self._preallocate()
        rounded = -(-size // self.alignment) * self.alignment
        key, owner = self._find(rounded, stream)
        if key:
            chunk = self._take(key & ADDRESS_MASK, key >> KEY_SHIFT, owner, rounded)
        else:
            grown = self._grow(rounded, stream)
            if grown is None:
                self.num_ooms += 1
                return None
            chunk = grown
        # The chunk is in use by ``stream`` (its ``key`` 0) for ``size`` bytes.
        address = chunk.address
        chunk.key = 0
        chunk.requested = size
        if not self.sync_on_free:
            self.stream_of[address] = stream
        in_use = self.bytes_in_use + rounded
        self.bytes_in_use = in_use
        if in_use > self.peak_bytes_in_use:
            self.peak_bytes_in_use = in_use
        self.num_allocs += 1
        return address

    def _find(self, rounded: int, stream: int) -> tuple[int, int]:
        """Best fit by (size, address) among shared free memory and the stream's own:
        ``(free-index key, owner)``, key 0 when nothing fits (keys order as (size, address))."""
        key = self.shared.best_key(rounded)
        if not self.sync_on_free:
            own = self.indexes.get(stream)
            if own is not None:
                mine = own.best_key(rounded)
                if mine and (not key or mine < key):
                    return mine, stream
        return key, SHARED

    def _grow(self, rounded: int, stream: int) -> Chunk | None:
        """A miss: map a new chunk and carve the allocation from its low end. If the device
        refuses: :meth:`_after_refusal`. Returns the allocation's chunk or None."""
        chunk = self._map_chunk(rounded)
        if chunk is None:
            return self._after_refusal(rounded, stream)
        self._split_off(chunk, rounded, SHARED)      # the rest: shared free memory
        return chunk

    def _after_refusal(self, rounded: int, stream: int) -> Chunk | None:
        """The device refused a new chunk: synchronise and retry (XLA's AllocateRaw) — the pool
        first, then (assumed) the wholly free chunks are remapped for it."""
        self.synchronize()
        key, owner = self._find(rounded, stream)
        if key:
            return self._take(key & ADDRESS_MASK, key >> KEY_SHIFT, owner, rounded)
        self._trim(0)
        chunk = self._map_chunk(rounded)
        if chunk is None:
            return None
        self._split_off(chunk, rounded, SHARED)
        return chunk

    def _chunk_bytes(self, rounded: int) -> int:
        """The physical chunk a miss of ``rounded`` bytes maps: round_up(rounded, chunk)."""
        return -(-rounded // self.chunk) * self.chunk

    def _map_chunk(self, rounded: int) -> Chunk | None:
        """Map a new physical chunk of round_up(rounded, chunk) bytes in a virtual range of its
        own: a region of one chunk, in use (``key`` 0) and in no index yet. Returns that chunk
        or None if refused."""
        nbytes = self._chunk_bytes(rounded)
        base = self.device.address_range(nbytes)
        if not self.device.map(base, nbytes):
            return None
        chunk = self._record[base] = ring_of(nbytes, base, self._spare)
        chunk.key = 0                               # in use until indexed
        self.regions[base] = nbytes
        self._ring[base] = chunk.prev
        self.mapped += nbytes
        if self.mapped > self.peak_mapped:
            self.peak_mapped = self.mapped
        return chunk

    def _take(self, address: int, chunk_size: int, owner: int, rounded: int) -> Chunk:
        """Hand out free chunk ``address``; the rest (if any) stays free with the same owner.
        Returns the chunk."""
        self.indexes[owner].remove(chunk_size, address)
        chunk = self._record[address]
        if chunk.next is chunk.prev:             # both its ring: the region was wholly free
            self.free_regions.discard(address)
        if not self.sync_on_free:
            del self.owner_of[address]
        chunk.key = 0
        self._split_off(chunk, rounded, owner)
        return chunk

    def _split_off(self, chunk: Chunk, rounded: int, owner: int) -> None:
        """``chunk`` (in use) keeps its low ``rounded`` bytes; the rest, if any, becomes a free
        chunk of ``owner`` (the chunk after it is never free: no merge)."""
        rest_size = chunk.size - rounded
        if not rest_size:
            return
        rest = chunk.address + rounded
        after = chunk.next
        chunk.size = rounded
        key = rest_size << KEY_SHIFT | rest
        spare = self._spare
        if spare:                       # a chunk a merge dropped, reused (ChunkMap.spare)
            piece = spare.pop()
            piece.size, piece.prev, piece.next = rest_size, chunk, after
            piece.key, piece.address = key, rest
        else:
            piece = Chunk(rest_size, chunk, after, key, rest, 0)
        self._record[rest] = chunk.next = after.prev = piece
        self.indexes[owner].add(rest_size, rest)
        if not self.sync_on_free:
            self.owner_of[rest] = owner

    # -- free --------------------------------------------------------------------------
    def free(self, address: int) -> None:
        chunk = self._record[address]
        if chunk.key:
            raise KeyError(f"chunk {address:#x} is not in use")
        self.bytes_in_use -= chunk.size
        self.num_frees += 1
        if self.sync_on_free:
            self._give_back(chunk, SHARED)
            # The synchronisation after the free applies the release threshold.
            if self._release_due():
                self._trim(self.threshold, self.limit_window)
        else:
            self._give_back(chunk, self.stream_of.pop(address))

    def _give_back(self, chunk: Chunk, owner: int) -> None:
        """Return ``chunk`` (in no index) as free memory of ``owner``, merging with the next free
        neighbour, then the previous one (as BFC and CuPy). With per-stream ownership a
        neighbour merges if it is shared or ``owner``'s: both parts are usable by ``owner``, and
        the merged chunk is ``owner``'s until the next synchronisation."""
        record = self._record
        owner_of = None if self.sync_on_free else self.owner_of
        indexes = self.indexes
        index = indexes.get(owner)
        if index is None:
            index = indexes[owner] = FreeIndex()
        address = chunk.address
        size = chunk.size
        after = chunk.next
        if after.key:                                   # free (a ring never is)
            neighbour_index: FreeIndex | None = index
            if owner_of is not None:
                neighbour_owner = owner_of[after.address]
                neighbour_index = indexes[neighbour_owner]
                if neighbour_owner != owner and neighbour_owner != SHARED:
                    neighbour_index = None
            if neighbour_index is not None:
                neighbour_index.remove(after.size, after.address)
                self._spare.append(record.pop(after.address))
                if owner_of is not None:
                    del owner_of[after.address]
                size += after.size
                after = chunk.next = after.next
                after.prev = chunk
        before = chunk.prev
        if before.key:
            neighbour_index = index
            if owner_of is not None:
                neighbour_owner = owner_of[before.address]
                neighbour_index = indexes[neighbour_owner]
                if neighbour_owner != owner and neighbour_owner != SHARED:
                    neighbour_index = None
            if neighbour_index is not None:
                neighbour_index.remove(before.size, before.address)
                self._spare.append(record.pop(address))
                size += before.size
                chunk, address = before, before.address
                chunk.next = after
                after.prev = chunk
        chunk.size = size
        chunk.key = size << KEY_SHIFT | address
        index.add(size, address)
        if owner_of is not None:
            owner_of[address] = owner
        if owner == SHARED and after is chunk.prev:     # both its ring: wholly free
            self.free_regions.add(address)

    # -- synchronisation and release ---------------------------------------------------
    def synchronize(self) -> None:
        """A stream/device synchronisation: every stream's freed memory becomes shared (merging
        with shared neighbours), then memory above the release threshold is released."""
        for owner, index in list(self.indexes.items()):
            if owner == SHARED or not len(index):
                continue
            for size, address in list(index.keys()):
                index.remove(size, address)
                del self.owner_of[address]
                self._give_back(self._record[address], SHARED)
        if self._release_due():
            self._trim(self.threshold, self.limit_window)

    def _release_due(self) -> bool:
        """Whether a synchronisation releases memory: a wholly free chunk exists and the pool
        holds more than the release threshold (a decision against the threshold, noted)."""
        if not self.free_regions:
            return False
        kept = self.threshold >= self.mapped
        self.limit_window.at_least(self.mapped, kept)
        return not kept

    def _trim(self, keep: int, window: LimitWindow | None = None) -> None:
        """cuMemPoolTrimTo(keep): release wholly free chunks, newest first, never taking the pool
        below ``keep`` bytes. ``window``: where ``keep`` is the release threshold, its limit
        window, which notes each comparison with it."""
        if self.mapped <= keep:
            if window is not None:
                window.at_least(self.mapped, True)
            return
        if window is not None:
            window.at_least(self.mapped, False)
        for base in sorted(self.free_regions, reverse=True):
            if self._trim_region(base, keep, window):
                break

    def _trim_region(self, base: int, keep: int, window: LimitWindow | None) -> bool:
        """One step of :meth:`_trim`'s loop: release wholly free region ``base`` unless that
        takes the pool below ``keep``; whether the pool is then down to ``keep`` (the trim
        stops)."""
        nbytes = self.regions[base]
        stays = self.mapped - nbytes < keep
        if window is not None:
            window.at_least(self.mapped - nbytes + 1, stays)
        if stays:
            return False
        self.free_regions.discard(base)
        self.chunks.remove_region(base)         # and out of the shared index
        if not self.sync_on_free:
            del self.owner_of[base]
        self.mapped -= nbytes
        self.device.unmap(base, nbytes)
        done = self.mapped <= keep
        if window is not None:
            window.at_least(self.mapped, done)
        return done

    def trim_to(self, min_bytes_to_keep: int) -> None:
        """cudaMemPoolTrimTo after a synchronisation."""
        self.synchronize()
        self._trim(min_bytes_to_keep)

    def empty_cache(self) -> None:
        """CuPy's MemoryAsyncPool.free_all_blocks: synchronize, then memPoolTrimTo(pool, 0)."""
        self.trim_to(0)

    def _preallocate(self) -> None:
        """XLA's SetStreamAndPreallocateMemory: AllocateRaw(threshold) then DeallocateRaw; the
        chunk stays as shared free memory (it is not above the threshold)."""
        self._preallocate_pending = False
        # The chunk is the threshold rounded up to whole chunks: alike for every threshold
        # that rounds to it.
        whole_chunks = self._chunk_bytes(self.threshold)
        self.limit_window.within(whole_chunks - self.chunk + 1, whole_chunks)
        chunk = self._map_chunk(self.threshold)
        if chunk is not None:
            base, nbytes = chunk.address, chunk.size
            chunk.key = nbytes << KEY_SHIFT | base
            self.shared.add(nbytes, base)
            self.free_regions.add(base)
            if not self.sync_on_free:
                self.owner_of[base] = SHARED

    # -- CuPy MemoryAsyncPool / pool attributes ----------------------------------------
    def used_bytes(self) -> int:
        """cudaMemPoolAttrUsedMemCurrent (allocation sizes after rounding)."""
        return self.bytes_in_use

    def total_bytes(self) -> int:
        """cudaMemPoolAttrReservedMemCurrent: physical memory the pool holds."""
        return self.mapped

    def free_bytes(self) -> int:
        return self.mapped - self.bytes_in_use

    # -- views -----------------------------------------------------------------------
    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        return self.chunks.chunks()

    def check(self) -> None:
        """Assert: the chunks tile their mapped regions (links, contiguity, rings, no strays),
        each region a whole number of growth chunks; every index is well formed and the indexes
        together hold exactly the free chunks, each once, at its size and record key, and in
        its owner's index (with ``sync=free`` all in the shared one and no owner or stream
        table); no two neighbouring free chunks that free_block would have merged (with
        ``sync=none``: neighbouring free chunks have two different stream owners);
        ``free_regions`` is exactly the regions that are one shared free chunk; mapped,
        bytes_in_use, requests and allocs − frees agree with a recount (with ``sync=none`` a
        stream for each chunk in use); peaks ≥ current values."""
        self.chunks.check_layout()
        record = self._record
        for base, nbytes in self.regions.items():
            if nbytes % self.chunk:
                fail(f"cuda-async: region {base:#x} is not a whole number of chunks")
        owner_of: dict[int, int] = {}
        for owner, index in self.indexes.items():
            index.check()
            for size, address in index.keys():
                chunk = record.get(address)
                if address in owner_of or chunk is None or not chunk.key:
                    fail(f"cuda-async: chunk {address:#x} is indexed twice or in use")
                if chunk.size != size or chunk.key != size << KEY_SHIFT | address:
                    fail(f"cuda-async: chunk {address:#x} is indexed at the wrong size")
                owner_of[address] = owner
        in_use = {address for address, chunk in record.items() if not chunk.key}
        require(len(owner_of) + len(in_use) == len(record),
                "cuda-async: a free chunk is in no index")
        require(self.indexes[SHARED] is self.shared, "cuda-async: the shared index moved")
        if self.sync_on_free:
            require(not self.owner_of, "cuda-async: sync=free keeps an owner table")
            require(not self.stream_of, "cuda-async: sync=free keeps a stream table")
            require(len(self.indexes) == 1, "cuda-async: sync=free has stream-owned free chunks")
        else:
            require(self.owner_of == owner_of,
                    "cuda-async: the owner table disagrees with the indexes")
            require(self.stream_of.keys() == in_use,
                    "cuda-async: the stream table is not the chunks in use")
        for address, chunk in record.items():
            after = chunk.next.address
            if address not in owner_of or after not in owner_of:
                continue
            first, second = owner_of[address], owner_of[after]
            if first == second or SHARED in (first, second):
                fail(f"cuda-async: neighbouring free chunks {address:#x} and {after:#x} not "
                     "merged")
        wholly_free = {base for base, ring in self._ring.items()
                       if ring.next is ring.prev and owner_of.get(base) == SHARED}
        require(self.free_regions == wholly_free,
                "cuda-async: free_regions is not the regions that are one shared free chunk")
        require(self.mapped == sum(self.regions.values()),
                "cuda-async: mapped is not the regions' sum")
        check_live_chunks("cuda-async", self, dict(self.requested), dict.fromkeys(self.in_use),
                          self.size_of)
        require(self.peak_bytes_in_use >= self.bytes_in_use,
                "cuda-async: peak_bytes_in_use < current")
        require(self.peak_mapped >= self.mapped, "cuda-async: peak_mapped < mapped")

    def native_numbers(self) -> dict[str, Any] | None:
        """CudaAsyncConfig (native/src/cuda_async.hpp): threshold, chunk, alignment, sync
        mode and whether the first malloc preallocates."""
        return {"threshold": self.threshold, "chunk": self.chunk, "alignment": self.alignment,
                "sync_on_free": bool(self.sync_on_free),
                "preallocate": bool(self.preallocate_pending)}

    def stats(self) -> PolicyStats:
        return PolicyStats(
            num_allocs=self.num_allocs, num_frees=self.num_frees, num_ooms=self.num_ooms,
            bytes_in_use=self.bytes_in_use, peak_bytes_in_use=self.peak_bytes_in_use,
            bytes_requested=sum(self.requested.values()), pool_bytes=self.mapped,
            peak_pool_bytes=self.peak_mapped,
            largest_free_block=max(index.largest() for index in self.indexes.values()),
            free_blocks=sum(len(index) for index in self.indexes.values()))
