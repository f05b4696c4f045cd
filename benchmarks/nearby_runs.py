"""Benchmark: how far min-capacity's checks above the answer follow the answer's own run
(issue 39, part 2, on a trace that does not repeat).

    python -m benchmarks.nearby_runs [--events 1000000] [--kind transformer]
                                     [--policies bfc ...] [--above 1 2 4 8] [--every 512]

min-capacity checks the capacities 1–8 resolution steps above its answer, each a replay that
completes, and on the 1M-event transformer trace those checks are most of a search's time.
A run one step above differs from the answer's first where a decision reads the capacity
(BFC's last Extend, clipped to the limit); a run there can be shared with the answer's only
where it comes back to the answer's state and stays. This measures that, for policies whose
decision rows are by address (sim/questions/run_repeats.py): it finds the answer, then runs
the answer and each capacity above it side by side in the core and, every ``--every``
events, compares their rows and live buffers. Two states count as *the same but the last
chunk* where every row is equal but the highest-addressed one, which may differ in size only
— for BFC's family the last region's last chunk, the one place a larger limit shows when the
regions are otherwise alike (sim/questions/capacity/regions.py's argument). It prints, per
capacity above, the share of checkpoints at which the two runs hold the same state but the last
chunk, and the stretches of checkpoints at which they do not (how many, and the longest).

With ``--forks`` (BFC's family, whose capacity use is ``bfc-regions``), also how often a run
above would have to leave the answer's: the Python twin's run at the answer, its region watch
(sim/questions/capacity/regions.py) noting each best-fit search's own interval of ``d`` (the
last region ``d`` bytes larger) that keeps that one decision, and, per capacity above, the
searches after the last Extend whose interval excludes its ``d``: the most times a run that
follows the answer's would have to fork from it; and the ``--segment``-event stretches of the
trace (4,096 by default) that hold at least one of them: a fork-and-join that saves the
answer's state at each stretch's start forks at least once per such stretch and replays at
least that stretch, so their count times the stretch is a floor on the events it replays.

Addresses are absolute: where the region whose size follows the capacity is not the last
(preallocate and JAX's default preallocate one region of a fraction of the card, then grow),
every later region lies elsewhere above the answer and the runs compare as different from
there on, however alike their decisions; this measure does not see through that.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from allocsim.policies import Policy, parse_policy
from allocsim.policies.base import CAPACITY_BFC_REGIONS, capacity_use_of
from allocsim.sim.kernel.device import DEFAULT_PROFILE, PROFILES, DeviceProfile, SimulatedDevice
from allocsim.sim.kernel.engine import ProcessReplay
from allocsim.sim.kernel.native import open_run
from allocsim.sim.questions.capacity.minimum import MiB, min_capacity
from allocsim.sim.questions.capacity.regions import RegionWatch
from allocsim.sim.questions.run_repeats import CoreMoment, core_moment
from allocsim.traces.model import OP_ALLOC, Trace
from benchmarks.capacity import _trace


def capacity_use_of_spec(policy: str) -> str:
    """The capacity use a setting declares (policies/base.py)."""
    resolved = parse_policy(policy).resolved()
    return capacity_use_of(resolved.policy_class, dict(resolved.params))


SETTINGS = ["bfc", "bfc:allow_growth=false", "bfc:garbage_collection=true",
            "jax:preallocate=false", "preallocate", "jax"]


def same_but_the_last_chunk(answer: CoreMoment, above: CoreMoment) -> bool:
    """Whether two runs' states are alike but for the size of the highest-addressed chunk: the
    same rows (address, size, in use, ...) but that one's size, and every live buffer at the
    same address."""
    if answer.rows.shape != above.rows.shape or answer.live != above.live:
        return False
    differ = np.flatnonzero((answer.rows != above.rows).any(axis=1))
    if len(differ) == 0:
        return True
    if len(differ) > 1 or differ[0] != len(answer.rows) - 1:
        return False
    columns = np.flatnonzero(answer.rows[differ[0]] != above.rows[differ[0]])
    return columns.tolist() == [1]


@dataclass(frozen=True)
class Nearby:
    """One capacity above the answer, against the answer's run."""

    above: int                  # resolution steps above the answer
    checkpoints: int
    alike: int                  # checkpoints at which the states were the same but the last chunk
    stretches: int              # runs of checkpoints at which they were not
    longest: int                # the longest of those, in checkpoints


def nearby(trace: Trace, policy: str, device: DeviceProfile, answer: int, steps: list[int], *,
           resolution: int = MiB, every: int = 512) -> list[Nearby]:
    """The answer's run against the run ``step`` resolutions above it, for each step: both in
    the core, side by side, compared every ``every`` events until either stops."""
    spec = parse_policy(policy)
    found = []
    for step in steps:
        runs = []
        for capacity in (answer, answer + step * resolution):
            run = open_run(trace, spec, device.device_with(capacity, device.context_bytes),
                           stop_on_oom=True, timeline_points=1000)
            if run is None:
                raise SystemExit(f"{policy}: the core does not take this run")
            runs.append(run)
        alike = checkpoints = 0
        stretches: list[int] = []
        current = 0
        for end in range(every, runs[0].n + 1, every):
            for run in runs:
                run.advance(end)
            if runs[0].stopped or runs[1].stopped:
                break
            moments = [core_moment(run) for run in runs]
            if moments[0] is None or moments[1] is None:
                raise SystemExit(f"{policy}: the core shows no decision rows for it")
            checkpoints += 1
            if same_but_the_last_chunk(moments[0], moments[1]):
                alike += 1
                if current:
                    stretches.append(current)
                current = 0
            else:
                current += 1
        if current:
            stretches.append(current)
        found.append(Nearby(step, checkpoints, alike, len(stretches), max(stretches, default=0)))
    return found


class _Decisions(RegionWatch):
    """The region watch, noting each search's own interval of ``d`` with the Extends made
    before it and the mallocs asked so far (the search serves the last of them)."""

    def __init__(self, policy: Policy, device: SimulatedDevice) -> None:
        super().__init__(policy, device)
        self.intervals: list[tuple[int, int, int, int]] = []    # (extends, mallocs, lo, hi)
        self.mallocs = 0
        malloc = policy.malloc

        def counted(*args: Any, **kwargs: Any) -> int | None:
            self.mallocs += 1
            return malloc(*args, **kwargs)

        policy.malloc = counted                             # type: ignore[method-assign]

    def decision_interval(self, rounded: int, key: int) -> tuple[int, int] | None:
        kept = super().decision_interval(rounded, key)      # asked once per watched search
        if kept is not None:
            self.intervals.append((len(self.extends), self.mallocs, *kept))
        return kept


@dataclass(frozen=True)
class Forks:
    """Per step above the answer: the searches after the last Extend whose interval excludes
    its ``d``, and the stretches of ``segment`` events holding one or more of them."""

    watched: int
    excluding: list[int]
    segments: list[int]


def forks(trace: Trace, policy: str, device: DeviceProfile, answer: int, steps: list[int], *,
          resolution: int = MiB, segment: int = 4096) -> Forks:
    """The searches after the last Extend of the Python run at ``answer`` that the watch saw
    (the last chunk free), and per step above how many of them exclude its ``d`` and in how
    many ``segment``-event stretches of the trace they lie (the run completes, so its k-th
    malloc is the trace's k-th allocation)."""
    simulated = SimulatedDevice(device.device_with(answer, device.context_bytes))
    run = ProcessReplay(trace, parse_policy(policy), simulated, stop_on_oom=True,
                        call_log=False)
    watch = _Decisions(run.policy, simulated)
    run.advance(run.n)
    allocations = np.flatnonzero(np.asarray(trace.op) == OP_ALLOC)
    if watch.mallocs != len(allocations):       # each malloc must name its allocation
        raise SystemExit(f"{policy}: {watch.mallocs:,} mallocs for {len(allocations):,} "
                         "allocations; the stretches cannot be placed")
    after = [(int(allocations[mallocs - 1]), lo, hi)
             for extends, mallocs, lo, hi in watch.intervals if extends == len(watch.extends)]
    excluding, segments = [], []
    for step in steps:
        at = [event for event, lo, hi in after if not lo <= step * resolution <= hi]
        excluding.append(len(at))
        segments.append(len({event // segment for event in at}))
    return Forks(len(after), excluding, segments)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--kind", default="transformer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", nargs="+", default=SETTINGS)
    parser.add_argument("--above", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--every", type=int, default=512)
    parser.add_argument("--forks", action="store_true",
                        help="also count the searches whose interval excludes each d")
    parser.add_argument("--segment", type=int, default=4096,
                        help="--forks: also count the stretches of this many events "
                             "holding such a search")
    args = parser.parse_args(argv)
    print("load average", *(f"{x:.2f}" for x in os.getloadavg()))
    trace = _trace(args.kind, args.events, args.seed)
    device = PROFILES[DEFAULT_PROFILE]
    print(f"{args.kind}, {len(trace):,} events, on {device.name}; checkpoints every "
          f"{args.every} events")
    print(f"{'policy':<28} {'answer':>14} {'above':>6} {'alike':>8} {'stretches':>10} "
          f"{'longest':>8}")
    answers = {}
    for policy in args.policies:
        answer = answers[policy] = min_capacity(trace, policy, device).min_capacity
        if answer is None:
            print(f"{policy:<28} {'none':>14}")
            continue
        for row in nearby(trace, policy, device, answer, args.above, every=args.every):
            share = row.alike / row.checkpoints if row.checkpoints else 0.0
            print(f"{policy:<28} {answer:>14,} {f'+{row.above}':>6} {share:>8.1%} "
                  f"{row.stretches:>10} {row.longest:>8}")
    if args.forks:
        print("\nsearches after the last Extend (the last chunk free) whose interval excludes "
              f"d, and (in brackets) the {args.segment}-event stretches holding them:")
        print(f"{'policy':<28} {'searches':>10} "
              + " ".join(f"{f'+{s}':>15}" for s in args.above))
        for policy, answer in answers.items():
            if answer is None or capacity_use_of_spec(policy) != CAPACITY_BFC_REGIONS:
                continue
            found = forks(trace, policy, device, answer, args.above, segment=args.segment)
            print(f"{policy:<28} {found.watched:>10,} " + " ".join(
                f"{f'{n:,} ({k:,})':>15}" for n, k in zip(found.excluding, found.segments,
                                                          strict=True)))
    print("load average", *(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
