"""Record one GPT training step on the chip at several model sizes and in four forms.

    python experiments/tpu/step_sizes_probe.py OUT --step NAME     (one form, one process)
    python experiments/tpu/step_sizes_probe.py OUT --list          (the names, in run order)
    python experiments/tpu/step_sizes_probe.py OUT --share ROLE     (two processes, one chip)

Issue 40's reviewer broke "jit alone raises the smallest device" by changing the model size: it
came from one 25-33 MiB CPU recording. This records the same step (experiments/gpt_step.py)
on the TPU at four sizes, each in four forms — op by op (``eager``), ``jax.jit`` without
donation (``jit``), with the state donated (``jit-donate``) and with each block
rematerialised as well (``jit-remat-donate``) — one process each, so ``peak_bytes_in_use`` is
the form's own. Each run is a profiler session from before the state is placed to after two
steps, so the runtime's own ``MemoryAllocation`` records (``OUT/NAME/…xplane.pb``) hold every
buffer the form needed; ``OUT/NAME.json`` keeps ``memory_stats()`` at each stage and, for the
jitted forms, ``memory_analysis()``. experiments/tpu/step_sizes.py reads what this records.

``--share holder`` / ``--share second``: whether a second process can use a chip a first one
holds (the question two jobs sharing one card asks on a GPU).

Runs with JAX and numpy alone (the chip has no allocsim installed).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))   # run as a script on the chip: the repository's modules too
from experiments.tpu.chip_probe import _profile_options, _stats  # noqa: E402

# name: (d_model, layers, heads, mlp, vocab). "mid" is the reviewer's DIM 1024 / HIDDEN 4096 /
# VOCAB 8192 block; 125m and 350m are GPT-3's table 2.1 shapes at a 32,000-token vocabulary.
SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "small": (512, 4, 8, 2048, 8192),
    "mid": (1024, 4, 16, 4096, 8192),
    "125m": (768, 12, 12, 3072, 32000),
    "350m": (1024, 24, 16, 4096, 32000),
}
FORMS = ("eager", "jit", "jit-donate", "jit-remat-donate")
BATCH, LENGTH = 8, 512


def step_names() -> list[str]:
    """Every size in every form, smallest size first (what a short run keeps)."""
    return [f"{size}-{form}" for size in SIZES for form in FORMS]


def run_step(out: Path, name: str) -> None:
    """Place the state, run two steps of one form, and keep the stats and records."""
    import jax
    import jax.numpy as jnp

    from experiments import gpt_step
    size, form = name.split("-", 1)
    d_model, layers, heads, mlp, vocab = SIZES[size]
    device = jax.devices()[0]
    record: dict[str, Any] = {
        "probe": name, "size": size, "form": form, "batch": BATCH, "length": LENGTH,
        "dims": [d_model, layers, heads, mlp], "vocab": vocab,
        "versions": {"jax": jax.__version__, "jaxlib": _version("jaxlib"),
                     "libtpu": _version("libtpu")},
        "device": str(device.device_kind), "stages": {}}
    stages = record["stages"]
    stages["start"] = _stats(device)
    options = _profile_options()
    jax.profiler.start_trace(str(out / name), **({} if options is None
                                                  else {"profiler_options": options}))
    try:
        step, abstract = gpt_step.build(d_model, layers, heads, mlp,
                                        remat="remat" in form, vocab=vocab)
        state = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), abstract)
        tokens = jnp.zeros((BATCH, LENGTH + 1), jnp.int32)
        jax.block_until_ready((state, tokens))
        stages["placed"] = _stats(device)
        if form == "eager":
            run = step
        else:
            jitted = jax.jit(step, donate_argnums=(0,) if "donate" in form else ())
            t = time.perf_counter()
            compiled = jitted.lower(state, tokens).compile()
            record["compile_s"] = time.perf_counter() - t
            analysis = compiled.memory_analysis()
            record["memory_analysis"] = {k: int(getattr(analysis, k)) for k in dir(analysis)
                                         if k.endswith("_in_bytes")}
            stages["compiled"] = _stats(device)
            run = compiled
        times = []
        for _ in range(2):
            t = time.perf_counter()
            state, loss = run(state, tokens)
            jax.block_until_ready((state, loss))
            times.append(time.perf_counter() - t)
            stages[f"step{len(times)}"] = _stats(device)
        record["step_s"] = times
    except Exception:
        record["error"] = traceback.format_exc()[-4000:]
    finally:
        jax.profiler.stop_trace()
    (out / f"{name}.json").write_text(json.dumps(record, indent=1))
    peak = record["stages"].get("step2", {}).get("peak_bytes_in_use")
    print(f"{name}: peak_bytes_in_use {peak} {'ERROR' if 'error' in record else ''}",
          flush=True)


def _version(package: str) -> str:
    from importlib import metadata
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def run_share(out: Path, role: str) -> None:
    """``holder`` holds 1 GiB on the chip for 25 s; ``second`` (started while it does) tries
    to use the chip and writes what happened."""
    t = time.perf_counter()
    record: dict[str, Any] = {"role": role}
    try:
        import jax
        import jax.numpy as jnp
        device = jax.devices()[0]
        record["platform"] = device.platform
        x = jnp.ones((1 << 28,), jnp.float32)   # 1 GiB
        x.block_until_ready()
        record["stats"] = _stats(device)
        if role == "holder":
            time.sleep(25)
    except Exception as error:   # what the second process is told, verbatim
        record["error"] = f"{type(error).__name__}: {error}"[-2000:]
    record["seconds"] = time.perf_counter() - t
    (out / f"share-{role}.json").write_text(json.dumps(record, indent=1))
    print(f"share {role}: {record.get('platform')} {record.get('error', 'ok')[:300]}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--step")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--share", choices=("holder", "second"))
    args = parser.parse_args()
    if args.list:
        print(" ".join(step_names()))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if args.share:
        run_share(args.out, args.share)
    elif args.step:
        run_step(args.out, args.step)
    gc.collect()


if __name__ == "__main__":
    main()
