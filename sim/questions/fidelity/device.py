"""The device fidelity's model runs on: recorded addresses handed out again, calls logged.

PyTorch's best fit breaks ties by address, so for the model to choose as the real allocator
did, its segments must lie where the recorded ones lay: :class:`RecordedAddressDevice` hands
out the recorded address of a segment when the model asks for the segment the recording made
next (same size, range free), and a fresh address above every recorded one otherwise
(:func:`address_floor`). Its :class:`AddressedView` logs each successful call with its
address, which is how a simulated snapshot (:mod:`allocsim.sim.questions.fidelity.simulate`)
gets its segment entries.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable

from allocsim.sim.kernel.device import (
    ADDRESS_BASE,
    RANGE_ALIGN,
    DeviceProfile,
    ProcessDevice,
    SimulatedDevice,
)

__all__ = ["AddressedView", "RecordedAddressDevice", "address_floor"]

GiB = 1 << 30


class AddressedView(ProcessDevice):
    """A process view that logs each successful device call with its address, and marks
    virtual-range requests so the device can tell them from cudaMalloc."""

    device: RecordedAddressDevice

    def reserve(self, nbytes: int) -> int | None:
        base = super().reserve(nbytes)
        if base is not None and self.device.calls is not None:
            self.device.calls.append(("segment_alloc", base, self._ranges[base]))
        return base

    def release(self, base: int) -> None:
        size = self._ranges[base]
        super().release(base)
        self.device.drop(base)
        self.device.pressure -= 1
        if self.device.calls is not None:
            self.device.calls.append(("segment_free", base, size))

    def address_range(self, nbytes: int) -> int:
        self.device.virtual = True
        try:
            base = super().address_range(nbytes)
        finally:
            self.device.virtual = False
        if self.device.calls is not None:
            self.device.calls.append(("address_range", base, nbytes))
        return base

    def map(self, address: int, nbytes: int) -> bool:
        ok = super().map(address, nbytes)
        if ok and self.device.calls is not None:
            self.device.calls.append(("segment_map", address, nbytes))
        return ok

    def unmap(self, address: int, nbytes: int) -> None:
        super().unmap(address, nbytes)
        self.device.pressure -= 1
        if self.device.calls is not None:
            self.device.calls.append(("segment_unmap", address, nbytes))


class RecordedAddressDevice(SimulatedDevice):
    """A simulated device that hands out recorded addresses when told what comes next.

    ``hints`` are ``(action, address, size)`` of the recorded segments expected now; a
    cudaMalloc of the same size takes the first such address that overlaps nothing held, a
    new virtual range (expandable segments) starts at the first recorded ``segment_map``.
    ``("address_range", base, 0)`` hints at the front are the virtual ranges of a seeded
    start (PyTorchCachingAllocator.seed asks for them in address order): the next virtual
    range request takes the first of them, at ``base`` if that range is free.
    Everything else gets a fresh address from ``floor`` up (above every recorded address),
    past every range held (a virtual range is 1.125 × the capacity long and may reach above
    ``floor``).
    ``calls`` (when a list) logs ``(action, address, size)`` of every successful call.

    Costs, for h hints and r ranges held: a range request O(h log r) plus O(r) to keep the
    bases sorted (hints are the few segments recorded at one point of the trace); a release
    O(r). Device calls are rare next to trace events, so none of this is on the per-event path.
    """

    def __init__(self, profile: DeviceProfile, floor: int = ADDRESS_BASE) -> None:
        super().__init__(profile)
        self._next_address = max(self._next_address, floor)
        self.hints: list[tuple[str, int, int]] = []
        self.held: dict[int, int] = {}         # ranges handed out and not released
        self._bases: list[int] = []            # their bases, sorted
        self.virtual = False
        self.calls: list[tuple[str, int, int]] | None = None
        self.pressure = 0           # refuse new memory until this many releases happened

    def _take(self, nbytes: int) -> bool:
        return self.pressure <= 0 and super()._take(nbytes)

    def view(self, process: int = 0) -> AddressedView:
        view = self.views.get(process)
        if not isinstance(view, AddressedView):
            view = self.views[process] = AddressedView(self, process)
        return view

    def _address_range(self, nbytes: int) -> int:
        if self.virtual and self.hints and self.hints[0][0] == "address_range":
            # A seeded virtual range: taken in order, at its address when that is free.
            _, address, _ = self.hints.pop(0)
            if self._unused(address, nbytes):
                self._hold(address, nbytes)
                return address
            return self._fresh(nbytes)
        want = "segment_map" if self.virtual else "segment_alloc"
        for k, (action, address, size) in enumerate(self.hints):
            if action != want or (want == "segment_alloc" and size != nbytes):
                continue
            if self._unused(address, nbytes):
                del self.hints[k]
                self._hold(address, nbytes)
                return address
        return self._fresh(nbytes)

    def _fresh(self, nbytes: int) -> int:
        """A fresh range from the next free address up, past any range held there (a
        virtual range at a recorded address can reach far above the floor). O(log r) per
        range passed."""
        base = super()._address_range(nbytes)
        while not self._unused(base, nbytes):
            last = self._bases[bisect_left(self._bases, base + nbytes) - 1]
            end = last + self.held[last]
            self._next_address = -(-end // RANGE_ALIGN) * RANGE_ALIGN + RANGE_ALIGN
            base = super()._address_range(nbytes)
        self._hold(base, nbytes)
        return base

    def _unused(self, address: int, nbytes: int) -> bool:
        """Does ``[address, address + nbytes)`` overlap no range held? O(log r)."""
        at = bisect_right(self._bases, address)
        if at and self._bases[at - 1] + self.held[self._bases[at - 1]] > address:
            return False
        return at == len(self._bases) or self._bases[at] >= address + nbytes

    def _hold(self, address: int, nbytes: int) -> None:
        self.held[address] = nbytes
        insort(self._bases, address)

    def drop(self, address: int) -> None:
        if self.held.pop(address, None) is not None:
            del self._bases[bisect_left(self._bases, address)]


def address_floor(addresses: Iterable[int]) -> int:
    """The first fresh address: 1 GiB above the highest recorded end, range-aligned."""
    top = max(addresses, default=0)
    return max(ADDRESS_BASE, -(-(top + GiB) // RANGE_ALIGN) * RANGE_ALIGN)
