"""The ``pytorch`` policy a snapshot's ``allocator_settings`` stand for, and back.

PyTorch writes its allocator settings into the snapshot (torch/csrc/cuda/memory_snapshot.cpp,
``_memory_snapshot_pickled``); :func:`settings_from_snapshot` maps them onto the ``pytorch``
policy's parameters (which keys are modelled: :mod:`allocsim.sim.questions.fidelity.pytorch`,
"What it follows"), :func:`settings_record` writes them back for simulated snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from allocsim.policies import PolicySpec, parse_policy
from allocsim.policies.pytorch.caching import (
    MiB,
    PyTorchCachingAllocator,
    parse_alloc_conf,
    parse_roundup_power2_divisions,
)
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.questions.fidelity.recording import FidelityError

__all__ = ["SnapshotSettings", "settings_from_snapshot", "settings_record"]

GiB = 1 << 30
SIZE_MAX = (1 << 64) - 1

# allocator_settings keys that only concern the host (pinned memory) or locking: they do not
# change where device memory goes.
_HOST_KEYS = {"pinned_num_register_threads", "release_lock_on_cudamalloc",
              "release_lock_on_hipmalloc", "pinned_use_cuda_host_register",
              "pinned_use_hip_host_register", "pinned_use_background_threads",
              "pinned_reserve_segment_size_mb", "last_allocator_settings"}


@dataclass
class SnapshotSettings:
    """The ``pytorch`` policy parameters a snapshot's ``allocator_settings`` stand for."""

    params: dict[str, Any]                 # PyTorchCachingAllocator keyword arguments
    spec: PolicySpec
    recorded: dict[str, Any] | None        # the settings as the file has them
    not_modelled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        return {"policy": str(self.spec), "params": self.params, "recorded": self.recorded,
                "not_modelled": self.not_modelled, "notes": self.notes}


def _divisions_text(value: Any) -> str:
    """``roundup_power2_divisions`` as recorded ({"1": d, …} or a 16-list) → the policy's
    ``[1:d;2:d;…]`` list ('' when every interval is 0)."""
    if isinstance(value, dict):
        items = sorted(((int(k), int(v)) for k, v in value.items()), key=lambda kv: kv[0])
    elif isinstance(value, (list, tuple)):
        items = [(1 << k, int(v)) for k, v in enumerate(value)]
    else:
        raise FidelityError(f"allocator_settings: roundup_power2_divisions is {value!r}, "
                            "expected a dict or a list")
    if not any(v for _, v in items):
        return ""
    values = {v for _, v in items}
    if len(values) == 1 and len(items) == 16:
        text = str(values.pop())
        parse_roundup_power2_divisions(text)
        return text
    text = "[" + ";".join(f"{bound}:{divs}" for bound, divs in items) + "]"
    parse_roundup_power2_divisions(text)   # PyTorch's validation (powers of two)
    return text


def _max_split_mb(value: Any, key: str) -> int:
    """Bytes as recorded → MiB for the policy (0 = unlimited: -1 or SIZE_MAX)."""
    value = int(value)
    if value < 0 or value >= (1 << 62) or value == SIZE_MAX:
        return 0
    if value % MiB:
        raise FidelityError(f"allocator_settings: {key} = {value} is not a whole number of MiB")
    return value // MiB


def settings_from_snapshot(recorded: Any) -> SnapshotSettings:
    """Map a snapshot's ``allocator_settings`` onto the ``pytorch`` policy's parameters.

    The structured keys win; keys only the ``PYTORCH_CUDA_ALLOC_CONF`` string carries
    (``max_non_split_rounding_mb``) are taken from it. Host-side keys are dropped, anything
    else is listed as not modelled. A memory fraction is not recorded in snapshots, so
    ``garbage_collection_threshold`` (which acts only with one) stays inactive; said so.
    """
    params: dict[str, Any] = {}
    not_modelled: list[str] = []
    notes: list[str] = []
    if not isinstance(recorded, dict):
        notes.append("the snapshot records no allocator_settings: PyTorch's defaults assumed")
        return SnapshotSettings(params, parse_policy("pytorch"), None, not_modelled, notes)
    conf = str(recorded.get("PYTORCH_CUDA_ALLOC_CONF") or "").strip()
    if conf:
        try:
            from_conf = parse_alloc_conf(conf)
        except ValueError as err:
            not_modelled.append(f"PYTORCH_CUDA_ALLOC_CONF={conf!r} ({err})")
            from_conf = {}
        for key, value in from_conf.items():
            if key == "max_non_split_rounding_mb":
                params[key] = int(value)
    for key, value in recorded.items():
        if key == "PYTORCH_CUDA_ALLOC_CONF":
            continue
        try:
            _read_key(key, value, params, not_modelled, notes)
        except FidelityError:
            raise
        except (TypeError, ValueError) as err:
            raise FidelityError(f"allocator_settings: {key} = {value!r}: {err}") from None
    spec_text = "pytorch" + (":" + ",".join(f"{k}={v}" for k, v in params.items())
                             if params else "")
    try:
        spec = parse_policy(spec_text)
        PyTorchCachingAllocator(SimulatedDevice(DeviceProfile("check", GiB)).view(0), **params)
    except ValueError as err:
        raise FidelityError(f"allocator_settings: the model cannot take them: {err}") from None
    return SnapshotSettings(params, spec, dict(recorded), not_modelled, notes)


def _read_key(key: str, value: Any, params: dict[str, Any], not_modelled: list[str],
              notes: list[str]) -> None:
    """One recorded setting into the policy's ``params`` (or ``not_modelled``, ``notes``)."""
    if key == "max_split_size":
        megabytes = _max_split_mb(value, key)
        if megabytes:
            params["max_split_size_mb"] = megabytes
    elif key in ("max_non_split_rounding_size", "max_non_split_rounding_mb"):
        megabytes = int(value) if key.endswith("_mb") else _max_split_mb(value, key)
        if megabytes:
            params["max_non_split_rounding_mb"] = megabytes
    elif key == "garbage_collection_threshold":
        if float(value) > 0:
            params["garbage_collection_threshold"] = float(value)
            notes.append("garbage_collection_threshold acts only with a memory fraction, "
                         "which snapshots do not record: garbage collection stays off")
    elif key == "expandable_segments":
        if bool(value):
            params["expandable_segments"] = True
    elif key == "roundup_power2_divisions":
        text = _divisions_text(value)
        if text:
            params["roundup_power2_divisions"] = text
    elif key in _HOST_KEYS:
        return
    elif key == "graph_capture_record_stream_reuse":
        if value:
            not_modelled.append(f"{key}={value} (CUDA graph capture is not modelled)")
    else:
        not_modelled.append(f"{key}={value!r}")


def settings_record(params: dict[str, Any]) -> dict[str, Any]:
    """The ``allocator_settings`` PyTorch would write for these ``pytorch`` parameters (the
    inverse of :func:`settings_from_snapshot`; used for simulated snapshots)."""
    split = params.get("max_split_size_mb", 0)
    divisions = parse_roundup_power2_divisions(params.get("roundup_power2_divisions", ""))
    return {"PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": split * MiB if split else -1,
            "garbage_collection_threshold": float(params.get("garbage_collection_threshold", 0)),
            "expandable_segments": bool(params.get("expandable_segments", False)),
            "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {str(1 << k): d for k, d in enumerate(divisions)}}
