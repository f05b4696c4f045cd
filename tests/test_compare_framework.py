"""Answers in the user's framework (issue 37, item 2).

What is held here: ``allocsim compare`` on a recording weighs that recording's own
framework's settings — PyTorch's on a PyTorch trace, JAX's on a JAX one, TensorFlow's on a
TensorFlow profile, the TPU runtime on a TPU profile — and its winner line is a setting one
can paste; named policies (``--policies``) are compared as before; a trace that names no
framework gets the generic policies; every comparison says what it compared and why, the
bare ``allocsim compare`` over the mixed bundled traces included.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocsim.policies import DEFAULT_POLICIES
from allocsim.sim.cli.main import main
from allocsim.sim.kernel.device import resolve_device
from allocsim.traces import formats

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "traces" / "data"
TORCH = DATA / "sample-torch-cpu-mlp.npz"
JAX = DATA / "sample-jax-cpu-train.npz"
TF = REPO / "tests" / "data" / "xplane" / "tf-cpu-default.xplane.pb"
TPU = REPO / "tests" / "data" / "tpu" / "compaction-2"
EOR = REPO.parent / "shared" / "traces" / "torch-snapshot-eor.pickle"


def compare_json(capsys, *argv: str) -> dict | list:
    assert main(["compare", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def compare_text(capsys, *argv: str) -> str:
    assert main(["compare", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("path, name, first", [
    (TORCH, "pytorch", "pytorch"),
    (JAX, "jax", "jax"),
    (TF, "tensorflow", "bfc:allow_growth=false,garbage_collection=true"),
])
def test_a_recording_is_compared_under_its_own_frameworks_settings(capsys, path: Path,
                                                                    name: str,
                                                                    first: str) -> None:
    data = compare_json(capsys, str(path))
    assert data["framework"]["name"] == name
    policies = [r["policy"] for r in data["results"]]
    assert policies[0] == first                     # the framework's defaults come first
    assert len(policies) >= 2
    assert not set(policies) & {"on-demand", "best-fit", "buddy"}   # no generic policy
    labels = [s["label"] for s in data["framework"]["settings"]]
    assert labels[0] == f"{name} defaults"
    assert all(s["paste"] for s in data["framework"]["settings"][1:])


def test_pytorchs_settings_are_those_tune_knows() -> None:
    from allocsim.sim.questions.framework_settings import default_choice
    trace = formats.load(str(EOR if EOR.is_file() else TORCH))
    choice = default_choice(trace, resolve_device(None, None, None))
    labels = [c.label for c in choice.candidates]
    assert labels[:2] == ["pytorch defaults", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]
    assert "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync" in labels


@pytest.mark.skipif(not EOR.is_file(), reason=f"{EOR} not present")
def test_the_winner_on_a_pytorch_snapshot_is_a_line_to_paste(capsys) -> None:
    out = compare_text(capsys, str(EOR), "--capacity", "24GiB")
    winner = next(line for line in out.splitlines() if line.startswith("winner:"))
    assert winner.startswith("winner: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True — ")
    assert "paste:  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in out
    assert "on-demand" not in out and "best-fit" not in out


def test_when_the_defaults_win_there_is_nothing_to_set(capsys) -> None:
    data = compare_json(capsys, str(TORCH))
    assert data["winner"] == "pytorch"
    assert data["framework"]["paste"] == []
    out = compare_text(capsys, str(TORCH))
    assert "paste:  nothing to set (the pytorch defaults)" in out
    assert "the fewest changes from the defaults decide" in out


def test_a_jax_winner_is_an_environment_line(capsys) -> None:
    data = compare_json(capsys, str(JAX))
    assert data["framework"]["paste"] == ["XLA_PYTHON_CLIENT_ALLOCATOR=platform"]
    assert "winner: XLA_PYTHON_CLIENT_ALLOCATOR=platform" in compare_text(capsys, str(JAX))


def test_a_tensorflow_profile_is_told_from_a_jax_one_by_its_ops() -> None:
    from allocsim.sim.questions.framework_settings import framework_of
    device = resolve_device(None, None, None)
    name, why = framework_of(formats.load(str(TF)), device)
    assert name == "tensorflow" and "TensorFlow's" in why


def test_a_tpu_profile_is_compared_on_a_tpu_under_the_runtime(capsys) -> None:
    data = compare_json(capsys, str(TPU))
    assert data["device"]["name"] == "tpu-v5e"
    assert [r["policy"] for r in data["results"]] == ["tpu"]
    assert data["framework"]["name"] == "tpu" and data["winner"] == "tpu"
    on_gpu = compare_json(capsys, str(TPU), "--device", "h100-80g")
    assert on_gpu["framework"]["name"] == "jax"      # asked about a GPU: JAX's settings there


def test_named_policies_are_compared_as_given(capsys) -> None:
    data = compare_json(capsys, str(TORCH), "--policies", "bfc", "best-fit")
    assert [r["policy"] for r in data["results"]] == ["bfc", "best-fit"]
    assert data["framework"]["name"] is None and data["framework"]["paste"] is None
    out = compare_text(capsys, str(TORCH), "--policies", "bfc", "best-fit")
    assert "compared: the policies named with --policies" in out


def test_bare_compare_says_what_it_compared_for_each_bundled_trace(capsys) -> None:
    data = compare_json(capsys)
    assert isinstance(data, list)
    by_name = {c["trace"]["name"]: c for c in data}
    synthetic = by_name["default-training"]
    assert synthetic["framework"]["name"] is None
    assert [r["policy"] for r in synthetic["results"]] == list(DEFAULT_POLICIES)
    assert "names no framework" in synthetic["framework"]["why"]
    assert by_name["sample-jax-cpu-train"]["framework"]["name"] == "jax"
    assert by_name["sample-torch-cpu-mlp"]["framework"]["name"] == "pytorch"
    out = compare_text(capsys)
    assert out.count("compared: ") == len(data)
    assert "compared: the generic policies, because a synthetic trace names no framework" in out
    assert "compared: JAX's own settings" in out and "compared: PyTorch's own settings" in out


def test_an_alloc_conf_is_added_and_pasted_as_given(capsys) -> None:
    data = compare_json(capsys, str(TORCH), "--alloc-conf", "max_split_size_mb:128")
    labels = [s["label"] for s in data["framework"]["settings"]]
    assert labels[-1] == "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128"
