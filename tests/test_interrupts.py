"""Ctrl-C and SIGTERM end every command in one line, never a traceback (issue 25.5).

A Ctrl-C in a terminal reaches the whole process group (the command and its sweep workers);
``kill`` and job schedulers send SIGTERM. Whenever it lands — while allocsim is still importing
numpy, while a sweep runs its cells, while ``gen`` writes its file — the command prints one line
saying it was interrupted and what to do (a sweep: how to resume), and exits 128 + the signal:
130 for SIGINT, 143 for SIGTERM. Nothing half-written is left behind.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from allocsim.atomic_files import temporary_pattern

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="process groups and signals as on Linux")
ALLOCSIM = [sys.executable, "-m", "allocsim"]
SIGNALS = {"SIGINT": (signal.SIGINT, 130), "SIGTERM": (signal.SIGTERM, 143)}


def start(argv: list[str], cwd: Path) -> subprocess.Popen:
    """The command in a process group of its own, as a shell runs a foreground job: with
    Ctrl-C at its default even where the tests themselves were started with it ignored (a
    script's ``cmd &`` starts its job so, and an ignored signal stays ignored across exec:
    every command here would then run through its SIGINT and exit 0)."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)   # SIG_DFL in the child
    try:
        return subprocess.Popen([*ALLOCSIM, *argv], cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def signal_group(process: subprocess.Popen, signum: int) -> tuple[int, str, str]:
    os.killpg(process.pid, signum)
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


def wait_for(predicate, process: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert process.poll() is None, "the command ended before it was interrupted"
        assert time.monotonic() < deadline, "the command never got there"
        time.sleep(0.005)


PROGRESS_LINE = re.compile(r"^allocsim: (compare|sweep|min-capacity|tune|report|info|validate): ")


def assert_one_clean_line(out: str, err: str) -> str:
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, out + err
    # Progress lines ("allocsim: compare: replaying ...") say what was running; the ending is
    # one line beside them.
    lines = [line for line in err.splitlines() if line.startswith("allocsim:")
             and not PROGRESS_LINE.match(line)]
    assert len(lines) <= 1, err
    return (out + err).strip().splitlines()[-1]


def write_grid(folder: Path, seeds: int, events: int) -> Path:
    grid = folder / "grid.toml"
    grid.write_text('output = "out.jsonl"\n[grid]\n'
                    f'traces = ["synth:random?events={events}&seed=[1..{seeds}]"]\n'
                    'policies = ["bfc", "best-fit", "on-demand", "pytorch"]\n')
    return grid


@pytest.mark.parametrize("name", list(SIGNALS))
def test_a_group_signal_while_the_sweep_starts_ends_in_one_line(name: str, tmp_path: Path) -> None:
    signum, status = SIGNALS[name]
    write_grid(tmp_path, seeds=4, events=20000)
    sweep = start(["sweep", "grid.toml", "--workers", "2", "--no-progress"], tmp_path)
    time.sleep(0.4)         # still importing numpy on most machines
    code, out, err = signal_group(sweep, signum)
    assert_one_clean_line(out, err)
    assert code == status, out + err
    # The one closing line: allocsim's own on stderr when the signal lands during start-up, the
    # summary's last on stdout once cells run (a "stopping: waiting ..." note may follow it
    # on stderr when cells were already handed to workers).
    closing = [line for line in (out + "\n" + err).splitlines()
               if line.startswith(("interrupted (", "allocsim: interrupted ("))]
    assert len(closing) == 1, out + err
    last = closing[0]
    assert f"interrupted ({name})" in last and "run the same command again" in last, last


@pytest.mark.parametrize("name", list(SIGNALS))
def test_a_group_signal_while_cells_run_says_how_to_resume_and_the_rerun_completes(
        name: str, tmp_path: Path) -> None:
    signum, status = SIGNALS[name]
    seeds = 10
    # Cells long enough (~0.1 s each in the native core) that the sweep is still running when
    # the first result line is seen.
    write_grid(tmp_path, seeds=seeds, events=400_000)
    output = tmp_path / "out.jsonl"
    argv = ["sweep", "grid.toml", "--workers", "2", "--no-progress"]
    sweep = start(argv, tmp_path)
    wait_for(lambda: output.exists() and output.read_bytes().count(b"\n") >= 1, sweep)
    code, out, err = signal_group(sweep, signum)
    assert_one_clean_line(out, err)
    assert code == status, out + err
    last = out.strip().splitlines()[-1]     # the summary's last line (the table is not printed)
    assert last.startswith(f"interrupted ({name}): ") and \
        "run the same command again to resume" in last, out
    assert output.read_bytes().count(b"\n") < seeds * 4, "interrupted mid-sweep, not after it"
    rerun = subprocess.run([*ALLOCSIM, *argv], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    cells = collections.Counter(json.loads(line)["cell"]
                                for line in output.read_text().splitlines())
    assert len(cells) == seeds * 4 and set(cells.values()) == {1}


@pytest.mark.parametrize("name", list(SIGNALS))
def test_gen_interrupted_while_writing_leaves_the_previous_file_and_no_temporary(
        name: str, tmp_path: Path) -> None:
    signum, status = SIGNALS[name]
    target = tmp_path / "run.csv"
    assert subprocess.run([*ALLOCSIM, "gen", "random", "events=100", "-o", target.name],
                          cwd=tmp_path, capture_output=True).returncode == 0
    before = target.read_bytes()
    pattern = temporary_pattern(target)

    def writing() -> bool:
        return any(pattern.fullmatch(p.name) for p in tmp_path.iterdir())
    gen = start(["gen", "random", "events=3000000", "-o", target.name], tmp_path)
    wait_for(writing, gen, timeout_s=120)
    code, out, err = signal_group(gen, signum)
    last = assert_one_clean_line(out, err)
    assert code == status, out + err
    assert last == (f"allocsim: interrupted ({name}); nothing half-written is left (every "
                    "output is written whole or not at all); run the same command again")
    assert target.read_bytes() == before and not writing()


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory) -> Path:
    from allocsim.traces import formats, synth
    path = tmp_path_factory.mktemp("big") / "big.npz"
    # Long enough that compare is still running 2.5 s in with the native core (~0.6M events/s
    # end to end with its figures and report on this machine).
    formats.save(synth.generate("random", seed=5, events=6_000_000), path)
    return path


COMPARE = ["--policies", "bfc", "pytorch", "best-fit", "-o", "out"]


@pytest.fixture(scope="module")
def compare_seconds(big_trace: Path, tmp_path_factory) -> float:
    """How long the compare below takes uninterrupted on this machine, now: the moments it is
    interrupted at are shares of it (fixed delays failed where an idle machine finished the
    compare inside the later one)."""
    started = time.monotonic()
    subprocess.run([*ALLOCSIM, "compare", str(big_trace), *COMPARE],
                   cwd=tmp_path_factory.mktemp("whole"), capture_output=True, check=True)
    return time.monotonic() - started


@pytest.mark.parametrize("name", list(SIGNALS))
def test_compare_interrupted_at_any_moment_ends_in_one_line(
        name: str, big_trace: Path, compare_seconds: float, tmp_path: Path) -> None:
    signum, status = SIGNALS[name]
    # Early (loading or the first replay) and late (the last replays or the report).
    for delay in (min(0.4, 0.1 * compare_seconds), 0.6 * compare_seconds):
        compare = start(["compare", str(big_trace), *COMPARE], tmp_path)
        time.sleep(delay)
        if compare.poll() is not None:
            pytest.fail(f"compare ended within {delay} s: too small to interrupt")
        code, out, err = signal_group(compare, signum)
        last = assert_one_clean_line(out, err)
        assert code == status, out + err
        assert last.startswith(f"allocsim: interrupted ({name})"), last


def test_the_entry_point_is_light_so_its_handlers_are_in_place_before_numpy_loads() -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    scripts = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml")
                            .read_text())["project"]["scripts"]
    assert scripts["allocsim"] == "allocsim.command:main"
    loaded = subprocess.run([sys.executable, "-c", "import sys, allocsim.command; "
                             "print(sorted(m for m in ('numpy', 'allocsim.sim') "
                             "if m in sys.modules))"], capture_output=True, text=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_ends_on_sigterm_as_by_default_not_with_the_parents_exception() -> None:
    """A sweep's worker is forked with the coordinator's handler; a group SIGTERM that reaches
    it before it sets its own must end it quietly, not raise the coordinator's exception."""
    script = ("import os, signal\n"
              "from allocsim.interrupts import ending_on_signals\n"
              "with ending_on_signals():\n"
              "    pid = os.fork()\n"
              "    if pid == 0:\n"
              "        os.kill(os.getpid(), signal.SIGTERM)\n"
              "        os._exit(0)\n"
              "    _, status = os.waitpid(pid, 0)\n"
              "    print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "True", done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
