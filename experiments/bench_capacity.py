"""Benchmark: min-capacity's time per policy, as a multiple of one replay (issue 17, item 3).

    python -m experiments.bench_capacity [--events 1000000] [--kind training] [--policies ...]

Generates the trace once, then per policy times one :func:`replay` on the default device and
:func:`min_capacity` on it, in this one process (CPU time: on a shared machine wall time
counts the neighbours), and prints both, the ratio (target ≤ 4) and the replays the search ran
(``evaluations``); then where min-capacity's time went: its replays that completed and those
that ran out of memory (each stops at its first OOM), and the share of its time spent on the
capacities checked just above the answer. By default every policy and the settings that
change how a policy depends on the capacity (fractions, limits, expandable segments, sync
modes, the JAX presets): a setting whose capacity use is not declared, or that is not
monotone, is where the search costs most, and the default policies alone once hid a 44×.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from allocsim.sim.kernel.device import DEFAULT_PROFILE, PROFILES
from allocsim.sim.kernel.engine import replay
from allocsim.sim.questions.capacity import oracle as capacity_oracle
from allocsim.sim.questions.capacity.minimum import VERIFY_ABOVE, min_capacity
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

        def logged_replay(oracle_self: capacity_oracle.CompletionOracle, capacity: int) -> bool:
            start = time.process_time()
            completed = replay_one(oracle_self, capacity)
            log.append((capacity, completed, time.process_time() - start))
            return completed

        def logged_probe(oracle_self: capacity_oracle.CompletionOracle) -> capacity_oracle.Probe:
            start = time.process_time()
            found = probe(oracle_self)
            log.append((capacity_oracle.PROBE_CAPACITY, found.completed,
                        time.process_time() - start))
            return found

        oracle._replay = logged_replay                          # type: ignore[method-assign]
        oracle._probe = logged_probe                            # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        oracle = capacity_oracle.CompletionOracle
        oracle._replay, oracle._probe = self._saved             # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--kind", default="training")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", nargs="+", default=SETTINGS)
    args = parser.parse_args(argv)
    trace = _trace(args.kind, args.events, args.seed)
    device = PROFILES[DEFAULT_PROFILE]
    width = max(len("policy"), *map(len, args.policies)) + 2
    print(f"{'policy':<{width}}{'replay s':>10}{'min-cap s':>11}{'ratio':>8}{'runs':>6}"
          f"{'passed':>8}{'failed':>8}{'checks above':>14}  answer")
    worst = 0.0
    for policy in args.policies:
        start = time.process_time()
        replay(trace, policy, device)
        one = time.process_time() - start
        with _ReplayLog() as log:
            start = time.process_time()
            answer = min_capacity(trace, policy, device)
            search = time.process_time() - start
        ratio = search / one if one else float("inf")
        worst = max(worst, ratio)
        above = set()
        if answer.min_capacity is not None:
            above = {answer.min_capacity + step * answer.resolution
                     for step in range(1, VERIFY_ABOVE + 1)}
        passed = sum(1 for _, completed, _ in log.replays if completed)
        checks = sum(seconds for capacity, _, seconds in log.replays if capacity in above)
        share = f"{checks / search:.0%}" if search else "-"
        print(f"{policy:<{width}}{one:>10.2f}{search:>11.2f}{ratio:>8.2f}{answer.evaluations:>6}"
              f"{passed:>8}{len(log.replays) - passed:>8}{share:>14}  "
              f"{answer.min_capacity} monotone={answer.monotone}", flush=True)
    print(f"worst ratio {worst:.2f} (target ≤ {TARGET:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
