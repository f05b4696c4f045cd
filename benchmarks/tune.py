"""Benchmark: ``allocsim tune``'s time against the replays it stands for (issue 28: a
200-setting search over a 1M-event trace within 200 replays' time).

    python -m benchmarks.tune [--events 1000000] [--framework pytorch] [--headroom 0.04]

Generates the trace once, then, in this one process, in CPU time (wall-clock time on a
shared machine measures the neighbours; both are printed): the whole tune search on a card
(every stage, the explanation and the evidence included), then one full replay of the
setting it answers with and one of the framework's defaults — the floors, measured in the
same run (the least of ``FLOOR_REPEAT`` timings each). Prints the settings searched, the
replays run (fewer where settings share one), and the ratio of tune's time to (settings × one
replay of the answer, a replay that completes): the target is ≤ 1. The card is the trace's
peak live bytes plus ``--headroom`` (tight enough that the defaults' fragmentation matters).
Tune runs twice: with a replay per setting from event 0 to its end, and with shared runs
(settings that differ only in their limit resume from each other's saved states, and a run
that repeats itself has its tail copied: sim/questions/shared_runs.py,
sim/questions/run_repeats.py); both times are printed in replays of the answer (issue 39's
target: 80 settings in under 20), with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from allocsim.sim.kernel.device import DEFAULT_PROFILE, PROFILES
from allocsim.sim.kernel.engine import replay
from allocsim.sim.questions.tune.recommend import tune
from allocsim.sim.questions.tune.search import local_evaluator
from allocsim.sim.questions.tune.space import framework
from allocsim.traces.formats import load
from allocsim.traces.model import Trace
from benchmarks.capacity import shared_runs_made

TARGET = 1.0
FLOOR_REPEAT = 5                # timings of each floor replay; the least is kept


def _trace(kind: str, events: int, seed: int) -> Trace:
    from allocsim.sim.cli.main import main

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.npz"
        main(["gen", kind, f"events={events}", "--seed", str(seed), "-o", str(path)])
        return load(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--kind", default="training")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--framework", default="pytorch")
    parser.add_argument("--headroom", type=float, default=0.04)
    args = parser.parse_args(argv)
    trace = _trace(args.kind, args.events, args.seed)
    peak = trace.peak_live()[0]
    card = PROFILES[DEFAULT_PROFILE]
    device = card.device_with(int(peak * (1 + args.headroom)), card.context_bytes)
    fw = framework(args.framework)
    print(_load(), flush=True)
    started = time.process_time()
    plain = tune(trace, args.framework, device, evaluate=local_evaluator(trace, share=False))
    plain_s = time.process_time() - started
    with shared_runs_made() as made:
        started, wall = time.process_time(), time.perf_counter()
        result = tune(trace, args.framework, device)
        tune_s, tune_wall = time.process_time() - started, time.perf_counter() - wall
    if result.to_json_dict() != plain.to_json_dict():
        raise SystemExit("tune answered differently with shared runs")
    floors = {}
    for name, setting in (("answer", result.best.setting if result.best else fw.default()),
                          ("defaults", fw.default())):
        times = []
        for _ in range(FLOOR_REPEAT):       # the least of a few: one timing moves by ±10%
            started = time.process_time()
            run = replay(trace, fw.spec(setting, device.capacity), device)
            times.append(time.process_time() - started)
        floors[name] = (min(times), run.completed)
    settings = len(result.trials)
    replay_s = floors["answer"][0]
    ratio = tune_s / (settings * replay_s)
    print(f"trace: {args.kind}, {len(trace):,} events, peak live {peak / (1 << 20):,.0f} MiB; "
          f"card {device.capacity / (1 << 20):,.0f} MiB; framework {args.framework}")
    for name, (seconds, completed) in floors.items():
        print(f"one replay of the {name}: {seconds:.2f} s CPU ({len(trace) / seconds:,.0f} "
              f"events/s, {'completes' if completed else 'runs out of memory'})")
    print(f"tune: {tune_s:.1f} s CPU, {tune_wall:.1f} s wall, for {settings} settings, "
          f"{result.replays} replays ({result.shared} shared)")
    print(f"ratio tune / (settings x one replay of the answer) = {ratio:.2f} (target <= "
          f"{TARGET:.1f}); against the defaults' replay "
          f"{tune_s / (settings * floors['defaults'][0]):.2f}; "
          f"replays per setting {result.replays / settings:.2f}")
    resumed = sum(runs.resumed for runs in made)
    copied = sum(runs.repeated_runs for runs in made)
    kept_events = sum(runs.events_resumed for runs in made)
    skipped = kept_events / max(1, kept_events + sum(runs.events_run for runs in made))
    print(f"in replays of the answer: tune {tune_s / replay_s:.1f} with shared runs "
          f"({resumed} of its runs resumed, skipping {skipped:.0%} of their events; "
          f"{copied} repeated themselves and were copied to their end or shared a copied "
          f"one's), {plain_s / replay_s:.1f} with a replay per setting from event 0 to its end "
          f"(target: {settings} settings in under {settings / 4:.0f})")
    print(f"answer: {' ; '.join(result.paste) or 'defaults'} — {result.headline()}")
    print(_load())
    return 0 if ratio <= TARGET else 1


def _load() -> str:
    """The machine's load averages over 1, 5 and 15 minutes."""
    return "load average " + " ".join(f"{value:.2f}" for value in os.getloadavg())


if __name__ == "__main__":
    raise SystemExit(main())
