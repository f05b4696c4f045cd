"""Benchmark: replay speed (events/second) and memory per event of every policy.

    python -m benchmarks.replay [--events 1000000] [--kind training] [--policies ...]
    python -m benchmarks.replay --memory      # bytes/event, one subprocess per policy
    python -m benchmarks.replay --memory --events 10000000     # issue 17's 10M events
    python -m benchmarks.replay --memory --trace t10m.npz      # or a saved trace

Speed (the default, issue 17): generates the trace once and, in this one process, times the
floor — a bare Python dict loop over the same events (alloc: ``d[id] = size``, running sum,
peak; free: ``pop``) — and every policy's :func:`replay`, loading excluded. Each policy's runs
alternate with runs of the floor, ``--repeat`` (3) of each, and its ratio is its fastest run
to the fastest floor beside it: a machine whose speed drifts during the benchmark (a shared
one) moves both alike. Each policy is printed with its events/s and that ratio (target:
within 13× of the floor, ≈ 1M events/s). ``pytorch`` is also set against DynaPipe's
pure-Python model of the same allocator: with ``--dynapipe PATH`` (its
``allocation_simulator.py``; benchmarks/dynapipe.py says where from) that model is timed here,
beside the floor like a policy, and the ratio is measured; without it, the ratio is the
estimate at equal floors (it ran at 0.31–0.33M events/s where this floor was 13.5M, ≈
floor/42), printed as an estimate (issue 17's target 2: ≥ 2.5×).

Memory (``--memory``): replays the saved trace through each policy in a fresh subprocess
(one core; a clean heap so peak RSS belongs to that replay alone). Memory per event is
(peak RSS while replaying − RSS after imports) / events: the trace's columns plus everything
the replay holds at its worst (the engine's per-chunk lists, the policy's state, the timeline's
buckets and temporaries; a replay to the end keeps no device-call log). The peak is reset
after loading (Linux clear_refs) so the loader's own transient memory is reported apart, as
``load bytes/event``. Targets (issue 2):
≥ 500,000 events/s and < 100 bytes/event for every policy on one core of the CI machine;
issue 17.4: ≤ 40 bytes/event at 10,000,000 events (``trace bytes/event`` is what the loaded
trace's columns hold: packed, ~18 for a training trace, see allocsim.traces.model). With
``--trace`` the file is replayed as it is (``allocsim gen training events=10000000 -o F``);
without, a trace of ``--events`` events is generated and saved first.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from allocsim.atomic_files import write_text
from allocsim.traces.model import OP_ALLOC

if TYPE_CHECKING:
    from allocsim.traces.model import Trace

DEFAULT_POLICIES = ("on-demand", "preallocate", "best-fit", "bfc")
SPEED_POLICIES = ("on-demand", "preallocate", "best-fit", "bfc", "pytorch",
                  "pytorch:expandable_segments=true", "cupy", "cuda-async",
                  "cuda-async:fraction=0.75", "buddy")
FLOOR_RATIO_TARGET = 13.0
DYNAPIPE_FLOOR_RATIO = 42.0     # DynaPipe's PyTorch-allocator simulator: floor / 42 (docstring)
DYNAPIPE_TARGET = 2.5           # pytorch's target against it, at equal floors


def _rss_bytes() -> int:
    """Current resident set size (Linux /proc), in bytes."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize()


def _peak_rss_bytes() -> int:
    """Peak resident set size since the last reset (VmHWM), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


def measure_one(policy: str, path: str, device: str) -> dict:
    """Load the trace and replay it through ``policy`` (run in a subprocess). A policy written
    ``simpy:SPEC`` goes through the simpy engine as a one-process shared run instead of the
    plain loop, to measure what the event scheduler costs."""
    from allocsim.sim.kernel.device import resolve_device
    from allocsim.sim.kernel.engine import SharedProcess, replay, run_shared
    from allocsim.traces import formats

    through_simpy = policy.startswith("simpy:")
    spec = policy.removeprefix("simpy:")

    profile = resolve_device(device)
    gc.collect()
    baseline = _rss_bytes()
    trace = formats.load(path)
    load_peak = _peak_rss_bytes()
    gc.collect()
    _reset_peak_rss()
    start = time.perf_counter()
    if through_simpy:
        result = run_shared([SharedProcess(trace, spec)], profile).results[0]
    else:
        result = replay(trace, spec, profile)
    elapsed = time.perf_counter() - start
    peak_rss = _peak_rss_bytes()
    return {
        "policy": policy, "events": len(trace), "seconds": elapsed,
        "events_per_s": len(trace) / elapsed,
        "bytes_per_event": (peak_rss - baseline) / len(trace),
        "load_bytes_per_event": (load_peak - baseline) / len(trace),
        "trace_bytes_per_event": trace.nbytes / len(trace),
        "peak_reserved": result.peak_reserved, "completed": result.completed,
    }


def dict_floor(ops: list[int], ids: list[int], sizes: list[int]) -> int:
    """The floor: what a bare Python loop over the events costs (the peak of live bytes)."""
    live: dict[int, int] = {}
    total = peak = 0
    for op, buffer, size in zip(ops, ids, sizes):
        if op == OP_ALLOC:
            live[buffer] = size
            total += size
            if total > peak:
                peak = total
        else:
            total -= live.pop(buffer, 0)
    return peak


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """The fastest of ``repeat`` runs of ``run``, in seconds (garbage collected before each)."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def best_beside(repeat: int, floor: Callable[[], object],
                run: Callable[[], object]) -> tuple[float, float]:
    """The fastest of ``repeat`` runs of ``floor`` and of ``run``, alternating (floor, run,
    floor, run, ...), in seconds: each measured under the same conditions as the other."""
    floor_s = run_s = float("inf")
    for _ in range(repeat):
        floor_s = min(floor_s, best_of(1, floor))
        run_s = min(run_s, best_of(1, run))
    return floor_s, run_s


def measure_speed(trace: Trace, policies: list[str], device: str, repeat: int,
                  dynapipe: str | None = None) -> list[dict]:
    """The floor and every policy's replay of ``trace`` side by side in this process, each the
    best of ``repeat`` and each policy's runs alternating with the floor's (its ratio is to
    that floor), and DynaPipe's simulator likewise where its file is given; prints one line
    each as it goes."""
    from allocsim.sim.kernel.device import resolve_device
    from allocsim.sim.kernel.engine import SharedProcess, replay, run_shared

    profile = resolve_device(device)
    n = len(trace)
    ops, ids = trace.op.tolist(), trace.id.tolist()
    sizes = trace.matched_sizes().tolist()
    def floor_run() -> object:
        return dict_floor(ops, ids, sizes)

    floor_s = best_of(repeat, floor_run)
    floor = n / floor_s
    print(f"{'policy':34s} {'events/s':>12s} {'floor ×':>8s} {'seconds':>8s} "
          f"{'floor beside':>13s}")
    print(f"{'dict loop (floor)':34s} {floor:12,.0f} {1.0:8.1f} {floor_s:8.3f}")
    rows = [{"policy": "floor", "events": n, "seconds": floor_s, "events_per_s": floor,
             "floor_ratio": 1.0}]
    dynapipe_s: float | None = None
    if dynapipe is not None:
        from benchmarks.dynapipe import dynapipe_runner, load_simulator

        beside_s, dynapipe_s = best_beside(repeat, floor_run,
                                           dynapipe_runner(trace, load_simulator(dynapipe)))
        rows.append({"policy": "DynaPipe's simulator", "events": n, "seconds": dynapipe_s,
                     "events_per_s": n / dynapipe_s, "floor_ratio": dynapipe_s / beside_s,
                     "floor_events_per_s": n / beside_s})
        print(f"{'DynaPipe (measured)':34s} {n / dynapipe_s:12,.0f} "
              f"{dynapipe_s / beside_s:8.1f} {dynapipe_s:8.3f} {n / beside_s:13,.0f}")
    for policy in policies:
        spec = policy.removeprefix("simpy:")
        if policy.startswith("simpy:"):
            def run(spec: str = spec) -> object:
                return run_shared([SharedProcess(trace, spec)], profile)
        else:
            def run(spec: str = spec) -> object:
                return replay(trace, spec, profile)
        beside_s, seconds = best_beside(repeat, floor_run, run)
        ratio = seconds / beside_s
        rows.append({"policy": policy, "events": n, "seconds": seconds,
                     "events_per_s": n / seconds, "floor_ratio": ratio,
                     "floor_events_per_s": n / beside_s})
        mark = "" if ratio <= FLOOR_RATIO_TARGET else "   (over the 13× target)"
        if policy == "pytorch" and dynapipe_s is not None:
            rows[-1]["dynapipe_x"] = dynapipe_s / seconds
            mark += (f"   ({dynapipe_s / seconds:.2f}× DynaPipe's simulator, measured; "
                     f"target {DYNAPIPE_TARGET}×)")
        elif policy == "pytorch":
            rows[-1]["dynapipe_x_estimated"] = DYNAPIPE_FLOOR_RATIO / ratio
            mark += (f"   ({DYNAPIPE_FLOOR_RATIO / ratio:.2f}× DynaPipe at equal floors, "
                     f"estimated; target {DYNAPIPE_TARGET}×)")
        print(f"{policy:34s} {n / seconds:12,.0f} {ratio:8.1f} {seconds:8.3f} "
              f"{n / beside_s:13,.0f}{mark}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--kind", default="training")
    parser.add_argument("--device", default="a100-80g")
    parser.add_argument("--policies", nargs="+",
                        help="policy specs; simpy:SPEC replays through the simpy engine "
                             "(default: every policy for speed, four and simpy:bfc for memory)")
    parser.add_argument("--repeat", type=int, default=3, help="speed: best of this many runs")
    parser.add_argument("--trace", help="replay this trace file instead of generating one "
                                        "(the same input for runs of two checkouts; with "
                                        "--memory, e.g. a 10M-event `allocsim gen` file)")
    parser.add_argument("--memory", action="store_true",
                        help="measure bytes/event instead, one subprocess per policy")
    parser.add_argument("--dynapipe", metavar="PATH",
                        help="speed: DynaPipe's allocation_simulator.py, timed beside pytorch "
                             "(benchmarks/dynapipe.py says where from)")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--one", nargs=2, metavar=("POLICY", "TRACE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one[0], args.one[1], args.device)))
        return 0

    from allocsim.traces import formats, synth

    if not args.memory:
        start = time.perf_counter()
        if args.trace:
            trace = formats.load(args.trace)
            made = f"{args.trace}, {len(trace):,} events (loaded"
        else:
            trace = synth.generate(args.kind, seed=0, events=args.events)
            made = f"{args.kind}, {len(trace):,} events (generated"
        print(f"trace: {made} in {time.perf_counter() - start:.2f} s); best of {args.repeat}, "
              "loading excluded")
        rows = measure_speed(trace, list(args.policies or SPEED_POLICIES), args.device,
                             args.repeat, args.dynapipe)
        if args.json:
            write_text(args.json, json.dumps(rows, indent=2) + "\n")
        return 0
    policies = args.policies or [*DEFAULT_POLICIES, "simpy:bfc"]
    with tempfile.TemporaryDirectory() as tmp:
        if args.trace:
            path = args.trace
            print(f"trace: {path}")
        else:
            path = str(Path(tmp) / "bench.npz")
            start = time.perf_counter()
            trace = synth.generate(args.kind, seed=0, events=args.events)
            formats.save(trace, path)
            print(f"trace: {args.kind}, {len(trace):,} events "
                  f"(generated and saved in {time.perf_counter() - start:.2f} s)")
            del trace           # the subprocesses load their own copy
        print(f"{'policy':34s} {'events/s':>12s} {'bytes/event':>12s} {'seconds':>8s} "
              f"{'load bytes/event':>17s} {'trace bytes/event':>18s}")
        rows = []
        for policy in policies:
            output = subprocess.run(
                [sys.executable, "-m", "benchmarks.replay", "--device", args.device,
                 "--one", policy, path], check=True, capture_output=True, text=True).stdout
            row = json.loads(output.strip().splitlines()[-1])
            rows.append(row)
            print(f"{policy:34s} {row['events_per_s']:12,.0f} {row['bytes_per_event']:12.1f} "
                  f"{row['seconds']:8.2f} {row['load_bytes_per_event']:17.1f} "
                  f"{row['trace_bytes_per_event']:18.1f}")
    if args.json:
        write_text(args.json, json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
