"""The simulated GPU: capacity, allocation granularity, what device calls cost, named profiles.

One :class:`SimulatedDevice` is shared by every process of a run; each process draws from it
through its own :class:`ProcessDevice` view, which implements the policies' two-call interface
(plus the virtual-memory calls) and counts what that process took. The device, not the policy,
is the authority on reserved bytes: a policy cannot under-report what it holds.

Addresses: a bump pointer hands out virtual addresses that are never reused, 2 MiB aligned
with a gap after every range, so two reservations are never adjacent (a policy that merged
across them would be caught by the overlap checks).

Where the numbers come from is written next to each. The costs are order-of-magnitude guesses
from public measurements (below) until ``allocsim calibrate`` measures a real device.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from allocsim.errors import UserInputError
from allocsim.policies.units import format_size, parse_size, round_up
from allocsim.traces.formats.limits import read_input_text
from allocsim.traces.model import TraceError

MiB = 1 << 20
GiB = 1 << 30
ADDRESS_BASE = 0x7F00_0000_0000   # where CUDA's unified address space usually starts
RANGE_ALIGN = 2 * MiB              # cudaMalloc'd ranges come back 2 MiB aligned on current GPUs


# The ranges a device profile's fields are held to (sim/output/schemas/device-profile.schema.json
# states them): no GPU has an exabyte or a mapping granularity over 1 GiB (current ones: 512 B
# and 2 MiB), and no device call takes an hour. Out of them, every result would be nonsense.
MAX_PROFILE_CAPACITY = 1 << 60
MAX_GRANULARITY = 1 << 30
MAX_CALL_SECONDS = 3600.0


@dataclass(frozen=True)
class CostModel:
    """Seconds a device call takes, linear in size: base + per_gib × GiB.

    Defaults (the CUDA Programming Guide's stream-ordered allocator chapter: cudaMalloc and
    cudaFree synchronise the device; published microbenchmarks): cudaMalloc ≈ 50 µs for
    4 KB–512 KB on measured (older) hardware, growing with size — the per-GiB slope is an
    assumption; cudaFree ≈ 14 µs when no kernel is in flight (one published measurement) and it
    synchronises the device, which this model does not add since no kernels are simulated.
    Virtual-memory map/unmap are assumed to cost as much as malloc/free. Calibrate to replace.
    """

    malloc_base_s: float = 50e-6
    malloc_per_gib_s: float = 100e-6
    free_base_s: float = 14e-6
    free_per_gib_s: float = 0.0
    map_base_s: float = 50e-6
    map_per_gib_s: float = 100e-6
    unmap_base_s: float = 14e-6
    source: str = "published measurements (order of magnitude; not calibrated)"

    def malloc(self, nbytes: int) -> float:
        return self.malloc_base_s + self.malloc_per_gib_s * nbytes / GiB

    def refused_malloc(self, nbytes: int) -> float:
        """A cudaMalloc the device refuses: the fixed cost only. The size-dependent
        part is committing pages, which a refusal does not do — so an impossible 8 EiB request
        costs microseconds, not minutes."""
        return self.malloc_base_s

    def refused_map(self, nbytes: int) -> float:
        """A map the device refuses: the fixed cost only, as :meth:`refused_malloc`."""
        return self.map_base_s

    def free(self, nbytes: int) -> float:
        return self.free_base_s + self.free_per_gib_s * nbytes / GiB

    def map(self, nbytes: int) -> float:
        return self.map_base_s + self.map_per_gib_s * nbytes / GiB

    def unmap(self, nbytes: int) -> float:
        return self.unmap_base_s


@dataclass(frozen=True)
class DeviceProfile:
    """What a named device is: total memory, granularities, call costs, and where each came from."""

    name: str
    capacity: int
    granularity: int = 512          # cudaMalloc sizes round up to this (see source)
    map_granularity: int = 2 * MiB  # cuMemGetAllocationGranularity, minimum, on current GPUs
    costs: CostModel = field(default_factory=CostModel)
    source: str = ""
    # The device's own share: what the CUDA context and the libraries (module images, cuBLAS
    # and cuDNN handles) hold before any allocator starts. The allocators' fractions are of
    # ``capacity`` (XLA's CreateBFCAllocator: total_memory × memory_fraction; PyTorch's
    # set_per_process_memory_fraction: fraction × total), but a cudaMalloc gets only what is
    # left: capacity − context_bytes − what is in use. 0 for a profile from a file unless it
    # says; the built-in profiles carry a documented default (DEFAULT_CONTEXT_NOTE).
    context_bytes: int = 0

    def with_capacity(self, capacity: int) -> DeviceProfile:
        return replace(self, name=f"{self.name}@{format_size(capacity)}", capacity=capacity)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DeviceProfile:
        """The profile in ``data`` (a device-profile JSON object), every field checked as
        sim/output/schemas/device-profile.schema.json states it. A field that is missing,
        unknown, of the wrong type or out of range raises :class:`UserInputError` naming it."""
        if not isinstance(data, dict):
            raise UserInputError(f"a device profile is a JSON object, got {_json_type(data)}")
        unknown = sorted(set(data) - _PROFILE_FIELDS)
        if unknown:
            raise UserInputError(f"unknown field {unknown[0]!r} (known: "
                                 f"{', '.join(sorted(_PROFILE_FIELDS))})")
        for key in ("name", "capacity"):
            if key not in data:
                raise UserInputError(f"missing required field {key!r}")
        values = dict(data)
        for key in ("name", "source"):
            if key in values and not isinstance(values[key], str):
                raise UserInputError(f"field {key!r} must be a string, "
                                     f"got {_json_type(values[key])}")
        if "context_bytes" in values:
            value = values["context_bytes"]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserInputError("field 'context_bytes' must be a whole number of bytes "
                                     f">= 0, got {_json_type(value)} {value!r}")
        for key in ("capacity", "granularity", "map_granularity"):
            if key in values:
                value = values[key]
                if isinstance(value, bool) or not isinstance(value, int):
                    raise UserInputError(f"field {key!r} must be an integer number of bytes, "
                                         f"got {_json_type(value)} {value!r}")
                if value < 1:
                    raise UserInputError(f"field {key!r} must be at least 1 byte, got {value}")
                most = MAX_PROFILE_CAPACITY if key == "capacity" else MAX_GRANULARITY
                if value > most:
                    raise UserInputError(f"field {key!r} must be at most {format_size(most)} "
                                         f"({most:,} bytes), got {value:,}")
        for key in ("granularity", "map_granularity"):
            if values.get(key, 1) > values["capacity"]:
                # Every device call would be refused: each policy would OOM at 0 B.
                raise UserInputError(f"field {key!r} ({values[key]:,} bytes) is larger than "
                                     f"the capacity ({values['capacity']:,} bytes)")
        costs = values.get("costs", {})
        if not isinstance(costs, dict):
            raise UserInputError(f"field 'costs' must be an object, got {_json_type(costs)}")
        unknown = sorted(set(costs) - _COST_FIELDS)
        if unknown:
            raise UserInputError(f"unknown field 'costs.{unknown[0]}' (known: "
                                 f"{', '.join(sorted(_COST_FIELDS))})")
        checked: dict[str, float | str] = {}
        for key, value in costs.items():
            if key == "source":
                if not isinstance(value, str):
                    raise UserInputError(f"field 'costs.source' must be a string, "
                                         f"got {_json_type(value)}")
                checked[key] = value
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UserInputError(f"field 'costs.{key}' must be a number of seconds, "
                                     f"got {_json_type(value)} {value!r}")
            try:
                seconds = float(value)
            except OverflowError:
                seconds = math.inf
            if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_CALL_SECONDS:
                raise UserInputError(f"field 'costs.{key}' must be a number of seconds from 0 "
                                     f"to {MAX_CALL_SECONDS:g}, got {value!r}")
            checked[key] = seconds
        values["costs"] = CostModel(**checked)  # type: ignore[arg-type]
        return cls(**values)


def _json_type(value: object) -> str:
    """The JSON name of ``value``'s type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


_PROFILE_FIELDS = frozenset(f.name for f in fields(DeviceProfile))
_COST_FIELDS = frozenset(f.name for f in fields(CostModel))


_GRANULARITY_NOTE = ("granularity 512 B: cudaMalloc pointers are at least 256-byte aligned "
                     "(CUDA Programming Guide); 512 B rounding is assumed, driver sub-allocation "
                     "of small requests is not modelled")

# The device's own share on the built-in profiles: assumed, not measured here (no GPU). A CUDA
# 12 process with lazy module loading (the default since CUDA 12.2) holds a few hundred MiB
# before its first allocation (context, module images, library handles), more on cards with
# more SMs (pytorch/pytorch PR #86509 measured a PyTorch process's context at 287,047,680 B
# with lazy loading, 666,632,192 B without). `--context SIZE` or a profile file's
# context_bytes sets it.
DEFAULT_CONTEXT_NOTE = ("context (CUDA context and libraries) assumed, not measured; --context "
                        "sets it")


def _profile(name: str, mib: int, card: str, context_mib: int) -> DeviceProfile:
    return DeviceProfile(name, mib * MiB, context_bytes=context_mib * MiB,
                         source=f"{card}: nvidia-smi reports {mib} MiB total; " + _GRANULARITY_NOTE
                         + f"; {context_mib} MiB {DEFAULT_CONTEXT_NOTE}")


PROFILES: dict[str, DeviceProfile] = {
    profile.name: profile
    for profile in (
        _profile("a100-40g", 40960, "A100-SXM4-40GB", 512),
        _profile("a100-80g", 81920, "A100-SXM4-80GB", 512),
        _profile("h100-80g", 81559, "H100 80GB HBM3", 512),
        _profile("h200-141g", 143771, "H200 141GB HBM3e", 512),
        _profile("l4-24g", 23034, "L4", 384),
        _profile("rtx4090-24g", 24564, "GeForce RTX 4090", 384),
        _profile("t4-16g", 15360, "Tesla T4", 256),
    )
}
DEFAULT_PROFILE = "a100-80g"


def resolve_device(name: str | None = None, capacity: str | int | None = None,
                   profile_file: str | Path | None = None) -> DeviceProfile:
    """The profile for ``--device NAME`` / ``--device-profile FILE``, with ``--capacity``
    applied. A name, file or capacity that does not work raises :class:`UserInputError`.

    An explicit capacity is the memory the allocators may use: it comes with no device share
    (``context_bytes`` 0; ``--context`` sets one). A named profile at its own capacity keeps
    its share, and so does every capacity min-capacity tries (``with_capacity``)."""
    if profile_file is not None:
        try:
            data = json.loads(read_input_text(profile_file, what="a device profile"))
        except TraceError as err:  # not a regular file, too large, not UTF-8
            raise UserInputError(f"{profile_file}: {err.problem}") from None
        except (OSError, ValueError) as err:
            raise UserInputError(f"{profile_file}: not a device profile: "
                                 f"{str(err).splitlines()[0] if str(err) else err!r}") from None
        except RecursionError:
            raise UserInputError(f"{profile_file}: not a device profile: JSON nested too "
                                 "deeply") from None
        try:
            profile = DeviceProfile.from_dict(data)
        except UserInputError as err:
            raise UserInputError(f"{profile_file}: not a device profile: {err}") from None
    else:
        if name is not None and not name.strip():
            raise UserInputError(f"--device: an empty name; known devices: "
                                 f"{', '.join(PROFILES)}")
        key = (name or DEFAULT_PROFILE).lower()
        if key not in PROFILES:
            raise UserInputError(f"unknown device {name!r}; known devices: "
                                 f"{', '.join(PROFILES)}")
        profile = PROFILES[key]
    if capacity is not None:
        nbytes = parse_size(capacity)
        if nbytes <= 0:
            raise UserInputError(f"capacity must be positive, got {capacity!r}")
        profile = replace(profile.with_capacity(nbytes), context_bytes=0)
    return profile


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

    def exit(self) -> int:
        """The process ends: the driver takes back everything it held (no policy involved, no
        cost charged). Returns the bytes released."""
        released = self.reserved
        self.device.used -= released
        self.reserved = 0
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
