"""Every command that writes spells "where to write" the same way: ``-o``, ``--out`` and
``--output`` are one option on all of them (issue 16.19), and no command has only some of
the three."""

from __future__ import annotations

import argparse

import pytest

from allocsim.sim.cli.common import OUTPUT_OPTIONS
from allocsim.sim.cli.main import build_parser

WRITING_COMMANDS = ("baseline", "calibrate", "compare", "convert", "export-snapshot", "gen",
                    "min-capacity", "record", "report", "share", "sweep", "validate")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def output_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if set(a.option_strings) & set(OUTPUT_OPTIONS)]


@pytest.mark.parametrize("command", WRITING_COMMANDS)
def test_every_writing_command_takes_all_three_spellings(command: str) -> None:
    parser = subcommands()[command]
    actions = output_actions(parser)
    assert len(actions) == 1, f"{command}: {[a.option_strings for a in actions]}"
    assert set(actions[0].option_strings) == set(OUTPUT_OPTIONS)
    assert actions[0].metavar in ("FILE", "DIR", "FILE.jsonl")
    assert actions[0].help


def test_no_command_has_a_partial_output_option() -> None:
    for name, parser in subcommands().items():
        for action in output_actions(parser):
            assert set(action.option_strings) == set(OUTPUT_OPTIONS), name


@pytest.mark.parametrize("spelling", OUTPUT_OPTIONS)
def test_the_spellings_mean_the_same_thing(spelling: str) -> None:
    parsed = build_parser().parse_args(["gen", "random", spelling, "t.npz"])
    assert parsed.output == "t.npz"
    parsed = build_parser().parse_args(["compare", "default", spelling, "results"])
    assert parsed.out == "results"


def test_convert_takes_its_output_as_an_argument_or_as_the_option(tmp_path, capsys) -> None:
    from allocsim.sim.cli.main import main
    source = tmp_path / "t.csv"
    assert main(["gen", "random", "events=100", "-o", str(source)]) == 0
    assert main(["convert", str(source), str(tmp_path / "a.jsonl")]) == 0
    assert main(["convert", str(source), "-o", str(tmp_path / "b.jsonl")]) == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    capsys.readouterr()
    assert main(["convert", str(source)]) == 2
    assert main(["convert", str(source), str(tmp_path / "c.jsonl"), "-o",
                 str(tmp_path / "d.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("allocsim: error: convert:") for line in err)
    assert not (tmp_path / "c.jsonl").exists() and not (tmp_path / "d.jsonl").exists()
