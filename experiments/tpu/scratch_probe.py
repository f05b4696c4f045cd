"""What the TPU runtime reserves as scratch for programs the scratch rule was not read from.

    python experiments/tpu/scratch_probe.py OUT --program NAME   (one program, one process)
    python experiments/tpu/scratch_probe.py OUT --list

traces/record/xla_tpu.py's ``runtime_scratch_bytes`` was read off the GPT steps of
step_sizes_probe.py. These programs (a sort-heavy chain with a temp, a gradient whose
buffer assignment holds an HBM temp that ``memory_analysis()`` does not count) test it: each
runs in a fresh process (``peak_bytes_reserved`` is the largest of the executables loaded) and
``OUT/NAME.json`` keeps ``memory_stats()`` after the run and ``memory_analysis()``.
tests/test_xla_tpu_compile.py compiles the same programs without a TPU and compares.

Runs with JAX and numpy alone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

# name: (function, rows, columns): arguments f32[rows, columns] and f32[columns, columns].
SHAPES = {"sortchain-1000x700": ("sortchain", 1000, 700),
          "sortchain-1536x1100": ("sortchain", 1536, 1100),
          "sortchain-777x1999": ("sortchain", 777, 1999),
          "grad-1000x700": ("grad", 1000, 700),
          "grad-777x1999": ("grad", 777, 1999)}


def program(kind: str) -> Any:
    """The program of a kind, as plain JAX."""
    import jax
    import jax.numpy as jnp

    def sortchain(a: Any, b: Any) -> Any:
        x = jnp.sort(a @ b, axis=0)
        y = jnp.sort(jnp.tanh(x) @ b.T, axis=1)
        return (y @ b).sum(), x[:3]

    def grad(a: Any, b: Any) -> Any:
        return jax.grad(lambda w: jnp.sum(jnp.tanh(jnp.tanh(a @ w) @ w.T) ** 2))(b)

    return {"sortchain": sortchain, "grad": grad}[kind]


def arguments(name: str) -> list[Any]:
    import jax
    import jax.numpy as jnp
    _, rows, columns = SHAPES[name]
    return [jax.ShapeDtypeStruct((rows, columns), jnp.float32),
            jax.ShapeDtypeStruct((columns, columns), jnp.float32)]


def run(out: Path, name: str) -> None:
    import jax
    import jax.numpy as jnp
    device = jax.devices()[0]
    args = [jnp.ones(a.shape, a.dtype) * 0.01 for a in arguments(name)]
    compiled = jax.jit(program(SHAPES[name][0])).lower(*args).compile()
    analysis = compiled.memory_analysis()
    assert analysis is not None, "this backend gives no memory_analysis()"
    jax.block_until_ready(compiled(*args))
    stats = {k: int(v) for k, v in (device.memory_stats() or {}).items()}
    record = {"program": name, "temp_size_in_bytes": int(analysis.temp_size_in_bytes),
              "stats": stats, "jax": jax.__version__}
    (out / f"{name}.json").write_text(json.dumps(record, indent=1))
    print(name, record["temp_size_in_bytes"], stats.get("peak_bytes_reserved"), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--program")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        print(" ".join(SHAPES))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    run(args.out, args.program)


if __name__ == "__main__":
    main()
