"""Run a program of experiments/tpu/programs.py on the chip as a user runs it, and measure it.

    python experiments/tpu/program_probe.py OUT --program NAME [--capacity BYTES]

Without ``--capacity``: the program runs on the whole chip; ``OUT/NAME.json`` keeps
``memory_stats()`` after each step's sync and at the end (``peak_bytes_in_use``,
``peak_bytes_reserved``: what allocsim predicts). With ``--capacity``: the program is given
exactly ``BYTES`` of HBM (the runtime's own 26,624 B included, as min-capacity counts them): a
ballast of ``bytes_limit − BYTES`` is placed first (u8 arrays from the host: 256 MiB pieces,
then whole 1024-byte tiles, then one 512 B granule), then the program runs; ``OUT/NAME-BYTES.json``
says whether it ran to its end and, if not, the runtime's refusal. One process per run
(``peak_bytes_in_use`` is the process's own). Runs with JAX and numpy alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))   # run as a script on the chip: the repository's modules too
from experiments.tpu.chip_probe import _stats, package_versions  # noqa: E402
from experiments.tpu.programs import PROGRAMS, Chip  # noqa: E402


class MeasuredChip(Chip):
    """The chip runtime, noting memory_stats() at each sync."""

    def __init__(self, device: Any, stages: dict[str, Any]) -> None:
        self.device = device
        self.stages = stages

    def sync(self, tree: Any) -> None:
        super().sync(tree)
        self.stages[f"sync{len(self.stages)}"] = _stats(self.device)


def ballast(device: Any, capacity: int) -> tuple[list[Any], int]:
    import jax
    import numpy as np
    limit = _stats(device)["bytes_limit"]
    total = limit - capacity
    if total < 0 or total % 512:
        raise ValueError(f"capacity {capacity} is not a multiple of 512 B under {limit}")
    chunk = 256 << 20
    tiles = total // 1024 * 1024
    pieces = [chunk] * (tiles // chunk) + [n for n in (tiles % chunk, total % 1024) if n]
    host = np.zeros(chunk, np.uint8)
    held = []
    for n in pieces:
        held.append(jax.device_put(host[:n], device))
        held[-1].block_until_ready()
    return held, total


def measured_run(out: Path, name: str, capacity: int | None, body: Any,
                 about: dict[str, Any]) -> None:
    """Run ``body(device, stages)`` on the chip — after a ballast leaving it ``capacity`` bytes,
    where given — and keep ``memory_stats()`` at its stages, whether it ran, and the runtime's
    refusal if it did not, in ``OUT/NAME.json`` (``NAME-CAPACITY.json``); one line printed."""
    import jax
    device = jax.devices()[0]
    record: dict[str, Any] = {**about, "capacity": capacity,
                              "versions": package_versions(), "stages": {}}
    stages = record["stages"]
    stages["start"] = _stats(device)
    started = time.perf_counter()
    held: list[Any] = []
    try:
        if capacity is not None:
            held, record["ballast"] = ballast(device, capacity)
            record["ballast_on_device"] = sum(
                a.addressable_data(0).on_device_size_in_bytes() for a in held)
            stages["ballast"] = _stats(device)
        body(device, stages)
        record["ran"] = True
    except Exception as err:   # the runtime's refusal is the finding
        record["ran"] = False
        record["error"] = str(err).splitlines()[0][:500] if str(err) else type(err).__name__
        record["error_kind"] = type(err).__name__
        record["traceback"] = traceback.format_exc()[-2000:]
    stages["end"] = _stats(device)
    record["seconds"] = round(time.perf_counter() - started, 2)
    file = out / (f"{name}.json" if capacity is None else f"{name}-{capacity}.json")
    file.write_text(json.dumps(record, indent=1))
    end = stages["end"]
    print(f"{file.name}: ran={record['ran']} peak_in_use={end['peak_bytes_in_use']} "
          f"peak_reserved={end.get('peak_bytes_reserved')} ({record['seconds']} s)"
          + ("" if record["ran"] else f" {record.get('error', '')[:200]}"), flush=True)


def run(out: Path, name: str, capacity: int | None) -> None:
    measured_run(out, name, capacity,
                 lambda device, stages: PROGRAMS[name](MeasuredChip(device, stages)),
                 {"program": name})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--program", choices=sorted(PROGRAMS), required=True)
    parser.add_argument("--capacity", type=int)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run(args.out, args.program, args.capacity)


if __name__ == "__main__":
    main()
