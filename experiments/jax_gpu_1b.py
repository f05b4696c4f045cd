"""A 1.3B-parameter transformer training step compiled for GPUs without one (docs/jax.md, "JAX
at full size on XLA:GPU").

``python -m experiments.jax_gpu_1b -o DIR [--targets h100-80g a100-40g l4-24g] [--steps 3]``
compiles one SGD-with-momentum step of a decoder-only transformer (d_model 2048, 24 layers,
16 heads, MLP 8192, vocabulary 32,000; batch 8 × 1024 tokens; f32; each block rematerialised
(``jax.checkpoint``); parameters and momentum donated) for each target with
:func:`allocsim.traces.record.xla_gpu.compile_for` and writes ``DIR/step-TARGET.npz`` (the
runtime's allocations over ``--steps`` steps) and ``DIR/compile.json`` (memory_analysis and
compile time per target). No GPU and no array: the arguments are ``jax.eval_shape`` of the
initialiser. Needs ``pip install -e '.[jax-gpu]'``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from allocsim.traces.record import xla_gpu
from experiments import gpt_step

xla_gpu.prepare()  # before jax is imported: the CUDA plugin with no device visible

D_MODEL, LAYERS, HEADS, MLP, VOCAB = 2048, 24, 16, 8192, 32000
BATCH, LENGTH = 8, 1024


def build(remat: bool = True) -> tuple[Any, Any, Any]:
    """The 1.3B step, its abstract state and token batch (experiments/gpt_step.py)."""
    step, state = gpt_step.build(D_MODEL, LAYERS, HEADS, MLP, remat=remat, vocab=VOCAB)
    return step, state, gpt_step.tokens(BATCH, LENGTH)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", required=True, type=Path)
    parser.add_argument("--targets", nargs="+", default=["h100-80g", "a100-40g", "l4-24g"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-remat", action="store_true",
                        help="keep every block's activations for the backward pass")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    train_step, state, tokens = build(remat=not args.no_remat)
    import jax
    n_params = sum(leaf.size for leaf in jax.tree.leaves(state[0]))
    targets: dict[str, dict[str, Any]] = {}
    found = {"parameters": int(n_params), "targets": targets}
    for target in args.targets:
        started = time.perf_counter()
        trace = xla_gpu.compile_for(train_step, (state, tokens), donate_argnums=0,
                                    target=target,
                                    schedule=xla_gpu.Schedule(steps=args.steps,
                                                              batch_argnums=(1,)),
                                    output=args.out / f"step-{target}.npz",
                                    keep_dump=args.out / f"dump-{target}")
        seconds = time.perf_counter() - started
        (executable,) = trace.metadata["xla_gpu"]["executables"]
        targets[target] = {**executable, "compile_s": round(seconds, 1),
                           "peak_live": int(trace.peak_live()[0])}
        print(f"{target}: {n_params / 1e9:.2f}B parameters, arguments {executable['argument']:,}"
              f" B, temp {executable['temp']:,} B, output {executable['output']:,} B "
              f"(aliased {executable['alias']:,}), peak live {trace.peak_live()[0]:,} B "
              f"({seconds:.1f} s)")
    (args.out / "compile.json").write_text(json.dumps(found, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
