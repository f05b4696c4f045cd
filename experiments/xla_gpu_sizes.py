"""Decoder-only transformer training steps of ~100M to ~7B parameters compiled for XLA:GPU
without a GPU, with donation and rematerialisation on and off: the traces the `compilation`
and `donation` experiments replay.

``python -m experiments.xla_gpu_sizes [--sizes 125m 1.3b 2.7b 6.7b] [--force]`` compiles one
SGD-with-momentum step (f32; batch 8 × 1024 tokens; the model of experiments/jax_gpu_1b.py
with its width and depth as named below) for the H100-80GB target with
:func:`allocsim.traces.record.xla_gpu.compile_for` for each size × donate (parameters and
momentum donated or not) × remat (each block ``jax.checkpoint``-ed or not), and the 1.3B step
with remat at batch 2 and 32 and sharded over 4 GPUs (``VARIANTS``), and writes
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

from allocsim.traces.record import xla_gpu

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


def build(d_model: int, layers: int, heads: int, mlp: int, remat: bool,
          batch: int = BATCH):  # jax types
    import jax
    import jax.numpy as jnp

    def init(key):
        keys = iter(jax.random.split(key, 4 * layers + 2))

        def dense(n_in, n_out):
            return jax.random.normal(next(keys), (n_in, n_out), jnp.float32) * n_in ** -0.5

        blocks = [{"qkv": dense(d_model, 3 * d_model), "out": dense(d_model, d_model),
                   "up": dense(d_model, mlp), "down": dense(mlp, d_model),
                   "norm1": jnp.ones(d_model), "norm2": jnp.ones(d_model)}
                  for _ in range(layers)]
        return {"embed": dense(VOCAB, d_model), "layers": blocks, "norm": jnp.ones(d_model),
                "head": dense(d_model, VOCAB)}

    def norm(x, scale):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale

    def block(x, p):
        b, t, _ = x.shape
        q, k, v = jnp.split(norm(x, p["norm1"]) @ p["qkv"], 3, axis=-1)
        split = lambda a: a.reshape(b, t, heads, d_model // heads)  # noqa: E731
        scores = jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) / (d_model // heads) ** 0.5
        mask = jnp.tril(jnp.ones((t, t), bool))
        attn = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", attn, split(v)).reshape(b, t, d_model) @ p["out"]
        return x + jax.nn.gelu(norm(x, p["norm2"]) @ p["up"]) @ p["down"]

    def loss(params, tokens):
        x = params["embed"][tokens[:, :-1]]
        for p in params["layers"]:
            x = jax.checkpoint(block)(x, p) if remat else block(x, p)
        logits = norm(x, params["norm"]) @ params["head"]
        labels = jax.nn.one_hot(tokens[:, 1:], VOCAB)
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels, -1))

    def train_step(state, tokens):
        params, momentum = state
        value, grads = jax.value_and_grad(loss)(params, tokens)
        momentum = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
        params = jax.tree.map(lambda p, m: p - 1e-4 * m, params, momentum)
        return (params, momentum), value

    params = jax.eval_shape(init, jax.random.key(0))
    # Two pytrees of the same abstract leaves would be one array per leaf object; copy them so
    # the momentum is arrays of its own.
    momentum = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
    tokens = jax.ShapeDtypeStruct((batch, LENGTH + 1), jnp.int32)
    return train_step, (params, momentum), tokens


def file_name(size: str, donate: bool, remat: bool) -> str:
    return f"{size}-{'donate' if donate else 'nodonate'}-{'remat' if remat else 'noremat'}.npz"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--force", action="store_true", help="compile files that exist again")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
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
                print(f"{path.name}: {len(trace):,} events, peak live "
                      f"{trace.peak_live()[0]:,} B ({time.perf_counter() - started:.0f} s)",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
