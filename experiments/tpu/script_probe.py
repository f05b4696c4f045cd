"""Run a script of experiments/tpu/scripts on the chip unchanged, and measure it.

    python experiments/tpu/script_probe.py OUT --script NAME [--capacity BYTES]

As experiments/tpu/program_probe.py (the same ballast), for a plain script run as ``__main__``
(``runpy``): ``OUT/NAME.json`` keeps ``memory_stats()`` at its end, or whether it ran in exactly
``BYTES`` of HBM. Runs with JAX and numpy alone."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))   # run as a script on the chip: the repository's modules too
from experiments.tpu.program_probe import measured_run  # noqa: E402

SCRIPTS = Path(__file__).parent / "scripts"


def run(out: Path, name: str, capacity: int | None) -> None:
    measured_run(out, name, capacity,
                 lambda device, stages: runpy.run_path(str(SCRIPTS / f"{name}.py"),
                                                       run_name="__main__"),
                 {"script": name})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--script", required=True)
    parser.add_argument("--capacity", type=int)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run(args.out, args.script, args.capacity)


if __name__ == "__main__":
    main()
