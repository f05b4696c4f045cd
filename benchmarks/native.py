"""Benchmark: the native core's speed and memory, as ratios to floors measured in the same run.

    python -m benchmarks.native [--events 1000000] [--kind transformer] [--repeat 3]
    python -m benchmarks.native --memory          # bytes/event, a subprocess per policy
    python -m benchmarks.native --context-bytes 0 --against-python

Speed (CPU time, ``time.process_time``, one process), against three floors over the same
events, each run alternating with each policy's runs, best of ``--repeat``, every ratio to the
floor measured beside it:

- the **tuned C++ best fit** (allocsim._native.tuned_best_fit, native/src/tuned_best_fit.cpp):
  allocsim's best-fit rule (256-byte rounding, always split, smallest fit and lowest address,
  coalescing, a heap mapped in whole pages) over pooled blocks with neighbour links,
  size-class bins of sorted vectors with a bitmap and an open-addressing id table; its peak
  is best-fit's peak pool bytes (printed, and checked in tests/test_bench_native.py), so it
  does the same work as fast as we know how. Target (issue 39): every policy at or under it;
- the **plain C++ best fit** (allocsim._native.plain_best_fit: std::set by size, std::map by
  address, an unordered_map of live buffers; issue 27's floor, target within 2×);
- the **read limit** (allocsim._native.read_columns): a loop that only reads the columns.

Each policy's :func:`~allocsim.sim.kernel.engine.replay` is timed whole (the core's replay and
the RunResult built from it); beside its time, the free blocks its index holds, averaged over
64 points of the run (``free blk``, untimed: :func:`free_blocks_held`) — the work a policy does
beyond best fit's, as every free and split searches and moves past the keys of its bin, and
best fit's own row is the floor's; the machine's load (os.getloadavg) is printed at the start and
the end. Policies the core lacks replay in Python here, and show it (``impl``). With
``--against-python`` each native policy's Python model (``ALLOCSIM_NATIVE=0``) is timed too,
once, and the core's speed-up over it printed.

DynaPipe (``--dynapipe PATH``: its ``allocation_simulator.py``, benchmarks/dynapipe.py says
where from): its PyTorch-allocator simulator is timed over the same events, best of
``--repeat``, and pytorch's speed is set against it (target ≥ 20×), measured, not estimated.
Without the file nothing is said of DynaPipe.

Memory (``--memory``): each policy in a fresh subprocess loads the saved trace and replays it;
bytes/event is (peak RSS over loading and replay − RSS after imports) / events, loading
included (target ≤ 24 B/event); beside it the replay's own peak (the peak reset after loading,
Linux clear_refs; the trace's columns held count) and what loading alone reached.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.dynapipe import dynapipe_runner, load_simulator, peak_reserved
from benchmarks.replay import _peak_rss_bytes, _reset_peak_rss, _rss_bytes

if TYPE_CHECKING:
    from allocsim.sim.kernel.device import DeviceProfile
    from allocsim.traces.model import Trace

POLICIES = ("preallocate", "best-fit", "best-fit:trim=true", "bfc", "bfc:allow_growth=false",
            "jax", "jax:preallocate=false", "pytorch", "pytorch:expandable_segments=true",
            "on-demand", "cupy", "cupy:fraction=0.5", "cuda-async", "cuda-async:sync=none",
            "cuda-async:fraction=0.75", "jax:allocator=cuda_async", "buddy")
TUNED_TARGET = 1.0          # every policy at or under the tuned C++ best fit's time (issue 39)
DYNAPIPE_TARGET = 20.0      # pytorch ≥ 20× DynaPipe's simulator
BYTES_TARGET = 24.0         # peak bytes/event, loading included


def cpu_best_of(repeat: int, run: Callable[[], object]) -> float:
    """The least CPU time of ``repeat`` runs of ``run``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def floor_columns(trace: Trace) -> tuple:
    """The columns the floors read: op, id and the sizes as the native policies read them."""
    return (trace.column("op"), trace.column("id"), trace.matched_sizes(packed=True))


def floor_runner(trace: Trace) -> Callable[[], object]:
    """The plain C++ best fit over ``trace``'s events, as the native policies read them."""
    from allocsim import _native  # type: ignore[attr-defined]

    columns, n = floor_columns(trace), len(trace)
    return lambda: _native.plain_best_fit(columns, n)


def tuned_runner(trace: Trace, page: int) -> Callable[[], int]:
    """The tuned C++ best fit (native/src/tuned_best_fit.cpp: best-fit's rule over pooled
    blocks, size-class bins with a bitmap and a flat id table) over ``trace``'s events, mapping
    ``page`` bytes at a time; it returns its peak mapped bytes, best-fit's peak pool bytes."""
    from allocsim import _native  # type: ignore[attr-defined]

    columns, n = floor_columns(trace), len(trace)
    return lambda: int(_native.tuned_best_fit(columns, n, page))


def read_runner(trace: Trace) -> Callable[[], object]:
    """The read limit: a loop that only widens the floors' columns and sums them."""
    from allocsim import _native  # type: ignore[attr-defined]

    columns, n = floor_columns(trace), len(trace)
    return lambda: _native.read_columns(columns, n)


def load_average() -> str:
    """The machine's load averages over 1, 5 and 15 minutes (os.getloadavg)."""
    import os

    return "load average " + " ".join(f"{value:.2f}" for value in os.getloadavg())


def python_seconds(trace: Trace, policy: str, profile: DeviceProfile) -> float:
    """The CPU time of one replay of ``policy`` by the Python models (the core turned off)."""
    import os

    from allocsim.sim.kernel.engine import replay

    before = os.environ.get("ALLOCSIM_NATIVE")
    os.environ["ALLOCSIM_NATIVE"] = "0"
    try:
        return cpu_best_of(1, lambda: replay(trace, policy, profile))
    finally:
        if before is None:
            del os.environ["ALLOCSIM_NATIVE"]
        else:
            os.environ["ALLOCSIM_NATIVE"] = before


def bench_profile(device: str, context_bytes: int | None) -> DeviceProfile:
    """The device the policies replay on: the named one, its context's share replaced by
    ``context_bytes`` when given (the core declines a device whose context holds memory,
    sim/kernel/native.py's device_config, so ``--context-bytes 0`` measures the core there)."""
    from dataclasses import replace

    from allocsim.sim.kernel.device import resolve_device

    profile = resolve_device(device)
    return profile if context_bytes is None else replace(profile, context_bytes=context_bytes)


def runs_native(trace: Trace, policy: str, profile: DeviceProfile) -> bool:
    """Whether replay() takes the core for this run (the policy, its settings and the device)."""
    from allocsim.policies import parse_policy
    from allocsim.sim.kernel.native import open_run

    return open_run(trace, parse_policy(policy), profile, stop_on_oom=False, timeline_points=1,
                    events=0) is not None


def free_blocks_held(trace: Trace, policy: str, profile: DeviceProfile,
                     points: int = 64) -> float | None:
    """The free blocks the policy's index holds, averaged over ``points`` even stops of a
    native run (None where the core does not run it): what each of its frees and splits
    searches and moves past, the work that parts policies of the same index."""
    from allocsim.policies import parse_policy
    from allocsim.sim.kernel.native import open_run

    run = open_run(trace, parse_policy(policy), profile, stop_on_oom=False, timeline_points=1)
    if run is None:
        return None
    held = []
    for stop in range(1, points + 1):
        run.advance(len(trace) * stop // points)  # to that event (an index, not a count)
        held.append(run.state()["policy_stats"]["free_blocks"])
    return sum(held) / len(held)


def measure_speed(trace: Trace, policies: list[str], profile: DeviceProfile, repeat: int,
                  against_python: bool = False, dynapipe: str | None = None
                  ) -> list[dict[str, Any]]:
    """Every policy beside the three floors — the tuned C++ best fit, the plain one and the
    read limit — and, given its file, DynaPipe's simulator; prints a line each as it goes,
    and the machine's load at the start and the end. Each policy's runs alternate with the
    floors' runs, and its ratios are to the floors measured beside it."""
    from allocsim.sim.kernel.engine import replay

    n = len(trace)
    plain, read = floor_runner(trace), read_runner(trace)
    tuned = tuned_runner(trace, profile.map_granularity)
    print(f"at the start: {load_average()}")
    best_fit_peak = replay(trace, "best-fit", profile).policy_stats.get("peak_pool_bytes")
    tuned_peak = tuned()
    print(f"tuned floor's peak {tuned_peak:,} B; best-fit's peak pool {best_fit_peak:,} B"
          + ("" if tuned_peak == best_fit_peak else "   (NOT the same work)"))
    dynapipe_s: float | None = None
    if dynapipe is not None:
        run_dynapipe = dynapipe_runner(trace, load_simulator(dynapipe))
        dynapipe_peak = peak_reserved(run_dynapipe())
        dynapipe_s = cpu_best_of(repeat, run_dynapipe)
        print(f"DynaPipe's simulator (measured): {n / dynapipe_s:,.0f} events/s; its peak "
              f"reserved {dynapipe_peak:,} B (its rules simplify PyTorch's: no small pool)")
    tuned_s, plain_s, read_s = (cpu_best_of(repeat, run) for run in (tuned, plain, read))
    print(f"tuned C++ best fit: {n / tuned_s:,.0f} events/s; plain C++ best fit "
          f"{n / plain_s:,.0f}; read limit {n / read_s:,.0f} ({read_s / n * 1e9:.2f} ns/event)")
    print(f"{'policy':28s} {'impl':7s} {'events/s':>12s} {'ns/event':>9s} {'× tuned':>8s} "
          f"{'× plain':>8s} {'× read':>7s} {'CPU s':>7s} {'free blk':>8s}")
    rows: list[dict[str, Any]] = [
        {"policy": "tuned C++ best fit", "events": n, "cpu_s": tuned_s,
         "events_per_s": n / tuned_s, "peak_bytes": tuned_peak,
         "best_fit_peak_bytes": best_fit_peak},
        {"policy": "plain C++ best fit", "events": n, "cpu_s": plain_s,
         "events_per_s": n / plain_s},
        {"policy": "read limit", "events": n, "cpu_s": read_s, "events_per_s": n / read_s}]
    if dynapipe_s is not None:
        rows.append({"policy": "DynaPipe's simulator", "events": n, "cpu_s": dynapipe_s,
                     "events_per_s": n / dynapipe_s, "peak_reserved": dynapipe_peak})
    for policy in policies:
        impl = "native" if runs_native(trace, policy, profile) else "Python"
        run_s = beside_tuned = beside_plain = beside_read = float("inf")
        for _ in range(repeat if impl == "native" else 1):
            beside_tuned = min(beside_tuned, cpu_best_of(1, tuned))
            beside_plain = min(beside_plain, cpu_best_of(1, plain))
            beside_read = min(beside_read, cpu_best_of(1, read))
            run_s = min(run_s, cpu_best_of(1, partial(replay, trace, policy, profile)))
        row: dict[str, Any] = {
            "policy": policy, "impl": impl, "events": n, "cpu_s": run_s,
            "events_per_s": n / run_s, "tuned_ratio": run_s / beside_tuned,
            "tuned_events_per_s": n / beside_tuned, "floor_ratio": run_s / beside_plain,
            "floor_events_per_s": n / beside_plain, "read_ratio": run_s / beside_read,
            "read_events_per_s": n / beside_read,
            "free_blocks_held": free_blocks_held(trace, policy, profile)}
        held = row["free_blocks_held"]
        mark = "" if row["tuned_ratio"] <= TUNED_TARGET else "   (over the tuned floor)"
        if policy == "pytorch" and dynapipe_s is not None:
            row["dynapipe_x"] = dynapipe_s / run_s
            mark += (f"   ({row['dynapipe_x']:.1f}× DynaPipe's simulator, measured; "
                     f"target {DYNAPIPE_TARGET:g}×)")
        if against_python and impl == "native":
            row["python_cpu_s"] = python_seconds(trace, policy, profile)
            row["python_x"] = row["python_cpu_s"] / run_s
            mark += f"   ({row['python_x']:.1f}× the Python model)"
        rows.append(row)
        print(f"{policy:28s} {impl:7s} {n / run_s:12,.0f} {run_s / n * 1e9:9.1f} "
              f"{row['tuned_ratio']:8.2f} {row['floor_ratio']:8.2f} {row['read_ratio']:7.1f} "
              f"{run_s:7.3f} {'—' if held is None else f'{held:.1f}':>8s}{mark}")
    print(f"at the end: {load_average()}")
    return rows


def measure_one(policy: str, path: str, profile: DeviceProfile) -> dict:
    """In a fresh process: load the trace and replay it; peak RSS over both."""
    from allocsim.sim.kernel.engine import replay
    from allocsim.traces import formats

    gc.collect()
    baseline = _rss_bytes()
    trace = formats.load(path)
    load_peak = _peak_rss_bytes()
    gc.collect()
    _reset_peak_rss()       # from here the peak is the replay's (with the trace held)
    start = time.process_time()
    result = replay(trace, policy, profile)
    cpu = time.process_time() - start
    replay_peak = _peak_rss_bytes()
    n = len(trace)
    return {"policy": policy, "events": n, "cpu_s": cpu,
            "bytes_per_event": (max(load_peak, replay_peak) - baseline) / n,
            "replay_bytes_per_event": (replay_peak - baseline) / n,
            "load_bytes_per_event": (load_peak - baseline) / n,
            "trace_bytes_per_event": trace.nbytes / n, "completed": result.completed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--kind", default="transformer")
    parser.add_argument("--device", default="a100-80g")
    parser.add_argument("--policies", nargs="+")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--context-bytes", type=int,
                        help="the device's context share in bytes (default: the profile's)")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--against-python", action="store_true",
                        help="also time each native policy's Python model, once")
    parser.add_argument("--dynapipe", metavar="PATH",
                        help="DynaPipe's allocation_simulator.py, to time it beside pytorch "
                             "(benchmarks/dynapipe.py says where from)")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--one", nargs=2, metavar=("POLICY", "TRACE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    profile = bench_profile(args.device, args.context_bytes)
    if args.one:
        print(json.dumps(measure_one(args.one[0], args.one[1], profile)))
        return 0

    from allocsim.sim.kernel.native import core, implementation
    from allocsim.traces import formats, synth

    if core() is None:
        print(f"the native core is not in use ({implementation()}): nothing to measure")
        return 1
    policies = list(args.policies or POLICIES)
    trace = synth.generate(args.kind, seed=0, events=args.events)
    print(f"trace: {args.kind}, {len(trace):,} events; CPU time, best of {args.repeat}")
    if not args.memory:
        rows = measure_speed(trace, policies, profile, args.repeat, args.against_python,
                             args.dynapipe)
    else:
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "bench.npz")
            formats.save(trace, path)
            del trace
            print(f"{'policy':28s} {'bytes/event':>12s} {'replay bytes/event':>19s} "
                  f"{'load bytes/event':>17s} {'trace bytes/event':>18s}")
            for policy in policies:
                output = subprocess.run(
                    [sys.executable, "-m", "benchmarks.native", "--device", args.device,
                     *([] if args.context_bytes is None
                       else ["--context-bytes", str(args.context_bytes)]),
                     "--one", policy, path], check=True, capture_output=True, text=True).stdout
                row = json.loads(output.strip().splitlines()[-1])
                rows.append(row)
                mark = "" if row["bytes_per_event"] <= BYTES_TARGET else "   (over 24)"
                print(f"{policy:28s} {row['bytes_per_event']:12.1f} "
                      f"{row['replay_bytes_per_event']:19.1f} "
                      f"{row['load_bytes_per_event']:17.1f} "
                      f"{row['trace_bytes_per_event']:18.1f}{mark}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
