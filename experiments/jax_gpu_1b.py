"""A 1.3B-parameter transformer training step compiled for GPUs without one (README, "JAX at
full size on XLA:GPU").

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

from allocsim.traces.record import xla_gpu

xla_gpu.prepare()  # before jax is imported: the CUDA plugin with no device visible

D_MODEL, LAYERS, HEADS, MLP, VOCAB = 2048, 24, 16, 8192, 32000
BATCH, LENGTH = 8, 1024


def build(remat: bool = True):  # returns (step, state, tokens): jax types
    import jax
    import jax.numpy as jnp

    def init(key):
        keys = iter(jax.random.split(key, 4 * LAYERS + 2))

        def dense(n_in, n_out):
            return jax.random.normal(next(keys), (n_in, n_out), jnp.float32) * n_in ** -0.5

        layers = [{"qkv": dense(D_MODEL, 3 * D_MODEL), "out": dense(D_MODEL, D_MODEL),
                   "up": dense(D_MODEL, MLP), "down": dense(MLP, D_MODEL),
                   "norm1": jnp.ones(D_MODEL), "norm2": jnp.ones(D_MODEL)}
                  for _ in range(LAYERS)]
        return {"embed": dense(VOCAB, D_MODEL), "layers": layers, "norm": jnp.ones(D_MODEL),
                "head": dense(D_MODEL, VOCAB)}

    def norm(x, scale):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale

    def block(x, p):
        b, t, _ = x.shape
        q, k, v = jnp.split(norm(x, p["norm1"]) @ p["qkv"], 3, axis=-1)
        heads = lambda a: a.reshape(b, t, HEADS, D_MODEL // HEADS)  # noqa: E731
        scores = jnp.einsum("bqhd,bkhd->bhqk", heads(q), heads(k)) / (D_MODEL // HEADS) ** 0.5
        mask = jnp.tril(jnp.ones((t, t), bool))
        attn = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", attn, heads(v)).reshape(b, t, D_MODEL) @ p["out"]
        return x + jax.nn.gelu(norm(x, p["norm2"]) @ p["up"]) @ p["down"]

    def loss(params, tokens):
        x = params["embed"][tokens[:, :-1]]
        for p in params["layers"]:
            # Rematerialised in the backward pass (as 1B runs do) unless --no-remat.
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
    state = (params, params)
    tokens = jax.ShapeDtypeStruct((BATCH, LENGTH + 1), jnp.int32)
    return train_step, state, tokens


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
    found = {"parameters": int(n_params), "targets": {}}
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
        found["targets"][target] = {**executable, "compile_s": round(seconds, 1),
                                    "peak_live": int(trace.peak_live()[0])}
        print(f"{target}: {n_params / 1e9:.2f}B parameters, arguments {executable['argument']:,}"
              f" B, temp {executable['temp']:,} B, output {executable['output']:,} B "
              f"(aliased {executable['alias']:,}), peak live {trace.peak_live()[0]:,} B "
              f"({seconds:.1f} s)")
    (args.out / "compile.json").write_text(json.dumps(found, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
