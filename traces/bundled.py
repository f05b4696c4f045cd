"""The sample traces shipped inside the package, so ``allocsim compare`` works with no input.

- ``default-training.npz``: the synthetic DNN training loop from
  :mod:`allocsim.traces.synth.training` at its default parameters and seed 0 (regenerate with
  ``python -m allocsim.traces.bundled``);
- ``sample-jax-cpu-train.npz``: a real JAX run (CPU; a transformer block trained for 20 jitted,
  donated steps) recorded with :func:`allocsim.traces.record.jax` by
  ``experiments/record_jax.py``;
- ``sample-torch-cpu-mlp.npz``, ``sample-torch-cpu-transformer.npz``: real PyTorch runs (CPU)
  recorded with :func:`allocsim.traces.record.record_torch` by
  ``experiments/record_samples.py``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from allocsim.traces.model import Trace

DEFAULT_TRACE_NAME = "default-training.npz"


def bundled_path(name: str = DEFAULT_TRACE_NAME) -> Path:
    return Path(str(resources.files("allocsim.traces") / "data" / name))


DEFAULT_TRACE_ARGUMENT = "default"


def resolve_trace_name(path: str) -> str:
    """What a trace argument names: ``default`` is the bundled default trace (every command
    that takes a trace file takes it), anything else the file itself."""
    return str(bundled_path()) if path == DEFAULT_TRACE_ARGUMENT else path


def bundled_names() -> list[str]:
    """Every sample trace shipped with the package."""
    folder = bundled_path().parent
    return sorted(p.name for p in folder.glob("*.npz"))


def load_bundled_traces() -> list[Trace]:
    """The default trace first, then the recorded samples (what ``allocsim compare`` runs
    with no arguments)."""
    from allocsim.traces import formats
    names = [DEFAULT_TRACE_NAME] + [n for n in bundled_names() if n != DEFAULT_TRACE_NAME]
    return [formats.load(bundled_path(name)) for name in names]


def load_default_trace() -> Trace:
    from allocsim.traces import formats
    return formats.load(bundled_path())


def regenerate() -> Path:
    """Write the default trace again from its generator (deterministic)."""
    from allocsim.traces import formats, synth
    trace = synth.generate("training", seed=0)
    trace.metadata["name"] = "default-training"
    path = bundled_path()
    formats.save(trace, path)
    return path


if __name__ == "__main__":
    print(regenerate())
