"""One vocabulary for ``--framework`` (issue 37.5): every command that takes it takes the same
canonical names (pytorch, jax, tensorflow, cupy), shows those in its help, and takes the other
common spelling (torch, tf) as an alias without a word."""

from __future__ import annotations

import argparse

import pytest

from allocsim.frameworks import ALIASES, FRAMEWORKS, canonical_framework
from allocsim.sim.cli.main import build_parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions
                  if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def framework_options() -> dict[str, argparse.Action]:
    found = {}
    for name, parser in subcommands().items():
        for action in parser._actions:
            if "--framework" in action.option_strings:
                found[name] = action
    return found


def test_record_and_tune_both_take_framework() -> None:
    assert {"record", "tune"} <= set(framework_options())


def test_record_and_tune_call_pytorch_by_the_same_name() -> None:
    parser = build_parser()
    record = parser.parse_args(["record", "--framework", "pytorch", "-o", "r.npz", "--",
                                "python", "train.py"])
    tune = parser.parse_args(["tune", "default", "--framework", "pytorch"])
    assert record.framework == tune.framework == "pytorch"


@pytest.mark.parametrize("command", ["record", "tune"])
@pytest.mark.parametrize("spelling", ["torch", "Torch", "pytorch", "PyTorch"])
def test_every_spelling_of_pytorch_is_pytorch_everywhere(command: str, spelling: str,
                                                         capsys) -> None:
    argv = {"record": ["record", "-o", "r.npz", "--framework", spelling, "--", "train.py"],
            "tune": ["tune", "default", "--framework", spelling]}[command]
    assert build_parser().parse_args(argv).framework == "pytorch"
    assert capsys.readouterr() == ("", ""), "an alias is taken without a word"


def test_tf_is_tensorflow_on_tune() -> None:
    assert build_parser().parse_args(["tune", "default", "--framework", "tf"]).framework \
        == "tensorflow"


@pytest.mark.parametrize("command", sorted(framework_options()))
def test_the_help_shows_the_canonical_names_only(command: str) -> None:
    action = framework_options()[command]
    listed = str(action.metavar)
    assert listed.startswith("{") and listed.endswith("}"), listed
    names = set(listed[1:-1].split(","))
    assert "pytorch" in names and "jax" in names
    assert names <= set(FRAMEWORKS) and not names & set(ALIASES), names
    assert f"--framework {listed}" in subcommands()[command].format_help()


@pytest.mark.parametrize("argv", [
    ["tune", "default", "--framework", "mxnet", "--capacity", "4GiB"],
    ["record", "--framework", "mxnet", "-o", "out.npz", "--", "prog.py"],
    ["record", "--framework", "tensorflow", "-o", "out.npz", "--", "prog.py"],
])
def test_an_unknown_framework_is_one_line_naming_the_known_ones(argv, tmp_path, monkeypatch,
                                                                capsys) -> None:
    from allocsim.sim.cli.main import main
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prog.py").write_text("import torch\n")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown framework" in err and "known: pytorch, jax" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prog.py"]


@pytest.mark.parametrize("text, name", [("torch", "pytorch"), ("PYTORCH", "pytorch"),
                                        (" jax ", "jax"), ("tf", "tensorflow"),
                                        ("cupy", "cupy"), ("mxnet", None), ("", None)])
def test_canonical_framework(text: str, name: str | None) -> None:
    assert canonical_framework(text) == name
