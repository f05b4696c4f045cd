"""Benchmark: min-capacity's time per policy, as a multiple of one replay (issue 17, item 3;
issue 39, part 2).

    python -m benchmarks.capacity [--events 1000000] [--kind transformer training]
                                  [--policies ...] [--repeat 3]

Generates each trace once, then per policy times one :func:`replay` on the default device and
the search two ways, each the least of ``--repeat`` timings taken in turn (the replay, then each
search, ``--repeat`` times), in this one process (CPU time: on a shared machine wall time counts
the neighbours, and CPU time still varies ±15% under load):
*plain*, every probe replayed from event 0, and *shared*, each probe resumed from the latest
saved state of an earlier run it shares (sim/questions/shared_runs.py, what
:func:`min_capacity` does). It prints both as multiples of the replay (target ≤ 4), the replays
the search ran (``evaluations``, the same for both), the shared search again as a multiple of
one replay on a card of the answer's size (``× at answer``: near its limit a policy may work
harder per event than on the roomy default card — a pool that trims and maps again near its
threshold — so the unit moves, and both are shown), how many of the shared search's probes
resumed and the share of all its probes' events that resumes skipped, how many of its probes
in the core stopped once they repeated themselves (a repeating trace:
sim/questions/run_repeats.py; both searches stop so), its replays that completed and those
that ran out of memory (each stops at its first), and the share of its
time spent on the capacities checked just above the answer; the two searches' answers must
agree. The machine's load (os.getloadavg) is printed at the start and the end. By default
every policy and the settings that change how a policy depends on the capacity (fractions,
limits, expandable segments, sync modes, the JAX presets): a setting whose capacity use is not
declared, or that is not monotone, is where the search costs most, and the default policies
alone once hid a 44×.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from allocsim.sim.kernel.device import DEFAULT_PROFILE, PROFILES, DeviceProfile
from allocsim.sim.kernel.engine import replay
from allocsim.sim.questions.capacity import minimum as capacity
from allocsim.sim.questions.capacity import oracle as capacity_oracle
from allocsim.sim.questions.capacity.minimum import VERIFY_ABOVE, CapacityAnswer, MiB
from allocsim.sim.questions.shared_runs import SharedRuns
from allocsim.traces.formats import load
from allocsim.traces.model import Trace

TARGET = 4.0

SETTINGS = [
    "on-demand", "preallocate", "preallocate:fraction=0.3", "best-fit", "bfc",
    "bfc:allow_growth=false", "bfc:garbage_collection=true", "pytorch",
    "pytorch:expandable_segments=true", "pytorch:per_process_memory_fraction=0.9",
    "pytorch:per_process_memory_fraction=0.9,garbage_collection_threshold=0.5",
    "pytorch:max_split_size_mb=64", "cupy", "cupy:fraction=0.5", "cuda-async",
    "cuda-async:fraction=0.75", "cuda-async:sync=none", "buddy", "jax", "jax:preallocate=false",
    "jax:allocator=cuda_async", "jax:allocator=platform",
]


def _trace(kind: str, events: int, seed: int) -> Trace:
    from allocsim.sim.cli.main import main

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.npz"
        main(["gen", kind, f"events={events}", "--seed", str(seed), "-o", str(path)])
        return load(path)


class _ReplayLog:
    """While open, notes each replay the oracle runs, in the core or in Python: (capacity,
    completed, CPU seconds). The generous first replay is noted too."""

    def __enter__(self) -> _ReplayLog:
        self.replays: list[tuple[int, bool, float]] = []
        oracle = capacity_oracle.CompletionOracle
        self._saved = (oracle._replay, oracle._probe)
        replay_one, probe = self._saved
        log = self.replays

        # The oracle's own methods, timed: ``self`` is the oracle here, as in the methods.
        def logged_replay(self: capacity_oracle.CompletionOracle, capacity: int) -> bool:
            start = time.process_time()
            completed = replay_one(self, capacity)
            log.append((capacity, completed, time.process_time() - start))
            return completed

        def logged_probe(self: capacity_oracle.CompletionOracle) -> capacity_oracle.Probe:
            start = time.process_time()
            found = probe(self)
            log.append((capacity_oracle.PROBE_CAPACITY, found.completed,
                        time.process_time() - start))
            return found

        oracle._replay = logged_replay                          # type: ignore[method-assign]
        oracle._probe = logged_probe                            # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        oracle = capacity_oracle.CompletionOracle
        oracle._replay, oracle._probe = self._saved             # type: ignore[method-assign]


def _load() -> str:
    """The machine's load averages over 1, 5 and 15 minutes."""
    return "load average " + " ".join(f"{value:.2f}" for value in os.getloadavg())


def _replay_seconds(trace: Trace, policy: str, device: DeviceProfile) -> float:
    start = time.process_time()
    replay(trace, policy, device)
    return time.process_time() - start


def _search(trace: Trace, policy: str, device: DeviceProfile, *, share: bool
            ) -> tuple[CapacityAnswer, float, list[tuple[int, bool, float]], list[SharedRuns]]:
    """One search, its CPU seconds, its replays (capacity, completed, seconds) and the shared
    runs behind them."""
    with shared_runs_made() as made, _ReplayLog() as log:
        start = time.process_time()
        answer = capacity._min_capacity(trace, policy, device, MiB, shortcuts=True, share=share)
        seconds = time.process_time() - start
    return answer, seconds, log.replays, made


@contextmanager
def shared_runs_made() -> Iterator[list[SharedRuns]]:
    """Every :class:`SharedRuns` made inside the block, in a list (what a search shared)."""
    made: list[SharedRuns] = []
    init = SharedRuns.__init__

    def kept(runs: SharedRuns, *args: Any, **kwargs: Any) -> None:
        init(runs, *args, **kwargs)
        made.append(runs)

    SharedRuns.__init__ = kept                                  # type: ignore[method-assign,assignment]
    try:
        yield made
    finally:
        SharedRuns.__init__ = init                              # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--kind", nargs="+", default=["transformer", "training"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", nargs="+", default=SETTINGS)
    parser.add_argument("--repeat", type=int, default=3,
                        help="times each is timed, the least kept (default 3)")
    args = parser.parse_args(argv)
    device = PROFILES[DEFAULT_PROFILE]
    print(_load(), flush=True)
    width = max(len("policy"), *map(len, args.policies)) + 2
    worst = 0.0
    for kind in args.kind:
        trace = _trace(kind, args.events, args.seed)
        print(f"\n{kind}, {len(trace):,} events")
        print(f"{'policy':<{width}}{'replay s':>9}{'plain ×':>9}{'shared ×':>10}"
              f"{'× at answer':>13}{'runs':>6}"
              f"{'resumed':>9}{'skipped':>9}{'repeated':>10}{'passed':>8}{'failed':>8}"
              f"{'checks above':>14}  answer")
        for policy in args.policies:
            # The replay and the two searches in turn, each repetition: a neighbour's load
            # that comes and goes weighs on all three alike, not on one of them.
            ones, plains, shareds = [], [], []
            for _ in range(args.repeat):
                ones.append(_replay_seconds(trace, policy, device))
                plains.append(_search(trace, policy, device, share=False))
                shareds.append(_search(trace, policy, device, share=True))
            one = min(ones)
            plain, plain_s, _, _ = min(plains, key=lambda r: r[1])
            answer, search, replays, made = min(shareds, key=lambda r: r[1])
            if answer.to_json_dict() != plain.to_json_dict():
                raise SystemExit(f"{kind} {policy}: the shared search answered differently")
            ratio = search / one if one else float("inf")
            worst = max(worst, ratio)
            at_answer, above = "-", set()
            if answer.min_capacity is not None:
                card = device.device_with(answer.min_capacity, device.context_bytes)
                tight = min(_replay_seconds(trace, policy, card) for _ in range(args.repeat))
                at_answer = f"{search / tight:.2f}" if tight else "-"
                above = {answer.min_capacity + step * answer.resolution
                         for step in range(1, VERIFY_ABOVE + 1)}
            passed = sum(1 for _, completed, _ in replays if completed)
            checks = sum(seconds for capacity, _, seconds in replays if capacity in above)
            share = f"{checks / search:.0%}" if search else "-"
            resumed = sum(runs.resumed for runs in made)
            kept = sum(runs.events_resumed for runs in made)
            run_events = sum(runs.events_run for runs in made)
            skipped = f"{kept / (kept + run_events):.0%}" if kept + run_events else "-"
            repeated = sum(runs.repeat_stops for runs in made)
            print(f"{policy:<{width}}{one:>9.3f}{plain_s / one:>9.2f}{ratio:>10.2f}"
                  f"{at_answer:>13}{answer.evaluations:>6}{resumed:>9}{skipped:>9}"
                  f"{repeated:>10}{passed:>8}"
                  f"{len(replays) - passed:>8}{share:>14}  "
                  f"{answer.min_capacity} monotone={answer.monotone}", flush=True)
    print(f"\nworst shared ratio {worst:.2f} (target ≤ {TARGET:g})")
    print(_load())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
