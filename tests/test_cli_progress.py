"""Progress of long commands when stderr is not a terminal (issue 16): plain lines at most
every ``PROGRESS_INTERVAL_S`` seconds on stderr, no carriage returns, stdout untouched."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest

from allocsim.sim.cli import common
from allocsim.sim.cli.common import PlainProgress
from allocsim.sim.cli.main import main

SMALL = ("time_ns,op,id,size\n0,alloc,1,1048576\n5,alloc,2,4096\n10,free,1,\n"
         "20,alloc,3,2097152\n30,free,2,\n40,free,3,\n")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def small(tmp_path: Path) -> Path:
    path = tmp_path / "small.csv"
    path.write_text(SMALL)
    return path


def test_lines_come_at_most_every_interval_and_end_with_the_time() -> None:
    clock, out = FakeClock(), io.StringIO()
    with PlainProgress("min-capacity", interval=10, stream=out, clock=clock) as log:
        log.update("searching bfc (policy 1/2)")       # 0 s: too early
        clock.now += 5
        log.update("searching bfc (policy 1/2)")       # 5 s: still too early
        clock.now += 7
        log.update("searching pytorch (policy 2/2)")   # 12 s: printed
        clock.now += 3
        log.update("searching pytorch (policy 2/2)")   # 15 s: 3 s after the last line
        clock.now += 54
    assert out.getvalue().splitlines() == [
        "allocsim: min-capacity: searching pytorch (policy 2/2), 12 s",
        "allocsim: min-capacity: done in 69 s"]
    assert "\r" not in out.getvalue()


def test_quick_work_prints_nothing() -> None:
    out = io.StringIO()
    with PlainProgress("validate", interval=10, stream=out) as log:
        log.update("replaying x on host")
    assert out.getvalue() == ""


def test_silent_work_gets_a_line_from_the_timer() -> None:
    out = io.StringIO()
    with PlainProgress("validate", interval=0.05, stream=out) as log:
        log.update("replaying x on host")
        time.sleep(0.4)
    lines = out.getvalue().splitlines()
    assert 2 <= len(lines) <= 10, lines
    assert all(re.fullmatch(r"allocsim: validate: replaying x on host, \d+ s", line)
               for line in lines[:-1]), lines
    assert re.fullmatch(r"allocsim: validate: done in \d+ s", lines[-1])


def test_disabled_or_failed_work_adds_no_end_line() -> None:
    out = io.StringIO()
    with PlainProgress("x", enabled=False, interval=0, stream=out) as log:
        log.update("step")
    assert out.getvalue() == ""
    with pytest.raises(RuntimeError), PlainProgress("x", interval=0, stream=out) as log:
        log.update("step")
        raise RuntimeError("boom")
    assert out.getvalue() == "allocsim: x: step, 0 s\n"   # no "done" after a failure


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("json_out", [False, True])
def test_min_capacity_progress_on_a_log(capsys, monkeypatch, small: Path,
                                        json_out: bool) -> None:
    monkeypatch.setattr(common, "PROGRESS_INTERVAL_S", 0.0)  # every step, for the test
    code, out, err = run(capsys, "min-capacity", small, "--policies", "bfc", "best-fit",
                         *(["--json"] if json_out else []))
    assert code == 0, err
    lines = err.splitlines()
    assert [re.sub(r"\d+ s$", "N s", line) for line in lines] == [
        "allocsim: min-capacity: searching bfc (policy 1/2), N s",
        "allocsim: min-capacity: searching best-fit (policy 2/2), N s",
        "allocsim: min-capacity: done in N s"]
    assert "\r" not in err
    if json_out:
        assert [a["policy"] for a in json.loads(out)["answers"]] == ["bfc", "best-fit"]
    else:
        assert "min capacity" in out and "allocsim:" not in out


@pytest.mark.parametrize("json_out", [False, True])
def test_validate_progress_on_a_log(capsys, monkeypatch, small: Path, json_out: bool) -> None:
    monkeypatch.setattr(common, "PROGRESS_INTERVAL_S", 0.0)
    code, out, err = run(capsys, "validate", small, "--policy", "bfc", "--backend", "host",
                         *(["--json"] if json_out else []))
    assert code == 0, err
    assert [re.sub(r"\d+ s$", "N s", line) for line in err.splitlines()] == [
        f"allocsim: validate: replaying {small} on host, N s",
        "allocsim: validate: done in N s"]
    if json_out:
        assert json.loads(out)["passed"] is True


def test_quick_commands_stay_silent_at_the_default_interval(capsys, small: Path) -> None:
    assert common.PROGRESS_INTERVAL_S >= 2   # past two seconds, a line (issue 37)
    code, _, err = run(capsys, "min-capacity", small, "--policies", "bfc")
    assert code == 0 and err == ""
    code, _, err = run(capsys, "validate", small, "--policy", "bfc", "--backend", "host")
    assert code == 0 and err == ""
    # an error stays one line
    code, _, err = run(capsys, "validate", small, "--backend", "host")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
