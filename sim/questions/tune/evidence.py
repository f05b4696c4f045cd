"""How far to trust a tune answer: what each framework's model was checked against, the
re-check of a recommendation on a recorded PyTorch snapshot, and what a GPU run would still
have to confirm.

The re-check (:func:`recheck_snapshot`): a PyTorch snapshot starts mid-run, with segments the
plain replay does not have (the plain replay allocates the blocks live at the start afresh).
Fidelity's seeded replay (:class:`~allocsim.sim.questions.fidelity.replay.Replay`) starts the
model from the recorded segments instead; run with the recommended setting and no recorded
decisions to match against, it says whether the setting still completes, and at what peak,
from the state the real process was in. :func:`~allocsim.sim.questions.fidelity.pytorch.fidelity`
itself (the model under the recorded settings against the recorded device calls) says how
well the model followed this very recording.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from allocsim.policies import format_size, parse_policy
from allocsim.sim.questions.fidelity.pytorch import FidelityError, check_snapshot_trace, fidelity
from allocsim.sim.questions.fidelity.replay import Replay
from allocsim.sim.questions.fidelity.settings import SnapshotSettings
from allocsim.sim.questions.tune.search import Trial
from allocsim.sim.questions.tune.space import Framework
from allocsim.traces.model import Trace


@dataclass
class Evidence:
    """What the answer rests on, and what is left to a GPU."""

    checked: str
    assumptions: list[str] = field(default_factory=list)
    fidelity: dict[str, Any] | None = None     # the model under the recorded settings
    recheck: dict[str, Any] | None = None      # the recommendation from the recorded start
    gpu_would_confirm: list[str] = field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        return {"checked": self.checked, "assumptions": self.assumptions,
                "fidelity": self.fidelity, "recheck": self.recheck,
                "gpu_would_confirm": self.gpu_would_confirm}


def is_snapshot(trace: Trace) -> bool:
    try:
        check_snapshot_trace(trace)
    except FidelityError:
        return False
    return True


def recheck_snapshot(trace: Trace, spec: str, capacity: int) -> dict[str, Any]:
    """The seeded replay of a snapshot under ``spec`` (a ``pytorch`` spec) on ``capacity``:
    completed, OOMs, peak reserved, with the replay's notes."""
    parsed = parse_policy(spec)
    settings = SnapshotSettings(params=dict(parsed.params), spec=parsed, recorded=None)
    run = Replay(trace, settings, capacity, [], [])
    failed = 0
    malloc = run.policy.malloc

    def counting(size: int, stream: int = 0) -> int | None:
        nonlocal failed
        address = malloc(size, stream)
        if address is None:
            failed += 1
        return address

    run.policy.malloc = counting    # type: ignore[method-assign]
    run.run()
    return {"spec": spec, "capacity": capacity, "completed": failed == 0, "ooms": failed,
            "peak_reserved": run.view.peak_reserved, "seeded_segments": run.seeded_segments,
            "notes": run.notes}


def gather(trace: Trace, fw: Framework, best: Trial | None, *, card: bool,
           trace_framework: str | None, device_capacity: int) -> Evidence:
    """The evidence section for ``best`` (None: nothing passed)."""
    evidence = Evidence(fw.evidence)
    if trace_framework is None:
        evidence.assumptions.append(
            f"the trace does not say which framework made it: its requests are taken as what "
            f"{fw.name}'s allocator would be asked for")
    elif trace_framework != fw.name:
        evidence.assumptions.append(
            f"the trace was recorded from {trace_framework}, tuned as {fw.name}: this assumes "
            f"{fw.name} would make the same requests, which a different framework does not")
    evidence.assumptions.append("modelled allocator time comes from the device profile's cost "
                                "model (calibrate one with `allocsim calibrate` on the card)")
    if fw.name == "pytorch" and is_snapshot(trace):
        report = fidelity(trace)
        evidence.fidelity = {"matched": report.matched, "total": report.total,
                             "extra": report.extra, "recorded_policy": report.policy,
                             "final_segments_match": report.final_segments_match}
        if best is not None and best.spec.startswith("pytorch"):
            capacity = best.capacity if card or best.min_capacity else device_capacity
            try:
                evidence.recheck = recheck_snapshot(trace, best.spec, capacity)
            except FidelityError as err:
                evidence.assumptions.append(f"not re-checked from the recorded start state: "
                                            f"{err}")
            if (evidence.recheck is not None and best.completed
                    and not evidence.recheck["completed"]):
                evidence.assumptions.append(
                    "from the recorded start state the setting does NOT complete on this card "
                    "(the plain replay allocated the start blocks afresh): treat it with care")
    peak = "" if best is None else format_size(best.peak_reserved)
    if fw.name == "pytorch":
        evidence.gpu_would_confirm += [
            f"torch.cuda.max_memory_reserved() after the run with the setting (predicted "
            f"{peak or 'n/a'}) and no OutOfMemoryError",
            "the allocator time on this card (torch.profiler, or the step time against the "
            "defaults')"]
    elif fw.name == "jax":
        evidence.gpu_would_confirm += [
            f"jax.local_devices()[0].memory_stats()['peak_bytes_in_use'] and 'bytes_limit' "
            f"with the setting (predicted peak reserved {peak or 'n/a'})",
            "XLA's compiled temporaries, cuDNN/cuBLAS workspaces and collectives are not in "
            "the trace unless it was recorded on the GPU"]
    elif fw.name == "tensorflow":
        evidence.gpu_would_confirm += [
            f"tf.config.experimental.get_memory_info('GPU:0')['peak'] with the setting "
            f"(predicted peak reserved {peak or 'n/a'})",
            "TensorFlow leaves part of the card to the system by default: the limit it takes "
            "is a little below the card"]
    else:
        evidence.gpu_would_confirm += [
            f"cupy.get_default_memory_pool().total_bytes() at its peak (predicted "
            f"{peak or 'n/a'}), or the async pool's reserved bytes",
            "when the async pool actually trims (at synchronisations the trace does not "
            "record; the model trims at every free, the most it could)"]
    return evidence
