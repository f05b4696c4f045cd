"""TensorFlow/XLA's BFC ("best-fit with coalescing") allocator, rule for rule.

Followed: openxla/xla xla/tsl/framework/bfc_allocator.cc (AllocateRawInternal, FindChunkPtr,
ShouldSplitChunk, Extend, DeallocateFreeRegions, TryToCoalesce) and bfc_allocator.h:

- every request rounds up to a multiple of 256 bytes (kMinAllocationSize); 0 bytes → null;
- free chunks sit in 21 bins, bin b holding sizes [256·2^b, 256·2^(b+1)), bin 20 everything of
  256 MiB and up, each ordered by (size, address); the search walks bins upward from
  bin(rounded) and takes the first chunk that fits — the smallest fitting chunk, lowest address
  on ties (policies/chunks.py's FreeIndex keeps exactly these 21 bins, each a sorted list, with
  a bitmask of the non-empty ones: O(log k) bisection in bin(rounded), then an O(1) jump);
- a chunk is split when chunk ≥ 2·rounded or chunk − rounded ≥ max_internal_fragmentation
  (128 MiB, or fragmentation_fraction·memory_limit when that is > 0); the caller keeps the low
  end, otherwise the whole chunk is handed out and its slack counts as in use;
- free merges with the next chunk if free, then the previous one; regions never merge;
- on a miss, Extend: available = floor256(memory_limit − pool_bytes), fail if rounded >
  available; double curr_region_allocation_bytes until it holds rounded; ask the device for
  min(curr, available); if refused, back off to round256(bytes·0.9) (strictly decreasing) until
  accepted or below rounded — on every refused Extend: current tsl has no started_backpedal_
  (TensorFlow's pre-tsl copy backed off once per allocator) — with bytes·0.9 computed as the
  source computes it, in single precision (size_t × float kBackpedalFactor is a float,
  truncated back to size_t); if curr did not grow for this request, double it after success;
- curr starts at round256(min(memory_limit, 2 MiB)) with allow_growth, else at
  round256(memory_limit) — one region of the whole limit, taken at the first allocation;
- garbage_collection (TensorFlow's GPU default; off in XLA/JAX): when Extend fails, free every
  region with no chunk in use, then Extend again.

Not modelled: TensorFlow's 10-second retry waiting for other threads to free memory, timestamped
chunks (freed_by_count), spatial partitioning, and alignment above 256 bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, ClassVar

from allocsim.policies.base import (
    NATIVE_SIZE_LIMIT,
    DeviceMemory,
    NativeTwin,
    Param,
    PolicyStats,
    fail,
    params_of,
    require,
)
from allocsim.policies.chunk_policy import ChunkPolicy
from allocsim.policies.chunks import bin_for_size
from allocsim.policies.limit_window import LimitWindow

# bin_for_size is BFC's BinNumForSize, public here.
__all__ = ["BFCAllocator", "PreallocateAllocator", "bin_for_size", "extend_available"]

MIN_ALLOCATION = 256
DEFAULT_MAX_INTERNAL_FRAGMENTATION = 128 << 20
BACKPEDAL_FACTOR = 0.9


def round_bytes(nbytes: int) -> int:
    """BFC's RoundedBytes: up to a multiple of 256."""
    return -(-nbytes // MIN_ALLOCATION) * MIN_ALLOCATION


def extend_available(memory_limit: int, pool_bytes: int) -> int:
    """Extend's ``available_bytes``: what the limit leaves beyond the pool, rounded down to
    256 bytes (Extend fails for a request above it; min-capacity's region watch reads it)."""
    return (memory_limit - pool_bytes) // MIN_ALLOCATION * MIN_ALLOCATION


def _float32(value: float) -> float:
    """``value`` rounded to the nearest IEEE single, as a C++ ``float`` holds it."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


_BACKPEDAL_FACTOR_F32 = _float32(BACKPEDAL_FACTOR)   # 0.89999997615814208984375


def backpedal_bytes(nbytes: int) -> int:
    """Extend's ``RoundedBytes(bytes * kBackpedalFactor)``: ``kBackpedalFactor`` is a
    ``float``, so ``bytes`` converts to float, the product is a float (the exact product of two
    singles fits a double, so rounding it once to single is the float multiply), and the
    implicit conversion back to ``size_t`` truncates. Double arithmetic differs for most sizes
    above 16 MiB (e.g. 1 GiB + 256 B backs off to the same bytes, 80 GiB + 256 B does not)."""
    return round_bytes(int(_float32(_float32(float(nbytes)) * _BACKPEDAL_FACTOR_F32)))


class BFCAllocator(ChunkPolicy):
    """BFC over a ChunkMap (policies/chunks.py): ChunkPolicy's malloc and free — best fit,
    the split rule with max_internal_fragmentation as its slack, coalescing — with Extend and
    DeallocateFreeRegions below as the growth rule."""

    name = "bfc"
    capacity_use = "bfc-regions; unless garbage_collection, fragmentation_fraction"
    native = NativeTwin("chunk", "bfc.hpp")
    description = "TensorFlow/XLA best-fit-with-coalescing allocator (growth by doubling regions)"
    def __init__(self, device: DeviceMemory, memory_limit: int = 0, fraction: float = 1.0,
                 allow_growth: bool = True, garbage_collection: bool = False,
                 fragmentation_fraction: float = 0.0) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        limit = int(memory_limit) if memory_limit else int(device.capacity * fraction)
        super().__init__(device, MIN_ALLOCATION,
                         int(fragmentation_fraction * limit) if fragmentation_fraction > 0
                         else DEFAULT_MAX_INTERNAL_FRAGMENTATION)
        self.memory_limit = limit
        self.allow_growth = allow_growth
        self.garbage_collection = garbage_collection
        if allow_growth:
            self.curr_region_allocation_bytes = round_bytes(min(self.memory_limit, 2 << 20))
        else:
            self.curr_region_allocation_bytes = round_bytes(self.memory_limit)
        self.pool_bytes = 0
        self.peak_pool_bytes = 0
        # Every memory_limit under which Extend and DeallocateFreeRegions would have decided
        # alike so far (min-capacity resumes runs at nearby capacities by it).
        self.limit_window = LimitWindow()

    PARAMS: ClassVar[dict[str, Param]] = params_of(
        __init__,
        memory_limit=("size", "bytes the allocator may hold; 0 = fraction × capacity"),
        fraction=("float", "memory_limit as a fraction of device capacity"),
        allow_growth=("bool", "grow in doubling regions from 2 MiB (else one region)"),
        garbage_collection=("bool", "free wholly free regions when growth fails"),
        fragmentation_fraction=(
            "float", "split threshold = this × memory_limit when > 0 (else 128 MiB)"),
    )

    @property
    def max_internal_fragmentation(self) -> int:
        """ShouldSplitChunk's threshold: split when the slack is at least this (ChunkPolicy's
        ``max_slack``)."""
        return self.max_slack

    def _make_room(self, rounded: int) -> bool:
        """AllocateRawInternal on a miss: Extend; if that fails, DeallocateFreeRegions (with
        garbage_collection) and Extend again."""
        return self._extend(rounded) or (self._deallocate_free_regions(rounded)
                                         and self._extend(rounded))

    # -- growth ----------------------------------------------------------------------
    def _extend(self, rounded: int) -> bool:
        """BFC's Extend, its start and end told to the observer (ChunkObserver's
        on_extend_start and on_extend)."""
        observer = self.observer
        if observer is None:
            return self._extend_region(rounded) is not None
        observer.on_extend_start(rounded)
        nbytes = self._extend_region(rounded)
        observer.on_extend(rounded, nbytes)
        return nbytes is not None

    def _extend_region(self, rounded: int) -> int | None:
        """BFC's Extend: one new region sized by the doubling rule, backing off on refusal.
        Returns the region's bytes, or None when it fails."""
        available = extend_available(self.memory_limit, self.pool_bytes)
        window = self.limit_window
        # floor256(limit - pool) >= x exactly when limit >= pool + round256(x).
        window.at_least(self.pool_bytes + round_bytes(rounded), rounded <= available)
        if rounded > available:
            return None
        increased = False
        while rounded > self.curr_region_allocation_bytes:
            self.curr_region_allocation_bytes *= 2
            increased = True
        curr = self.curr_region_allocation_bytes
        if curr <= available:
            window.at_least(self.pool_bytes + round_bytes(curr), True)
        else:       # the region is what the limit leaves: the same for the same 256 bytes
            window.within(self.pool_bytes + available,
                          self.pool_bytes + available + MIN_ALLOCATION - 1)
        nbytes = min(curr, available)
        base = self.device.reserve(nbytes)
        while base is None:
            backpedal = backpedal_bytes(nbytes)
            if backpedal >= nbytes:  # strict progress, as the source forces for small sizes
                backpedal = nbytes - MIN_ALLOCATION
            nbytes = backpedal
            if nbytes < rounded:
                return None
            base = self.device.reserve(nbytes)
        if not increased:
            self.curr_region_allocation_bytes *= 2
        self.chunks.add_region(base, nbytes)
        self.pool_bytes += nbytes
        self.peak_pool_bytes = max(self.peak_pool_bytes, self.pool_bytes)
        return nbytes

    def seed(self, regions: Sequence[tuple[int, int]],
             live: Sequence[tuple[int, int, int]],
             curr_region_allocation_bytes: int | None = None) -> None:
        """Start from a state the allocator was in (a profile that begins mid-run) instead of
        from nothing: ``regions`` ``(base, size)`` are taken from the device in the order given
        (each must come back at its base: a device that places ranges as told), ``live``
        chunks ``(address, size, requested)`` are carved out of them, and every other byte is
        free, one chunk per free run, as coalescing keeps BFC's chunks (no two free
        neighbours). ``curr_region_allocation_bytes``: Extend's next region size (default:
        left as construction set it). Only on an allocator that holds nothing yet; counters
        (allocations, peaks) start from this state."""
        chunks = self.chunks
        if chunks.regions:
            raise ValueError("BFC seed: the allocator already holds regions")
        for base, nbytes in regions:
            if nbytes <= 0 or nbytes % MIN_ALLOCATION or self.pool_bytes + nbytes > \
                    self.memory_limit:
                raise ValueError(f"BFC seed: region {base:#x} of {nbytes} bytes is not a "
                                 "multiple of 256 within memory_limit")
            got = self.device.reserve(nbytes)
            if got != base:
                raise ValueError(f"BFC seed: the device put region {base:#x} at "
                                 f"{got if got is None else hex(got)}")
            chunks.add_region(base, nbytes)
            self.pool_bytes += nbytes
        for address, nbytes, requested in sorted(live):
            free = chunks.free_chunk_holding(address, nbytes)
            if free is None:
                raise ValueError(f"BFC seed: live chunk {address:#x} of {nbytes} bytes is not "
                                 "inside free space of a region")
            start, size = free
            if start < address:     # keep [start, address) aside while the chunk is carved
                chunks.take(start, size, address - start, split=True)
            chunks.take(address, chunks.size[address], nbytes, split=True,
                        requested=max(int(requested), 1))
            if start < address:
                chunks.give_back(start)
            self.bytes_in_use += nbytes
            self.num_allocs += 1
        self.peak_bytes_in_use = self.bytes_in_use
        self.peak_pool_bytes = self.pool_bytes
        if curr_region_allocation_bytes is not None:
            self.curr_region_allocation_bytes = int(curr_region_allocation_bytes)

    def _deallocate_free_regions(self, rounded: int) -> bool:
        """BFC's DeallocateFreeRegions (only with garbage_collection)."""
        if not self.garbage_collection:
            return False
        free_regions = [base for base in self.chunks.regions if self.chunks.region_is_free(base)]
        free_bytes = sum(self.chunks.regions[base] for base in free_regions)
        if free_bytes == 0:
            return False
        room = rounded <= self.memory_limit - self.pool_bytes + free_bytes
        self.limit_window.at_least(rounded + self.pool_bytes - free_bytes, room)
        if not room:
            return False
        for base in free_regions:
            self.pool_bytes -= self.chunks.remove_region(base)
            self.device.release(base)
        return True

    def empty_cache(self) -> None:
        for base in [b for b in self.chunks.regions if self.chunks.region_is_free(b)]:
            self.pool_bytes -= self.chunks.remove_region(base)
            self.device.release(base)

    # -- views -----------------------------------------------------------------------
    def native_numbers(self) -> dict[str, Any] | None:
        """ChunkConfig's BFC fields (native/src/bfc.hpp): the memory limit, the first region,
        MIN_ALLOCATION, garbage collection and the back-off factor; None for a limit beyond
        the core's int64 Extend (its region size held below 2**62)."""
        if not 0 <= self.memory_limit < NATIVE_SIZE_LIMIT:
            return None
        return {**self.chunk_numbers(), "growth": "bfc", "memory_limit": self.memory_limit,
                "first_region": self.curr_region_allocation_bytes,
                "min_allocation": MIN_ALLOCATION,
                "garbage_collection": bool(self.garbage_collection),
                "backpedal_factor": BACKPEDAL_FACTOR}

    def stats(self) -> PolicyStats:
        return PolicyStats(
            num_allocs=self.num_allocs, num_frees=self.num_frees, num_ooms=self.num_ooms,
            bytes_in_use=self.bytes_in_use, peak_bytes_in_use=self.peak_bytes_in_use,
            bytes_requested=sum(self.requested.values()), pool_bytes=self.pool_bytes,
            peak_pool_bytes=self.peak_pool_bytes, largest_free_block=self.chunks.largest_free(),
            free_blocks=len(self.chunks.free_index))

    def check(self) -> None:
        """Assert ChunkMap's invariants (tiling, coalescing, free index = free chunks), and:
        every chunk a multiple of 256 bytes; the callers' blocks are the in-use chunks, each at
        least its request; pool_bytes = the regions' sum ≤ memory_limit; bytes_in_use = the
        in-use chunks' sum; allocs − frees = live blocks; peaks ≥ current values."""
        chunks = self.chunks
        chunks.check()
        for address, size in chunks.size.items():
            if size % MIN_ALLOCATION:
                fail(f"BFC: chunk {address:#x} of {size} bytes is not a multiple of 256")
        require(self.requested.keys() == set(chunks.in_use),
                "BFC: the requested table is not the in-use chunks")
        for address, size in self.requested.items():
            if not 0 < size <= chunks.size[address]:
                fail(f"BFC: block {address:#x} holds less than its request of {size}")
        require(self.pool_bytes == sum(chunks.regions.values()),
                f"BFC: pool_bytes {self.pool_bytes} is not the regions' sum")
        require(self.pool_bytes <= self.memory_limit, "BFC: pool_bytes over memory_limit")
        require(self.bytes_in_use == sum(chunks.size[a] for a in chunks.in_use),
                f"BFC: bytes_in_use {self.bytes_in_use} is not the in-use chunks' sum")
        require(self.num_allocs - self.num_frees == len(chunks.in_use),
                "BFC: allocs − frees is not the number of live blocks")
        require(self.peak_bytes_in_use >= self.bytes_in_use, "BFC: peak_bytes_in_use < current")
        require(self.peak_pool_bytes >= self.pool_bytes, "BFC: peak_pool_bytes < current")

    def fragmentation(self) -> float:
        """BFC's own GetFragmentation: (free pool − largest free chunk) / free pool."""
        free = self.pool_bytes - self.bytes_in_use
        return (free - self.chunks.largest_free()) / free if free else 0.0


class PreallocateAllocator(BFCAllocator):
    """JAX's default: BFC without growth, memory_limit = fraction × capacity, all of it taken
    as one region at the first allocation (XLA_PYTHON_CLIENT_PREALLOCATE=true, MEM_FRACTION
    0.75; jaxlib/xla_client.py, xla/pjrt/gpu/gpu_helpers.cc). Never grows. If the device
    refuses the whole region, BFC's back-off takes a smaller one, as the real one would."""

    name = "preallocate"
    capacity_use = "bfc-regions"   # BFC's Extend without growth: one region of the limit
    native = NativeTwin("chunk", "bfc.hpp")
    description = ("JAX default: one region of fraction × capacity at the first allocation "
                   "(BFC inside)")

    def __init__(self, device: DeviceMemory, fraction: float = 0.75, memory_limit: int = 0) -> None:
        super().__init__(device, memory_limit=memory_limit, fraction=fraction, allow_growth=False)

    PARAMS: ClassVar[dict[str, Param]] = params_of(
        __init__,
        fraction=("float", "share of device capacity taken up front (JAX: 0.75)"),
        memory_limit=("size", "bytes taken up front; 0 = fraction × capacity"),
    )
