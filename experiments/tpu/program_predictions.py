"""Predict, without a chip, what each program of experiments/tpu/programs.py holds on a v5e.

    python -m experiments.tpu.program_predictions OUT.json [--program NAME ...]

For each program: the trace of :class:`~experiments.tpu.programs.Predicted` (the program run
over allocsim's TPU Program, compiled with libtpu for ``tpu-v5e``), replayed through the
``tpu`` policy: peak in use (the chip's ``peak_bytes_in_use``: the trace's peak live plus the
runtime's own 26,624 B), scratch (the chip's ``peak_bytes_reserved``) and min-capacity's answer
at 512 B (the HBM the program runs in; experiments/tpu/program_probe.py proves it on the chip
with a ballast). Written before the chip runs them: the file is the prediction.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from experiments.tpu.programs import PROGRAMS, STEPS, Predicted


def predict(name: str) -> dict[str, Any]:
    from allocsim import api
    from allocsim.sim.kernel.device_profile import resolve_device
    from allocsim.sim.kernel.engine import replay
    started = time.perf_counter()
    rt = Predicted("tpu-v5e")
    PROGRAMS[name](rt)
    trace = rt.program.trace(name=name)
    v5e = resolve_device("tpu-v5e")
    result = replay(trace, "tpu", v5e)
    answer = api.min_capacity(trace, "tpu", v5e, resolution=512)
    facts = trace.metadata["xla_tpu"]
    runtime = answer.context_bytes
    if answer.min_capacity is None:
        raise RuntimeError(f"{name}: min-capacity found no capacity it runs in")
    return {"peak_bytes_in_use": int(result.peak_allocated) + runtime,
            "peak_bytes_reserved": facts["scratch_bytes"],
            "min_capacity": int(answer.min_capacity),
            "executables": [{k: e[k] for k in ("name", "calls", "code_bytes", "scratch_bytes")}
                            for e in facts["executables"]],
            "events": len(trace), "libtpu": facts["libtpu"], "jax": facts["jax"],
            "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--program", action="append", choices=sorted(PROGRAMS))
    args = parser.parse_args()
    found: dict[str, Any] = {"about": "experiments/tpu/program_predictions.py: each program of "
                      f"experiments/tpu/programs.py ({STEPS} steps) predicted for tpu-v5e "
                      "without a chip, written before the chip ran it",
             "predictions": {}}
    for name in args.program or list(PROGRAMS):
        found["predictions"][name] = predict(name)
        print(name, json.dumps(found["predictions"][name]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()
