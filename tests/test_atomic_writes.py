"""Every file allocsim writes is written whole or not at all (issue 25.2).

A writer stopped half-way — by ``ulimit -f``, a full disk, SIGKILL — leaves the previous output
byte for byte as it was, and an error names the file it was writing. Because an output is never
left cut short, allocsim never meets a truncated file of its own that it would then refuse to
replace: the rerun simply replaces the intact previous output. A killed writer's temporary file
(``.NAME.XXXXXXXXXXXXXXXX.tmp``) is removed by the next write of the same output, unless its
writer is still alive (it holds a lock on it); a file that only has such a name is not one.
"""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from allocsim.atomic_files import remove_stale_temporaries, temporary_pattern
from allocsim.errors import UserInputError
from allocsim.sim.cli.main import main
from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.questions.compare import compare
from allocsim.traces import formats, synth

LINUX = sys.platform.startswith("linux")
LIMIT = 4096            # bytes: every output below is larger


def temporaries(path: Path) -> list[str]:
    pattern = temporary_pattern(path)
    return sorted(p.name for p in path.parent.iterdir() if pattern.fullmatch(p.name))


@contextmanager
def file_size_limit(nbytes: int) -> Iterator[None]:
    """``ulimit -f`` for this process, for one call (Python ignores SIGXFSZ: writes fail)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.fixture(scope="module")
def trace():
    return synth.generate("random", seed=3, events=3000)


def _report(trace, path: Path) -> None:
    from allocsim.sim.output.html_report import write_report
    comparison = compare(trace, ["bfc", "on-demand"], resolve_device("a100-80g"))
    write_report([comparison.to_json_dict()], path)


def _figure(trace, path: Path) -> None:
    from allocsim.sim.output.figures import plot_peaks
    comparison = compare(trace, ["bfc", "on-demand"], resolve_device("a100-80g"))
    plot_peaks(comparison.results, path)


def _snapshot(trace, path: Path) -> None:
    from allocsim.sim.output.export import export_snapshot
    export_snapshot(trace, "pytorch", resolve_device("a100-80g"), path)


def _json(trace, path: Path) -> None:
    from allocsim.sim.output.files import write_json
    comparison = compare(trace, ["bfc", "on-demand"], resolve_device("a100-80g"))
    write_json(comparison.to_json_dict(timeline=True), path, kind="results")


def _trace(trace, path: Path) -> None:
    formats.save(trace, path)


WRITERS: dict[str, tuple[str, Callable]] = {
    "the HTML report": ("report.html", _report),
    "a figure": ("peaks.png", _figure),
    "export-snapshot": ("run.pickle", _snapshot),
    "results.json": ("results.json", _json),
    "a trace (gen, convert)": ("run.csv", _trace),
}


@pytest.mark.skipif(not LINUX, reason="RLIMIT_FSIZE as on Linux")
@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_write_past_the_file_size_limit_keeps_the_previous_output(writer: str, trace,
                                                                    tmp_path: Path) -> None:
    name, write = WRITERS[writer]
    path = tmp_path / name
    write(trace, path)
    before = path.read_bytes()
    assert len(before) > LIMIT
    with pytest.raises((OSError, UserInputError)) as caught, file_size_limit(LIMIT):
        write(trace, path)
    assert str(path) in str(caught.value), "the error names the file it was writing"
    assert path.read_bytes() == before, "the previous output is whole"
    assert temporaries(path) == [], "nothing half-written is left beside it"
    write(trace, path)      # and it is still allocsim's own, so it is replaced
    assert path.stat().st_size == len(before)


@pytest.mark.skipif(not LINUX, reason="RLIMIT_FSIZE as on Linux")
def test_export_snapshot_under_ulimit_f_names_the_file_and_the_rerun_replaces_it(
        trace, tmp_path: Path) -> None:
    source, target = tmp_path / "t.npz", tmp_path / "run.pickle"
    formats.save(trace, source)
    command = [sys.executable, "-m", "allocsim", "export-snapshot", str(source), "-o", str(target)]
    assert subprocess.run(command, capture_output=True).returncode == 0
    before = target.read_bytes()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
    limited = subprocess.run(command, capture_output=True, text=True, preexec_fn=limit)
    assert limited.returncode == 2
    assert limited.stderr.strip().splitlines() == [f"allocsim: error: {target}: File too large"]
    assert target.read_bytes() == before and temporaries(target) == []
    # Never truncated, so never refused as "not a snapshot allocsim wrote" afterwards.
    rerun = subprocess.run(command, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr


@pytest.mark.skipif(not LINUX, reason="SIGKILL and the temporary file's lock as on Linux")
def test_a_killed_gen_leaves_the_previous_trace_and_the_next_gen_removes_its_temporary(
        tmp_path: Path) -> None:
    target = tmp_path / "run.csv"
    small = [sys.executable, "-m", "allocsim", "gen", "random", "events=100", "-o", str(target)]
    assert subprocess.run(small, capture_output=True).returncode == 0
    before = target.read_bytes()
    big = [sys.executable, "-m", "allocsim", "gen", "random", "events=3000000", "-o",
           str(target)]
    writer = subprocess.Popen(big, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not any((tmp_path / name).stat().st_size > 0 for name in temporaries(target)):
            assert writer.poll() is None, "gen finished before it could be killed mid-write"
            assert time.monotonic() < deadline
            time.sleep(0.005)
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.wait()
    assert target.read_bytes() == before, "the previous trace is whole"
    assert len(temporaries(target)) == 1, "the killed writer's temporary file is left ..."
    assert subprocess.run(small, capture_output=True).returncode == 0
    assert temporaries(target) == [], "... until the next write of the same output"
    assert target.read_bytes() == before    # the same command, the same bytes


def _killed_writer(target: Path) -> Path:
    """The temporary file a writer of ``target`` leaves when SIGKILL stops it mid-write."""
    before = set(temporaries(target))
    code = ("import os, signal, sys\n"
            "from allocsim.atomic_files import atomic_output\n"
            "with atomic_output(sys.argv[1]) as stream:\n"
            "    stream.write(b'partial'); stream.flush()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True)
    made = set(temporaries(target)) - before
    assert len(made) == 1
    return target.parent / made.pop()


@contextmanager
def live_writer(target: Path) -> Iterator[Path]:
    """A writer of ``target`` that is still writing: its temporary file, while it runs."""
    code = ("import sys, time\n"
            "from allocsim.atomic_files import atomic_output\n"
            "with atomic_output(sys.argv[1]) as stream:\n"
            "    stream.write(b'partial'); stream.flush(); print('writing', flush=True)\n"
            "    time.sleep(60)\n")
    before = set(temporaries(target))
    writer = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
        made = set(temporaries(target)) - before
        assert len(made) == 1
        yield target.parent / made.pop()
    finally:
        writer.kill()
        writer.wait()


@pytest.mark.skipif(not LINUX, reason="flock as on Linux")
def test_the_sweep_removes_a_killed_writers_temporary_and_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    with live_writer(target) as live:
        stale = _killed_writer(target)
        # Files a user could have, named as allocsim names its temporary files (one copied
        # from one it made: the token proves a file, not a name), a link, another output's.
        token = stale.name.split(".")[-2]
        theirs = [tmp_path / ".out.json.0123abcd0123abcd.tmp",
                  tmp_path / ".out.json.0123abcd.tmp", tmp_path / ".out.json.mine.tmp",
                  tmp_path / f".other.json.{token}.tmp"]
        for path in theirs:
            path.write_bytes(b"the user's")
        copied = tmp_path / f".out.json.{'0' * len(token)}.tmp"
        copied.write_bytes(stale.read_bytes())
        link = tmp_path / f".out.json.{'f' * len(token)}.tmp"
        link.symlink_to(theirs[0])
        assert remove_stale_temporaries(target) == [stale]
        assert live.exists(), "a writer still running keeps its file"
    assert all(p.read_bytes() == b"the user's" for p in theirs)
    assert copied.exists() and link.is_symlink()
    assert remove_stale_temporaries(target) == [live], "once its writer ends, it goes too"


@pytest.mark.skipif(not LINUX, reason="flock as on Linux")
def test_convert_and_compare_keep_a_users_file_named_like_a_temporary(
        tmp_path: Path, capsys) -> None:
    """The issue's two cases: ``.own.csv.gz.0badcafe.tmp`` beside ``convert ok.csv own.csv.gz``
    and ``.results.json.deadbeef.tmp`` in ``compare -o DIR``."""
    source = tmp_path / "ok.csv"
    assert main(["gen", "random", "events=50", "-o", str(source)]) == 0
    users = [tmp_path / ".own.csv.gz.0badcafe.tmp", tmp_path / ".own.csv.gz.0badcafe0badcafe.tmp"]
    out = tmp_path / "out"
    out.mkdir()
    users += [out / ".results.json.deadbeef.tmp", out / ".results.json.deadbeefdeadbeef.tmp"]
    for path in users:
        path.write_text("my notes\n")
    assert main(["convert", str(source), str(tmp_path / "own.csv.gz")]) == 0
    assert main(["compare", str(source), "--policies", "on-demand", "-o", str(out)]) == 0
    assert [p.read_text() for p in users] == ["my notes\n"] * len(users)


def test_a_very_long_name_still_gets_a_temporary_file_beside_it(tmp_path: Path) -> None:
    from allocsim.atomic_files import write_text
    target = tmp_path / ("n" * 250 + ".json")
    write_text(target, "{}\n")
    assert target.read_text() == "{}\n" and temporaries(target) == []


def test_a_write_error_names_the_file_on_the_command_line(tmp_path: Path, capsys) -> None:
    source = tmp_path / "t.npz"
    assert main(["gen", "random", "events=50", "-o", str(source)]) == 0
    target = tmp_path / "no-such-folder" / "run.pickle"
    capsys.readouterr()
    assert main(["export-snapshot", str(source), "-o", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"allocsim: error: {target}: No such file or directory"]


def _limited(nbytes: int) -> Callable[[], None]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.RLIM_INFINITY))
    return limit


@pytest.mark.skipif(not LINUX, reason="RLIMIT_FSIZE as on Linux")
def test_a_sweeps_results_file_past_the_size_limit_is_named(tmp_path: Path) -> None:
    """Issue 36.15: "allocsim: error: File too large", naming nothing."""
    (tmp_path / "grid.toml").write_text(
        '[grid]\ntraces = ["synth:random?events=300&seed=[1..3]"]\npolicies = ["bfc"]\n')
    done = subprocess.run([sys.executable, "-m", "allocsim", "sweep", "grid.toml", "--output",
                           "out.jsonl", "--workers", "1", "--no-progress"], cwd=tmp_path,
                          capture_output=True, text=True, preexec_fn=_limited(1024))
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["allocsim: error: out.jsonl: File too large"]


@pytest.mark.skipif(not LINUX, reason="RLIMIT_FSIZE and /proc as on Linux")
def test_standard_output_past_the_size_limit_is_named(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    with target.open("w") as stdout:
        done = subprocess.run([sys.executable, "-m", "allocsim", "compare", "--json"],
                              stdout=stdout, stderr=subprocess.PIPE, text=True,
                              preexec_fn=_limited(1024))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"allocsim: error: standard output ({target}): File too large"]
