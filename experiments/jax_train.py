"""A plain-JAX training script (no optax, no flax): what a JAX user hands to ``allocsim record``.

    allocsim record --framework jax -o run.npz -- python experiments/jax_train.py [--steps 20]

A small transformer-style model (embedding, one attention block, an MLP, a softmax head) trained
with Adam written out by hand. Options choose what changes which buffers live when:

- ``--no-jit``: every op runs eagerly (``jax.disable_jit()``), one buffer per intermediate;
- ``--no-donate``: the update step does not donate its parameters and optimizer state;
- ``--varying``: the sequence length changes every step (32, 64, 128), so the step recompiles
  for each new shape;
- ``--donate-batch``: also donate the token batch, a donation XLA refuses (no output has its
  shape and type: "Some donated buffers were not usable"), so the batch stays live;
- ``--size``: the model's vocabulary, width and MLP width (:data:`SIZES`; ``small``, the
  default, is the shipped recordings' 25-46 MiB model; ``large`` the DIM 1024 / HIDDEN 4096 /
  VOCAB 8192 block a reviewer ran at 816 MiB live, issue 40).

Seeded: the same options give the same buffers (times are the run's).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

VOCAB, DIM, HIDDEN, BATCH = 512, 128, 512, 16
SIZES = {"small": (512, 128, 512), "medium": (2048, 512, 2048), "large": (8192, 1024, 4096)}


def use_size(name: str) -> None:
    """Set the model's (VOCAB, DIM, HIDDEN) for this process: a script's one run, chosen once
    before anything is built."""
    global VOCAB, DIM, HIDDEN
    VOCAB, DIM, HIDDEN = SIZES[name]


def init_params(key: jax.Array) -> dict[str, jax.Array]:
    keys = jax.random.split(key, 6)
    scale = DIM ** -0.5
    return {
        "embed": jax.random.normal(keys[0], (VOCAB, DIM)) * scale,
        "qkv": jax.random.normal(keys[1], (DIM, 3 * DIM)) * scale,
        "out": jax.random.normal(keys[2], (DIM, DIM)) * scale,
        "up": jax.random.normal(keys[3], (DIM, HIDDEN)) * scale,
        "down": jax.random.normal(keys[4], (HIDDEN, DIM)) * HIDDEN ** -0.5,
        "head": jax.random.normal(keys[5], (DIM, VOCAB)) * scale,
    }


def loss_fn(params: dict[str, jax.Array], tokens: jax.Array, targets: jax.Array) -> jax.Array:
    x = params["embed"][tokens]                                   # [B, T, D]
    q, k, v = jnp.split(x @ params["qkv"], 3, axis=-1)
    attention = jax.nn.softmax(q @ k.transpose(0, 2, 1) / np.sqrt(DIM), axis=-1)
    x = x + (attention @ v) @ params["out"]
    x = x + jax.nn.gelu(x @ params["up"]) @ params["down"]
    logits = x @ params["head"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1))


def adam_step(params: Any, opt: Any, tokens: jax.Array, targets: jax.Array,
              step: jax.Array) -> tuple[Any, Any, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
    m, v = opt
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
    v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
    t = step + 1.0
    params = jax.tree.map(
        lambda p, m, v: p - 1e-3 * (m / (1 - 0.9 ** t)) / (jnp.sqrt(v / (1 - 0.999 ** t)) + 1e-8),
        params, m, v)
    return params, (m, v), loss


def batches(steps: int, varying: bool, seed: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    for step in range(steps):
        length = (32, 64, 128)[step % 3] if varying else 64
        tokens = rng.integers(0, VOCAB, size=(BATCH, length + 1))
        yield tokens[:, :-1], tokens[:, 1:]


def train(steps: int = 20, *, jit: bool = True, donate: bool = True,
          varying: bool = False, donate_batch: bool = False) -> float:
    """Train for ``steps`` steps; returns the last loss."""
    step_fn = adam_step
    if jit:
        donated = ((0, 1) if donate else ()) + ((2,) if donate_batch else ())
        step_fn = jax.jit(adam_step, donate_argnums=donated)
    mode = contextlib.nullcontext() if jit else jax.disable_jit()
    with mode:
        params = init_params(jax.random.key(0))
        opt = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))
        loss = jnp.zeros(())
        for step, (tokens, targets) in enumerate(batches(steps, varying)):
            params, opt, loss = step_fn(params, opt, jnp.asarray(tokens), jnp.asarray(targets),
                                        jnp.asarray(float(step)))
        return float(loss)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-jit", action="store_true", help="run every op eagerly")
    parser.add_argument("--no-donate", action="store_true", help="do not donate the state")
    parser.add_argument("--varying", action="store_true", help="vary the sequence length")
    parser.add_argument("--donate-batch", action="store_true",
                        help="also donate the token batch (a donation XLA refuses)")
    parser.add_argument("--size", choices=list(SIZES), default="small",
                        help="vocabulary, width and MLP width (default small)")
    args = parser.parse_args(argv)
    use_size(args.size)
    if args.donate_batch:
        import warnings
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    loss = train(args.steps, jit=not args.no_jit, donate=not args.no_donate,
                 varying=args.varying, donate_batch=args.donate_batch)
    print(f"trained {args.steps} steps, last loss {loss:.4f}")


if __name__ == "__main__":
    main()
