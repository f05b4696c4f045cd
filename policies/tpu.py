"""The TPU runtime's HBM allocator (JAX on a TPU), as the chip's own records show it.

The runtime is closed source, so every rule here was read off its ``MemoryAllocation`` /
``MemoryDeallocation`` records (``jax.profiler`` on a TPU v5e, JAX 0.10.2, libtpu 0.0.42.1;
recorded by experiments/tpu/chip_probe.py, committed under tests/data/tpu/) and each is pinned
by tests/test_tpu_policy.py against those records:

- **No preallocation, no growth**: the runtime owns all of HBM from the start (``bytes_limit``
  16,909,336,064 B on a v5e) and hands out offsets in it; it holds ``runtime_bytes`` (26,624 B
  on a v5e) at the very top before any array. What it holds from the device, in the model, is
  what it has in use: each buffer is taken from the device as it is placed and given back as
  it is freed (so ``peak_reserved`` is the chip's ``peak_bytes_in_use`` plus its
  ``peak_bytes_reserved``, each less the runtime's bytes), never all of HBM at once.
- ``scratch_bytes`` (a program's scratch, the chip's ``bytes_reserved``; compile_for puts it
  in the trace, traces/record/xla_tpu.py): held at the **bottom** of HBM from the heap's start,
  ``[0, scratch_bytes)``; buffers are placed above it and the free total leaves it out. Read
  on the chip (experiments/tpu/scratch_place_probe.py, tests/data/tpu/scratch-place): with a
  1.61 GB scratch held, 256 MiB buffers filled HBM from the top down to exactly 1.61 GB above
  offset 0, the runtime's ``bytes_available`` counting the scratch as taken; a program run
  later whose scratch no hole held was given it after a compaction, the free block again
  starting above it.
- ``round_to_granule``: every buffer is a multiple of 512 B (its layout's size, already
  rounded by the caller, as ``on_device_size_in_bytes`` reports it).
- ``best_fit``: the smallest free block that holds the request; among equal sizes the one at
  the highest address; the block at the bottom of HBM (just above the scratch) only when no
  other holds it; the buffer
  is placed at the block's **top** end (so a fresh heap fills from the top down).
- ``place``: the buffer goes at the top end of the block best fit chose; the rest of the
  block stays free below it.
- ``coalesce``: a freed buffer merges with free neighbours at once.
- ``compact``: when no free block holds the request but the free total does, every live buffer
  slides to the top of HBM in address order (live buffers are moved, not lost), leaving one
  free block below them (above the scratch); the request is then placed by ``best_fit``. Cost:
  measured 16–39 ms for 1.9–4.2 GB moved on the v5e (``compaction_seconds``), against ~0.2 ms
  for an ordinary allocation; charged to the run's modelled time as a device call of kind
  ``compact`` (the only TPU call with a time: sim/kernel/device_profile.py's TPU_COSTS).
- ``free_total_short`` (the OOM): a request fails only when the free total (less the scratch)
  is short ("Attempting to allocate 7.78G. That was not possible. There are 7.72G free.").

Not modelled: the chip gives an idle program's scratch (and its code) up when a buffer needs
the room, and takes it again at the program's next run (scratch-place, records 55–56: the
scratch released, the code freed, then a compaction). A trace does not say when its programs
run, so the model holds the scratch throughout: it answers whether the step runs, and refuses a
buffer the chip would have given the idle scratch's room.

The native core's twin (native/src/tpu.hpp) has each rule under the same name and is handed
this module's constants (the granule, the runtime's bytes, the compaction cost line).

Buffers move, so :meth:`malloc` returns a handle (stable for the buffer's life) and
:meth:`hbm_offset` says where the buffer is now. Executables' generated code is a buffer (a
trace carries it as an allocation, as compile_for does); their scratch is ``scratch_bytes``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any, ClassVar

from allocsim.policies.base import (
    NATIVE_SIZE_LIMIT,
    DeviceMemory,
    NativeTwin,
    Param,
    Policy,
    PolicyStats,
    fail,
    params_of,
    require,
)
from allocsim.policies.units import round_up

GRANULE = 512
V5E_RUNTIME_BYTES = 26_624
# Compaction's cost on a v5e: the time from the request to its record, 64 MiB buffers
# (experiments/tpu/chip_probe.py, compaction-2/4/8): 39.1, 22.5 and 16.3 ms. Against the bytes
# this model's compact moves in those three runs (every live buffer whose offset changes:
# 8.39, 4.16 and 2.08 GB — the figure compaction_seconds is applied to), a least-squares line
# through the three (_fit_compaction_cost, below). An earlier fit took 4.23, 3.15 and 1.88 GB
# for x, another count of the bytes moved, and so charged the model's compactions up to twice
# the measured time.


def round_to_granule(size: int, granule: int = GRANULE) -> int:
    """The bytes a buffer of ``size`` takes: a whole number of 512 B granules."""
    return round_up(size, granule)


def _fit_compaction_cost() -> tuple[float, float]:
    points = ((8_388_608_000, 0.0391), (4_160_749_568, 0.0225), (2_080_374_784, 0.0163))
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points)
             / sum((x - mean_x) ** 2 for x, _ in points))
    return max(mean_y - slope * mean_x, 0.0), slope * 1e9


COMPACTION_BASE_S, COMPACTION_PER_GB_S = _fit_compaction_cost()



def compaction_seconds(moved_bytes: int) -> float:
    """Modelled time of one compaction that moves ``moved_bytes`` (v5e, measured)."""
    return COMPACTION_BASE_S + COMPACTION_PER_GB_S * moved_bytes / 1e9


class TpuRuntimeAllocator(Policy):
    """Best fit from the top of HBM with coalescing, compaction when no hole fits."""

    name = "tpu"
    # All of HBM is the heap, taken at the first allocation: the capacity sizes it (and so every
    # placement), as no rule min-capacity's shortcuts know; the safe declaration.
    capacity_use = "unknown"
    native = NativeTwin("tpu", "tpu.hpp")
    description = ("TPU runtime (JAX on TPU): all HBM, best fit from the top, 512 B granules, "
                   "compaction when no hole fits")

    def __init__(self, device: DeviceMemory, runtime_bytes: int = V5E_RUNTIME_BYTES,
                 granule: int = GRANULE, scratch_bytes: int | None = None) -> None:
        super().__init__(device)
        self.runtime_bytes = int(runtime_bytes)
        self.granule = int(granule)
        if self.granule < 1:
            raise ValueError("granule must be at least 1 byte")
        # The bottom of the heap the scratch holds: [0, floor), whole granules. Unset: the
        # trace's own (sim/kernel/trace_scratch.py gives it), else none.
        self.scratch_bytes = scratch_bytes
        self.floor = round_to_granule(max(scratch_bytes or 0, 0), self.granule)
        # HBM's size, read once as the runtime starts: the heap is all of it below the
        # runtime's bytes (reserved at the first allocation). Read here, at the build, so a
        # watcher of the build (min-capacity's probe in the native core) sees that the
        # capacity decides every placement.
        self.hbm_bytes = device.capacity
        self.heap_base: int | None = None
        self.heap_size = 0
        self.peak_bytes_in_use = 0
        self.num_compactions = 0
        self.compaction_moved_bytes = 0
        self.compaction_s = 0.0
        # Free blocks: start -> size, end -> start, and the best-fit index of (size, -start).
        self._free: dict[int, int] = {}
        self._free_end: dict[int, int] = {}
        self._index: list[tuple[int, int]] = []
        # Live buffers: handle -> (offset, size); offsets are relative to the heap (= HBM).
        self._live: dict[int, tuple[int, int]] = {}
        # What each live buffer holds from the device: handle -> the range reserve() gave.
        self._held: dict[int, int] = {}
        self._next_handle = 1

    PARAMS: ClassVar[dict[str, Param]] = params_of(
        __init__,
        runtime_bytes=("size", "bytes the runtime holds at the top of HBM (v5e: 26,624)"),
        granule=("size", "every buffer is a multiple of this (TPU: 512 bytes)"),
        scratch_bytes=("size", "a program's scratch, held at the bottom of HBM (the chip's "
                               "bytes_reserved); unset: the trace's own (compile_for "
                               "writes it), else none"),
    )

    # -- free blocks -----------------------------------------------------------------
    def _add_free(self, start: int, size: int) -> None:
        self._free[start] = size
        self._free_end[start + size] = start
        bisect.insort(self._index, (size, -start))

    def _remove_free(self, start: int) -> int:
        size = self._free.pop(start)
        del self._free_end[start + size]
        at = bisect.bisect_left(self._index, (size, -start))
        del self._index[at]
        return size

    def _start_heap(self) -> bool:
        # The runtime owns HBM whole, everything below its own bytes: an address range, the
        # device's memory taken as buffers are placed; the scratch first, at the bottom.
        self.heap_size = self.hbm_bytes - self.runtime_bytes
        if self.heap_size <= 0 or self.floor >= self.heap_size:
            return False
        if self.floor and self.device.reserve(self.floor) is None:
            return False
        self.heap_base = self.device.address_range(self.heap_size)
        self._add_free(self.floor, self.heap_size - self.floor)
        return True

    # -- the rules -------------------------------------------------------------------
    def best_fit(self, size: int) -> int | None:
        """The start of the smallest free block of at least ``size`` (highest address among
        equals), or None. The block at the bottom of HBM (just above the scratch: the part
        never yet handed out, or all that compaction freed) is taken only when no other block
        holds the request: on the chip a 32 MiB request went to a 64 MiB hole, not to the
        62 MiB free at the bottom (compaction-2, events 376–378)."""
        index = self._index
        at = bisect.bisect_left(index, (size, -(1 << 62)))
        if at == len(index):
            return None
        start = -index[at][1]
        if start == self.floor and at + 1 < len(index):   # the bottom block: the last resort
            return -index[at + 1][1]
        return start

    def place(self, start: int, size: int) -> int:
        """Take ``size`` bytes at the top end of the free block at ``start``; the rest stays
        free below. Returns the buffer's offset."""
        block = self._remove_free(start)
        if block > size:
            self._add_free(start, block - size)
        return start + block - size

    def coalesce(self, offset: int, size: int) -> None:
        """Free the span at ``offset``, merged with the free block below it and the one above."""
        start, end = offset, offset + size
        before = self._free_end.get(start)
        if before is not None:
            self._remove_free(before)
            start = before
        if end in self._free:
            end += self._remove_free(end)
        self._add_free(start, end - start)

    def free_total_short(self, size: int) -> bool:
        """The OOM rule: a request fails only when the heap's free total (the scratch left
        out) cannot hold it."""
        return self.heap_size - self.floor - self.bytes_in_use < size

    def compact(self) -> None:
        """Slide every live buffer to the top of the heap, in address order; the free block
        left is between the scratch and them. A compaction that moved something is charged
        to the device as a ``compact`` call of :func:`compaction_seconds`."""
        top = self.heap_size
        moved = 0
        for handle, (offset, size) in sorted(self._live.items(), key=lambda kv: -kv[1][0]):
            top -= size
            if top != offset:
                moved += size
                self._live[handle] = (top, size)
        self._free.clear()
        self._free_end.clear()
        self._index.clear()
        if top > self.floor:
            self._add_free(self.floor, top - self.floor)
        if moved:   # memory already compact is left as it was: no compaction to count
            seconds = compaction_seconds(moved)
            self.num_compactions += 1
            self.compaction_moved_bytes += moved
            self.compaction_s += seconds
            self.device.busy("compact", moved, seconds)

    def malloc(self, size: int, stream: int = 0) -> int | None:
        if size <= 0:
            return None
        if self.heap_base is None and not self._start_heap():
            self.num_ooms += 1
            return None
        size = round_to_granule(size, self.granule)
        start = self.best_fit(size)
        if start is None:
            # The runtime compacts on every miss, also for a request it then refuses: after a
            # refused request the chip's next frees name the moved addresses
            # (tests/data/tpu/steps/350m-eager).
            self.compact()
            if self.free_total_short(size):
                self.num_ooms += 1
                return None
            start = self.best_fit(size)
            if start is None:
                fail("tpu: compaction left no block for a request the free total holds")
        held = self.device.reserve(size)
        if held is None:   # the device is out (a context larger than the runtime's bytes)
            self.num_ooms += 1
            return None
        offset = self.place(start, size)
        handle = self._next_handle
        self._next_handle += 1
        self._live[handle] = (offset, size)
        self._held[handle] = held
        in_use = self.bytes_in_use + size
        self.bytes_in_use = in_use
        if in_use > self.peak_bytes_in_use:
            self.peak_bytes_in_use = in_use
        self.num_allocs += 1
        return handle

    def free(self, address: int) -> None:
        offset, size = self._live.pop(address)
        self.device.release(self._held.pop(address))
        self.coalesce(offset, size)
        self.bytes_in_use -= size
        self.num_frees += 1

    def hbm_offset(self, handle: int) -> int:
        """Where the buffer is in HBM now (the runtime's ``addr``)."""
        return self._live[handle][0]

    def place_at(self, offset: int, size: int) -> int | None:
        """A buffer live before a recording began, put where the runtime's records say it is
        (a start state, not a rule: the runtime never places by request); None when that
        span is not free."""
        if self.heap_base is None and not self._start_heap():
            return None
        size = round_to_granule(size, self.granule)
        block = next(((start, length) for start, length in self._free.items()
                      if start <= offset and offset + size <= start + length), None)
        if block is None:
            return None
        held = self.device.reserve(size)
        if held is None:
            return None
        start, length = block
        self._remove_free(start)
        if offset > start:
            self._add_free(start, offset - start)
        if offset + size < start + length:
            self._add_free(offset + size, start + length - offset - size)
        handle = self._next_handle
        self._next_handle += 1
        self._live[handle] = (offset, size)
        self._held[handle] = held
        self.bytes_in_use += size
        self.peak_bytes_in_use = max(self.peak_bytes_in_use, self.bytes_in_use)
        self.num_allocs += 1
        return handle

    # -- the Policy interface --------------------------------------------------------
    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        base = self.heap_base or 0
        spans = [(offset, size, True) for offset, size in self._live.values()]
        spans += [(start, size, False) for start, size in self._free.items()]
        for offset, size, used in sorted(spans):
            yield base + offset, size, used

    def check(self) -> None:
        """Assert: live and free blocks tile the heap above the scratch without overlap; no
        two free blocks touch (coalescing); the index is the free blocks; bytes_in_use = the
        live sizes' sum; allocs − frees = live buffers; peak ≥ current."""
        spans = sorted([(o, s, True) for o, s in self._live.values()]
                       + [(a, s, False) for a, s in self._free.items()])
        at = self.floor
        previous_free = False
        for offset, size, used in spans:
            require(offset == at, f"tpu: a gap or overlap at offset {at}")
            require(size > 0 and size % self.granule == 0, f"tpu: block at {offset} of {size}")
            require(used or not previous_free, f"tpu: free neighbours at {offset} not merged")
            previous_free = not used
            at = offset + size
        require(at == self.heap_size or self.heap_base is None,
                "tpu: the blocks do not tile the heap")
        require(sorted(self._index) == sorted((s, -a) for a, s in self._free.items()),
                "tpu: the best-fit index is not the free blocks")
        require(self.bytes_in_use == sum(s for _, s in self._live.values()),
                "tpu: bytes_in_use is not the live buffers' sum")
        require(self.num_allocs - self.num_frees == len(self._live),
                "tpu: allocs − frees is not the number of live buffers")
        require(self.peak_bytes_in_use >= self.bytes_in_use, "tpu: peak < current")

    def native_numbers(self) -> dict[str, Any] | None:
        """TpuConfig (native/src/tpu.hpp): the granule, the runtime's own bytes and the
        compaction cost line; None beyond the core's int64 heap size and rounding."""
        if not (0 <= self.runtime_bytes < NATIVE_SIZE_LIMIT and self.granule < NATIVE_SIZE_LIMIT):
            return None
        if not 0 <= self.floor < NATIVE_SIZE_LIMIT:
            return None
        return {"granule": self.granule, "runtime_bytes": self.runtime_bytes,
                "scratch_bytes": self.floor, "compaction_base_s": COMPACTION_BASE_S,
                "compaction_per_gb_s": COMPACTION_PER_GB_S}

    def stats(self) -> PolicyStats:
        largest = self._index[-1][0] if self._index else 0
        return PolicyStats(
            num_allocs=self.num_allocs, num_frees=self.num_frees, num_ooms=self.num_ooms,
            bytes_in_use=self.bytes_in_use, peak_bytes_in_use=self.peak_bytes_in_use,
            bytes_requested=self.bytes_in_use, pool_bytes=self.heap_size,
            peak_pool_bytes=self.heap_size, largest_free_block=largest,
            free_blocks=len(self._free),
            extra={"num_compactions": self.num_compactions,
                   "compaction_moved_bytes": self.compaction_moved_bytes})
