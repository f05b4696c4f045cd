"""The ``pytorch`` policy a snapshot's ``allocator_settings`` stand for, and back.

PyTorch writes its allocator settings into the snapshot (torch/csrc/cuda/memory_snapshot.cpp,
``_memory_snapshot_pickled``); :meth:`PyTorchSettings.from_snapshot
<allocsim.policies.settings.pytorch.PyTorchSettings.from_snapshot>` reads them (which keys
are modelled: :mod:`allocsim.sim.questions.fidelity.pytorch`, "What it follows"), and
:func:`settings_from_snapshot` checks that the model takes them; :func:`settings_record`
writes them back for simulated snapshots (``PyTorchSettings.to_snapshot``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from allocsim.policies import PolicySpec, parse_policy
from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.policies.settings import PyTorchSettings
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.questions.fidelity.recording import FidelityError

__all__ = ["SnapshotSettings", "settings_from_snapshot", "settings_record"]

GiB = 1 << 30


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


def settings_from_snapshot(recorded: Any) -> SnapshotSettings:
    """The ``pytorch`` policy a snapshot's ``allocator_settings`` stand for (PyTorch's
    defaults, said so, when it records none); :class:`FidelityError` (one line) for settings
    the model cannot read or take."""
    if not isinstance(recorded, dict):
        return SnapshotSettings({}, parse_policy("pytorch"), None, [], [
            "the snapshot records no allocator_settings: PyTorch's defaults assumed"])
    try:
        reading = PyTorchSettings.from_snapshot(recorded)
    except ValueError as err:
        raise FidelityError(str(err)) from None
    try:
        spec = parse_policy(reading.settings.spec())
        PyTorchCachingAllocator(SimulatedDevice(DeviceProfile("check", GiB)).view(0),
                                **reading.params)
    except ValueError as err:
        raise FidelityError(f"allocator_settings: the model cannot take them: {err}") from None
    return SnapshotSettings(reading.params, spec, dict(recorded), reading.not_modelled,
                            reading.notes)


def settings_record(params: dict[str, Any]) -> dict[str, Any]:
    """The ``allocator_settings`` PyTorch would write for these ``pytorch`` parameters (the
    inverse of :func:`settings_from_snapshot`; used for simulated snapshots)."""
    return PyTorchSettings(**params).to_snapshot()
