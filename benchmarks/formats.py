"""Benchmark: how fast traces are written, read and validated, per format.

    python -m benchmarks.formats [--events 1000000]

Prints seconds to save and to load (parse + strict validation) a synthetic training trace in
each native format, and the file size.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args(argv)

    from allocsim.traces import formats, synth
    from allocsim.traces.validate import validate

    trace = synth.generate("training", seed=0, events=args.events)
    start = time.perf_counter()
    validate(trace)
    print(f"{len(trace):,} events; strict validation {time.perf_counter() - start:.3f} s")
    print(f"{'format':10s} {'save s':>8s} {'load s':>8s} {'MB':>8s}")
    with tempfile.TemporaryDirectory() as tmp:
        for ext in (".npz", ".csv", ".csv.gz", ".jsonl", ".jsonl.gz"):
            path = Path(tmp) / f"bench{ext}"
            start = time.perf_counter()
            formats.save(trace, path)
            saved = time.perf_counter()
            formats.load(path)
            loaded = time.perf_counter()
            print(f"{ext:10s} {saved - start:8.2f} {loaded - saved:8.2f} "
                  f"{path.stat().st_size / 1e6:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
