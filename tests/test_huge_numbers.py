"""Numbers past anything real (issue 56, items 9 and 18): a size of 5,000 digits in any size
option, a share start past a trace's int64 times, a CuPy request larger than any device. Each
ends in ONE `allocsim: error:` line and exit 2, never a traceback (Python's own "Exceeds the
limit (4300 digits)" ValueError, an OverflowError) and never an answer (exit 0)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from allocsim.policies.units import parse_size
from allocsim.sim.cli.main import build_parser, main
from allocsim.sim.kernel.device_profile import MAX_PROFILE_CAPACITY
from allocsim.sim.questions.share import MAX_END_NS, parse_start
from allocsim.traces.formats.cupy_log import MAX_HELD_BYTES

SMALL = "time_ns,op,id,size\n0,alloc,1,1048576\n10,free,1,\n"
DIGITS_5000 = "9" * 5000


def refused(capsys, tmp_path: Path, *argv: object) -> str:
    """Run ``allocsim ARGV`` in-process; assert one error line, exit 2, no traceback and
    nothing written in ``tmp_path``; the line."""
    capsys.readouterr()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse's own refusal
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("allocsim: error:"), err
    assert "Traceback" not in err and "4300" not in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    return lines[0]


@pytest.fixture()
def small_trace(tmp_path: Path) -> Path:
    path = tmp_path / "small.csv"
    path.write_text(SMALL)
    return path


# -- 1. a 5,000-digit size in any size option -------------------------------------------------

# The arguments each command needs besides the size option (TRACE: the small trace; OUT: a
# file that must not be written). tune reads --context only for a card (--device).
COMMAND_ARGS = {
    "compare": ["TRACE"],
    "min-capacity": ["TRACE"],
    "share": ["TRACE"],
    "baseline": ["TRACE", "-o", "OUT"],
    "export-snapshot": ["TRACE", "-o", "OUT.pickle"],
    "fidelity": ["TRACE"],
    "explain-oom": ["TRACE", "--policy", "bfc"],
    "validate": ["TRACE", "--policy", "bfc"],
    "calibrate": [],
    "tune": ["TRACE", "--framework", "pytorch", "--device", "a100-80g"],
}
SIZE_NAMES = {"--capacity", "--context", "--process-context", "--first-step-load",
              "--resolution", "--sizes"}


def size_options() -> list[tuple[str, str]]:
    """Every ``(command, option)`` of the parser that takes a size: metavar SIZE, or one of
    the size options by name (``--capacity`` of some commands has no metavar)."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for command, sub in commands.choices.items():
        for action in sub._actions:
            for option in action.option_strings:
                if option in SIZE_NAMES or action.metavar == "SIZE":
                    found.append((command, option))
    return sorted(found)


SIZE_OPTIONS = size_options()


def test_every_size_option_is_covered() -> None:
    assert {command for command, _ in SIZE_OPTIONS} <= set(COMMAND_ARGS)
    options = {option for _, option in SIZE_OPTIONS}
    assert options == SIZE_NAMES, options
    assert len(SIZE_OPTIONS) >= 18


@pytest.mark.parametrize(("command", "option"), SIZE_OPTIONS)
def test_a_5000_digit_size_is_one_line_naming_the_option(
        capsys, tmp_path: Path, small_trace: Path, command: str, option: str) -> None:
    args = [{"TRACE": small_trace, "OUT": tmp_path / "out.json",
             "OUT.pickle": tmp_path / "out.pickle"}.get(a, a)
            for a in COMMAND_ARGS[command]]
    line = refused(capsys, tmp_path, command, *args, option, DIGITS_5000)
    assert f"{option}: " in line, line
    assert "5,000 digits" in line, line
    assert len(line) < 200, line      # the number is counted, not printed back


@pytest.mark.parametrize("text", [DIGITS_5000, DIGITS_5000 + "GiB", "0." + DIGITS_5000,
                                  DIGITS_5000 + "x", "1_" * 3000 + "1"])
def test_the_size_parser_refuses_any_number_of_too_many_digits(text: str) -> None:
    with pytest.raises(ValueError, match="digits") as caught:
        parse_size(text)
    assert type(caught.value).__name__ == "UserInputError"


def test_sizes_of_forty_digits_still_parse() -> None:
    assert parse_size("0" * 30 + "4096") == 4096
    assert parse_size("1" + "0" * 39) == 10**39


# -- 2. a share start past what a trace's int64 times hold ------------------------------------

@pytest.mark.parametrize("start", ["9223372036854775807ns", "9223372036854775808ns",
                                   "300000000000s", DIGITS_5000, DIGITS_5000 + "ns"])
def test_a_share_start_past_int64_times_is_one_line(capsys, tmp_path: Path,
                                                    small_trace: Path, start: str) -> None:
    line = refused(capsys, tmp_path, "share", small_trace, f"{small_trace}@{start}")
    assert "start time" in line, line
    assert len(line) < 300, line


def test_a_start_that_pushes_the_trace_past_the_clock_is_one_line(
        capsys, tmp_path: Path, small_trace: Path) -> None:
    # The start alone fits; its trace's 10 ns do not.
    line = refused(capsys, tmp_path, "share", small_trace,
                   f"{small_trace}@{MAX_END_NS - 5}ns")
    assert f"{small_trace}@{MAX_END_NS - 5}ns" in line and "10 ns" in line, line


def test_a_start_up_to_the_clock_still_runs(capsys, small_trace: Path) -> None:
    assert main(["share", str(small_trace), f"{small_trace}@{MAX_END_NS - 10}ns",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["processes"][1]["start_ns"] == MAX_END_NS - 10


def test_share_starts_are_exact() -> None:
    assert parse_start("9007199254740993ns") == 9007199254740993   # 2**53 + 1: no float
    assert parse_start("1.5s") == 1_500_000_000 and parse_start("0.5") == 500_000_000
    assert parse_start(f"{MAX_END_NS}ns") == MAX_END_NS
    with pytest.raises(ValueError, match="146 years"):
        parse_start(f"{MAX_END_NS + 1}ns")


# -- 3. a CuPy request larger than any device -------------------------------------------------

def hook(name: str, size: int, ptr: int = 4096, **more: object) -> str:
    record: dict[str, object] = {"hook": name, "device_id": 0, "mem_size": size,
                                 "mem_ptr": ptr, "pmem_id": "0x1", **more}
    if name == "malloc":
        record["size"] = size
    return json.dumps(record)


HUGE = (1 << 63) - 1024       # below CuPy's 512-byte rounding limit: read until now
CUPY_LOGS = {
    "malloc 2^63-1024": ([hook("malloc", HUGE), hook("free", HUGE)], 0, "size"),
    "malloc 2^62": ([hook("malloc", 1 << 62), hook("free", 1 << 62)], 0, "size"),
    "malloc past 1 EiB": ([hook("malloc", MAX_HELD_BYTES + 512)], 0, "size"),
    "second malloc": ([hook("malloc", 512), hook("free", 512),
                       hook("malloc", HUGE, ptr=8192)], 2, "size"),
    "mem_size of a free": ([hook("malloc", 512), hook("free", HUGE)], 1, "mem_size"),
    "free before recording": ([hook("free", HUGE)], 0, "mem_size"),
    "pool miss": ([hook("alloc", HUGE), hook("malloc", 512), hook("free", 512)], 0,
                  "mem_size"),
}


@pytest.mark.parametrize("case", sorted(CUPY_LOGS))
@pytest.mark.parametrize("command", [["compare", "--policies", "cupy"], ["info"]])
def test_a_cupy_log_holding_more_than_any_device_is_refused(
        capsys, tmp_path: Path, case: str, command: list[str]) -> None:
    lines, record, field = CUPY_LOGS[case]
    path = tmp_path / "hooks.log"
    path.write_text("\n".join(lines) + "\n")
    line = refused(capsys, tmp_path, command[0], path, *command[1:])
    assert line.startswith(f"allocsim: error: {path}: event {record}: line {record + 1}: "
                           f"{field} "), line
    assert "more than any device holds" in line, line


def test_the_bound_is_the_largest_device_allocsim_models(capsys, tmp_path: Path) -> None:
    assert MAX_HELD_BYTES == MAX_PROFILE_CAPACITY
    path = tmp_path / "hooks.log"
    path.write_text("\n".join([hook("malloc", MAX_HELD_BYTES), hook("free", MAX_HELD_BYTES)])
                    + "\n")
    assert main(["info", str(path)]) == 0, capsys.readouterr().err


def test_a_failed_cupy_request_of_any_size_is_still_an_oom_it_recorded(
        capsys, tmp_path: Path) -> None:
    # mem_ptr 0: the pool refused it; the log recorded an OOM, no buffer.
    path = tmp_path / "hooks.log"
    path.write_text("\n".join([hook("malloc", HUGE, ptr=0), hook("malloc", 512),
                               hook("free", 512)]) + "\n")
    assert main(["info", str(path), "--json"]) == 0, capsys.readouterr().err
