"""Full-size JAX training jobs compiled for XLA:GPU without a GPU: the population that
preallocate_vs_grow, fragmentation and arena_vs_growth are judged on (a shared helper of those
three experiments; it writes only under ``experiments/data/xla-gpu/``).

``python -m experiments.preallocate_vs_grow.xla_jobs [--only NAME ...]`` compiles each job of
:data:`JOBS` with :func:`allocsim.traces.record.xla_gpu.compile_for` (deviceless, no array
allocated) and writes

- ``experiments/data/xla-gpu/NAME.npz``: what JAX's runtime asks its allocator over the
  schedule (the arguments as arrays, then per call the preallocated temp and the outputs no
  donated argument aliases) — **measured**: XLA:GPU's own buffer assignment for that target;
- ``NAME.buffers.npz`` (jobs with ``buffers=True``): one execution's logical buffers over their
  live ranges (the dump's ``buffers`` view: what an online allocator would be asked if every
  buffer were its own malloc — the input of the arena question);
- ``index.json``: each job's settings, parameter count, ``memory_analysis()`` and the jax,
  jaxlib, libtpu and XLA versions it was compiled with (experiments/runner/versions.py).

The programs: a decoder-only transformer (pre-norm, GELU MLP, causal softmax attention;
vocabulary 32,000; f32; SGD with momentum, parameters and momentum the train state), at five
sizes from 0.13B to 6.7B parameters (GPT-3's 125M / 350M / 1.3B / 2.7B / 6.7B shapes). What is
*not* in these traces (XLA's buffer assignment does not have it): cuBLAS/cuDNN workspaces,
autotuning scratch, NCCL buffers, CUDA-graph memory, the CUDA context. Times are synthesised
(``synthetic_times``): no slowdown measured on them is a finding.

Compiling all of :data:`JOBS` took about 45 minutes on 2 shared cores; the files are
committed, so the experiments never compile.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from allocsim.atomic_files import write_text
from allocsim.traces.record import xla_gpu
from experiments import gpt_step
from experiments.runner.versions import installed

xla_gpu.prepare()  # before jax is imported: the CUDA plugin with no device visible

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "experiments" / "data" / "xla-gpu"

SIZES, VOCAB = gpt_step.SIZES, gpt_step.VOCAB


@dataclass(frozen=True)
class Job:
    """One compiled training job (its file is ``NAME.npz``)."""

    size: str
    batch: int = 8
    length: int = 1024
    remat: bool = True
    donate: bool = True
    target: str = "h100-80g"
    devices: int = 1
    buckets: tuple[int, ...] = ()   # other sequence lengths, one executable each, taken in turn
    steps: int = 3
    buffers: bool = False           # also write the logical-buffers view
    tags: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        parts = [self.size, f"b{self.batch}", f"t{self.length}"]
        parts += [] if self.remat else ["noremat"]
        parts += [] if self.donate else ["nodonate"]
        parts += [f"bucket{'-'.join(map(str, self.buckets))}"] if self.buckets else []
        parts += [f"x{self.devices}"] if self.devices > 1 else []
        return "-".join([*parts, self.target])


def _jobs() -> list[Job]:
    jobs = []
    for size in SIZES:       # sizes x remat x donation, at batch 8 x 1024 on an H100
        jobs.append(Job(size, buffers=True, tags=("size", "remat", "donate")))
        if size == "6.7b":   # its remat-off and undonated steps: not compiled (time budget)
            continue
        jobs.append(Job(size, remat=False, buffers=True, tags=("remat",)))
        jobs.append(Job(size, donate=False, tags=("donate",)))
    for batch, length in ((2, 512), (32, 512), (2, 4096)):   # batch and length sweep
        jobs.append(Job("1.3b", batch=batch, length=length, tags=("batch-length",)))
    jobs.append(Job("350m", length=2048, steps=8, tags=("batch-length",)))
    # fixed shapes (every batch padded to the longest) against length buckets
    jobs.append(Job("125m", length=2048, steps=8, tags=("fixed",)))
    jobs.append(Job("125m", length=256, buckets=(512, 1024, 2048), steps=8, tags=("bucketed",)))
    jobs.append(Job("125m", target="a100-40g", tags=("target",)))   # other GPUs
    jobs.append(Job("125m", target="l4-24g", tags=("target",)))
    jobs.append(Job("1.3b", target="a100-40g", tags=("target",)))
    jobs.append(Job("1.3b", target="l4-24g", tags=("target",)))   # may not fit 24 GB: a member
    return jobs


JOBS = _jobs()


def build(job: Job) -> tuple[Any, Any, list[Any]]:
    """The train step, its state and the token batches (one per executable) of ``job``
    (experiments/gpt_step.py)."""
    step, state = gpt_step.build(*SIZES[job.size], remat=job.remat, vocab=VOCAB)
    return step, state, [gpt_step.tokens(job.batch, n) for n in (job.length, *job.buckets)]


def _clean(trace: Any, job: Job, view: str) -> None:
    """Metadata that says what the trace is and nothing about this machine (no path)."""
    meta = trace.metadata
    for key in ("path", "listing", "dump"):
        meta.pop(key, None)
    for key in ("allocations", "files"):   # the dump's own listing: large, and in the dump
        meta.get("xla", {}).pop(key, None)
    meta["name"] = f"{job.name} ({view})"
    meta["source"] = f"experiments/preallocate_vs_grow/xla_jobs.py:{job.name}"


def compile_job(job: Job) -> dict[str, Any]:
    """Compile ``job``, write its file(s) and return its index entry."""
    import jax

    from allocsim.traces import formats
    step, state, tokens = build(job)
    with tempfile.TemporaryDirectory(prefix="allocsim-jobs-") as tmp:
        trace = xla_gpu.compile_for(
            step, (state, tokens[0]), donate_argnums=0 if job.donate else (),
            target=job.target, devices=job.devices,
            schedule=xla_gpu.Schedule(steps=job.steps, batch_argnums=(1,),
                                      buckets=tuple((state, t) for t in tokens[1:])),
            keep_dump=tmp)
        _clean(trace, job, "runtime")
        formats.save(trace, DATA / f"{job.name}.npz")
        if job.buffers:
            buffers = formats.load(Path(tmp) / "train0", view="buffers")
            _clean(buffers, job, "logical buffers")
            formats.save(buffers, DATA / f"{job.name}.buffers.npz")
        shutil.rmtree(tmp, ignore_errors=True)
    executables = trace.metadata["xla_gpu"]["executables"]
    return {**asdict(job), "name": job.name,
            "parameters": int(sum(leaf.size for leaf in jax.tree.leaves(state[0]))),
            "executables": [{k: e[k] for k in ("argument", "output", "alias", "temp")}
                            for e in executables],
            "peak_live": int(trace.peak_live()[0]), "events": len(trace),
            "versions": installed()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="job names (default: every job)")
    parser.add_argument("--skip-tag", nargs="*", default=[], help="leave out jobs so tagged")
    args = parser.parse_args(argv)
    DATA.mkdir(parents=True, exist_ok=True)
    index_path = DATA / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    for job in JOBS:
        if (args.only and job.name not in args.only) or set(args.skip_tag) & set(job.tags):
            continue
        entry = compile_job(job)
        index[job.name] = entry
        print(f"{job.name}: {entry['parameters'] / 1e9:.2f}B parameters, peak live "
              f"{entry['peak_live'] / 2**30:.2f} GiB", flush=True)
        ordered = {j.name: index[j.name] for j in JOBS if j.name in index}
        write_text(index_path, json.dumps(ordered, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
