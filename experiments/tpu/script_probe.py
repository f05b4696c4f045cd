"""Run a script of experiments/tpu/scripts on the chip unchanged, and measure it.

    python experiments/tpu/script_probe.py OUT --script NAME [--capacity BYTES]

As experiments/tpu/program_probe.py (the same ballast), for a plain script run as ``__main__``
(``runpy``): ``OUT/NAME.json`` keeps ``memory_stats()`` at its end, or whether it ran in exactly
``BYTES`` of HBM. Runs with JAX and numpy alone."""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))   # run as a script on the chip: the repository's modules too
from experiments.tpu.chip_probe import _stats, package_versions  # noqa: E402
from experiments.tpu.program_probe import ballast  # noqa: E402

SCRIPTS = Path(__file__).parent / "scripts"


def run(out: Path, name: str, capacity: int | None) -> None:
    import jax
    device = jax.devices()[0]
    record: dict[str, Any] = {"script": name, "capacity": capacity,
                              "versions": package_versions(), "stages": {}}
    stages = record["stages"]
    stages["start"] = _stats(device)
    started = time.perf_counter()
    held: list[Any] = []
    try:
        if capacity is not None:
            held, record["ballast"] = ballast(device, capacity)
            record["ballast_pieces"] = len(held)    # held to the end: the ballast stays
            stages["ballast"] = _stats(device)
        runpy.run_path(str(SCRIPTS / f"{name}.py"), run_name="__main__")
        record["ran"] = True
    except Exception as err:   # the runtime's refusal is the finding
        record["ran"] = False
        record["error"] = str(err).splitlines()[0][:500] if str(err) else type(err).__name__
        record["traceback"] = traceback.format_exc()[-2000:]
    stages["end"] = _stats(device)
    record["seconds"] = round(time.perf_counter() - started, 2)
    file = out / (f"{name}.json" if capacity is None else f"{name}-{capacity}.json")
    file.write_text(json.dumps(record, indent=1))
    end = stages["end"]
    print(f"{file.name}: ran={record['ran']} peak_in_use={end['peak_bytes_in_use']} "
          f"peak_reserved={end.get('peak_bytes_reserved')} ({record['seconds']} s)"
          + ("" if record["ran"] else f" {record.get('error', '')[:200]}"), flush=True)


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
