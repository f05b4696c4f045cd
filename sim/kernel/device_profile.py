"""What a GPU is to the simulator: its capacity, allocation granularity, the device's own share
(CUDA context and libraries), what device calls cost, and the named profiles (``--device``,
``--device-profile FILE``, ``--capacity``). sim/kernel/device.py's :class:`SimulatedDevice` is
built from one.

A device is resolved once, at the edge: the named profile (:func:`named_profile`) with what
the user or a search overrides applied by one rule, :meth:`DeviceProfile.device_with` (a
capacity given is the allocators' memory, with no context unless one is given). The profile
keeps its name and the override beside it; :attr:`DeviceProfile.label` shows both
(``a100-80g@24.00GiB``), and only a stored document's name is read back (:func:`read_label`).

Where the numbers come from is written next to each. The costs are order-of-magnitude guesses
from public measurements (below) until ``allocsim calibrate`` measures a real device.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from allocsim.errors import UserInputError
from allocsim.policies.units import format_size, parse_size
from allocsim.traces.formats.limits import read_input_text
from allocsim.traces.model import TraceError

MiB = 1 << 20
GiB = 1 << 30


# The ranges a device profile's fields are held to (sim/output/schemas/device-profile.schema.json
# states them): no GPU has an exabyte or a mapping granularity over 1 GiB (current ones: 512 B
# and 2 MiB), and no device call takes an hour. Out of them, every result would be nonsense.
MAX_PROFILE_CAPACITY = 1 << 60
MAX_GRANULARITY = 1 << 30
MAX_CALL_SECONDS = 3600.0


def check_capacity(nbytes: int, what: str = "capacity") -> int:
    """``nbytes`` as a device's capacity; refused in one line naming ``what`` (the option or
    field that gave it) unless from 1 byte to :data:`MAX_PROFILE_CAPACITY`, the bound a
    profile file is held to, so ``--capacity 16EiB`` is refused where it is typed rather than
    past the native core's 64-bit sizes."""
    if nbytes <= 0:
        raise UserInputError(f"{what}: capacity must be positive, e.g. 24GiB; got "
                             f"{nbytes:,} bytes")
    if nbytes > MAX_PROFILE_CAPACITY:
        raise UserInputError(f"{what}: at most {format_size(MAX_PROFILE_CAPACITY)} "
                             f"({MAX_PROFILE_CAPACITY:,} bytes), the largest device allocsim "
                             f"models; got {_bytes_shown(nbytes)}")
    return nbytes


def check_context(nbytes: int, capacity: int, what: str = "--context") -> int:
    """``nbytes`` as the device's own share of a device of ``capacity``: refused in one line
    naming ``what`` unless it leaves the allocators something (the same rule for ``--context``
    and a profile file's ``context_bytes``; a share of the whole device would report every
    policy out of memory at 0 B)."""
    if nbytes >= capacity:
        raise UserInputError(f"{what}: {format_size(nbytes)} ({_bytes_shown(nbytes)}) is no "
                             f"less than the device's {format_size(capacity)}: nothing is "
                             "left for the allocators")
    return nbytes


def _bytes_shown(nbytes: int) -> str:
    return f"{nbytes:,} bytes" if nbytes < 10**30 else f"{float(nbytes):.3e} bytes"


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
    # The profile's own capacity when ``capacity`` is an override (:meth:`device_with`), else
    # None. It is kept beside the name, never written into it: ``name`` stays the profile's
    # ("a100-80g"), :attr:`label` shows the override ("a100-80g@24.00GiB").
    own_capacity: int | None = None

    @property
    def label(self) -> str:
        """The name as every answer shows it: the profile's name, with ``@SIZE`` when its
        capacity was overridden."""
        if self.own_capacity is None:
            return self.name
        return f"{self.name}@{format_size(self.capacity)}"

    @property
    def profile_capacity(self) -> int:
        """The named profile's own capacity, whatever was overridden (the memory a trace
        compiled for this card assumed)."""
        return self.capacity if self.own_capacity is None else self.own_capacity

    def device_with(self, capacity: int | None = None,
                    context: int | None = None) -> DeviceProfile:
        """This device with its capacity and/or its own share (``context_bytes``) overridden:
        the one rule for ``--capacity``/``--context``, a sweep's ``capacities``, the cards
        min-capacity and tune try, and the validator.

        The rule (README "context", docs/models.md "The device's own share"): a capacity given
        is the memory the allocators may use, so it comes with **no context** unless
        ``context`` gives one; a search over card sizes of this device (min-capacity, tune)
        passes ``context=self.context_bytes`` to keep its share. A context alone replaces the
        profile's share at the profile's capacity; neither returns the device unchanged.

        Sizes are bytes checked where they were given, once (:func:`check_capacity`,
        :func:`check_context`: the option or file that gave them); here they are applied, so
        a search may try a card its own share fills (one that fits nothing)."""
        if capacity is None:
            return self if context is None else replace(self, context_bytes=context)
        return replace(self, capacity=capacity, context_bytes=context or 0,
                       own_capacity=self.profile_capacity)

    def as_dict(self) -> dict:
        """The profile as a device-profile JSON object (its schema's fields): the name as
        :attr:`label` shows it, the override in it rather than a field of its own."""
        data = asdict(self)
        del data["own_capacity"]
        data["name"] = self.label
        return data

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
        if "context_bytes" in values:
            check_context(values["context_bytes"], values["capacity"], "field 'context_bytes'")
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
        values["name"], values["own_capacity"] = read_label(values["name"], values["capacity"])
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


def read_label(label: str, capacity: int) -> tuple[str, int | None]:
    """``(name, own_capacity)`` of a device as a stored document shows it (a results file, a
    baseline, a profile file written from a resized device): ``"a100-80g@24.00GiB"`` at 24 GiB
    is the built-in a100-80g resized, as :attr:`DeviceProfile.label` wrote it; any other name
    is a name. Only documents are read this way; a device in memory keeps its parts."""
    name, at, size = label.rpartition("@")
    if at and name in PROFILES and size == format_size(capacity):
        return name, PROFILES[name].capacity
    return label, None


_PROFILE_FIELDS = frozenset(f.name for f in fields(DeviceProfile)) - {"own_capacity"}
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


# TPUs (JAX on a TPU; policies/tpu.py). The v5e's limit is measured: memory_stats()'s
# bytes_limit on a TPU v5e chip, JAX 0.10.2, libtpu 0.0.42.1 (experiments/tpu/chip_probe.py).
# The others are their public HBM sizes, assumed (not measured here): the runtime's own limit
# on those chips is not known.
TPU_V5E_BYTES_LIMIT = 16_909_336_064


TPU_RUNTIME_BYTES = 26_624   # in use before the first array (memory_stats), measured on a v5e


# A TPU's calls cost nothing in the model: the runtime's allocation is host bookkeeping whose
# time was not separable, on the chip, from device_put's transfer (experiments/tpu/chip_probe.py
# times the two together). What is modelled is compaction, which the tpu policy charges itself
# (policies/tpu.py, compaction_seconds: measured).
TPU_COSTS = CostModel(malloc_base_s=0.0, malloc_per_gib_s=0.0, free_base_s=0.0,
                      free_per_gib_s=0.0, map_base_s=0.0, map_per_gib_s=0.0, unmap_base_s=0.0,
                      source="TPU: an allocation's own time not modelled (not separable from "
                             "device_put's transfer on the chip); compaction modelled by the "
                             "tpu policy, measured on a v5e")


def _tpu_profile(name: str, capacity: int, source: str) -> DeviceProfile:
    # The runtime's own bytes are the device's context: any policy replayed on a TPU starts
    # without them; the tpu policy keeps them at the top of HBM (runtime_bytes).
    return DeviceProfile(name, capacity, granularity=512, map_granularity=512,
                         context_bytes=TPU_RUNTIME_BYTES, costs=TPU_COSTS, source=source)


TPU_PROFILES = (
    _tpu_profile("tpu-v5e", TPU_V5E_BYTES_LIMIT,
                 "TPU v5e: bytes_limit measured on the chip (JAX 0.10.2, libtpu 0.0.42.1); "
                 "512 B granules measured; context 26,624 B measured (the runtime's own bytes "
                 "before any array)"),
    _tpu_profile("tpu-v4", 32 * GiB, "TPU v4: 32 GiB HBM (public figure), assumed, not "
                 "measured; context and granules assumed as on a v5e"),
    _tpu_profile("tpu-v5p", 95 * GiB, "TPU v5p: 95 GiB HBM (public figure), assumed, not "
                 "measured; context and granules assumed as on a v5e"),
    _tpu_profile("tpu-v6e", 32 * GiB, "TPU v6e (Trillium): 32 GiB HBM (public figure), "
                 "assumed, not measured; context and granules assumed as on a v5e"),
)

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
        *TPU_PROFILES,
    )
}
DEFAULT_PROFILE = "a100-80g"


def resolve_device(name: str | None = None, capacity: str | int | None = None,
                   profile_file: str | Path | None = None,
                   context: int | None = None) -> DeviceProfile:
    """The profile for ``--device NAME`` / ``--device-profile FILE``, with ``capacity`` and
    ``context`` applied by :meth:`DeviceProfile.device_with` (its docstring states the rule:
    a capacity given is the allocators' memory, with no context unless one is given). A name,
    file or capacity that does not work raises :class:`UserInputError`.

    ``capacity`` is a size (``"24GiB"``) or bytes, parsed and checked here, once; the command
    line parses its ``--capacity`` itself (``capacity_option``, which notes a fraction of a
    byte) and hands the bytes to :meth:`~DeviceProfile.device_with` directly."""
    profile = named_profile(name, profile_file)
    nbytes = None if capacity is None else check_capacity(parse_size(capacity))
    device = profile.device_with(nbytes, context)
    if context is not None:
        check_context(context, device.capacity, "context")
    return device


def named_profile(name: str | None = None,
                  profile_file: str | Path | None = None) -> DeviceProfile:
    """The profile ``--device NAME`` or ``--device-profile FILE`` names (the default profile
    for neither), nothing overridden."""
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
            return DeviceProfile.from_dict(data)
        except UserInputError as err:
            raise UserInputError(f"{profile_file}: not a device profile: {err}") from None
    if name is not None and not name.strip():
        raise UserInputError(f"--device: an empty name; known devices: "
                             f"{', '.join(PROFILES)}")
    key = (name or DEFAULT_PROFILE).lower()
    if key not in PROFILES:
        raise UserInputError(f"unknown device {name!r}; known devices: "
                             f"{', '.join(PROFILES)}")
    return PROFILES[key]
