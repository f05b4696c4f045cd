"""Where the TPU runtime holds an executable's scratch, and what it takes from the buffers' HBM.

    python experiments/tpu/scratch_place_probe.py OUT [--only NAME]

The runtime holds a program's scratch as ``bytes_reserved`` (the largest temp of the programs
loaded so far, traces/record/xla_tpu.py's ``runtime_scratch_bytes``); its records
(``MemoryAllocation`` / ``MemoryDeallocation``) are of buffers only. Read off the chip here,
under a profiler session each (``OUT/NAME/...xplane.pb`` beside ``OUT/NAME.json``, as
chip_probe.py records):

- ``scratch-fill``: a 1 GiB argument, a program with a 1.6 GB temp run once (its scratch held),
  then 256 MiB buffers until the runtime refuses one, then smaller ones down to 512 B: the
  lowest address a buffer gets says where the scratch is not; the refusal's message and the
  last buffer granted say whether the scratch counts against the buffers' free total;
- then every other 256 MiB buffer freed and a program with a 3.2 GB temp run (its scratch
  larger than any hole, smaller than the free total): does the runtime compact for scratch,
  move it, or refuse;
- then both programs dropped (``bytes_reserved`` after) and the chip filled again: do buffers
  now reach the addresses the scratch held;
- ``scratch-empty``: the 1.6 GB-temp program run first, on an empty chip, then 256 MiB buffers
  until refused (where the scratch goes when all of HBM is free).

Runs with JAX and numpy alone (the chip has no allocsim).
"""

from __future__ import annotations

import argparse
import gc
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.tpu.chip_probe import Probe, _stats, package_versions

MiB = 1 << 20
N = int(__import__("os").environ.get("PROBE_N", 16384))   # the argument: f32[N, N], 1 GiB


def programs() -> dict[str, Any]:
    """Two programs whose HBM temps (XLA:TPU, libtpu 0.0.42.1, compiled without a chip) are
    1.5 and 3 × their argument's size at N = 8192; at N = 16384 about 1.6 and 3.2 GB."""
    import jax.numpy as jnp

    def big(x: Any) -> Any:
        a = jnp.exp(x)
        b = jnp.sin(x)
        return ((jnp.tanh(a @ b) @ a) * b).sum()

    def bigger(x: Any) -> Any:
        a = jnp.exp(x)
        b = jnp.sin(x)
        e = jnp.cos(x)
        c = a @ b
        return ((jnp.tanh(c) @ a + e @ c) * b * e).sum()

    return {"big": big, "bigger": bigger}


def _run(p: Probe, name: str, compiled: Any, x: Any) -> None:
    import jax
    try:
        jax.block_until_ready(compiled(x))
        p.log.append({"op": "run", "program": name, "stats": _stats(p.device)})
    except Exception as err:   # the runtime's refusal is a finding
        p.log.append({"op": "run", "program": name, "error": str(err)[:2000],
                      "stats": _stats(p.device)})


def _fill(p: Probe, first_key: int, sizes: tuple[int, ...]) -> int:
    """Buffers of each size in turn until the runtime refuses one; returns the next key."""
    key = first_key
    # Off a TPU (a dry run on a CPU) the host's memory would be filled: a few buffers only.
    most = None if p.device.platform == "tpu" else 4
    for size in sizes:
        made = 0
        while (most is None or made < most) and p.alloc(key, size, stats=False):
            key += 1
            made += 1
        key += 1
    p.log.append({"op": "filled", "stats": _stats(p.device)})
    return key


FILL = (256 * MiB, 16 * MiB, MiB, 64 * 1024, 512)


def probe_fill(out: Path) -> None:
    import jax
    import numpy as np
    made = programs()
    with Probe(out, "scratch-fill") as p:
        p.notes["versions"] = package_versions()
        x = jax.device_put(np.ones((N, N), np.float32), p.device)
        x.block_until_ready()
        p.log.append({"op": "argument", "stats": _stats(p.device)})
        compiled = {name: jax.jit(f).lower(x).compile() for name, f in made.items()}
        p.notes["memory_analysis"] = {
            name: {k: int(getattr(c.memory_analysis(), k)) for k in dir(c.memory_analysis())
                   if k.endswith("_in_bytes")} for name, c in compiled.items()}
        _run(p, "big", compiled["big"], x)
        end = _fill(p, 0, FILL)
        # Every other 256 MiB buffer freed: holes no 3.2 GB scratch fits.
        large = sorted(k for k, a in p.live.items() if a.nbytes == 256 * MiB)
        for k in large[1::2]:
            p.free(k, stats=False)
        p.log.append({"op": "holes", "stats": _stats(p.device)})
        _run(p, "bigger", compiled["bigger"], x)
        _run(p, "big", compiled["big"], x)
        del compiled
        gc.collect()
        jax.clear_caches()
        gc.collect()
        p.log.append({"op": "dropped", "stats": _stats(p.device)})
        _fill(p, end + 10_000, FILL)
        del x


def probe_empty(out: Path) -> None:
    import jax
    import numpy as np
    made = programs()
    with Probe(out, "scratch-empty") as p:
        small = jax.device_put(np.ones((8, 128), np.float32), p.device)
        compiled = jax.jit(made["big"]).lower(
            jax.ShapeDtypeStruct((N, N), np.float32)).compile()
        x = jax.device_put(np.ones((N, N), np.float32), p.device)
        _run(p, "big", compiled, x)
        del x
        gc.collect()
        p.log.append({"op": "argument-freed", "stats": _stats(p.device)})
        _fill(p, 0, FILL)
        del small, compiled


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    steps = {"scratch-fill": probe_fill, "scratch-empty": probe_empty}
    for name, step in steps.items():
        if args.only and name != args.only:
            continue
        try:
            step(args.out)
        except Exception:
            print(f"{name} failed:\n{traceback.format_exc()}", flush=True)
        gc.collect()


if __name__ == "__main__":
    main()
