"""PyTorch's allocator settings as one typed value: read from ``PYTORCH_CUDA_ALLOC_CONF`` or a
snapshot's ``allocator_settings``, written back as either, as the line a user pastes, or as the
registry spec of the model that stands for them.

This module is where the settings' names are spelled (``expandable_segments``,
``max_split_size_mb`` …, PyTorch's own); every command, ``tune`` and ``fidelity`` go through
:class:`PyTorchSettings` rather than writing or splitting ``key:value`` text themselves. The
grammar and PyTorch's validation are :func:`allocsim.policies.pytorch.settings.parse_alloc_conf`
(c10/core/AllocatorConfig.cpp, c10/cuda/CUDAAllocatorConfig.cpp); the snapshot's keys are
torch/csrc/cuda/memory_snapshot.cpp's ``_memory_snapshot_pickled``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from allocsim.policies.pytorch.settings import (
    parse_alloc_conf,
    parse_roundup_power2_divisions,
)

MiB = 1 << 20
SIZE_MAX = (1 << 64) - 1
NEVER_RELEASE = 1 << 60          # a release threshold no card reaches (UINT64_MAX in CUDA)
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
# Where PyTorch reads its settings from, first found wins (PYTORCH_ALLOC_CONF is the newer name).
ALLOC_CONF_VARIABLES = ("PYTORCH_ALLOC_CONF", ALLOC_CONF)
NATIVE, ASYNC = "native", "cudaMallocAsync"

# allocator_settings keys that only concern the host (pinned memory) or locking: they do not
# change where device memory goes.
_HOST_KEYS = frozenset({
    "pinned_num_register_threads", "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
    "pinned_use_background_threads", "pinned_reserve_segment_size_mb",
    "last_allocator_settings"})


class SnapshotSettingsError(ValueError):
    """A snapshot's ``allocator_settings`` the model cannot read; the message is one line."""


@dataclass(frozen=True)
class PyTorchSettings:
    """One choice of PyTorch's allocator settings, each field PyTorch's own name and default.

    ``roundup_power2_divisions`` is kept as PyTorch's text (``"4"``, ``"[256:1,>:8]"``; ""
    for none); ``per_process_memory_fraction`` None is no fraction (PyTorch's 1.0 sets none
    either; 0.0 is a limit of 0 bytes, as in PyTorch); ``backend`` ``cudaMallocAsync`` is
    CUDA's stream-ordered pool, a different model.
    """

    backend: str = NATIVE
    expandable_segments: bool = False
    max_split_size_mb: int = 0
    roundup_power2_divisions: str = ""
    garbage_collection_threshold: float = 0.0
    per_process_memory_fraction: float | None = None
    max_non_split_rounding_mb: int = 20

    # The conf's order of the keys, as tune has always pasted them; the fraction goes last (in
    # code, set_per_process_memory_fraction, where paste puts it).
    CONF_ORDER: ClassVar[tuple[str, ...]] = (
        "backend", "expandable_segments", "max_split_size_mb", "max_non_split_rounding_mb",
        "roundup_power2_divisions", "garbage_collection_threshold",
        "per_process_memory_fraction")

    # -- reading ---------------------------------------------------------------------------
    @classmethod
    def from_alloc_conf(cls, text: str) -> PyTorchSettings:
        """The settings in a ``PYTORCH_CUDA_ALLOC_CONF`` value (``"expandable_segments:True,
        max_split_size_mb:128"``, with or without ``PYTORCH_CUDA_ALLOC_CONF=``), validated
        as PyTorch validates them; ValueError with one line otherwise. Keys that do not
        change device memory are accepted and dropped."""
        body = text.strip()
        if not body.split("=", 1)[-1].strip("'\" "):
            return cls()
        params = parse_alloc_conf(body, any_backend=True)
        values: dict[str, Any] = {}
        for key, value in params.items():
            kind = _FIELD_TYPES[key]
            if kind is bool:
                values[key] = value == "true"
            elif kind is float:
                values[key] = float(value)
            elif kind is int:
                values[key] = int(value)
            else:
                values[key] = value.replace(";", ",")
        return cls(**values)

    @classmethod
    def from_snapshot(cls, recorded: dict[str, Any]) -> SnapshotReading:
        """The settings a snapshot's ``allocator_settings`` record, with what the model does not
        follow (``not_modelled``) and what it assumed (``notes``).

        The structured keys win; keys only the ``PYTORCH_CUDA_ALLOC_CONF`` string carries
        (``max_non_split_rounding_mb``) are taken from it. Host-side keys are dropped,
        anything else is listed as not modelled. A memory fraction is not recorded in
        snapshots, so ``garbage_collection_threshold`` (which acts only with one) stays
        inactive; said so. Raises :class:`SnapshotSettingsError` (one line)."""
        reading = SnapshotReading(cls())
        conf = str(recorded.get(ALLOC_CONF) or "").strip()
        if conf:
            try:
                from_conf = parse_alloc_conf(conf)      # the pytorch model's keys only
            except ValueError as err:
                reading.not_modelled.append(f"{ALLOC_CONF}={conf!r} ({err})")
            else:
                if "max_non_split_rounding_mb" in from_conf:
                    reading.set(max_non_split_rounding_mb=int(
                        from_conf["max_non_split_rounding_mb"]))
        for key, value in recorded.items():
            if key == ALLOC_CONF:
                continue
            try:
                reading.read(key, value)
            except SnapshotSettingsError:
                raise
            except (TypeError, ValueError) as err:
                raise SnapshotSettingsError(f"allocator_settings: {key} = {value!r}: "
                                            f"{err}") from None
        return reading

    # -- writing ---------------------------------------------------------------------------
    def changed(self) -> dict[str, Any]:
        """The fields that differ from PyTorch's defaults, in :attr:`CONF_ORDER`."""
        default = PyTorchSettings()
        return {key: getattr(self, key) for key in self.CONF_ORDER
                if getattr(self, key) != getattr(default, key)}

    def to_alloc_conf(self) -> str:
        """The ``PYTORCH_CUDA_ALLOC_CONF`` value that sets these settings ("" for the
        defaults); :meth:`from_alloc_conf` reads it back to the same value."""
        return ",".join(f"{key}:{_conf_text(value)}" for key, value in self.changed().items())

    def paste(self, capacity: int | None = None) -> list[str]:
        """The lines a user pastes: the environment variable (quoted when it holds a list),
        then the fraction as the code that sets it ([] for the defaults). Every settings
        value takes the card's ``capacity`` in :meth:`paste` and :meth:`spec`; these do not
        need it."""
        conf = replace(self, per_process_memory_fraction=None).to_alloc_conf()
        lines = []
        if conf:
            lines.append(f"{ALLOC_CONF}='{conf}'" if "[" in conf else f"{ALLOC_CONF}={conf}")
        if self.per_process_memory_fraction is not None:
            lines.append("torch.cuda.set_per_process_memory_fraction("
                         f"{self.per_process_memory_fraction:g})")
        return lines

    def spec(self, capacity: int | None = None) -> str:
        """The registry spec of the model: ``pytorch:expandable_segments=true,...``, or for
        the async backend CUDA's pool, which never gives memory back (PyTorch sets its release
        threshold to UINT64_MAX, CUDAMallocAsyncAllocator.cpp)."""
        if self.backend == ASYNC:
            return f"cuda-async:release_threshold={NEVER_RELEASE}"
        params = self.changed()
        return "pytorch" + (":" + ",".join(f"{key}={_spec_text(value)}"
                                           for key, value in params.items()) if params else "")

    def to_snapshot(self) -> dict[str, Any]:
        """The ``allocator_settings`` PyTorch writes for these settings (what
        :meth:`from_snapshot` reads; used for simulated snapshots)."""
        split = self.max_split_size_mb
        divisions = parse_roundup_power2_divisions(self.roundup_power2_divisions)
        return {ALLOC_CONF: "", "max_split_size": split * MiB if split else -1,
                "garbage_collection_threshold": float(self.garbage_collection_threshold),
                "expandable_segments": bool(self.expandable_segments),
                "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                "pinned_use_cuda_host_register": False,
                "roundup_power2_divisions": {str(1 << k): d for k, d in enumerate(divisions)}}


_FIELD_TYPES: dict[str, type] = {f.name: type(f.default) for f in fields(PyTorchSettings)}
_FIELD_TYPES["per_process_memory_fraction"] = float


def _conf_text(value: Any) -> str:
    return str(value)                       # True, 128, [256:1,>:8], 0.6: PyTorch's spelling


def _param(value: Any) -> Any:
    return value.replace(",", ";") if isinstance(value, str) else value


def _spec_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).replace(",", ";")     # a list inside a registry spec uses ';'


@dataclass
class SnapshotReading:
    """What :meth:`PyTorchSettings.from_snapshot` read: the settings, the ``pytorch``
    policy's parameters the recording set (in the order read, defaults too: what fidelity
    reports as read), the recorded ones the model does not follow, and the notes on what it
    assumed."""

    settings: PyTorchSettings
    params: dict[str, Any] = field(default_factory=dict)
    not_modelled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def set(self, **values: Any) -> None:
        self.settings = replace(self.settings, **values)
        self.params.update({key: _param(value) for key, value in values.items()})

    def read(self, key: str, value: Any) -> None:
        """One recorded setting into :attr:`settings` (or ``not_modelled``, ``notes``)."""
        if key == "max_split_size":
            megabytes = _recorded_mb(value, key)
            if megabytes:
                self.set(max_split_size_mb=megabytes)
        elif key in ("max_non_split_rounding_size", "max_non_split_rounding_mb"):
            megabytes = int(value) if key.endswith("_mb") else _recorded_mb(value, key)
            if megabytes:
                self.set(max_non_split_rounding_mb=megabytes)
        elif key == "garbage_collection_threshold":
            if float(value) > 0:
                self.set(garbage_collection_threshold=float(value))
                self.notes.append("garbage_collection_threshold acts only with a memory "
                                  "fraction, which snapshots do not record: garbage "
                                  "collection stays off")
        elif key == "expandable_segments":
            if bool(value):
                self.set(expandable_segments=True)
        elif key == "roundup_power2_divisions":
            text = _recorded_divisions(value)
            if text:
                self.set(roundup_power2_divisions=text)
        elif key in _HOST_KEYS:
            return
        elif key == "graph_capture_record_stream_reuse":
            if value:
                self.not_modelled.append(f"{key}={value} (CUDA graph capture is not modelled)")
        else:
            self.not_modelled.append(f"{key}={value!r}")


def _recorded_divisions(value: Any) -> str:
    """``roundup_power2_divisions`` as recorded ({"1": d, …} or a 16-list) → PyTorch's
    ``[1:d,2:d,…]`` text ('' when every interval is 0)."""
    if isinstance(value, dict):
        items = sorted(((int(k), int(v)) for k, v in value.items()), key=lambda kv: kv[0])
    elif isinstance(value, (list, tuple)):
        items = [(1 << k, int(v)) for k, v in enumerate(value)]
    else:
        raise SnapshotSettingsError(f"allocator_settings: roundup_power2_divisions is "
                                    f"{value!r}, expected a dict or a list")
    if not any(v for _, v in items):
        return ""
    values = {v for _, v in items}
    if len(values) == 1 and len(items) == 16:
        text = str(values.pop())
    else:
        text = "[" + ",".join(f"{bound}:{divs}" for bound, divs in items) + "]"
    parse_roundup_power2_divisions(text)   # PyTorch's validation (powers of two)
    return text


def _recorded_mb(value: Any, key: str) -> int:
    """Bytes as recorded → MiB for the policy (0 = unlimited: -1 or SIZE_MAX)."""
    value = int(value)
    if value < 0 or value >= (1 << 62) or value == SIZE_MAX:
        return 0
    if value % MiB:
        raise SnapshotSettingsError(f"allocator_settings: {key} = {value} is not a whole "
                                    "number of MiB")
    return value // MiB


__all__ = ["ALLOC_CONF", "ALLOC_CONF_VARIABLES", "NEVER_RELEASE", "PyTorchSettings",
           "SnapshotReading", "SnapshotSettingsError"]
