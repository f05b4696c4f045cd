"""Telling whose a file is costs a bounded read and ends in one line (issue 36, items 8, 11).

An existing output is checked before allocsim replaces it. The check reads a bounded head of the
file — a 6 GB sparse ``results.json`` in ``compare -o DIR``, or a 6 GB sweep output, is judged
in well under a second within 3 GB of memory — and a file that breaks the reader (a corrupt
gzip stream, a zip member packed by a method Python lacks, JSON nested past the parser's
recursion) is simply not allocsim's: one line, exit status 2, the file as it was.
"""

from __future__ import annotations

import gzip
import resource
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from allocsim.sim.cli.main import main

LINUX = sys.platform.startswith("linux")
SIX_GB = 6 << 30


def _under_3gb(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.RLIM_INFINITY))
    return subprocess.run([sys.executable, "-m", "allocsim", *argv], cwd=cwd, text=True,
                          capture_output=True, preexec_fn=limit, timeout=120)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.npz"
    assert main(["gen", "random", "events=200", "-o", str(path)]) == 0
    return path


def _sparse(path: Path) -> None:
    with path.open("wb") as handle:
        handle.truncate(SIX_GB)


@pytest.mark.skipif(not LINUX, reason="sparse files and RLIMIT_AS as on Linux")
def test_a_6gb_sparse_results_json_is_refused_from_its_head(tmp_path: Path, trace: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _sparse(out / "results.json")
    done = _under_3gb(["compare", str(trace), "--policies", "on-demand", "-o", "out"], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines() == [
        "allocsim: error: out/results.json: exists and is not compare's results allocsim "
        "wrote; refusing to overwrite it (choose another output path, or move the file)"]
    assert (out / "results.json").stat().st_size == SIX_GB


@pytest.mark.skipif(not LINUX, reason="sparse files and RLIMIT_AS as on Linux")
def test_a_6gb_sparse_sweep_output_is_refused_from_its_head(tmp_path: Path) -> None:
    (tmp_path / "grid.toml").write_text(
        '[grid]\ntraces = ["synth:random?events=300&seed=1"]\npolicies = ["bfc"]\n')
    _sparse(tmp_path / "big.jsonl")
    done = _under_3gb(["sweep", "grid.toml", "--output", "big.jsonl", "--workers", "1",
                       "--no-progress"], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines() == [
        "allocsim: error: big.jsonl: not a sweep results file; it does not start with a sweep "
        "record, so it is left as it is (give another --output, or remove it)"]


def test_a_large_results_json_of_compares_is_still_recognised_by_its_head(
        tmp_path: Path, trace: Path, monkeypatch) -> None:
    from allocsim.sim.output import ownership
    out = tmp_path / "out"
    argv = ["compare", str(trace), "--policies", "on-demand", "-o", str(out)]
    assert main(argv) == 0
    monkeypatch.setattr(ownership, "JSON_WHOLE_BYTES", 16)    # every file counts as large
    assert main(argv) == 0, "its own results.json, known by its head"
    (out / "results.json").write_text('{"kind": "mine", "notes": "' + "x" * 100 + '"}')
    assert main(argv) == 2


def _corrupt_gzip(path: Path) -> None:
    packed = bytearray(gzip.compress(b"# allocsim-metadata: {}\n" * 2000))
    packed[20:40] = b"\xff" * 20                          # the deflate stream broken
    path.write_bytes(bytes(packed))


def _zip_packed_by_an_unknown_method(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("format.npy", b"allocsim-trace")
    raw = bytearray(path.read_bytes())
    for header, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):   # method: 99 (AES)
        at = raw.find(header)
        raw[at + offset:at + offset + 2] = struct.pack("<H", 99)
    path.write_bytes(bytes(raw))


def _deep_json(path: Path) -> None:
    path.write_text("[" * 200_000 + "]" * 200_000)


@pytest.mark.parametrize(("name", "make"), [
    ("run.csv.gz", _corrupt_gzip), ("run.npz", _zip_packed_by_an_unknown_method),
    ("results.json", _deep_json)], ids=["zlib.error", "NotImplementedError", "RecursionError"])
def test_an_output_that_breaks_the_reader_is_refused_in_one_line(
        name: str, make, tmp_path: Path, trace: Path, capsys) -> None:
    target = tmp_path / name
    make(target)
    before = target.read_bytes()
    capsys.readouterr()
    if name == "results.json":
        argv = ["compare", str(trace), "--policies", "on-demand", "-o", str(tmp_path)]
    else:
        argv = ["convert", str(trace), str(target)]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"allocsim: error: {target}: exists and is not")
    assert target.read_bytes() == before
