"""No caching at all: every malloc is a device malloc, every free a device free.

This is JAX's ``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` (and CuPy with ``set_allocator(None)``):
the only mode that returns memory to the device at once, and the slowest, since each call
synchronises the device. Reserved bytes equal live bytes plus the device's own rounding.
Costs: O(1) per malloc and free (a dict entry), plus the device call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from allocsim.policies.base import (
    DeviceMemory,
    NativeTwin,
    Param,
    Policy,
    PolicyStats,
    fail,
    params_of,
    require,
)


class OnDemandAllocator(Policy):
    name = "on-demand"
    capacity_use = "limit-fatal"   # capacity only refuses cudaMalloc; a refusal is the OOM
    native = NativeTwin("on-demand", "on_demand.hpp")
    description = "no cache: cudaMalloc/cudaFree for every buffer (JAX allocator=platform)"

    def __init__(self, device: DeviceMemory) -> None:
        super().__init__(device)
        self.live: dict[int, int] = {}  # address -> requested bytes
        self.peak_bytes_in_use = 0
        self._reserve, self._release = device.reserve, device.release   # bound once: hot path

    PARAMS: ClassVar[dict[str, Param]] = params_of(__init__)

    def malloc(self, size: int, stream: int = 0) -> int | None:
        if size <= 0:
            return None
        address = self._reserve(size)
        if address is None:
            self.num_ooms += 1
            return None
        self.live[address] = size
        in_use = self.bytes_in_use + size
        self.bytes_in_use = in_use
        if in_use > self.peak_bytes_in_use:
            self.peak_bytes_in_use = in_use
        self.num_allocs += 1
        return address

    def free(self, address: int) -> None:
        self.bytes_in_use -= self.live.pop(address)
        self._release(address)
        self.num_frees += 1

    def check(self) -> None:
        """Assert: every live block has a positive size; bytes_in_use = their sum; allocs −
        frees = live blocks; peak ≥ current."""
        for address, size in self.live.items():
            if size <= 0:
                fail(f"on-demand: block {address:#x} has size {size}")
        require(self.bytes_in_use == sum(self.live.values()),
                f"on-demand: bytes_in_use {self.bytes_in_use} is not the live blocks' sum")
        require(self.num_allocs - self.num_frees == len(self.live),
                "on-demand: allocs − frees is not the number of live blocks")
        require(self.peak_bytes_in_use >= self.bytes_in_use,
                "on-demand: peak_bytes_in_use < current")

    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        for address in sorted(self.live):
            yield address, self.live[address], True

    def stats(self) -> PolicyStats:
        return PolicyStats(
            num_allocs=self.num_allocs, num_frees=self.num_frees, num_ooms=self.num_ooms,
            bytes_in_use=self.bytes_in_use, peak_bytes_in_use=self.peak_bytes_in_use,
            bytes_requested=self.bytes_in_use, pool_bytes=self.bytes_in_use,
            peak_pool_bytes=self.peak_bytes_in_use, largest_free_block=0, free_blocks=0)
