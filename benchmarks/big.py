"""Benchmark: a very large trace (500 million events) loaded and replayed in the native core.

    python -m benchmarks.big [--events 500000000] [--kind transformer]
                                    [--policies bfc pytorch] [--dir /tmp] [--trace FILE]

Issue 27.4's target: a 500-million-event trace replays in under 16 GiB. The trace is written
to a temporary ``.npz`` block by block (:func:`allocsim.traces.synth.save_streamed`: the
generator's trace, never held in memory), then each policy, in a fresh subprocess, loads it
(``formats.load``: the strict validation included) and replays it
(:func:`~allocsim.sim.kernel.engine.replay`, which takes the core); the file is deleted at the
end (``--trace FILE`` replays an existing file instead, and keeps it). Per policy: the
process's peak RSS (VmHWM: imports, loading and replay — the figure the target is about), its
bytes/event (over the RSS after imports, as native.py's ``--memory``), loading's and the
replay's wall and CPU seconds, the replay's events/s, and whether the run completed. One
policy's process at a time: two would not fit beside each other in a 23 GB machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.replay import _peak_rss_bytes, _rss_bytes

TARGET_BYTES = 16 << 30    # the whole process's peak, loading included


def measure_one(policy: str, path: str, device: str) -> dict:
    """In a fresh process: load ``path`` and replay it through ``policy`` on ``device``."""
    from allocsim.sim.kernel.device import resolve_device
    from allocsim.sim.kernel.engine import replay
    from allocsim.sim.kernel.native import core
    from allocsim.traces import formats

    profile = resolve_device(device)
    baseline = _rss_bytes()
    wall, cpu = time.perf_counter(), time.process_time()
    trace = formats.load(path)
    load_wall, load_cpu = time.perf_counter() - wall, time.process_time() - cpu
    load_peak = _peak_rss_bytes()
    wall, cpu = time.perf_counter(), time.process_time()
    result = replay(trace, policy, profile)
    replay_wall, replay_cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = _peak_rss_bytes()
    n = len(trace)
    return {"policy": policy, "events": n, "native": core() is not None,
            "peak_rss_bytes": peak,
            "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "baseline_rss_bytes": baseline, "load_peak_rss_bytes": load_peak,
            "bytes_per_event": (peak - baseline) / n,
            "trace_bytes_per_event": trace.nbytes / n,
            "load_wall_s": load_wall, "load_cpu_s": load_cpu,
            "replay_wall_s": replay_wall, "replay_cpu_s": replay_cpu,
            "events_per_s": n / replay_cpu, "completed": result.completed,
            "peak_reserved": result.peak_reserved}


def generate(kind: str, events: int, path: str) -> dict:
    """Write the ``kind`` trace of about ``events`` events to ``path``, block by block."""
    from allocsim.traces import synth

    wall, cpu = time.perf_counter(), time.process_time()
    made = synth.plan(kind, seed=0, events=events)
    if not isinstance(made, synth.SynthPlan):
        raise SystemExit(f"{kind} traces cannot be streamed; use training or transformer")
    facts = synth.save_streamed(made, path)
    return {"events": facts.events, "file_bytes": os.path.getsize(path),
            "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
            "peak_rss_bytes": _peak_rss_bytes()}


def run_policies(path: str, policies: list[str], device: str) -> list[dict]:
    """Each policy in its own process, one after the other; prints a line each."""
    env = dict(os.environ, ALLOCSIM_MAX_INPUT_BYTES=str(os.path.getsize(path)))
    print(f"{'policy':24s} {'peak RSS':>9s} {'B/event':>8s} {'load s':>13s} "
          f"{'replay s':>13s} {'events/s':>11s}  (wall/CPU)")
    rows = []
    for policy in policies:
        output = subprocess.run(
            [sys.executable, "-m", "benchmarks.big", "--device", device,
             "--one", policy, path], check=True, capture_output=True, text=True, env=env).stdout
        row = json.loads(output.strip().splitlines()[-1])
        rows.append(row)
        mark = "" if row["peak_rss_bytes"] < TARGET_BYTES else "   (over 16 GiB)"
        print(f"{policy:24s} {row['peak_rss_bytes'] / 2**30:6.2f}GiB "
              f"{row['bytes_per_event']:8.1f} "
              f"{row['load_wall_s']:6.1f}/{row['load_cpu_s']:<6.1f} "
              f"{row['replay_wall_s']:6.1f}/{row['replay_cpu_s']:<6.1f} "
              f"{row['events_per_s']:11,.0f}{'' if row['native'] else '  (Python)'}"
              f"{'' if row['completed'] else '  (OOM)'}{mark}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=float, default=500e6)
    parser.add_argument("--kind", default="transformer")
    parser.add_argument("--device", default="a100-80g")
    parser.add_argument("--policies", nargs="+", default=["bfc", "pytorch"])
    parser.add_argument("--dir", help="folder for the temporary trace (default: the system's)")
    parser.add_argument("--trace", help="replay this .npz instead of generating one (kept)")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--one", nargs=2, metavar=("POLICY", "TRACE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one[0], args.one[1], args.device)))
        return 0
    report: dict = {"kind": args.kind, "device": args.device}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = args.trace
        if path is None:
            path = str(Path(tmp) / "big.npz")
            made = generate(args.kind, int(args.events), path)
            report["generated"] = made
            print(f"generated {args.kind}: {made['events']:,} events, "
                  f"{made['file_bytes'] / 2**30:.2f} GiB file, {made['wall_s']:.0f} s wall "
                  f"({made['cpu_s']:.0f} s CPU), peak RSS {made['peak_rss_bytes'] / 2**30:.2f} GiB",
                  flush=True)
        report["runs"] = run_policies(path, args.policies, args.device)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
