"""min-capacity's answer for a TPU step, proved on the chip: the step runs at the HBM it says and
not below.

    python experiments/tpu/min_capacity_probe.py OUT --size small --capacity BYTES

allocsim answers, without a chip, the smallest HBM a jitted GPT step (experiments/gpt_step.py,
the state donated, two steps) needs: ``compile_for(..., target="tpu-v5e")`` then
``min-capacity --policies tpu`` (peak in use + the program's scratch + the runtime's own
bytes; experiments/tpu/min_capacity.py makes the predictions). A chip has one HBM size, so
this probe gives the step exactly ``BYTES`` of it: a ballast of ``bytes_limit − BYTES`` is
placed first (u8 arrays of 256 MiB, whole 1024-byte tiles, one 512-byte granule), then the state and
the tokens are put on the chip from host memory (no program runs to make them: a program's
code is HBM too), the step is compiled and run twice. ``OUT/NAME.json`` keeps whether both
steps ran, the runtime's refusal if one did not, and ``memory_stats()`` at each stage.

One process per capacity (``peak_bytes_in_use`` is the process's own). Runs with JAX and
numpy alone (the chip has no allocsim).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))   # run as a script on the chip: the repository's modules too
from experiments.tpu.chip_probe import _stats, package_versions  # noqa: E402
from experiments.tpu.step_sizes_probe import BATCH, LENGTH, SIZES  # noqa: E402

STEPS = 2


def run(out: Path, size: str, capacity: int) -> None:
    import jax
    import numpy as np

    from experiments import gpt_step
    device = jax.devices()[0]
    name = f"{size}-{capacity}"
    record: dict[str, Any] = {"size": size, "capacity": capacity, "steps": STEPS,
                              "versions": package_versions(), "stages": {}, "ran_steps": 0}
    stages = record["stages"]
    stages["start"] = _stats(device)
    try:
        limit = stages["start"]["bytes_limit"]
        ballast = limit - capacity
        record["ballast"] = ballast
        if ballast < 0 or ballast % 512:
            raise ValueError(f"capacity {capacity} is not a multiple of 512 B under {limit}")
        # 256 MiB pieces (as the compaction probes filled HBM), the rest in whole 1024-byte
        # tiles, and the last 512 B as one granule.
        chunk = 256 << 20
        tiles = ballast // 1024 * 1024
        pieces = [chunk] * (tiles // chunk) + [n for n in (tiles % chunk, ballast % 1024) if n]
        host = np.zeros(chunk, np.uint8)
        held = []
        for n in pieces:
            held.append(jax.device_put(host[:n], device))
            held[-1].block_until_ready()
        record["ballast_on_device"] = sum(
            a.addressable_data(0).on_device_size_in_bytes() for a in held)
        stages["ballast"] = _stats(device)
        d_model, layers, heads, mlp, vocab = SIZES[size]
        step, abstract = gpt_step.build(d_model, layers, heads, mlp, remat=False, vocab=vocab)
        state = jax.tree.map(lambda a: jax.device_put(np.zeros(a.shape, a.dtype), device),
                             abstract)
        tokens = jax.device_put(np.zeros((BATCH, LENGTH + 1), np.int32), device)
        jax.block_until_ready((state, tokens))
        stages["placed"] = _stats(device)
        compiled = jax.jit(step, donate_argnums=(0,)).lower(state, tokens).compile()
        stages["compiled"] = _stats(device)
        for k in range(STEPS):
            state, loss = compiled(state, tokens)
            jax.block_until_ready(loss)
            record["ran_steps"] = k + 1
            stages[f"step{k + 1}"] = _stats(device)
    except Exception as err:   # the runtime's refusal is the finding
        record["error"] = str(err).splitlines()[0][:500] if str(err) else type(err).__name__
        record["error_kind"] = type(err).__name__
        record["traceback"] = traceback.format_exc()[-2000:]
        stages["refused"] = _stats(device)
    record["ran"] = record["ran_steps"] == STEPS
    (out / f"{name}.json").write_text(json.dumps(record, indent=1))
    print(f"{name}: ran {record['ran_steps']}/{STEPS} steps"
          + (f" ({record.get('error', '')[:160]})" if not record["ran"] else ""), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), required=True)
    parser.add_argument("--capacity", type=int, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run(args.out, args.size, args.capacity)


if __name__ == "__main__":
    main()
