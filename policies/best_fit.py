"""Address-ordered best fit with immediate coalescing over one heap that grows in pages.

Johnstone & Wilson's reference policy ("The memory fragmentation problem: solved?", 1998):
take the smallest free block that fits, the lowest address on ties, split off the rest, and
merge a freed block with free neighbours at once. On a GPU the heap is what the CUDA
virtual-memory API gives: one virtual range as large as the device, with physical pages mapped
at its top when the free space at the end cannot serve a request (cuMemMap; 2 MiB pages).
The heap never shrinks unless ``trim=true``, which unmaps wholly free pages at the top after a
free, as a heap would with sbrk(-n).

Costs (policies/chunks.py, k = free chunks in the size-class bin touched): malloc is one
FreeIndex search, O(log k) bisection + an O(1) jump between bins, and an O(log k + k) insertion
of a split's rest; free is O(1) link updates plus one O(log k + k) index update per merged
neighbour and one for the freed chunk; growth and trim add one device call each.
"""

from __future__ import annotations

from typing import Any, ClassVar

from allocsim.policies.base import (
    DeviceMemory,
    NativeTwin,
    Param,
    PolicyStats,
    fail,
    params_of,
    require,
)
from allocsim.policies.chunk_policy import ChunkPolicy
from allocsim.policies.units import round_up


class BestFitAllocator(ChunkPolicy):
    """Best fit over a ChunkMap (policies/chunks.py): ChunkPolicy's malloc and free with
    max_slack 0 (always split), and mapping pages at the top of the heap as the growth rule."""

    name = "best-fit"
    capacity_use = "limit-fatal"   # the device-sized range decides nothing; refused map = OOM
    native = NativeTwin("chunk", "best_fit.hpp")
    description = "address-ordered best fit + coalescing on a heap grown page by page (VMM)"
    def __init__(self, device: DeviceMemory, alignment: int = 256, page: int = 0,
                 trim: bool = False) -> None:
        super().__init__(device, int(alignment), 0)
        self.page = int(page) or device.map_granularity
        if self.page % device.map_granularity:
            raise ValueError(f"page must be a multiple of the device's mapping granularity "
                             f"({device.map_granularity} bytes)")
        self.trim = trim
        # Reserve virtual space for the whole device; it costs no memory until mapped.
        self.heap_base = device.address_range(round_up(device.capacity, self.page))
        self.mapped = 0
        self.peak_mapped = 0

    PARAMS: ClassVar[dict[str, Param]] = params_of(
        __init__,
        alignment=("size", "every block is a multiple of this (CUDA: 256 bytes)"),
        page=("size", "growth step; 0 = the device's mapping granularity (2 MiB)"),
        trim=("bool", "unmap wholly free pages at the top of the heap on free"),
    )

    def _make_room(self, rounded: int) -> bool:
        return self._grow(rounded)

    def _tail_free_bytes(self) -> int:
        """Free bytes at the top of the heap (0 if the last chunk is in use)."""
        if not self.mapped:
            return 0
        _, size, in_use = self.chunks.last_chunk(self.heap_base)
        return 0 if in_use else size

    def _grow(self, rounded: int) -> bool:
        """Map just enough whole pages at the top for ``rounded`` bytes."""
        need = rounded - self._tail_free_bytes()
        extra = round_up(need, self.page)
        if not self.device.map(self.heap_base + self.mapped, extra):
            return False
        if self.mapped:
            self.chunks.grow_region(self.heap_base, extra)
        else:
            self.chunks.add_region(self.heap_base, extra)
        self.mapped += extra
        self.peak_mapped = max(self.peak_mapped, self.mapped)
        return True

    def _trim(self) -> None:
        """Unmap the wholly free pages at the top of the heap."""
        free_pages = self._tail_free_bytes() // self.page * self.page
        if free_pages == 0:
            return
        if free_pages == self.mapped:  # the whole heap is free: forget the region
            self.chunks.remove_region(self.heap_base)
        else:
            self.chunks.shrink_region(self.heap_base, free_pages)
        self.mapped -= free_pages
        self.device.unmap(self.heap_base + self.mapped, free_pages)

    def check(self) -> None:
        """Assert ChunkMap's invariants (tiling, coalescing, free index = free chunks), and:
        the heap is one region at heap_base of exactly the mapped bytes (none when nothing is
        mapped), a whole number of pages; with ``trim``, no wholly free page at its top; every
        chunk a multiple of the alignment when pages are; the callers' blocks are the in-use
        chunks, each at least its request; bytes_in_use = the in-use chunks' sum; allocs − frees
        = live blocks; peaks ≥ current values."""
        chunks = self.chunks
        chunks.check()
        expected = {self.heap_base: self.mapped} if self.mapped else {}
        require(chunks.regions == expected,
                f"best-fit: the regions {chunks.regions} are not the mapped heap {expected}")
        require(self.mapped % self.page == 0, "best-fit: mapped bytes not a whole number of pages")
        if self.trim:
            require(self._tail_free_bytes() < self.page,
                    "best-fit: trim left a wholly free page at the top of the heap")
        if self.page % self.alignment == 0:
            for address, size in chunks.size.items():
                if size % self.alignment:
                    fail(f"best-fit: chunk {address:#x} of {size} bytes breaks the alignment")
        require(self.requested.keys() == set(chunks.in_use),
                "best-fit: the requested table is not the in-use chunks")
        for address, size in self.requested.items():
            if not 0 < size <= chunks.size[address]:
                fail(f"best-fit: block {address:#x} holds less than its request of {size}")
        require(self.bytes_in_use == sum(chunks.size[a] for a in chunks.in_use),
                f"best-fit: bytes_in_use {self.bytes_in_use} is not the in-use chunks' sum")
        require(self.num_allocs - self.num_frees == len(chunks.in_use),
                "best-fit: allocs − frees is not the number of live blocks")
        require(self.peak_bytes_in_use >= self.bytes_in_use,
                "best-fit: peak_bytes_in_use < current")
        require(self.peak_mapped >= self.mapped, "best-fit: peak_mapped < mapped")

    def native_numbers(self) -> dict[str, Any] | None:
        """ChunkConfig's best-fit fields (native/src/best_fit.hpp): page, heap base, trim."""
        return {**self.chunk_numbers(), "growth": "best-fit", "page": self.page,
                "heap_base": self.heap_base, "trim": bool(self.trim)}

    def stats(self) -> PolicyStats:
        return PolicyStats(
            num_allocs=self.num_allocs, num_frees=self.num_frees, num_ooms=self.num_ooms,
            bytes_in_use=self.bytes_in_use, peak_bytes_in_use=self.peak_bytes_in_use,
            bytes_requested=sum(self.requested.values()), pool_bytes=self.mapped,
            peak_pool_bytes=self.peak_mapped, largest_free_block=self.chunks.largest_free(),
            free_blocks=len(self.chunks.free_index))
