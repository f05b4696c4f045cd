"""A training step compiled for a GPU on a machine without one, its trace written for CI.

    python docs/examples/gpu_step.py -o step.npz [--target h100-80g] [--hidden 4096]
        [--layers 8] [--batch 64] [--steps 3]

An MLP of ``--layers`` square ``--hidden`` layers trained by SGD with momentum (parameters and
momentum donated), compiled with XLA:GPU for ``--target`` (a device profile of ``allocsim
devices``) by :func:`allocsim.traces.record.xla_gpu.compile_for`: no GPU, no array allocated.
``allocsim baseline step.npz --device TARGET`` records what the allocators need for it;
``allocsim check`` after a change to the program says whether its GPU memory grew (docs/jax.md,
"CI for a JAX program's GPU memory"). Needs ``pip install -e ".[jax-gpu]"``.
"""

from __future__ import annotations

import argparse
import sys

from allocsim.errors import UserInputError
from allocsim.traces.record import xla_gpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True, help="trace file to write (.npz)")
    parser.add_argument("--target", default="h100-80g", help="device profile (allocsim devices)")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)

    xla_gpu.prepare()  # before jax is imported: no device visible, no cuInit
    import jax
    import jax.numpy as jnp

    width = args.hidden
    params = [jax.ShapeDtypeStruct((width, width), jnp.float32) for _ in range(args.layers)]
    batch = jax.ShapeDtypeStruct((args.batch, width), jnp.float32)

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    def train_step(state, x):
        ws, momentum = state
        grads = jax.grad(loss)(ws, x)
        momentum = [0.9 * m + g for m, g in zip(momentum, grads)]
        return ([w - 0.01 * m for w, m in zip(ws, momentum)], momentum)

    try:
        trace = xla_gpu.compile_for(train_step, ((params, params), batch), donate_argnums=0,
                                    target=args.target, output=args.output,
                                    schedule=xla_gpu.Schedule(steps=args.steps,
                                                              batch_argnums=(1,)))
    except UserInputError as err:  # an unknown target, the plugin missing, ...: one line
        print(f"gpu_step: error: {err}", file=sys.stderr)
        return 2
    peak, _ = trace.peak_live()
    print(f"wrote {args.output}: {len(trace):,} events, peak live {peak:,} B on {args.target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
