"""What compile_for costs over a plain deviceless compile (issue 26: within 1.5×).

``python -m benchmarks.xla_gpu [--repeats 3] [--layers 8] [--width 2048]`` compiles the
same MLP training step for the h100-80g target, alternating plain
``jax.jit(step, donate_argnums=0).lower(*args).compile()`` and
:func:`allocsim.traces.record.xla_gpu.compile_for` (which adds XLA's dump files, reading them and
the replay), a fresh function each time (no compilation cache), and prints the median seconds
of each and their ratio. Needs ``pip install -e '.[jax-gpu]'``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from allocsim.traces.record import xla_gpu

xla_gpu.prepare()


def make_step(layers: int) -> Callable[..., Any]:  # a fresh function: jax caches per function
    import jax
    import jax.numpy as jnp

    def loss(params, x):
        for w in params:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    def train_step(params, x):
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, jax.grad(loss)(params, x))
    return train_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=2048)
    args = parser.parse_args(argv)
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec

    from allocsim.traces.record.gpu_targets import target_config
    params = [jax.ShapeDtypeStruct((args.width, args.width), jnp.float32)
              for _ in range(args.layers)]
    x = jax.ShapeDtypeStruct((256, args.width), jnp.float32)
    topology = topologies.get_topology_desc(platform="cuda", topology="1x1x1",
                                            target_config=target_config("h100-80g").text)
    sharding = NamedSharding(topologies.make_mesh(topology, (1,), ("d",)), PartitionSpec())
    placed = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                          (params, x))
    plain, ours = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        jax.jit(make_step(args.layers), donate_argnums=0).lower(*placed).compile()
        plain.append(time.perf_counter() - started)
        started = time.perf_counter()
        xla_gpu.compile_for(make_step(args.layers), (params, x), donate_argnums=0,
                            target="h100-80g")
        ours.append(time.perf_counter() - started)
    a, b = statistics.median(plain), statistics.median(ours)
    print(f"plain lower().compile(): {a:.2f} s; compile_for: {b:.2f} s (median of "
          f"{args.repeats}, alternating); ratio {b / a:.2f}x (target <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
