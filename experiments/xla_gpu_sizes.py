"""Decoder-only transformer training steps of ~100M to ~7B parameters compiled for XLA:GPU
without a GPU, with donation and rematerialisation on and off: the traces the `compilation`
and `donation` experiments replay.

``python -m experiments.xla_gpu_sizes [--sizes 125m 1.3b 2.7b 6.7b] [--force]`` compiles one
SGD-with-momentum step (f32; batch 8 × 1024 tokens; the model of experiments/jax_gpu_1b.py
with its width and depth as named below) for the H100-80GB target with
:func:`allocsim.traces.record.xla_gpu.compile_for` for each size × donate (parameters and
momentum donated or not) × remat (each block ``jax.checkpoint``-ed or not), and the 1.3B step
with remat at batch 2 and 32 and sharded over 4 GPUs (``VARIANTS``) and without remat at batch
4 and 16 and on an A100-80GB and an L4-24GB target (``NOREMAT_VARIANTS``), and writes
``experiments/data/xla_gpu/NAME-{donate,nodonate}-{remat,noremat}.npz``: what JAX's runtime
asks its allocator over 3 steps (the state made before the first call; per call the batch, the
temp and the outputs no donated argument aliases). A file that exists is kept (the compile
cache: 16 compiles take minutes on 2 cores); ``--force`` compiles again. No array is allocated.
Needs ``pip install -e '.[jax-gpu]'``. The files carry no path or machine detail: only the
buffers, synthetic times and the compile's memory_analysis.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from allocsim.traces.record import xla_gpu
from experiments import gpt_step
from experiments.runner.versions import stamp

xla_gpu.prepare()  # before jax is imported: the CUDA plugin with no device visible

OUT = Path(__file__).resolve().parent / "data" / "xla_gpu"
TARGET = "h100-80g"
BATCH, LENGTH, VOCAB, STEPS = 8, 1024, 32000, 3
# name: (d_model, layers, heads, mlp) — GPT-3 paper / OPT shapes at 125M, 1.3B, 2.7B, 6.7B.
SIZES = {"125m": (768, 12, 12, 3072), "1.3b": (2048, 24, 16, 8192),
         "2.7b": (2560, 32, 32, 10240), "6.7b": (4096, 32, 32, 16384)}


# Beside the sizes: the 1.3B step (remat on) at other batch sizes and sharded over 4 GPUs
# (FSDP: each argument's largest dimension split; the trace is one device's), donated or not.
VARIANTS = {"1.3b-b2": ("1.3b", 2, 1), "1.3b-b32": ("1.3b", 32, 1), "1.3b-4gpu": ("1.3b", 8, 4)}
# Issue 40: "donation raises peak live at 1.3B without remat" came from one card and one batch;
# the 1.3B step without remat at batch 4 and 16 on the H100, and at batch 8 on an A100-80GB and
# an L4-24GB, donated or not: name: (size, batch, target).
NOREMAT_VARIANTS = {"1.3b-b4": ("1.3b", 4, "h100-80g"), "1.3b-b16": ("1.3b", 16, "h100-80g"),
                    "1.3b-a100-80g": ("1.3b", 8, "a100-80g"), "1.3b-l4": ("1.3b", 8, "l4-24g")}


def build(d_model: int, layers: int, heads: int, mlp: int, remat: bool,
          batch: int = BATCH) -> tuple[Any, Any, Any]:
    """One size's step, abstract state and token batch (experiments/gpt_step.py)."""
    step, state = gpt_step.build(d_model, layers, heads, mlp, remat=remat, vocab=VOCAB)
    return step, state, gpt_step.tokens(batch, LENGTH)


def file_name(size: str, donate: bool, remat: bool) -> str:
    return f"{size}-{'donate' if donate else 'nodonate'}-{'remat' if remat else 'noremat'}.npz"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--force", action="store_true", help="compile files that exist again")
    parser.add_argument("--noremat-variants", nargs="*", default=list(NOREMAT_VARIANTS),
                        choices=list(NOREMAT_VARIANTS))
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    for variant in args.noremat_variants:
        size, batch, target = NOREMAT_VARIANTS[variant]
        for donate in (True, False):
            path = OUT / file_name(variant, donate, False)
            if path.exists() and not args.force:
                print(f"{path.name}: kept (--force compiles again)")
                continue
            step, state, tokens = build(*SIZES[size], remat=False, batch=batch)
            started = time.perf_counter()
            trace = xla_gpu.compile_for(step, (state, tokens),
                                        donate_argnums=0 if donate else (), target=target,
                                        schedule=xla_gpu.Schedule(steps=STEPS,
                                                                  batch_argnums=(1,)),
                                        output=path)
            stamp(OUT, [path.name])
            print(f"{path.name}: {len(trace):,} events, peak live {trace.peak_live()[0]:,} B "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    for variant in args.variants:
        size, batch, devices = VARIANTS[variant]
        for donate in (True, False):
            path = OUT / file_name(variant, donate, True)
            if path.exists() and not args.force:
                print(f"{path.name}: kept (--force compiles again)")
                continue
            step, state, tokens = build(*SIZES[size], remat=True, batch=batch)
            started = time.perf_counter()
            trace = xla_gpu.compile_for(step, (state, tokens),
                                        donate_argnums=0 if donate else (), target=TARGET,
                                        schedule=xla_gpu.Schedule(steps=STEPS,
                                                                  batch_argnums=(1,)),
                                        devices=devices, output=path)
            stamp(OUT, [path.name])
            print(f"{path.name}: {len(trace):,} events, peak live {trace.peak_live()[0]:,} B "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    for size in args.sizes:
        for remat in (True, False):
            for donate in (True, False):
                path = OUT / file_name(size, donate, remat)
                if path.exists() and not args.force:
                    print(f"{path.name}: kept (--force compiles again)")
                    continue
                step, state, tokens = build(*SIZES[size], remat=remat)
                started = time.perf_counter()
                trace = xla_gpu.compile_for(step, (state, tokens),
                                            donate_argnums=0 if donate else (), target=TARGET,
                                            schedule=xla_gpu.Schedule(steps=STEPS,
                                                                      batch_argnums=(1,)),
                                            output=path)
                stamp(OUT, [path.name])
                print(f"{path.name}: {len(trace):,} events, peak live "
                      f"{trace.peak_live()[0]:,} B ({time.perf_counter() - started:.0f} s)",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
