"""Issue 26 item 1: a GPU target config for every device profile, consistent with it.

The configs (traces/record/gpu_targets/*.txtpb) are what XLA:GPU compiles against without a
GPU; each one's ``device_memory_size`` is its profile's capacity, so a compile for a card and the
simulated card agree. A damaged or unknown target is one line.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from allocsim.errors import UserInputError
from allocsim.sim.kernel.device import PROFILES
from allocsim.sim.kernel.device_profile import TPU_PROFILES
from allocsim.traces.record.gpu_targets import target_config, target_names

CARDS = {"a100-40g": "8.0", "a100-80g": "8.0", "h100-80g": "9.0", "h200-141g": "9.0",
         "l4-24g": "8.9", "rtx4090-24g": "8.9", "t4-16g": "7.5"}


def test_every_device_profile_has_a_target_and_every_target_a_profile() -> None:
    # The GPU ones: a TPU profile's compile target is libtpu's topology, not a GPU card.
    gpus = set(PROFILES) - {profile.name for profile in TPU_PROFILES}
    assert set(target_names()) == gpus == set(CARDS)


@pytest.mark.parametrize("name", sorted(CARDS))
def test_a_target_agrees_with_its_profile(name: str) -> None:
    target = target_config(name)
    assert target.device_memory_size == PROFILES[name].capacity
    assert target.compute_capability == CARDS[name]


def test_the_l4_profile_is_what_nvidia_smi_reports() -> None:
    assert PROFILES["l4-24g"].capacity == 23034 << 20


def test_an_unknown_target_names_the_known_ones() -> None:
    with pytest.raises(UserInputError, match=r"unknown GPU target 'b200' \(known: a100-40g, "):
        target_config("b200")


@pytest.mark.parametrize("edit, expect", [
    (lambda t: t.replace("device_memory_size", "device_memory"), "no positive device_memory_size"),
    (lambda t: t.replace("65536\n}", "65536\n"), "unbalanced braces"),
    (lambda t: t.replace('"CUDA"', '"ROCM"'), 'platform_name: "CUDA"'),
    (lambda t: t.replace("major: 9", "maj: 9"), "no cuda_compute_capability"),
])
def test_a_damaged_target_file_is_one_line(tmp_path: Path, edit, expect: str) -> None:
    path = tmp_path / "mine.txtpb"
    path.write_text(edit(target_config("h100-80g").text))
    with pytest.raises(UserInputError, match=expect) as err:
        target_config(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_a_target_file_of_ones_own_reads(tmp_path: Path) -> None:
    path = tmp_path / "my-h100.txtpb"
    path.write_text(target_config("h100-80g").text.replace("core_count: 132", "core_count: 114"))
    target = target_config(path)
    assert target.name == "my-h100" and "core_count: 114" in target.text


def compiled_trace(tmp_path: Path, target: str) -> Path:
    """A trace as compile_for writes it (its target in the metadata), made by hand."""
    from allocsim.traces import Trace, formats
    trace = Trace.from_events([(0, "alloc", 1, 1 << 20), (1, "free", 1, None)],
                              xla_gpu={"target": target, "device_memory_size":
                                       PROFILES[target].capacity})
    path = tmp_path / "step.npz"
    formats.save(trace, path)
    return path


def test_a_compiled_trace_runs_on_its_target_by_default(tmp_path: Path, capsys) -> None:
    import json

    from allocsim.sim.cli.main import main
    path = compiled_trace(tmp_path, "l4-24g")
    assert main(["min-capacity", str(path), "--policies", "bfc", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["device"] == "l4-24g"


def test_a_device_that_disagrees_with_the_target_is_one_line(tmp_path: Path, capsys) -> None:
    from allocsim.sim.cli.main import main
    path = compiled_trace(tmp_path, "h100-80g")
    assert main(["compare", str(path), "--policies", "bfc", "--device", "a100-40g"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "compiled for h100-80g" in err and "--device h100-80g" in err
    assert main(["compare", str(path), "--policies", "bfc", "--device", "h100-80g"]) == 0


HIDE_THE_PLUGIN = """
import sys
sys.modules["jax_plugins.xla_cuda12"] = None  # as on a machine without allocsim[jax-gpu]
import runpy
sys.argv = ["gpu_step.py", *sys.argv[1:]]
runpy.run_path(%r, run_name="__main__")
"""


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_the_plugin_missing_is_one_line(tmp_path: Path) -> None:
    """Runs where the plugin is installed too: the child hides it before jax looks for it."""
    program = Path(__file__).resolve().parents[1] / "docs" / "examples" / "gpu_step.py"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run([sys.executable, "-c", HIDE_THE_PLUGIN % str(program), "-o",
                           str(tmp_path / "step.npz"), "--hidden", "64", "--layers", "1"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("gpu_step: error:")]
    assert len(ours) == 1 and "XLA:GPU is not available" in ours[0], done.stderr[-2000:]
    assert "pip install 'allocsim[jax-gpu]'" in ours[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "step.npz").exists()
