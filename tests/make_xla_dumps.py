"""Remake the XLA dump files under tests/data/xla/ (``python tests/make_xla_dumps.py [cpu]
[gpu]``).

Compiles a few jitted JAX programs with ``XLA_FLAGS=--xla_dump_to=...`` in a child process
(the flag must be set before jax is imported) — for XLA:CPU into ``cpu/``, or (``gpu``, which
needs jax's CUDA plugin and no GPU) for XLA:GPU with the h100-80g target into ``gpu/`` —
and keeps ``memory_analysis.json`` (each module's ``argument``, ``output``, ``alias`` and
``temp`` bytes as ``compile().memory_analysis()`` gives them) and, for each program's module,
only the four text files the importer reads (``*-live-range.txt``, ``*-buffer-assignment.txt``,
``*-buffer-assignment-values.txt``, ``*-memory-usage-report.txt``):

- ``jit_train_step``: one SGD step of a 4-layer MLP (forward, backward, update);
- ``jit_train_step_donated``: the same with ``donate_argnums=0`` (the parameters' buffers are
  reused by the updated parameters: parameter allocations that are also maybe-live-out);
- ``jit_update_cache``: an in-place ``dynamic_update_slice`` of a KV-cache-like buffer (XLA
  copies the parameter first, then updates the copy in place);
- ``jit_update_cache_donated``: the same with the buffer donated (no copy: updated in place);
- ``jit_rnn_scan``: a ``lax.scan`` (a while loop: phi values, tuple elements).

Made with jax 0.10.2; other versions write the same files with other numbers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "xla" / "cpu"  # gpu/ beside it
KEEP = re.compile(r"^module_\d+\.(jit_train_step|jit_train_step_donated|jit_update_cache|"
                  r"jit_update_cache_donated|jit_rnn_scan)\.(sm_[0-9.]+a?_)?[a-z_]*"
                  r"after_optimizations-"
                  r"(live-range|buffer-assignment|buffer-assignment-values|"
                  r"memory-usage-report)\.txt$")

PROGRAM = r"""
import json
import os
import sys

import numpy as np
import jax
import jax.numpy as jnp

MODE, OUT = sys.argv[1], sys.argv[2]
if MODE == "gpu":   # compile for a GPU without one (allocsim.traces.record.xla_gpu)
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec
    topology = topologies.get_topology_desc(platform="cuda", target_config=sys.argv[3],
                                            topology="1x1x1")
    SHARDING = NamedSharding(topologies.make_mesh(topology, (1,), ("d",)), PartitionSpec())
ANALYSIS = {}


def compile_(f, args, donate=()):
    # Lower and compile (XLA writes the dump files); keep memory_analysis() beside them.
    if MODE == "gpu":
        args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.asarray(a).dtype,
                                                           sharding=SHARDING), args)
    m = jax.jit(f, donate_argnums=donate).lower(*args).compile().memory_analysis()
    ANALYSIS["jit_" + f.__name__] = {
        key: int(getattr(m, key + "_size_in_bytes"))
        for key in ("argument", "output", "alias", "temp")}


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


compile_(train_step, (params, x, y))
compile_(train_step_donated, (params, x, y), donate=0)


def update_cache(cache, new, index):
    return jax.lax.dynamic_update_slice(cache, new, (index, 0, 0))


def update_cache_donated(cache, new, index):
    return update_cache(cache, new, index)


cache = np.zeros((64, 128, 64), np.float32)
new = np.ones((1, 128, 64), np.float32)
compile_(update_cache, (cache, new, np.int32(3)))
compile_(update_cache_donated, (cache, new, np.int32(3)), donate=0)


def rnn_scan(h, xs, w):
    def body(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h.sum(axis=0)
    return jax.lax.scan(body, h, xs)


compile_(rnn_scan, (np.ones((64, 256), np.float32), np.ones((16, 64, 256), np.float32),
                    np.ones((256, 256), np.float32) * 0.01))
with open(OUT, "w") as f:
    json.dump({"jax": jax.__version__, "modules": ANALYSIS}, f, indent=1, sort_keys=True)
"""

GPU_TARGET = "h100-80g"
ANALYSIS_FILE = "memory_analysis.json"


def gpu_environment() -> dict[str, str]:
    """What the CUDA plugin needs to compile without a GPU (trace-formats: "XLA:GPU without a
    GPU"): no device visible, its version check (which calls cuInit) skipped."""
    return {"CUDA_VISIBLE_DEVICES": "-1", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1",
            "JAX_PLATFORMS": "cpu"}


def make(out: Path, mode: str = "cpu") -> list[Path]:
    """Compile the programs with jax (``mode`` ``cpu``, or ``gpu``: for the h100-80g target,
    deviceless; needs allocsim[jax-gpu]) and write the kept dump files and memory_analysis.json
    (each module's argument, output, alias and temp bytes) into ``out`` (replaced)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={tmp}", JAX_PLATFORMS="cpu")
        argv = [sys.executable, "-c", PROGRAM, mode, str(Path(tmp) / ANALYSIS_FILE)]
        if mode == "gpu":
            from allocsim.traces.record.gpu_targets import target_config
            env.update(gpu_environment())
            argv.append(target_config(GPU_TARGET).text)
        subprocess.run(argv, env=env, check=True)
        kept = sorted(p for p in Path(tmp).iterdir() if KEEP.match(p.name))
        if not kept:
            raise RuntimeError("jax wrote none of the expected dump files")
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for path in [*kept, Path(tmp) / ANALYSIS_FILE]:
            shutil.copyfile(path, out / path.name)
    return sorted(out.iterdir())


def main() -> int:
    modes = sys.argv[1:] or ["cpu"]
    for mode in modes:
        if mode not in ("cpu", "gpu"):
            print(f"usage: python tests/make_xla_dumps.py [cpu] [gpu]; got {mode!r}")
            return 2
        folder = OUT.parent / mode
        written = make(folder, mode)
        total = sum(p.stat().st_size for p in written)
        print(f"{len(written)} files, {total:,} bytes in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
