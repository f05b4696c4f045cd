"""A snapshot's recorded OOM, and the seeded model stopped just before it (for explain-oom).

An ``oom`` entry is a request the real allocator failed: it is not in the trace (PyTorch
records no alloc for it) and its ``device_free`` gives the capacity the process had
(:func:`~allocsim.sim.questions.fidelity.recording.snapshot_capacity`).
:func:`model_at_recorded_oom` replays the seeded model as
:func:`~allocsim.sim.questions.fidelity.pytorch.fidelity` does and stops there, so
:mod:`allocsim.sim.questions.explain` can read the state the request met.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.sim.kernel.device import ProcessDevice
from allocsim.sim.questions.fidelity.recording import (
    check_snapshot_trace,
    compared_refs,
    episodes,
    snapshot_capacity,
)
from allocsim.sim.questions.fidelity.replay import Replay
from allocsim.sim.questions.fidelity.settings import SnapshotSettings, settings_from_snapshot
from allocsim.traces.model import Trace

__all__ = ["RecordedOOM", "model_at_recorded_oom", "recorded_oom"]


@dataclass
class RecordedOOM:
    """The first ``oom`` entry of a snapshot: the request that failed and where."""

    index: int                  # among the compared reference entries
    event: int                  # the trace event it comes before
    request: int                # rounded bytes (PyTorch records the rounded size)
    stream: int
    device_free: int
    recorded_reserved: int      # what the process held then (after its release path)
    capacity: int
    capacity_source: str
    time_ns: int | None
    settings: SnapshotSettings


def recorded_oom(trace: Trace) -> RecordedOOM | None:
    """The snapshot's first recorded OOM, or None when it has none."""
    check_snapshot_trace(trace)
    refs = compared_refs(trace)
    capacity, source, index = snapshot_capacity(trace, refs)
    if index is None or capacity is None:
        return None
    ref = refs[index]
    return RecordedOOM(index=index, event=int(ref["event"]), request=int(ref["size"]),
                       stream=int(ref.get("stream") or 0),
                       device_free=int(ref.get("device_free") or 0),
                       recorded_reserved=capacity - int(ref.get("device_free") or 0),
                       capacity=capacity, capacity_source=source, time_ns=ref.get("time_ns"),
                       settings=settings_from_snapshot(trace.metadata.get("allocator_settings")))


def model_at_recorded_oom(trace: Trace, oom: RecordedOOM
                          ) -> tuple[PyTorchCachingAllocator, ProcessDevice, list[str], int]:
    """The seeded model replayed as :func:`~allocsim.sim.questions.fidelity.pytorch.fidelity` does,
    stopped just before the recorded failed request (its release path not yet run):
    ``(policy, device view, notes, the request's stream as the model numbers it)``."""
    refs = compared_refs(trace)
    initial = trace.metadata.get("initial_segments") or []
    initial_reserved = sum(int(s["total_size"]) for s in initial)
    found, _ = episodes(refs, trace.op.tolist(), initial_reserved, oom.capacity)
    at = next((k for k, e in enumerate(found)
               if e.kind == "oom" and e.entries[-1] == oom.index), None)
    if at is None:
        raise RuntimeError(f"{trace.name}: recorded entry #{oom.index} is not an oom episode")
    replay = Replay(trace, oom.settings, oom.capacity, refs, found)
    replay.run(stop=(oom.event, at))
    return replay.policy, replay.view, replay.notes, replay.ranks.get(oom.stream, oom.stream)
