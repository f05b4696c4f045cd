"""Sweeps must not lose a user's work: ``--output`` onto a file that is not a results file
leaves it byte for byte as it was; killing the sweep (SIGKILL, its main process only) leaves no
worker behind and no stale lock, and running the same command again completes the grid with
every cell exactly once."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from allocsim.sim.cli.main import main
from allocsim.traces import formats, synth

LINUX = sys.platform.startswith("linux")


def write_grid(folder: Path, grid: str, output: str | None = None) -> Path:
    path = folder / "grid.toml"
    head = f'output = "{output}"\n' if output else ""
    path.write_text(f"{head}[grid]\n{grid}\n")
    return path


SMALL_GRID = 'traces = ["synth:random?events=300&seed=1"]\npolicies = ["bfc", "best-fit"]'


def _npz(path: Path) -> None:
    formats.save(synth.generate("training", seed=1, events=300), path)


def _json_document(path: Path) -> None:
    path.write_text(json.dumps({"cell": "mine", "status": "ok", "notes": [1, 2, 3]}, indent=2))


def _compact_json(path: Path) -> None:
    # One line, no newline, shaped almost like a record: still a whole document, not a torn line.
    path.write_text('{"cell":"traces/a.npz | bfc | d | default","status":"ok"}')


def _jsonl_of_other_records(path: Path) -> None:
    path.write_text('{"cell": "x", "value": 1}\n{"cell": "y", "value": 2}\n')


def _text(path: Path) -> None:
    path.write_text("my notes\nabout the experiment\nunfinished last line")


def _binary(path: Path) -> None:
    path.write_bytes(random.Random(7).randbytes(5000))


def _records_then_a_stranger(path: Path) -> None:
    # A real results file someone appended a line of their own to: not ours to cut or extend.
    good = {"cell": "a | bfc | d | default", "trace": "a", "policy": "bfc", "device": "d",
            "capacity": None, "status": "ok", "error": None, "result": None}
    path.write_text(json.dumps(good, separators=(",", ":")) + "\n# my comment\n")


@pytest.mark.parametrize("make", [_npz, _json_document, _compact_json, _jsonl_of_other_records,
                                  _text, _binary, _records_then_a_stranger],
                         ids=lambda make: make.__name__.strip("_"))
def test_output_onto_a_file_that_is_not_a_results_file_is_refused(tmp_path, capsys, make):
    target = tmp_path / "precious.npz"
    make(target)
    before = target.read_bytes()
    grid = write_grid(tmp_path, SMALL_GRID)
    argv = ["sweep", str(grid), "--output", str(target), "--workers", "1", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"allocsim: error: {target}: not a sweep results file; ")
    assert err.count("\n") == 1                       # one line
    assert target.read_bytes() == before              # byte-identical
    assert main([*argv, "--retry-errors"]) == 2 and target.read_bytes() == before


def test_the_sweep_files_own_output_key_is_checked_too(tmp_path, capsys):
    target = tmp_path / "notes.txt"
    _text(target)
    before = target.read_bytes()
    grid = write_grid(tmp_path, SMALL_GRID, output="notes.txt")
    assert main(["sweep", str(grid), "--workers", "1", "--no-progress"]) == 2
    assert "not a sweep results file" in capsys.readouterr().err
    assert target.read_bytes() == before


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_is_refused_without_opening_it(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    grid = write_grid(tmp_path, SMALL_GRID)
    assert main(["sweep", str(grid), "--output", str(fifo), "--no-progress"]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_a_results_file_cut_by_a_crash_is_still_recognised(tmp_path, capsys):
    grid = write_grid(tmp_path, SMALL_GRID)
    output = tmp_path / "out.jsonl"
    argv = ["sweep", str(grid), "--output", str(output), "--workers", "1", "--no-progress"]
    assert main(argv) == 0
    lines = output.read_bytes().splitlines(keepends=True)
    assert len(lines) == 2
    # A crash during the very first line, during a later one, and zeros after a power loss.
    for damaged in (lines[0][:5], lines[0] + lines[1][:20], lines[0] + b"\0" * 64):
        output.write_bytes(damaged)
        assert main(argv) == 0
        text = output.read_text()
        assert text.endswith("\n") and len({json.loads(x)["cell"] for x in text.splitlines()}) == 2
    capsys.readouterr()


def test_an_empty_file_is_a_results_file(tmp_path, capsys):
    output = tmp_path / "empty.jsonl"
    output.touch()
    grid = write_grid(tmp_path, SMALL_GRID)
    assert main(["sweep", str(grid), "--output", str(output), "--no-progress"]) == 0
    assert len(output.read_text().splitlines()) == 2
    capsys.readouterr()


# -- killing the sweep ---------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")        # a zombie has ended; only its reaping is left


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.skipif(not LINUX, reason="finds the workers through /proc")
def test_sigkill_of_the_sweep_leaves_no_worker_and_the_rerun_completes(tmp_path):
    seeds, policies = 12, ["bfc", "best-fit", "on-demand", "pytorch"]
    grid = write_grid(tmp_path, f'traces = ["synth:random?events=30000&seed=[1..{seeds}]"]\n'
                                f"policies = {json.dumps(policies)}")
    output = tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "allocsim", "sweep", grid.name, "--output", output.name,
               "--workers", "2", "--no-progress"]
    with open(tmp_path / "first.log", "wb") as log:
        sweep = subprocess.Popen(command, cwd=tmp_path, stdout=log, stderr=log)
    try:
        assert _wait_for(lambda: output.exists() and output.read_bytes().count(b"\n") >= 2, 30)
        workers = _children(sweep.pid)
        assert workers, "the sweep runs its cells in worker processes"
    finally:
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait()
    written = output.read_bytes().count(b"\n")
    assert written < seeds * len(policies), "killed mid-sweep, not after it"
    # The workers end with their parent, within a few seconds (not minutes).
    assert _wait_for(lambda: not any(_alive(pid) for pid in workers), 5), \
        [pid for pid in workers if _alive(pid)]
    # No stale lock: the same command runs again and completes the grid.
    rerun = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "another sweep" not in rerun.stderr
    cells = collections.Counter(json.loads(line)["cell"]
                                for line in output.read_text().splitlines())
    assert len(cells) == seeds * len(policies)
    assert set(cells.values()) == {1}                 # every cell exactly once


@pytest.mark.skipif(not LINUX, reason="reads a process's descriptors through /proc")
def test_local_workers_do_not_hold_the_results_file(tmp_path):
    from allocsim.sim.sweeps.executors import make_runner
    from allocsim.sim.sweeps.grid import parse_definition
    from allocsim.sim.sweeps.store import ResultsFile

    sweep = parse_definition({"grid": {"traces": ["synth:random?events=200"],
                                       "policies": ["bfc", "best-fit"]}}, base_dir=tmp_path)
    results = ResultsFile(tmp_path / "r.jsonl")
    runner = make_runner("local", 2, sweep.cells(), private=[results.identity()])
    try:
        records = [runner.submit(cell).result(timeout=30) for cell in sweep.cells()]
        target = str(tmp_path / "r.jsonl")
        for pid in {int(r["worker"].rsplit(":", 1)[1]) for r in records}:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
            assert target not in links               # so its lock dies with the coordinator
    finally:
        runner.close()
        results.close()


WATCHED_CHILD = """
import os, sys, time
from allocsim.sim.sweeps.executors import die_with_parent
parent = os.getpid()
child = os.fork()
if child == 0:
    die_with_parent(parent, use_prctl=False, interval_s=0.05)
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_without_prctl_a_worker_still_ends_with_its_parent(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", WATCHED_CHILD], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()

    def gone() -> bool:
        if LINUX:
            return not _alive(child)
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        return False

    assert _wait_for(gone, 5)
