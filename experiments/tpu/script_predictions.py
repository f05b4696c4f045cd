"""Predict, without a chip, what each script of experiments/tpu/scripts holds on a v5e, by
recording it unchanged with ``allocsim record --framework jax --target tpu-v5e`` (the script
runs here on the CPU; every program it runs is compiled for the v5e).

    python -m experiments.tpu.script_predictions OUT.json

The same fields as experiments/tpu/program_predictions.py; written before the chip runs the
scripts (experiments/tpu/script_probe.py)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).parent / "scripts"
NAMES = ("eager_mix", "eval_loop")


def predict(name: str) -> dict[str, Any]:
    from allocsim import api
    from allocsim.sim.kernel.device_profile import resolve_device
    from allocsim.sim.kernel.engine import replay
    from allocsim.traces.formats import load
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / f"{name}.npz"
        subprocess.run([sys.executable, "-m", "allocsim", "record", "--framework", "jax",
                        "--target", "tpu-v5e", "-o", str(out), "--", sys.executable,
                        str(SCRIPTS / f"{name}.py")], check=True, capture_output=True,
                       env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
        trace = load(out)
    v5e = resolve_device("tpu-v5e")
    result = replay(trace, "tpu", v5e)
    answer = api.min_capacity(trace, "tpu", v5e, resolution=512)
    if answer.min_capacity is None:
        raise RuntimeError(f"{name}: min-capacity found no capacity it runs in")
    facts = trace.metadata["xla_tpu"]
    return {"peak_bytes_in_use": int(result.peak_allocated) + answer.context_bytes,
            "peak_bytes_reserved": facts["scratch_bytes"],
            "min_capacity": int(answer.min_capacity),
            "executables": [{k: e[k] for k in ("name", "calls", "code_bytes", "scratch_bytes")}
                            for e in facts["executables"]],
            "events": len(trace), "libtpu": facts["libtpu"], "jax": facts["jax"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    found: dict[str, Any] = {
        "about": "experiments/tpu/script_predictions.py: each script of experiments/tpu/scripts "
                 "recorded unchanged on the CPU with record --framework jax --target tpu-v5e, "
                 "written before the chip ran it", "predictions": {}}
    for name in NAMES:
        found["predictions"][name] = predict(name)
        print(name, json.dumps(found["predictions"][name])[:300], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()
