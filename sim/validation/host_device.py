"""The policies' ``DeviceMemory`` on host memory (:class:`HostDevice`), for the ``host`` backend:
numpy buffers behind fake addresses, so the whole validator runs (and is tested) without a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from allocsim.policies import format_size
from allocsim.policies.units import round_up
from allocsim.sim.kernel.device import ADDRESS_BASE, RANGE_ALIGN, DeviceProfile
from allocsim.sim.validation.errors import ValidatorError
from allocsim.sim.validation.measured import CallLog
from allocsim.sim.validation.patterns import count_pattern_errors, fill_pattern
from allocsim.sim.validation.spans import Spans


class HostDevice:
    """The policies' ``DeviceMemory`` on host memory, for the ``host`` backend.

    ``reserve(n)`` allocates a numpy buffer of n bytes rounded up to the profile's granularity
    (the bytes the simulated device counts) behind a fake address from a bump counter laid out
    like :class:`~allocsim.sim.kernel.device.SimulatedDevice`'s; ``map`` allocates one buffer
    per page of ``map_granularity``. Reserved bytes are the sizes of the buffers held, measured, not
    modelled. Misuse the real driver would refuse (mapping a page twice, unmapping one never
    mapped, releasing an unknown base) is recorded in ``problems``.
    """

    def __init__(self, profile: DeviceProfile, clock: Callable[[], int] = time.perf_counter_ns
                 ) -> None:
        self.profile = profile
        self.capacity = profile.capacity
        self.map_granularity = profile.map_granularity
        self.granularity = profile.granularity
        self._clock = clock
        self._next_address = ADDRESS_BASE
        self.ranges = Spans()     # reserve()d: base -> (requested bytes, buffer)
        self.pages = Spans()      # mapped: page address -> (page bytes, buffer)
        self.vranges = Spans()    # address_range()d: base -> (bytes, None)
        self.reserved = 0
        self.peak_reserved = 0
        self.calls = 0             # every call, failed ones too (the engine's "a call happened")
        self.log = CallLog()
        self.event = -1            # the event being replayed, for the call log
        self.problems: list[str] = []

    # -- bookkeeping -----------------------------------------------------------------
    def _bump(self, nbytes: int) -> int:
        base = self._next_address
        self._next_address = base + round_up(max(nbytes, 1), RANGE_ALIGN) + RANGE_ALIGN
        return base

    def _buffer(self, nbytes: int) -> np.ndarray:
        try:
            # np.zeros: calloc'd, so untouched pages of a big region cost no host memory.
            return np.zeros(nbytes, dtype=np.uint8)
        except MemoryError:
            raise ValidatorError(f"host backend: cannot hold a {format_size(nbytes)} region in "
                                 f"host memory; give a smaller --capacity") from None

    def _called(self, kind: str, nbytes: int, ok: bool, start_ns: int) -> None:
        self.calls += 1
        self.log.add(self.event, kind, nbytes, ok, self._clock() - start_ns)

    def _grew(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    # -- cudaMalloc / cudaFree -------------------------------------------------------
    def reserve(self, nbytes: int) -> int | None:
        start = self._clock()
        taken = round_up(nbytes, self.granularity)
        if self.reserved + taken > self.capacity:
            self._called("malloc", nbytes, False, start)
            return None
        buffer = self._buffer(taken)
        base = self._bump(taken)
        self.ranges.add(base, nbytes, buffer)   # usable extent: what was asked, not the rounding
        self._grew(buffer.nbytes)
        self._called("malloc", nbytes, True, start)
        return base

    def release(self, base: int) -> None:
        start = self._clock()
        held = self.ranges.pop(base)
        if held is None:
            self.problems.append(f"release of 0x{base:x}, which is not a reserved base")
            self._called("free", 0, False, start)
            return
        self.reserved -= held[1].nbytes
        self._called("free", held[1].nbytes, True, start)

    # -- virtual memory --------------------------------------------------------------
    def address_range(self, nbytes: int) -> int:
        base = self._bump(nbytes)
        self.vranges.add(base, round_up(max(nbytes, 1), self.map_granularity), None)
        return base

    def map(self, address: int, nbytes: int) -> bool:
        if nbytes % self.map_granularity:
            # The policy's bug, not the user's: DeviceMemory.map takes whole pages.
            raise RuntimeError(f"map of {nbytes} bytes is not a multiple of the mapping "
                               f"granularity {self.map_granularity}")
        start = self._clock()
        if self.reserved + nbytes > self.capacity:
            self._called("map", nbytes, False, start)
            return False
        if self.vranges.pieces(address, nbytes, span_across=False) is None:
            self.problems.append(f"map of {format_size(nbytes)} at 0x{address:x} outside any "
                                 f"reserved address range")
        for page in range(address, address + nbytes, self.map_granularity):
            if self.pages.containing(page) is not None:
                self.problems.append(f"page 0x{page:x} mapped twice")
                continue
            buffer = self._buffer(self.map_granularity)
            self.pages.add(page, self.map_granularity, buffer)
            self._grew(buffer.nbytes)
        self._called("map", nbytes, True, start)
        return True

    def unmap(self, address: int, nbytes: int) -> None:
        start = self._clock()
        for page in range(address, address + nbytes, self.map_granularity):
            held = self.pages.pop(page)
            if held is None:
                self.problems.append(f"unmap of page 0x{page:x}, which is not mapped")
                continue
            self.reserved -= held[1].nbytes
        self._called("unmap", nbytes, True, start)

    # -- what the validator asks -----------------------------------------------------
    def _pieces(self, address: int, size: int) -> list[tuple[int, int, Any]] | None:
        # A block lies inside one reserve()d range, or across contiguous mapped pages.
        return (self.ranges.pieces(address, size, span_across=False)
                or self.pages.pieces(address, size, span_across=True))

    def fill(self, address: int, size: int, key: int) -> bool:
        """Write allocation ``key``'s pattern over the block; False if not wholly held."""
        pieces = self._pieces(address, size)
        if pieces is None:
            return False
        phase = 0
        for offset, length, buffer in pieces:
            fill_pattern(buffer[offset:offset + length], key, phase)
            phase += length
        return True

    def check(self, address: int, size: int, key: int) -> int:
        """Words of the block that lost the pattern (-1 if the block is not wholly held)."""
        pieces = self._pieces(address, size)
        if pieces is None:
            return -1
        bad = 0
        phase = 0
        for offset, length, buffer in pieces:
            bad += count_pattern_errors(buffer[offset:offset + length], key, phase)
            phase += length
        return bad

    def measured_reserved(self) -> int:
        return self.reserved

    def close(self) -> None:
        self.ranges = Spans()
        self.pages = Spans()
