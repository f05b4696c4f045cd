"""``allocsim record --framework jax --target tpu-v5e`` (traces/record/jax_recorder/target.py):
a user's unchanged JAX script runs here on the CPU and every program it runs is compiled for
the TPU; the trace is what the chip's runtime holds. Held to the chip's own records of the same
programs (tests/data/tpu/programs: JAX 0.10.2, libtpu 0.0.42.1, a v5e). Needs jax and libtpu
(skips without them, saying so)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from allocsim.errors import UserInputError

DATA = Path(__file__).parent / "data" / "tpu" / "programs"
REPO = Path(__file__).parents[1]

if importlib.util.find_spec("jax") is None or importlib.util.find_spec("libtpu") is None:
    pytest.skip("needs jax and libtpu (pip install -e '.[jax-tpu]'): XLA:TPU compiles only "
                "with libtpu", allow_module_level=True)

SCRIPT = """
import sys
sys.path.insert(0, {repo!r})
from experiments.tpu.programs import Chip, PROGRAMS
PROGRAMS[{name!r}](Chip())
"""


def _record(tmp_path: Path, name: str) -> dict[str, int]:
    from allocsim import api
    from allocsim.sim.kernel.device_profile import resolve_device
    from allocsim.sim.kernel.engine import replay
    from allocsim.traces.formats import load
    script = tmp_path / f"{name}.py"
    script.write_text(SCRIPT.format(repo=str(REPO), name=name))
    out = tmp_path / f"{name}.npz"
    done = subprocess.run([sys.executable, "-m", "allocsim", "record", "--framework", "jax",
                           "--target", "tpu-v5e", "-o", str(out), "--", sys.executable,
                           str(script)], capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    trace = load(out)
    v5e = resolve_device("tpu-v5e")
    answer = api.min_capacity(trace, "tpu", v5e, resolution=512)
    assert answer.min_capacity is not None
    assert trace.metadata["target_recording"]["unseen_arguments"] == 0
    return {"peak": replay(trace, "tpu", v5e).peak_allocated + answer.context_bytes,
            "scratch": trace.metadata["xla_tpu"]["scratch_bytes"],
            "min": answer.min_capacity}


def _ran(name: str, capacity: int) -> bool:
    for folder in (DATA / "round2", DATA):
        path = folder / f"{name}-{capacity}.json"
        if path.exists():
            return bool(json.loads(path.read_text())["ran"])
    raise FileNotFoundError(f"no chip run of {name} at {capacity}")


@pytest.mark.parametrize("name", ["init-train-eval", "conv-adam", "lstm-nodonate"])
def test_an_unchanged_script_recorded_for_the_tpu_holds_what_the_chip_held(
        tmp_path: Path, name: str) -> None:
    got = _record(tmp_path, name)
    chip = json.loads((DATA / f"{name}.json").read_text())["stages"]["end"]
    assert got["peak"] == chip["peak_bytes_in_use"]
    assert got["scratch"] == chip["peak_bytes_reserved"]
    assert _ran(name, got["min"])
    assert not _ran(name, got["min"] - 256 * 1024)


def test_eager_ops_and_typed_keys_are_programs_on_the_tpu_too(tmp_path: Path) -> None:
    # jax.random.key, jnp.zeros and an eager add each run an XLA program: each is compiled
    # for the TPU and holds its code there, as the chip's runtime holds it.
    from allocsim.traces.formats import load
    script = tmp_path / "eager.py"
    script.write_text("import jax, jax.numpy as jnp\n"
                      "key = jax.random.key(0)\n"
                      "w = jax.jit(lambda k: jax.random.normal(k, (256, 256)))(key)\n"
                      "total = jnp.zeros(()) + jnp.sum(w)\n"
                      "print(float(total))\n")
    out = tmp_path / "eager.npz"
    done = subprocess.run([sys.executable, "-m", "allocsim", "record", "--framework", "jax",
                           "--target", "tpu-v5e", "-o", str(out), "--", sys.executable,
                           str(script)], capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    facts = load(out).metadata["xla_tpu"]
    names = [e["name"].split(".")[0] for e in facts["executables"]]
    assert "jit__lambda_" in names or any("lambda" in n for n in names)
    assert len(names) >= 4                     # the key, the normal, zeros, sum, add
    assert all(e["code_bytes"] > 0 for e in facts["executables"])
    assert facts["libtpu"] == "0.0.42.1"


def test_a_gpu_target_for_jax_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "allocsim", "record", "--framework", "jax",
                           "--target", "a100-40g", "-o", "/tmp/never.npz", "--", sys.executable,
                           "-c", "pass"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "a TPU only" in done.stderr and "Traceback" not in done.stderr


def test_a_target_the_recorder_does_not_compile_for_is_refused() -> None:
    from allocsim.traces.record.jax_recorder.target import TargetRecorder
    with pytest.raises(UserInputError, match="not a TPU"):
        TargetRecorder(None, "h100-80g")
