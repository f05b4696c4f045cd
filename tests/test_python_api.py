"""The flat Python API (``allocsim.load``, ``replay``, ``compare``, ``min_capacity``, ``tune``):
each gives the answer its command gives, on the bundled traces, and a mistake is the same one
line; importing ``allocsim`` still imports nothing else."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import allocsim
from allocsim.errors import UserInputError
from allocsim.sim.cli import main
from allocsim.sim.kernel.device_profile import resolve_device
from allocsim.sim.kernel.engine import replay as engine_replay
from allocsim.traces import formats
from allocsim.traces.bundled import bundled_path
from allocsim.traces.model import TraceError

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "traces" / "data"
TORCH_SAMPLE = str(DATA / "sample-torch-cpu-mlp.npz")
JAX_SAMPLE = str(DATA / "sample-jax-cpu-train.npz")


def command_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_load_reads_a_path_or_the_bundled_default_as_the_formats_do() -> None:
    by_name = allocsim.load("default")
    by_path = formats.load(bundled_path())
    assert by_name.name == by_path.name == "default-training"
    for column in ("time_ns", "op", "id", "size", "stream", "process"):
        assert np.array_equal(getattr(by_name, column), getattr(by_path, column))
    assert allocsim.load(Path(TORCH_SAMPLE)).metadata == formats.load(TORCH_SAMPLE).metadata


def test_a_file_that_is_no_trace_is_the_readers_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time_ns,op,id,size\n0,alloc,1,-5\n")
    with pytest.raises(TraceError, match=r"bad\.csv"):
        allocsim.load(bad)


def test_replay_is_the_engines_replay_of_the_named_device() -> None:
    trace = allocsim.load("default")
    ours = allocsim.replay(trace, "bfc", "a100-40g")
    engines = engine_replay(trace, "bfc", resolve_device("a100-40g"))
    assert ours.to_json_dict() == engines.to_json_dict()
    # A path and a device profile are taken too; no device is the default profile.
    assert (allocsim.replay("default", "bfc", allocsim.device("a100-40g")).to_json_dict()
            == ours.to_json_dict())
    assert allocsim.replay(trace, "bfc").device == resolve_device(None).name


def test_replay_gives_the_figures_compare_prints_for_that_policy(capsys) -> None:
    printed = command_json(capsys, "compare", "default", "--policies", "bfc",
                           "--device", "a100-40g")
    ours = allocsim.replay("default", "bfc", "a100-40g").to_json_dict()
    (result,) = printed["results"]
    assert {k: result[k] for k in ours if k in result} == {k: ours[k] for k in ours
                                                           if k in result}


@pytest.mark.parametrize("argv, policies", [
    ((), None),                                             # the recording's own settings
    (("--policies", "bfc", "best-fit", "on-demand"), ["bfc", "best-fit", "on-demand"]),
])
def test_compare_is_the_commands_answer(capsys, argv: tuple[str, ...],
                                        policies: list[str] | None) -> None:
    printed = command_json(capsys, "compare", TORCH_SAMPLE, *argv, "--device", "a100-40g")
    ours = allocsim.compare(TORCH_SAMPLE, policies, "a100-40g")
    assert ours.to_json_dict() == printed
    assert ours.winner is not None


def test_min_capacity_is_the_commands_answer(capsys) -> None:
    printed = command_json(capsys, "min-capacity", "default", "--policies", "bfc",
                           "--device", "a100-40g")
    ours = allocsim.min_capacity("default", "bfc", "a100-40g")
    assert [ours.to_json_dict()] == printed["answers"]


def test_tune_on_a_card_is_the_commands_answer(capsys) -> None:
    printed = command_json(capsys, "tune", TORCH_SAMPLE, "--framework", "torch",
                           "--device", "rtx4090-24g")
    ours = allocsim.tune(TORCH_SAMPLE, "torch", "rtx4090-24g")
    assert ours.to_json_dict() == printed
    assert ours.card


def test_tune_without_a_device_searches_the_smallest_card_as_the_command_does(capsys) -> None:
    printed = command_json(capsys, "tune", JAX_SAMPLE, "--framework", "jax")
    ours = allocsim.tune(JAX_SAMPLE, "jax")
    assert ours.to_json_dict() == printed
    assert not ours.card


def test_an_unknown_device_or_framework_is_the_commands_one_line() -> None:
    with pytest.raises(UserInputError, match="unknown device 'a100-41g'; known devices"):
        allocsim.replay("default", "bfc", "a100-41g")
    with pytest.raises(UserInputError, match="unknown framework 'mxnet'"):
        allocsim.tune("default", "mxnet", "a100-40g")


def test_importing_allocsim_imports_nothing_else() -> None:
    code = ("import sys, allocsim; "
            "print(sorted(m for m in sys.modules if m.startswith('allocsim')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["['allocsim']"]


def test_the_flat_names_are_listed_and_an_unknown_one_is_an_attribute_error() -> None:
    assert {"load", "replay", "compare", "min_capacity", "tune", "device"} <= set(dir(allocsim))
    assert set(allocsim.__all__) >= {"load", "replay", "compare", "min_capacity", "tune"}
    with pytest.raises(AttributeError, match="no attribute 'replays'"):
        allocsim.replays  # noqa: B018


def test_the_example_in_the_docs_prints_what_the_docs_show() -> None:
    page = (REPO / "docs" / "python-api.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S)
    shown = re.search(r"prints\n\n```text\n(.*?)```", page, re.S)
    assert code and shown
    done = subprocess.run([sys.executable, "-c", code.group(1)], cwd=REPO, capture_output=True,
                          text=True, check=True)
    assert done.stdout == shown.group(1)
