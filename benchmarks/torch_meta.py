"""Benchmark: the PyTorch meta recorder on a 1.3B-parameter GPT training step.

    python -m benchmarks.torch_meta [--width 2048] [--layers 24] [--repeats 1]

Runs ``tests/torch_programs/gpt_adamw.py`` (two AdamW steps; width, 24 blocks, 16 heads, batch
8, length 1024, a 32,000-way head) in this process, on the meta device, twice per repeat:

- *floor*: the program alone on the meta device (``TORCH_PROGRAM_DEVICE=meta``; PyTorch's own
  meta execution, no recorder);
- *recorded*: under ``allocsim.traces.record.torch.meta.record_cuda`` ("cuda" redirected,
  every storage recorded, CUDA's kernel choices for a100-80g).

Prints wall and CPU seconds for each (best of ``--repeats``; the CPU time is the fairer figure
on a shared machine), the ratio recorded / floor, events per second, and the recorder's own
memory: its event array (bytes per event) and one weak reference plus its dict slot per live
storage (``sys.getsizeof``), the two things it holds. The floor takes AdamW's per-parameter
path (the meta device is not a ``foreach`` device); the recorded run takes the ``foreach`` path
CUDA takes. The issue's targets: a step recorded in under 30 s; memory
bounded by the number of live tensors, never their sizes.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
from pathlib import Path

from allocsim.traces.model import Trace

# What a run leaves: the trace (None unrecorded), live storages, bytes per storage, event bytes.
Facts = tuple[Trace | None, int, int, int]

PROGRAM = Path(__file__).resolve().parents[1] / "tests" / "torch_programs" / "gpt_adamw.py"


def _run(argv: list[str], recorded: bool) -> tuple[float, float, Facts]:
    from allocsim.traces.record.torch.meta import record_cuda

    saved = sys.argv
    sys.argv = [str(PROGRAM), *argv]
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        if recorded:
            os.environ.pop("TORCH_PROGRAM_DEVICE", None)
            with record_cuda(None, target="a100-80g") as rec:
                namespace = runpy.run_path(str(PROGRAM), run_name="__main__")
                live = len(rec._live)
                ref = next(iter(rec._live.values()), None)
                per_storage = sys.getsizeof(ref) + 3 * 8 if ref is not None else 0  # + slot
                event_bytes = rec._events.buffer_info()[1] * rec._events.itemsize
            trace = rec.trace
        else:
            os.environ["TORCH_PROGRAM_DEVICE"] = "meta"
            namespace = runpy.run_path(str(PROGRAM), run_name="__main__")
            trace, live, per_storage, event_bytes = None, 0, 0, 0
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    finally:
        sys.argv = saved
        os.environ.pop("TORCH_PROGRAM_DEVICE", None)
    del namespace
    return seconds, cpu, (trace, live, per_storage, event_bytes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    program_args = [str(args.width), str(args.layers), "16", "8", "1024", "32000"]
    import torch  # noqa: F401  (imported before timing: its import is not the recorder's)

    floor = recorded = floor_cpu = recorded_cpu = float("inf")
    facts: Facts = (None, 0, 0, 0)
    for _ in range(args.repeats):
        seconds, cpu, _ = _run(program_args, recorded=False)
        floor, floor_cpu = min(floor, seconds), min(floor_cpu, cpu)
        seconds, cpu, facts = _run(program_args, recorded=True)
        recorded, recorded_cpu = min(recorded, seconds), min(recorded_cpu, cpu)
    trace, live, per_storage, event_bytes = facts
    assert trace is not None
    peak, peak_event = trace.peak_live()
    live_at_peak = int(trace.op[: peak_event + 1].tolist().count(0)
                       - trace.op[: peak_event + 1].tolist().count(1))
    print(f"program      gpt_adamw {' '.join(program_args)} (2 AdamW steps)")
    print(f"floor        {floor:.2f} s wall, {floor_cpu:.2f} s CPU (meta, no recorder)")
    print(f"recorded     {recorded:.2f} s wall, {recorded_cpu:.2f} s CPU, {len(trace):,} "
          "events, peak live "
          f"{peak / 2**30:.2f} GiB ({live_at_peak:,} storages live at the peak, {live:,} at "
          "the end)")
    print(f"ratio        {recorded_cpu / floor_cpu:.2f}x the floor's CPU time; "
          f"{len(trace) / recorded_cpu:,.0f} events per CPU second")
    print(f"memory       {event_bytes / max(len(trace), 1):.0f} B per event (the event array, "
          f"{event_bytes / 2**10:.0f} KiB), {per_storage} B per live storage "
          f"({per_storage * live_at_peak / 2**10:.0f} KiB at the peak); no tensor data")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
