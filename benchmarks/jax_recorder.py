"""Benchmark: the JAX recorder's overhead on a training loop of jitted steps.

    python -m benchmarks.jax_recorder [--steps 100] [--hidden 64 256 512] [--repeats 3]

Times ``--steps`` jitted SGD steps of a small MLP (params, grads, donated update) without and
with ``allocsim.traces.record.jax`` (best of ``--repeats``), per hidden width, and prints the
ratio recorded / plain. The recorder sends every call through JAX's Python dispatch path, a
fixed cost per call (about 0.1-0.2 ms on a CPU), so the ratio falls as the step grows.
"""

from __future__ import annotations

import argparse
import itertools
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import allocsim.traces.record

    def loss(params, x, y):
        for w, b in params[:-1]:
            x = jnp.tanh(x @ w + b)
        w, b = params[-1]
        return jnp.mean((x @ w + b - y) ** 2)

    def run(hidden: int) -> float:
        sizes = [128, hidden, hidden, 10]
        key = jax.random.key(0)
        params = []
        for a, b in itertools.pairwise(sizes):
            key, sub = jax.random.split(key)
            params.append((jax.random.normal(sub, (a, b)) * 0.01, jnp.zeros(b)))
        update = jax.jit(lambda p, x, y: jax.tree.map(
            lambda q, g: q - 0.01 * g, p, jax.grad(loss)(p, x, y)), donate_argnums=(0,))
        x, y = jnp.ones((64, 128)), jnp.ones((64, 10))
        params = update(params, x, y)  # compiled before timing
        jax.block_until_ready(params)
        start = time.perf_counter()
        for _ in range(args.steps):
            params = update(params, x, y)
        jax.block_until_ready(params)
        return time.perf_counter() - start

    print(f"jax {jax.__version__} on {jax.devices()[0]}; {args.steps} jitted steps, best of "
          f"{args.repeats}")
    print(f"{'hidden':>6s} {'plain ms':>9s} {'recorded ms':>12s} {'per step +us':>13s} "
          f"{'ratio':>6s} {'events':>7s}")
    for hidden in args.hidden:
        plain = min(run(hidden) for _ in range(args.repeats))
        recorded, events = float("inf"), 0
        for _ in range(args.repeats):
            with allocsim.traces.record.jax(None) as recorder:
                recorded = min(recorded, run(hidden))
            events = len(recorder)
        extra = (recorded - plain) / args.steps * 1e6
        print(f"{hidden:6d} {plain * 1e3:9.2f} {recorded * 1e3:12.2f} {extra:13.1f} "
              f"{recorded / plain:6.2f}x {events:7d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
