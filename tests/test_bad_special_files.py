"""Special files and oversized inputs: a FIFO, a character device (``/dev/zero``,
``/dev/urandom``, ``/dev/null``) or a compression bomb, named wherever allocsim reads a file —
a trace, ``--device-profile``, a baseline to ``check``, a results file to ``report``, a sweep
file, a trace a sweep or a baseline names — ends in one line ``allocsim: error: FILE: ...``,
exit 2, without blocking and without reading the file into memory."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest

from allocsim.sim.cli.main import main
from allocsim.traces import formats, synth

LINUX = sys.platform.startswith("linux")


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.npz"
    formats.save(synth.generate("random", seed=1, events=200), path)
    return path


def fifo(tmp_path: Path, name: str) -> Path:
    """A FIFO; should a reader block on it, a writer opens and closes it after 5 s, so an
    old reader sees an empty file (and the test fails) rather than hanging the suite."""
    path = tmp_path / name
    os.mkfifo(path)

    def unblock() -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader opened it: nothing is blocked
            return
        os.close(fd)

    timer = threading.Timer(5.0, unblock)
    timer.daemon = True
    timer.start()
    return path


def one_line(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("allocsim: error: "), err
    assert "Traceback" not in err
    return err.strip()


def commands(special: Path, trace: Path, out: Path) -> dict[str, list[str]]:
    """Every command that reads a file a user names, with ``special`` in that place."""
    return {
        "info": ["info", str(special)],
        "compare": ["compare", str(special), "--policies", "bfc"],
        "device-profile": ["compare", str(trace), "--policies", "bfc",
                           "--device-profile", str(special)],
        "check": ["check", str(special)],
        "report": ["report", str(special), "-o", str(out / "r.html")],
        "sweep": ["sweep", str(special), "--no-progress"],
        "baseline": ["baseline", str(special), "--policies", "bfc", "-o",
                     str(out / "b.json")],
        "min-capacity": ["min-capacity", str(special), "--policies", "bfc"],
    }


NAMES = ["info", "compare", "device-profile", "check", "report", "sweep", "baseline",
         "min-capacity"]


@pytest.mark.skipif(not LINUX, reason="FIFOs and /dev/null as on Linux")
@pytest.mark.parametrize("command", NAMES)
@pytest.mark.parametrize("kind", ["fifo", "dev-null", "dev-zero-link"])
def test_a_special_file_is_refused_before_it_is_read(tmp_path: Path, capsys, trace: Path,
                                                     command: str, kind: str) -> None:
    if kind == "fifo":
        special = fifo(tmp_path, "pipe.csv")
        expected = "is a FIFO (named pipe), not a regular file"
    else:
        special = tmp_path / "device.csv"
        special.symlink_to("/dev/null" if kind == "dev-null" else "/dev/zero")
        expected = "is a character device, not a regular file"
    err = one_line(capsys, commands(special, trace, tmp_path)[command])
    assert err == f"allocsim: error: {special}: {expected}"
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "b.json").exists()


@pytest.mark.skipif(not LINUX, reason="FIFOs as on Linux")
def test_a_sweep_and_a_baseline_naming_a_fifo_as_trace_are_refused(tmp_path: Path, capsys,
                                                                   trace: Path) -> None:
    pipe = fifo(tmp_path, "pipe.npz")
    grid = tmp_path / "grid.toml"
    grid.write_text(f'[grid]\ntraces = ["{pipe}"]\npolicies = ["bfc"]\n')
    err = one_line(capsys, ["sweep", str(grid), "--no-progress", "--workers", "1"])
    assert f"{str(pipe)!r}: is a FIFO (named pipe), not a regular file" in err
    # A baseline whose trace has since become a FIFO: check refuses it, no hang.
    baseline = tmp_path / "baseline.json"
    assert main(["baseline", str(trace), "--policies", "bfc", "-o", str(baseline)]) == 0
    document = json.loads(baseline.read_text())
    trace.unlink()
    os.mkfifo(trace)
    baseline.write_text(json.dumps(document))
    err = one_line(capsys, ["check", str(baseline)])
    assert f"{trace}: is a FIFO (named pipe), not a regular file" in err


@pytest.mark.skipif(not LINUX, reason="/dev/zero and /dev/urandom as on Linux")
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_endless_device_is_refused_in_bounded_memory(tmp_path: Path, device: str) -> None:
    """In a child limited to 1 GiB of address space and 60 s: the old reader trusted st_size
    (0 for a device) and read until memory ran out."""
    link = tmp_path / "endless.csv.gz"
    link.symlink_to(device)
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
    run = subprocess.run(
        [sys.executable, "-c", limit + "import sys; from allocsim.sim.cli.main import main; "
         f"sys.exit(main(['info', {str(link)!r}]))"],
        capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert run.stderr == f"allocsim: error: {link}: is a character device, not a regular file\n"


def bomb(path: Path, megabytes: int) -> Path:
    """A gzip file of ``megabytes`` MiB of CSV-looking zeros, written in pieces (~1000x)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with path.open("wb") as out:
        out.write(packer.compress(b"time_ns,op,id,size\n"))
        block = b"0" * (1 << 20)
        for _ in range(megabytes):
            out.write(packer.compress(block))
        out.write(packer.flush())
    return path


def test_a_gzip_bomb_is_refused_by_its_ratio_long_before_the_limit(tmp_path: Path,
                                                                   capsys) -> None:
    # 512 MiB from 0.5 MiB, well under the 2 GiB limit: the old reader decompressed it all.
    path = bomb(tmp_path / "bomb.csv.gz", 512)
    assert path.stat().st_size < 1 << 20
    err = one_line(capsys, ["info", str(path)])
    assert err.startswith(f"allocsim: error: {path}: it decompresses more than 200 times over")
    assert "a compression bomb" in err


def test_decompression_stops_within_megabytes_of_a_bomb(tmp_path: Path) -> None:
    from allocsim.traces.formats.limits import decompress_gzip
    from allocsim.traces.model import TraceError
    raw = bomb(tmp_path / "bomb.gz", 256).read_bytes()
    with pytest.raises(TraceError) as caught:
        decompress_gzip(raw, "bomb.gz")
    # Refused once just past the 16 MiB floor: from the first ~100 KiB of input.
    out, consumed = (int(n.replace(",", "")) for n in
                     re.findall(r"\(([\d,]+) bytes from the first ([\d,]+)\)",
                                caught.value.problem)[0])
    assert 16 << 20 < out < 20 << 20 and consumed < 200 << 10


def test_a_real_gzipped_trace_and_concatenated_members_still_read(tmp_path: Path) -> None:
    trace = synth.generate("training", seed=2, events=5000)
    path = tmp_path / "t.csv.gz"
    formats.save(trace, path)
    assert len(formats.load(path)) == len(trace)
    # Two gzip members one after the other (cat a.gz b.gz): one stream, as gzip(1) reads it.
    text = gzip.decompress(path.read_bytes())
    half = text.index(b"\n", len(text) // 2) + 1
    joined = tmp_path / "joined.csv.gz"
    joined.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))
    assert len(formats.load(joined)) == len(trace)
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(formats.TraceError, match="corrupt gzip data"):
        formats.load(cut)


def long_distinct_rows(path: Path, megabytes: int, *, slow: bool) -> int:
    """A ``.csv.gz`` of rows just under the 128 KiB line limit, each with its own tag (about
    27x compressed, so neither the line nor the ratio guard stops it); ``slow``: a space before
    an id sends it to the csv-module path. Returns its decompressed size."""
    block = bytes(range(97, 123)) * 157                      # 4 KiB of letters
    rows = megabytes * 8                                      # 8 rows a MiB
    total = 0
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(b"time_ns,op,id,size,tag\n")
        for i in range(rows):
            tag = (b"%012d" % i + block) * 31                 # ~124 KiB, distinct
            line = b"%d,alloc,%s%d,256,%s\n" % (i, b" " if slow else b"", i, tag)
            out.write(line)
            total += len(line)
    return total + 23


@pytest.mark.parametrize("slow", [False, True], ids=["fast-path", "csv-module-path"])
def test_long_distinct_tags_are_refused_at_their_budget_in_bounded_memory(
        tmp_path: Path, monkeypatch, slow: bool) -> None:
    """Both CSV paths built a table of every row's tag (and the csv path a copy of the whole
    text, then a StringIO of it) before the tag budget was checked: a 64 MiB file peaked at
    5.5x its size (fast path) and 7.8x (csv path). Now the budget is kept as rows come and the
    body is read in place: the peak is the file once (its decompression's slack included) and
    the distinct tags' table, a few times the budget (raw and decoded copies), not a multiple
    of the file. The budget is made 4 MiB here so that a small file shows it."""
    import tracemalloc

    from allocsim.traces.formats.native import csv as native_csv
    monkeypatch.setattr(native_csv, "MAX_TAG_TEXT", 4 << 20)
    path = tmp_path / "long.csv.gz"
    size = long_distinct_rows(path, 48, slow=slow)
    tracemalloc.start()
    try:
        with pytest.raises(formats.TraceError, match="distinct tags hold more than"):
            formats.load(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.25 * size + 3 * (4 << 20), (peak, size)
