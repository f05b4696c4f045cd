"""The simulated GPU a run's processes share: what each took, its addresses, its device calls.

One :class:`SimulatedDevice` is shared by every process of a run; each process draws from it
through its own :class:`ProcessDevice` view, which implements the policies' two-call interface
(plus the virtual-memory calls) and counts what that process took. The device, not the policy,
is the authority on reserved bytes: a policy cannot under-report what it holds.

Addresses: a bump pointer hands out virtual addresses that are never reused, 2 MiB aligned
with a gap after every range, so two reservations are never adjacent (a policy that merged
across them would be caught by the overlap checks).

Memory outside the allocators comes in two kinds, counted apart: the device's own share
(``context_bytes`` of its profile: taken once, before any process, :attr:`SimulatedDevice.context`)
and what one process holds beside its allocator — its own CUDA context, the module images it
loads at its first step (:meth:`ProcessDevice.hold_outside`, :attr:`ProcessDevice.outside`,
given back when it exits). Both count in the device's ``used`` and ``peak_used``; neither
counts in a process's ``reserved``, which stays what its allocator took.

What a device is — capacity, granularity, the device's own share, call costs, the named
profiles — is sim/kernel/device_profile.py's (re-exported here).
"""

from __future__ import annotations

from dataclasses import dataclass

from allocsim.policies.units import round_up

# What a device is (capacity, granularity, context, costs, the named profiles) lives in
# device_profile.py; its names are this module's too, where callers have always found them.
from allocsim.sim.kernel.device_profile import (
    DEFAULT_CONTEXT_NOTE,
    DEFAULT_PROFILE,
    MAX_CALL_SECONDS,
    MAX_GRANULARITY,
    MAX_PROFILE_CAPACITY,
    PROFILES,
    CostModel,
    DeviceProfile,
    resolve_device,
)

MiB = 1 << 20
GiB = 1 << 30
ADDRESS_BASE = 0x7F00_0000_0000   # where CUDA's unified address space usually starts
RANGE_ALIGN = 2 * MiB              # cudaMalloc'd ranges come back 2 MiB aligned on current GPUs

__all__ = [
    "ADDRESS_BASE", "DEFAULT_CONTEXT_NOTE", "DEFAULT_PROFILE", "MAX_CALL_SECONDS",
    "MAX_GRANULARITY", "MAX_PROFILE_CAPACITY", "PROFILES", "RANGE_ALIGN", "CostModel",
    "DeviceCall", "DeviceProfile", "ProcessDevice", "SimulatedDevice", "resolve_device",
]


@dataclass
class DeviceCall:
    """One device call, as logged for the timeline: who, what, how big, did it work, cost."""

    process: int
    kind: str          # malloc | free | map | unmap
    nbytes: int
    ok: bool
    cost_s: float
    address: int | None = None   # the range's base / the mapped address (None if refused)


class SimulatedDevice:
    """A GPU shared by several processes: capacity is global, accounting per process."""

    def __init__(self, profile: DeviceProfile) -> None:
        self.profile = profile
        # Memory is whole granules: a partial last granule could never be handed out, yet it
        # would count toward a policy's fraction × capacity (BFC's last region then refused by
        # its rounding, issue 16.12). A real GPU's memory is whole pages.
        self.capacity = profile.capacity // profile.granularity * profile.granularity
        # The device's own share is taken before any process allocates (whole granules).
        self.context = min(round_up(profile.context_bytes, profile.granularity), self.capacity)
        self.used = self.context            # bytes taken: the context and every process
        self.peak_used = self.context
        self._next_address = ADDRESS_BASE
        self.views: dict[int, ProcessDevice] = {}

    def view(self, process: int = 0) -> ProcessDevice:
        """The device as process ``process`` sees it (created on first use)."""
        if process not in self.views:
            self.views[process] = ProcessDevice(self, process)
        return self.views[process]

    @property
    def next_address(self) -> int:
        """Where the next range will start (the bump pointer; the native core starts its own
        device's from it)."""
        return self._next_address

    def _address_range(self, nbytes: int) -> int:
        base = self._next_address
        # A gap of one alignment unit keeps any two ranges from touching.
        self._next_address = base + round_up(max(nbytes, 1), RANGE_ALIGN) + RANGE_ALIGN
        return base

    def _take(self, nbytes: int) -> bool:
        if self.used + nbytes > self.capacity:
            return False
        self.used += nbytes
        if self.used > self.peak_used:
            self.peak_used = self.used
        return True


class ProcessDevice:
    """One process's view of a :class:`SimulatedDevice`: the policies' ``DeviceMemory``.

    Counts this process's reserved bytes (its own peak too), device calls, and their modelled
    cost. ``calls`` increases with every call so the engine can notice one cheaply.

    Costs (r cudaMalloc'd ranges, m mapped pieces of this process): ``reserve``, ``release``,
    ``address_range`` and ``map`` are O(1); ``unmap`` is O(1) when it unmaps exactly a piece
    that was mapped (what the policies do) and O(m) otherwise (a scan of every mapped piece);
    ``holdings`` is O((r + m) log(r + m)); ``exit`` O(r + m). With ``log`` set, every call
    also appends one :class:`DeviceCall`.

    Two paths (issue 17: on-demand and cuda-async make a device call at nearly every event):
    ``reserve``, ``release``, ``address_range``, ``map`` and ``unmap`` are each written out in
    one body — the device's ``_take`` and ``_address_range``, ``_charge``, ``_grew`` and the
    cost model's formula inline, the same arithmetic in the same order — when ``_fast`` holds
    (plain device, view and cost model, no ``log``). Otherwise each runs its ``_*_general``
    twin, which composes those pieces as written and is the referee:
    tests/test_device_fast_path.py holds the two to the same addresses, counters, reserved
    bytes and costs on random workloads of every policy.
    """

    def __init__(self, device: SimulatedDevice, process: int) -> None:
        self.device = device
        self.process = process
        self.capacity = device.capacity
        self.map_granularity = device.profile.map_granularity
        self._granularity = device.profile.granularity
        self._costs = device.profile.costs
        self.reserved = 0
        self.peak_reserved = 0
        self.outside = 0            # held beside the allocator: hold_outside (not in reserved)
        self.calls = 0
        self.mallocs = 0
        self.frees = 0
        self.failed_mallocs = 0
        self.cost_s = 0.0           # total modelled time of this process's device calls
        self.pending_cost_s = 0.0   # cost not yet charged to simulated time by the engine
        self._ranges: dict[int, int] = {}   # reserve()d base -> bytes taken
        self._mapped: dict[int, int] = {}   # mapped address -> bytes (virtual-memory pages)
        # The written-out calls (see "Two paths" below) hold for the plain device, view and
        # cost model only: a subclass that changes how memory is taken, addresses are handed
        # out or calls are charged (min-capacity's recording device, fidelity's addressed
        # device) or a calibrated cost model of another type takes the general path.
        costs = self._costs
        self._plain = (type(device)._take is SimulatedDevice._take
                       and type(device)._address_range is SimulatedDevice._address_range
                       and type(self)._charge is ProcessDevice._charge
                       and type(self)._grew is ProcessDevice._grew
                       and type(costs) is CostModel)
        self._malloc_cost = (costs.malloc_base_s, costs.malloc_per_gib_s)
        self._free_cost = (costs.free_base_s, costs.free_per_gib_s)
        self._map_cost = (costs.map_base_s, costs.map_per_gib_s)
        self._log: list[DeviceCall] | None = None
        self._fast = self._plain
        self.log = None             # set to a list to keep every call (the general path)

    @property
    def log(self) -> list[DeviceCall] | None:
        return self._log

    @log.setter
    def log(self, value: list[DeviceCall] | None) -> None:
        self._log = value
        self._fast = self._plain and value is None

    # -- bookkeeping -----------------------------------------------------------------
    def _charge(self, kind: str, nbytes: int, ok: bool, cost: float,
                address: int | None = None) -> None:
        self.calls += 1
        self.cost_s += cost
        self.pending_cost_s += cost
        if self._log is not None:
            self._log.append(DeviceCall(self.process, kind, nbytes, ok, cost, address))

    def _grew(self, nbytes: int) -> None:
        self.reserved += nbytes
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved

    # -- cudaMalloc / cudaFree -------------------------------------------------------
    def reserve(self, nbytes: int) -> int | None:
        """cudaMalloc: ``nbytes`` rounded up to the granularity, at a fresh range; None when
        the device is full. O(1). The written-out twin of :meth:`_reserve_general`."""
        if not self._fast:
            return self._reserve_general(nbytes)
        device = self.device
        granularity = self._granularity
        taken = -(-nbytes // granularity) * granularity
        used = device.used + taken
        if used > device.capacity:
            cost = self._malloc_cost[0]                     # CostModel.refused_malloc
            self.calls += 1
            self.cost_s += cost
            self.pending_cost_s += cost
            self.failed_mallocs += 1
            return None
        device.used = used
        if used > device.peak_used:
            device.peak_used = used
        self.mallocs += 1
        base = device._next_address                         # SimulatedDevice._address_range
        span = taken if taken > 0 else 1
        device._next_address = base + -(-span // RANGE_ALIGN) * RANGE_ALIGN + RANGE_ALIGN
        malloc_base, malloc_per_gib = self._malloc_cost     # CostModel.malloc
        cost = malloc_base + malloc_per_gib * nbytes / GiB
        self.calls += 1
        self.cost_s += cost
        self.pending_cost_s += cost
        self._ranges[base] = taken
        reserved = self.reserved + taken
        self.reserved = reserved
        if reserved > self.peak_reserved:
            self.peak_reserved = reserved
        return base

    def release(self, base: int) -> None:
        """cudaFree of a range :meth:`reserve` gave. O(1). The twin of
        :meth:`_release_general`."""
        if not self._fast:
            return self._release_general(base)
        taken = self._ranges.pop(base)
        self.device.used -= taken
        self.reserved -= taken
        self.frees += 1
        free_base, free_per_gib = self._free_cost           # CostModel.free
        cost = free_base + free_per_gib * taken / GiB
        self.calls += 1
        self.cost_s += cost
        self.pending_cost_s += cost
        return None

    # -- virtual memory (cuMemAddressReserve / cuMemMap / cuMemUnmap) ----------------
    def address_range(self, nbytes: int) -> int:
        """cuMemAddressReserve: a fresh virtual range (no memory, no call charged). O(1)."""
        if not self._fast:
            return self._address_range_general(nbytes)
        device = self.device
        base = device._next_address                         # SimulatedDevice._address_range
        span = nbytes if nbytes > 0 else 1
        device._next_address = base + -(-span // RANGE_ALIGN) * RANGE_ALIGN + RANGE_ALIGN
        return base

    def map(self, address: int, nbytes: int) -> bool:
        """cuMemMap ``nbytes`` at ``address``; False when the device is full. O(1). The twin
        of :meth:`_map_general`."""
        if not self._fast or nbytes % self.map_granularity:
            return self._map_general(address, nbytes)
        device = self.device
        used = device.used + nbytes
        map_base, map_per_gib = self._map_cost
        if used > device.capacity:
            cost = map_base                                 # CostModel.refused_map
            self.calls += 1
            self.cost_s += cost
            self.pending_cost_s += cost
            self.failed_mallocs += 1
            return False
        device.used = used
        if used > device.peak_used:
            device.peak_used = used
        cost = map_base + map_per_gib * nbytes / GiB        # CostModel.map
        self.calls += 1
        self.cost_s += cost
        self.pending_cost_s += cost
        self.mallocs += 1
        self._mapped[address] = nbytes
        reserved = self.reserved + nbytes
        self.reserved = reserved
        if reserved > self.peak_reserved:
            self.peak_reserved = reserved
        return True

    def unmap(self, address: int, nbytes: int) -> None:
        """cuMemUnmap ``[address, address + nbytes)``. The twin of :meth:`_unmap_general`,
        written out for the common case, exactly one mapped piece (O(1))."""
        mapped = self._mapped
        if not self._fast or mapped.get(address) != nbytes:
            return self._unmap_general(address, nbytes)
        del mapped[address]
        self.device.used -= nbytes
        self.reserved -= nbytes
        self.frees += 1
        cost = self._costs.unmap_base_s                     # CostModel.unmap
        self.calls += 1
        self.cost_s += cost
        self.pending_cost_s += cost
        return None

    # -- the general paths: the pieces composed as written ----------------------------
    def _reserve_general(self, nbytes: int) -> int | None:
        taken = round_up(nbytes, self._granularity)
        if not self.device._take(taken):
            self._charge("malloc", nbytes, False, self._costs.refused_malloc(nbytes))
            self.failed_mallocs += 1
            return None
        self.mallocs += 1
        base = self.device._address_range(taken)
        self._charge("malloc", nbytes, True, self._costs.malloc(nbytes), base)
        self._ranges[base] = taken
        self._grew(taken)
        return base

    def _release_general(self, base: int) -> None:
        taken = self._ranges.pop(base)
        self.device.used -= taken
        self.reserved -= taken
        self.frees += 1
        self._charge("free", taken, True, self._costs.free(taken), base)

    def _address_range_general(self, nbytes: int) -> int:
        return self.device._address_range(nbytes)

    def _map_general(self, address: int, nbytes: int) -> bool:
        """cuMemMap ``nbytes`` at ``address``; False when the device is full. O(1)."""
        if nbytes % self.map_granularity:
            # A policy's mistake, not the user's: a policy must map whole granules.
            raise RuntimeError(f"map of {nbytes} bytes is not a multiple of the mapping "
                               f"granularity {self.map_granularity}")
        ok = self.device._take(nbytes)
        cost = self._costs.map(nbytes) if ok else self._costs.refused_map(nbytes)
        self._charge("map", nbytes, ok, cost, address if ok else None)
        if not ok:
            self.failed_mallocs += 1
            return False
        self.mallocs += 1
        self._mapped[address] = nbytes
        self._grew(nbytes)
        return True

    def _unmap_general(self, address: int, nbytes: int) -> None:
        """cuMemUnmap ``[address, address + nbytes)``. O(1) for exactly one mapped piece,
        else O(m) in this process's mapped pieces: every piece is scanned and the ones the
        range overlaps are cut."""
        end = address + nbytes
        if self._mapped.get(address) == nbytes:   # the common case: exactly what was mapped
            del self._mapped[address]
            self.device.used -= nbytes
            self.reserved -= nbytes
            self.frees += 1
            self._charge("unmap", nbytes, True, self._costs.unmap(nbytes), address)
            return
        # Pages may be unmapped in other pieces than they were mapped in: cut the intervals.
        for start, size in list(self._mapped.items()):
            stop = start + size
            if stop <= address or start >= end:
                continue
            del self._mapped[start]
            if start < address:
                self._mapped[start] = address - start
            if stop > end:
                self._mapped[end] = stop - end
        self.device.used -= nbytes
        self.reserved -= nbytes
        self.frees += 1
        self._charge("unmap", nbytes, True, self._costs.unmap(nbytes), address)

    # -- work with no memory in it ----------------------------------------------------
    def busy(self, kind: str, nbytes: int, seconds: float) -> None:
        """The device works for this process without taking or giving memory (the TPU
        runtime's compaction copies ``nbytes`` within HBM): one call of ``kind`` costing
        ``seconds``, the policy's own figure (the cost model knows no such call)."""
        self._charge(kind, nbytes, True, seconds)

    # -- memory outside the allocator -----------------------------------------------
    def hold_outside(self, nbytes: int) -> bool:
        """The process takes ``nbytes`` beside its allocator — its CUDA context when it starts,
        the module images it loads at its first step — rounded up to whole granules like any
        take; False, nothing taken, when the device is full (the process cannot go on: a
        context or a module load that fails is fatal to it). Counted in the device's ``used``
        and ``peak_used`` and in :attr:`outside`, never in :attr:`reserved` (what the
        allocator took); no device call is counted or charged (the driver's own memory, not
        the allocator's). Given back at :meth:`exit`. O(1)."""
        taken = round_up(nbytes, self._granularity)
        if not self.device._take(taken):
            return False
        self.outside += taken
        return True

    def exit(self) -> int:
        """The process ends: the driver takes back everything it held — what its allocator
        reserved and what it held outside it (no policy involved, no cost charged). Returns
        the bytes released."""
        released = self.reserved + self.outside
        self.device.used -= released
        self.reserved = 0
        self.outside = 0
        self._ranges.clear()
        self._mapped.clear()
        return released

    def holdings(self) -> list[tuple[int, int]]:
        """``(address, bytes)`` of the memory held now: cudaMalloc'd ranges, and mapped pages
        with touching pieces joined (a heap grown page by page is one span)."""
        merged: list[list[int]] = []
        for start, size in sorted(self._mapped.items()):
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1][1] += size
            else:
                merged.append([start, size])
        return sorted(list(self._ranges.items()) + [(a, n) for a, n in merged])
