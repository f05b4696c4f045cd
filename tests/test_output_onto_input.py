"""An output that names the command's own input is refused in one line, the input untouched.

``export-snapshot s.pickle -o s.pickle`` replaced its input with its own replay (exit 0), and
``report rd/results.json -o rd/results.json`` ended in a TypeError traceback (issue 56, items
1 and 11). The rule is ``convert``'s (refusing to overwrite the input file), now one helper
(:func:`allocsim.atomic_files.refuse_overwriting_input`) that knows the same file by any
spelling: as given, ``./NAME``, an absolute path, a symbolic link, a hard link.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from one_line import refused

from allocsim.sim.cli.main import main
from allocsim.traces import formats
from allocsim.traces.synth import generate


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _as_given(path: Path) -> str:
    return path.name


def _dot_slash(path: Path) -> str:
    return f".{os.sep}{path.name}"


def _absolute(path: Path) -> str:
    return str(path.resolve())


def _symlink(path: Path) -> str:
    link = path.with_name("link-" + path.name)
    link.symlink_to(path.name)
    return link.name


def _hard_link(path: Path) -> str:
    link = path.with_name("hard-" + path.name)
    os.link(path, link)
    return link.name


SPELLINGS: dict[str, Callable[[Path], str]] = {
    "as given": _as_given, "./name": _dot_slash, "absolute": _absolute,
    "symbolic link": _symlink, "hard link": _hard_link,
}


@pytest.fixture
def snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> Path:
    """A small snapshot ``s.pickle`` that export-snapshot wrote (so no ownership check would
    stop it being replaced), in the working folder."""
    monkeypatch.chdir(tmp_path)
    formats.save(generate("training", layers=1, steps=1), tmp_path / "t.npz")
    assert main(["export-snapshot", "t.npz", "--policy", "bfc", "-o", "s.pickle"]) == 0
    capsys.readouterr()
    return tmp_path / "s.pickle"


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_export_snapshot_refuses_to_write_over_its_own_input(
        spelling: str, snapshot: Path, capsys) -> None:
    before = _digest(snapshot)
    output = SPELLINGS[spelling](snapshot)
    line = refused(capsys, "export-snapshot", "s.pickle", "--policy", "bfc", "-o", output)
    assert line.startswith(f"allocsim: error: {output}: ")
    assert "refusing to overwrite the input file" in line
    assert _digest(snapshot) == before
    assert sorted(p.name for p in snapshot.parent.iterdir() if p.name.startswith(".")) == []


def test_export_snapshot_refuses_its_input_given_by_another_spelling(
        snapshot: Path, capsys) -> None:
    before = _digest(snapshot)
    line = refused(capsys, "export-snapshot", str(snapshot.resolve()), "-o", "s.pickle")
    assert line.endswith(f"s.pickle: refusing to overwrite the input file "
                         f"({snapshot.resolve()})")           # names the input as given
    assert _digest(snapshot) == before


def test_export_snapshot_still_writes_a_different_file(snapshot: Path, capsys) -> None:
    before = _digest(snapshot)
    assert main(["export-snapshot", "s.pickle", "--policy", "bfc", "-o", "other.pickle"]) == 0
    assert _digest(snapshot) == before and (snapshot.parent / "other.pickle").is_file()


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> Path:
    """``rd/results.json`` of ``compare --json -o rd`` on a small trace, rd in the working
    folder."""
    monkeypatch.chdir(tmp_path)
    formats.save(generate("training", layers=1, steps=1), tmp_path / "t.npz")
    assert main(["compare", "t.npz", "--policies", "bfc", "--json", "-o", "rd"]) == 0
    capsys.readouterr()
    return tmp_path / "rd" / "results.json"


def _in_folder(spell: Callable[[Path], str], path: Path) -> str:
    """A spelling of ``path`` (in rd/) from the working folder."""
    spelt = spell(path)
    return spelt if os.path.isabs(spelt) else str(Path("rd") / spelt)


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_report_refuses_to_write_over_its_results_file(
        spelling: str, results: Path, capsys) -> None:
    before = _digest(results)
    output = _in_folder(SPELLINGS[spelling], results)
    line = refused(capsys, "report", "rd/results.json", "-o", output)
    assert line.startswith(f"allocsim: error: {output}: ")
    assert "refusing to overwrite the input file" in line
    assert _digest(results) == before
    assert not list(results.parent.glob(".*"))


def test_report_refuses_any_of_several_inputs(results: Path, capsys) -> None:
    second = results.with_name("second.json")
    second.write_bytes(results.read_bytes())
    before = _digest(second)
    line = refused(capsys, "report", "rd/results.json", "./rd/second.json", "-o",
                   "rd/second.json")
    assert "rd/second.json: refusing to overwrite the input file (./rd/second.json)" in line
    assert _digest(second) == before


def test_report_to_a_json_name_that_is_no_input_is_one_line_not_a_traceback(
        results: Path, capsys) -> None:
    line = refused(capsys, "report", "rd/results.json", "-o", "rd/page.json")
    assert "rd/page.json: a report is an HTML page" in line
    assert not (results.parent / "page.json").exists()


def test_report_still_writes_its_page(results: Path, capsys) -> None:
    before = _digest(results)
    assert main(["report", "rd/results.json", "-o", "rd/page.html"]) == 0
    assert _digest(results) == before and (results.parent / "page.html").is_file()


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_convert_refuses_its_input_however_it_is_spelt(
        spelling: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    # convert's own rule compared resolved paths: a hard link slipped past it (the write's
    # rename broke the link, so only luck kept the input); the one rule covers it now.
    monkeypatch.chdir(tmp_path)
    trace = tmp_path / "h.npz"
    formats.save(generate("training", layers=1, steps=1), trace)
    before = _digest(trace)
    output = SPELLINGS[spelling](trace)
    line = refused(capsys, "convert", "h.npz", output)
    assert "refusing to overwrite the input file" in line
    assert _digest(trace) == before
