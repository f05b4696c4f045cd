"""One member of a population, named and measured on its own (issue 40: populations regenerate
in a process pool, each member in whichever worker takes it).

A :class:`MemberSource` says where a member's trace comes from — a generator and its seed, a
compiled job's file, a recording — in a few picklable fields, so a worker makes the trace
itself instead of receiving it. :func:`measure_member` is everything the population measures
on one member (each policy's minimum capacity with its monotonicity record, peak reserved,
the winner across costs and budgets, the versions a compiled job or recording came from) and
depends on nothing but its arguments: the row it returns is the same in any process and in
any order, which is what lets
:func:`experiments.preallocate_vs_grow.population.measure` hand members to a pool and still
write population.json byte for byte as a serial run does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.sim.kernel.device import DeviceProfile, resolve_device
from allocsim.sim.questions.capacity.minimum import CapacityAnswer, min_capacity
from allocsim.sim.questions.capacity.oracle import CompletionOracle
from allocsim.sim.questions.compare import compare, normalize_spec
from allocsim.traces import formats, synth
from allocsim.traces.model import Trace
from experiments.runner.execute import ROOT, resolution, winners_across
from experiments.runner.versions import versions_of

JOBS = ROOT / "experiments" / "data" / "xla-gpu"
XLA_PLAN = "xla-plan"   # pseudo-policy: XLA's own buffer assignment (buffers-view members)


@dataclass(frozen=True)
class MemberSource:
    """Where one member's trace comes from: ``generate`` (a generator, its ``params`` and
    ``seed``) or ``path`` (a compiled job or a recording, relative to the repository)."""

    member: str
    device: str
    generate: str | None = None
    params: tuple[tuple[str, Any], ...] = ()
    seed: int = 0
    path: str | None = None

    def load(self) -> Trace:
        if self.generate is not None:
            return synth.generate(self.generate, seed=self.seed, **dict(self.params))
        assert self.path is not None
        return formats.load(ROOT / self.path)


def jobs_index() -> dict[str, Any]:
    path = JOBS / "index.json"
    return json.loads(path.read_text()) if path.exists() else {}


def sources(family: dict[str, Any], device: str) -> list[MemberSource]:
    """The members of a family, in a fixed order, without making any trace."""
    out = []
    if "generate" in family:
        params = tuple(sorted(family.get("params", {}).items()))
        for seed in range(int(family.get("seeds", 10))):
            out.append(MemberSource(f"seed {seed}", device, generate=family["generate"],
                                    params=params, seed=seed))
    elif "jobs" in family:
        wanted, where = set(family["jobs"]), family.get("where", {})
        suffix = ".buffers.npz" if family.get("view") == "buffers" else ".npz"
        for name, job in jobs_index().items():
            path = JOBS / f"{name}{suffix}"
            if (wanted & set(job["tags"]) and path.exists()
                    and all(job.get(k) == v for k, v in where.items())):
                out.append(MemberSource(name, job["target"],
                                        path=path.relative_to(ROOT).as_posix()))
    else:
        for file in family["files"]:
            if (ROOT / file).exists():
                out.append(MemberSource(Path(file).stem, device, path=file))
    return out


def fingerprint(trace: Trace) -> str:
    """What makes a member distinct: a hash of the trace's ops, ids, sizes, streams and
    processes, leaving out its times (a seed that moves only the times is not a new member)."""
    digest = hashlib.sha256()
    for column in (trace.op, trace.id, trace.size, trace.stream, trace.process):
        digest.update(np.ascontiguousarray(column).astype(np.int64).tobytes())
    return digest.hexdigest()[:16]


GRID = 0.01          # the monotonicity scan's step, a fraction of peak live ...
GRID_POINTS = 100    # ... and how many steps above the answer it checks (to +100% over it)


def grid_failures(trace: Trace, policy: str, device: DeviceProfile,
                  answer: CapacityAnswer) -> list[int]:
    """The capacities on a grid of :data:`GRID` × peak live above the answer (up to
    :data:`GRID_POINTS` steps) at which the policy does not complete. The search verifies
    only a few resolution steps above its answer: a policy that completes at +10% and fails
    again at +12% to +78% (``jax:fraction=1.0`` on the jitted generated transformer) passes
    that check, and only a scan this wide shows it. The offline plan is not scanned: it is
    no online policy, and every capacity above its plan's size holds it."""
    spec = normalize_spec(policy)
    if answer.min_capacity is None or isinstance(spec, str):   # str: the offline plan's name
        return []
    step = max(answer.resolution,
               -(-int(answer.lower_bound * GRID) // answer.resolution) * answer.resolution)
    # Every capacity asked is a multiple of the resolution, each once: a run saves only the
    # states a run at another could resume from.
    oracle = CompletionOracle(trace, spec, device, grid=answer.resolution)
    return [capacity for k in range(1, GRID_POINTS + 1)
            if not oracle.completes(capacity := answer.min_capacity + k * step)]


def capacity_record(answer: CapacityAnswer, scanned: Sequence[int] = ()) -> dict[str, Any]:
    """The confidence in one minimum capacity: the ``monotone`` flag (false where the search's
    own check or the grid scan, ``scanned``, found a failure above the answer), the failures
    above it, the exceptions, and the range of capacities over which the answer is uncertain —
    from the smallest that completes to the one from which every capacity tried completed
    (one value twice where the policy is monotone)."""
    failures = sorted({*answer.failed_above, *scanned})
    high = answer.completes_from
    if high is not None and failures:
        high = max(high, failures[-1] + answer.resolution)
    return {"monotone": answer.monotone and not failures, "failures": failures,
            "exceptions": list(answer.exceptions), "range": [answer.min_capacity, high]}


def xla_plan(trace: Trace, step: int) -> int | None:
    """XLA's own compile-time assignment of the step (the module's allocations: arguments,
    temp, outputs not aliased), for a member in the ``buffers`` view; None otherwise."""
    total = trace.metadata.get("xla", {}).get("total_bytes")
    return None if total is None else -(-int(total) // step) * step


@dataclass(frozen=True)
class MemberTask:
    """What to measure on one member: the policies, whether to measure peak reserved, the
    sensitivity grid (cost scales, budgets) where the definition has one, and whether the
    member's times are measured (a recording: only then is a winner a finding)."""

    source: MemberSource
    policies: tuple[str, ...]
    reserved: bool
    grid: tuple[tuple[float, ...], tuple[float, ...]] | None
    recorded: bool


def measure_member(task: MemberTask) -> dict[str, Any]:
    """The population's row for one member: a pure function of ``task``."""
    trace = task.source.load()
    policies = list(task.policies)
    # The context (a constant per card, the same for every policy) is left out, so that every
    # policy's answer, the offline plan's included, is the allocator's need.
    device = replace(resolve_device(task.source.device, None), context_bytes=0)
    step = resolution("auto", trace)
    row: dict[str, Any] = {"member": task.source.member, "device": device.label,
                           "peak_live": int(trace.peak_live()[0]),
                           "resolution": step, "events": len(trace),
                           "fingerprint": fingerprint(trace),
                           "min_capacity": {}, "capacity": {}, "peak_reserved": {}}
    versions = versions_of(Path(task.source.path), ROOT) if task.source.path else None
    if versions:
        row["versions"] = versions     # the compiler of a compiled job or recording
    for policy in policies:
        if policy == XLA_PLAN:
            row["min_capacity"][policy] = xla_plan(trace, step)
            continue
        answer = min_capacity(trace, policy, device, resolution=step)
        row["min_capacity"][policy] = answer.min_capacity
        row["capacity"][policy] = capacity_record(
            answer, grid_failures(trace, policy, device, answer))
    grid = ([list(task.grid[0]), list(task.grid[1])] if task.grid else None)
    measured_times = task.recorded and not trace.metadata.get("synthetic_times")
    if task.reserved or (grid and measured_times):
        comparison = compare(trace, [p for p in policies if p != XLA_PLAN], device)
        row["peak_reserved"] = {r.policy: r.peak_reserved for r in comparison.results}
        if grid and measured_times:
            trace.metadata["name"] = task.source.member
            row["winners"] = winners_across(trace, policies, device,
                                            (grid[0], grid[1]),
                                            comparison.results)["winners"]
    return row
