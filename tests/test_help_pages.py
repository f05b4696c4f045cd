"""Every ``allocsim COMMAND --help`` (issue 37.5): the seven options that say how an input
file is read stand apart in one group, "reading the input", instead of among the command's own
options; and every page ends with examples — 1 to 3 real commands, each one the command line
accepts, that run on what a checkout holds (the bundled traces, committed test data)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

from allocsim.sim.cli.main import build_parser, main

REPO = Path(__file__).resolve().parents[1]
READING_OPTIONS = ("--strict", "--device-index", "--start-state", "--module", "--xla-view",
                   "--steps", "--allocator")
READING_GROUP = "reading the input"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions
                  if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


COMMANDS = sorted(subcommands())
READING = sorted(name for name, parser in subcommands().items()
                 if "--xla-view" in parser._option_string_actions)


def examples(command: str) -> list[str]:
    """The commands under ``examples:`` at the end of the page (``a && b``: two)."""
    page = subcommands()[command].format_help()
    assert "\nexamples:\n" in page, f"allocsim {command} --help shows no examples"
    lines = page.split("\nexamples:\n", 1)[1].splitlines()
    shown = [line.strip() for line in lines if line.strip()]
    assert all(line.startswith("allocsim ") for line in shown), shown
    return shown


def test_the_reading_options_are_on_many_commands() -> None:
    assert len(READING) >= 8 and {"compare", "tune", "info", "fidelity"} <= set(READING)


@pytest.mark.parametrize("command", READING)
def test_the_reading_options_stand_in_their_own_group(command: str) -> None:
    parser = subcommands()[command]
    [group] = [g for g in parser._action_groups if g.title == READING_GROUP]
    assert sorted(o for a in group._group_actions for o in a.option_strings) \
        == sorted(READING_OPTIONS)
    page = parser.format_help()
    own, reading = page.split(f"\n{READING_GROUP}:", 1)
    for option in READING_OPTIONS:
        assert f"  {option}" in reading and f"  {option}" not in own, option


def test_the_top_page_shows_examples_too() -> None:
    page = build_parser().format_help()
    assert "\nexamples:\n  allocsim compare\n" in page and page.rstrip().endswith(
        "allocsim COMMAND --help: what a command takes, and its own examples")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_page_ends_with_examples(command: str) -> None:
    shown = examples(command)
    assert 1 <= len(shown) <= 3, shown
    page = subcommands()[command].format_help().rstrip()
    assert page.endswith(shown[-1]), "the examples are the page's end"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_example_parses(command: str) -> None:
    used = set()
    for line in examples(command):
        for part in line.split("&&"):
            argv = shlex.split(part)[1:]
            build_parser().parse_args(argv)    # a mistake exits 2: the test fails
            used.add(argv[0])
    assert command in used, "an example of the command itself"


# Examples that need what a checkout does not hold (a GPU, a program to record), or take
# longer than a test should (a whole sweep grid).
NOT_RUN = {"calibrate", "record"}
EXIT_ONE = {"share", "check", "fidelity", "explain-oom"}   # a finding said by status 1


@pytest.mark.parametrize("command", [c for c in COMMANDS if c not in NOT_RUN])
def test_every_example_runs_in_a_checkout(command: str, tmp_path: Path, monkeypatch,
                                          capsys) -> None:
    for folder in ("traces", "tests", "docs", "experiments"):
        (tmp_path / folder).symlink_to(REPO / folder)
    monkeypatch.chdir(tmp_path)
    for line in examples(command):
        for part in line.split("&&"):
            argv = shlex.split(part)[1:]
            status = main(argv)
            err = capsys.readouterr().err
            assert status == 0 or (status == 1 and argv[0] in EXIT_ONE), (part, err)
            assert "Traceback" not in err
