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
    assert action.choices, f"{command}: --framework lists its names"
    assert set(action.choices) <= set(FRAMEWORKS), action.choices
    assert not set(action.choices) & set(ALIASES)
    page = subcommands()[command].format_help()
    assert "{" + ",".join(action.choices) + "}" in page


def test_an_unknown_framework_is_one_line_naming_the_known_ones(capsys) -> None:
    from allocsim.sim.cli.main import main
    with pytest.raises(SystemExit) as stop:
        main(["tune", "default", "--framework", "mxnet"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'mxnet'" in err and "pytorch" in err and "jax" in err


@pytest.mark.parametrize("text, name", [("torch", "pytorch"), ("PYTORCH", "pytorch"),
                                        (" jax ", "jax"), ("tf", "tensorflow"),
                                        ("cupy", "cupy"), ("mxnet", None), ("", None)])
def test_canonical_framework(text: str, name: str | None) -> None:
    assert canonical_framework(text) == name
