"""Record the JAX runs the project ships and its experiments use, on this machine's backend.

    python -m experiments.record_jax [--steps 20]

Needs jax (``pip install -e ".[jax]"``; the CPU build is enough). Runs the plain-JAX model of
``experiments/jax_train.py`` under :func:`allocsim.traces.record.jax`, each run in a fresh
process so that nothing of one run is live in the next, and writes

- ``traces/data/sample-jax-cpu-train.npz`` — jitted, state donated: the bundled recording
  ``allocsim compare`` replays with no arguments;
- ``experiments/data/jax/train-{jit-donate,jit-nodonate,eager,varying}.npz`` — the same model
  jitted with and without ``donate_argnums``, op by op (``jax.disable_jit()``), and with a
  sequence length that changes every step (recompiles); ``train-jit-donate-refused.npz`` also
  donates the token batch, which XLA refuses;
- ``experiments/data/jax/xla-dump/`` — XLA's own buffer assignment of the jitted step
  (``XLA_FLAGS=--xla_dump_to``), the text files ``allocsim fidelity DIR`` reads.

Seeded: the buffers and their order repeat; times are the run's. On CPU the temp sizes are
XLA:CPU's buffer assignment (see docs/jax.md, "What a recording measures").
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "traces" / "data" / "sample-jax-cpu-train.npz"
DATA = REPO / "experiments" / "data" / "jax"
RUNS = {
    "train-jit-donate": [],
    "train-jit-nodonate": ["--no-donate"],
    "train-eager": ["--no-jit"],
    "train-varying": ["--varying"],
    "train-jit-donate-refused": ["--donate-batch"],
}
# jit and donation at three model sizes (issue 40: one 25-33 MiB recording was not enough):
# experiments/data/jax/sizes/train-{jit-donate,jit-nodonate,eager}-{small,medium,large}.npz.
SIZED = {f"train-{mode}-{size}": [*options, "--size", size]
         for size in ("small", "medium", "large")
         for mode, options in (("jit-donate", []), ("jit-nodonate", ["--no-donate"]),
                               ("eager", ["--no-jit"]))}
CHILD = r"""
import sys
import allocsim.traces.record as record
sys.path.insert(0, sys.argv[1])
import jax_train
out, name, options = sys.argv[2], sys.argv[3], sys.argv[4:]
meta = {"recorded_by": "experiments/record_jax.py", "run": name,
        "options": " ".join(options)}
with record.jax(out, metadata=meta):
    jax_train.main(options)
"""


def record_run(name: str, options: list[str], out: Path, env: dict[str, str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", CHILD, str(REPO / "experiments"), str(out), name,
                    *options], check=True, env=env)


def dump_step(steps: int, target: Path) -> None:
    """XLA's buffer assignment of the jitted, donated step: only the text files allocsim
    reads, of the modules whose name says adam_step."""
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={folder}")
        subprocess.run([sys.executable, str(REPO / "experiments" / "jax_train.py"),
                        "--steps", str(min(steps, 2))], check=True, env=env)
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        suffixes = ("-live-range.txt", "-buffer-assignment.txt",
                    "-buffer-assignment-values.txt", "-memory-usage-report.txt")
        for path in Path(folder).iterdir():
            if "adam_step" in path.name and path.name.endswith(suffixes):
                shutil.copy(path, target / path.name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--sizes", action="store_true",
                        help="record only the runs at three model sizes (experiments/data/jax/"
                             "sizes/), at most 6 steps each")
    args = parser.parse_args(argv)
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", ""))
    if args.sizes:
        from experiments.runner.versions import stamp
        for name, options in SIZED.items():
            out = DATA / "sizes" / f"{name}.npz"
            record_run(name, [*options, "--steps", str(min(args.steps, 6))], out, env)
            stamp(DATA / "sizes", [out.name])
            print(f"wrote {out.relative_to(REPO)}", flush=True)
        return
    for name, options in RUNS.items():
        out = DATA / f"{name}.npz"
        record_run(name, [*options, "--steps", str(args.steps)], out, env)
        print(f"wrote {out.relative_to(REPO)}")
    from allocsim.traces import formats
    bundled = formats.load(DATA / "train-jit-donate.npz")
    bundled.metadata["name"] = BUNDLED.name.removesuffix(".npz")
    formats.save(bundled, BUNDLED)
    print(f"wrote {BUNDLED.relative_to(REPO)}")
    dump_step(args.steps, DATA / "xla-dump")
    print(f"wrote {(DATA / 'xla-dump').relative_to(REPO)}/")
    from experiments.runner.versions import stamp
    stamp(DATA, [f"{name}.npz" for name in RUNS] + ["xla-dump"])


if __name__ == "__main__":
    main()
