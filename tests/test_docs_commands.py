"""Every `allocsim ...` command the README and docs/*.md show is one the command line accepts,
and the ones that need only what a checkout holds run as shown.

A command is taken from a fenced code block (a line starting `allocsim` or `$ allocsim`, a YAML
`- run: allocsim`, continued over `\\` line ends, split at `&&` and `;`) or from inline code
(`` `allocsim ...` `` in prose and tables). Each must parse with the CLI's own parser. A command
whose inputs all exist in a checkout (bundled traces, committed test data, or a file an
earlier command of the same block wrote) is also run, in a scratch folder that sees the
checkout's traces/, tests/, docs/ and experiments/, and must end with the status the docs
promise (0, or 1 where the command reports a finding by its status).
"""

from __future__ import annotations

import argparse
import glob
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FOLDERS_SEEN = ("traces", "tests", "docs", "experiments")
OUTPUT_OPTIONS = {"-o", "--out", "--output"}

# Commands another test already runs and checks word for word: not run twice.
RUN_ELSEWHERE = {
    "allocsim tune traces/data/sample-jax-cpu-train.npz --framework jax --capacity 32MiB":
        "tests/test_tune.py::test_the_user_guide_shows_what_tune_prints",
    "allocsim tune default traces/data/sample-jax-cpu-train.npz --framework jax --capacity 2GiB":
        "tests/test_tune.py::test_the_user_guide_shows_what_tune_prints",
    "allocsim tune default --framework pytorch --capacity 1GiB":
        "tests/test_next_step.py::test_the_user_guide_shows_what_nothing_fits_prints",
    "allocsim sweep docs/examples/grid.toml -o results.jsonl":
        "tests/test_readme.py::test_the_example_sweep_grid_the_guide_names_runs",
}
# Commands whose documented answer is their exit status 1 (a finding, not a failure: share's
# processes that do not fit together, tune's job that fits no setting of the card).
EXIT_ONE = {"share", "tune"}
# A block with a command that costs more than this (seconds) is marked slow by listing the
# command in SLOW; none does today: each runs in under 1.5 s, the whole file in ~8 s.
CHEAP_SECONDS = 10.0
SLOW: set[str] = set()


@dataclass(frozen=True)
class Shown:
    """One command as a document shows it."""
    doc: str
    block: int           # the fenced block it is in (-1: inline code)
    text: str

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text, comments=True)[1:]

    @property
    def command(self) -> str:
        """The command without its comment, as a shell would run it."""
        return " ".join(["allocsim", *self.argv])


def _commands_of_line(line: str) -> list[str]:
    parts = re.split(r"&&|;", line)
    return [part.strip() for part in parts if part.strip().startswith("allocsim ")
            or part.strip() == "allocsim"]


def shown_commands() -> list[Shown]:
    found: list[Shown] = []
    for doc in DOCS:
        name = doc.relative_to(REPO).as_posix()
        inside, block, pending, prose = False, -1, "", []
        for raw in doc.read_text().splitlines():
            if raw.startswith("```"):
                inside, pending = not inside, ""
                block += inside
                continue
            if not inside:
                prose.append(raw)
                continue
            line = pending + raw.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            line = re.sub(r"^(\$ |- run: )", "", line)
            found += [Shown(name, block, command) for command in _commands_of_line(line)]
        for span in re.findall(r"`(allocsim [^`]+)`", "\n".join(prose)):
            found += [Shown(name, -1, command)
                      for command in _commands_of_line(" ".join(span.split()))]
    return found


COMMANDS = shown_commands()
UNIQUE = sorted({shown.command: shown for shown in COMMANDS}.values(), key=lambda s: s.command)


def test_the_docs_show_commands() -> None:
    assert len(UNIQUE) > 40
    assert any(shown.doc == "README.md" for shown in UNIQUE)


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    from allocsim.sim.cli.main import build_parser
    [action] = [a for a in build_parser()._actions
                if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


@pytest.mark.parametrize("shown", UNIQUE, ids=[shown.command for shown in UNIQUE])
def test_each_shown_command_parses(shown: Shown) -> None:
    """A command in a code block parses whole; one named in prose (`allocsim tune`,
    `allocsim validate TRACE --policy P`) names a command and options it has."""
    from allocsim.sim.cli.main import build_parser
    argv = shown.argv
    if shown.block < 0:
        if argv[0].startswith("-"):
            assert set(argv) <= {"--version", "--help", "-h"}, shown.text
            return
        subcommand = _subcommands().get(argv[0])
        assert subcommand is not None, f"{shown.doc}: no command `allocsim {argv[0]}`"
        own = argv[1:argv.index("--")] if "--" in argv else argv[1:]    # not the program's
        options = {token.split("=")[0] for token in own if token.startswith("--")}
        unknown = options - set(subcommand._option_string_actions)
        assert not unknown, f"{shown.doc}: `{shown.text}`: no option {sorted(unknown)}"
        return
    try:
        build_parser().parse_args(argv)
    except SystemExit as stop:     # --version and --help end here too, with status 0
        assert stop.code == 0, f"{shown.doc}: `{shown.text}` does not parse"


def _inputs(argv: list[str]) -> list[str]:
    """The paths a command reads: its positional arguments as its parser names them (not a
    generator's kind or parameters, not `record`'s program, not `convert`'s output), and
    --device-profile; a share spec's TRACE of TRACE:POLICY@START."""
    from allocsim.sim.cli.main import build_parser
    parsed = build_parser().parse_args(argv)
    not_inputs = {"kind", "params", "command", "output_file"}
    inputs = [getattr(parsed, "device_profile", None)]
    for action in _subcommands()[argv[0]]._actions:
        if not action.option_strings and action.dest not in not_inputs:
            value = getattr(parsed, action.dest)
            inputs += value if isinstance(value, list) else [value]
    return [str(path).split("@")[0].split(":")[0] for path in inputs if path]


def _outputs(argv: list[str]) -> list[str]:
    named = [argv[i + 1] for i, token in enumerate(argv[:-1]) if token in OUTPUT_OPTIONS]
    return named + argv[2:3] if argv[0] == "convert" else named


def runnable_blocks() -> list[list[Shown]]:
    """Each fenced block's commands that need only what a checkout holds, in order."""
    blocks: dict[tuple[str, int], list[Shown]] = {}
    for shown in COMMANDS:
        if shown.block >= 0:
            blocks.setdefault((shown.doc, shown.block), []).append(shown)
    runnable = []
    for commands in blocks.values():
        written: set[str] = set()
        kept = []
        for shown in commands:
            argv = shown.argv
            if argv[0] in {"record", "calibrate", "validate"} or shown.command in RUN_ELSEWHERE:
                continue         # needs a framework, a GPU or a program; or run elsewhere
            present = all(path == "default" or path in written
                          or glob.glob(str(REPO / path)) for path in _inputs(argv))
            if not present:
                continue         # a placeholder (run.npz) or what an unrun command writes
            kept.append(shown)
            written |= {path.rstrip("/") for path in _outputs(argv)}
        if kept:
            runnable.append(kept)
    return runnable


BLOCKS = runnable_blocks()


def _run(shown: Shown, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from allocsim.sim.cli.main import main
    argv = []
    for token in shown.argv:     # the shell's glob expansion; ../shared seen from the checkout
        if token.startswith("../shared/"):
            token = str(REPO.parent / token[3:])
        matches = sorted(glob.glob(token)) if "*" in token else []
        argv += matches or [token]
    try:
        status = main(argv)
    except SystemExit as stop:
        status = int(stop.code or 0)
    captured = capsys.readouterr()
    return status, captured.err


@pytest.mark.parametrize("block", [
    pytest.param(block, id=f"{block[0].doc}#{block[0].block}",
                 marks=[pytest.mark.slow] if any(s.command in SLOW for s in block) else [])
    for block in BLOCKS])
def test_each_runnable_block_runs_as_shown(block: list[Shown], tmp_path: Path, monkeypatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    for folder in FOLDERS_SEEN:
        (tmp_path / folder).symlink_to(REPO / folder)
    monkeypatch.chdir(tmp_path)
    for shown in block:
        started = time.perf_counter()
        status, err = _run(shown, capsys)
        took = time.perf_counter() - started
        expected = {0, 1} if shown.argv[0] in EXIT_ONE else {0}
        assert status in expected, f"{shown.doc}: `{shown.text}` ended {status}: {err.strip()}"
        assert "Traceback" not in err, err
        assert took < CHEAP_SECONDS or shown.command in SLOW, \
            f"`{shown.command}` took {took:.1f} s: list it in SLOW"


def test_a_runnable_block_is_found_in_the_readme_and_the_guide() -> None:
    docs = {block[0].doc for block in BLOCKS}
    assert {"README.md", "docs/user-guide.md"} <= docs


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    return {_anchor(m) for m in re.findall(r"^#{1,6} (.*)$", text, flags=re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=[doc.relative_to(REPO).as_posix() for doc in DOCS])
def test_every_link_between_the_docs_leads_somewhere(doc: Path) -> None:
    """A relative link names a file of the checkout, and a #part names one of its headings."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue                       # https:, mailto:
        path, _, part = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists():
            broken.append(target)
        elif part and linked.suffix == ".md" and part not in _anchors(linked):
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)}: {broken}"
