"""Remake the XLA dump files under tests/data/xla/ (``python tests/make_xla_dumps.py``).

Runs a few jitted JAX programs on the CPU with ``XLA_FLAGS=--xla_dump_to=...`` in a child
process (the flag must be set before jax is imported) and keeps, for each program's module,
only the four text files the importer reads (``*-live-range.txt``, ``*-buffer-assignment.txt``,
``*-buffer-assignment-values.txt``, ``*-memory-usage-report.txt``):

- ``jit_train_step``: one SGD step of a 4-layer MLP (forward, backward, update);
- ``jit_train_step_donated``: the same with ``donate_argnums=0`` (the parameters' buffers are
  reused by the updated parameters: parameter allocations that are also maybe-live-out);
- ``jit_update_cache``: an in-place ``dynamic_update_slice`` of a KV-cache-like buffer (XLA
  copies the parameter first, then updates the copy in place);
- ``jit_update_cache_donated``: the same with the buffer donated (no copy: updated in place);
- ``jit_rnn_scan``: a ``lax.scan`` (a while loop: phi values, tuple elements).

Made with jax 0.10 on the CPU; other versions write the same files with other numbers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "xla" / "cpu"
KEEP = re.compile(r"^module_\d+\.(jit_train_step|jit_train_step_donated|jit_update_cache|"
                  r"jit_update_cache_donated|jit_rnn_scan)\.[a-z_]*after_optimizations-"
                  r"(live-range|buffer-assignment|buffer-assignment-values|"
                  r"memory-usage-report)\.txt$")

PROGRAM = r'''
import numpy as np
import jax
import jax.numpy as jnp

rng = np.random.default_rng(0)
widths = [256, 512, 512, 512, 10]
params = [(rng.standard_normal((a, b), dtype=np.float32) * 0.05, np.zeros(b, np.float32))
          for a, b in zip(widths[:-1], widths[1:])]
x = rng.standard_normal((128, widths[0]), dtype=np.float32)
y = rng.standard_normal((128, widths[-1]), dtype=np.float32)


def loss(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = jax.nn.relu(h @ w + b)
    w, b = params[-1]
    return jnp.mean((h @ w + b - y) ** 2)


def train_step(params, x, y):
    grads = jax.grad(loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)


def train_step_donated(params, x, y):
    return train_step(params, x, y)


jax.jit(train_step)(params, x, y)
jax.jit(train_step_donated, donate_argnums=0)(params, x, y)


def update_cache(cache, new, index):
    return jax.lax.dynamic_update_slice(cache, new, (index, 0, 0))


def update_cache_donated(cache, new, index):
    return update_cache(cache, new, index)


cache = np.zeros((64, 128, 64), np.float32)
new = np.ones((1, 128, 64), np.float32)
jax.jit(update_cache)(cache, new, 3)
jax.jit(update_cache_donated, donate_argnums=0)(cache, new, 3)


def rnn_scan(h, xs, w):
    def body(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h.sum(axis=0)
    return jax.lax.scan(body, h, xs)


jax.jit(rnn_scan)(np.ones((64, 256), np.float32), np.ones((16, 64, 256), np.float32),
                  np.ones((256, 256), np.float32) * 0.01)
'''


def make(out: Path) -> list[Path]:
    """Run the programs with jax and write the kept dump files into ``out`` (replaced)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={tmp}", JAX_PLATFORMS="cpu")
        subprocess.run([sys.executable, "-c", PROGRAM], env=env, check=True)
        kept = sorted(p for p in Path(tmp).iterdir() if KEEP.match(p.name))
        if not kept:
            raise RuntimeError("jax wrote none of the expected dump files")
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for path in kept:
            shutil.copyfile(path, out / path.name)
    return sorted(out.iterdir())


def main() -> int:
    written = make(OUT)
    total = sum(p.stat().st_size for p in written)
    print(f"{len(written)} files, {total:,} bytes in {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
