"""A trace's metadata name is the file's to choose, so it is hostile input where it becomes a
file name: ``compare A B -o DIR`` files each trace's figures under ``NN-NAME-``, and
``validate -o DIR`` its report under ``NAME-BACKEND-POLICY``. Whatever the name — separators,
``..``, NUL, leading dots, a reserved device name, a name of thousands of characters — every file
is written inside DIR (issue 25.3); :func:`safe_stem` is the one function that makes the name
safe."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from allocsim.sim.cli.main import main
from allocsim.sim.output.files import MAX_STEM_BYTES, safe_stem
from allocsim.traces import formats, synth

HOSTILE = ["/../../ESCAPED", "../../../ESCAPED", "..", ".", "...", "a/../../b", "\\..\\..\\x",
           "nul\x00byte", ".hidden", "..hidden", "/", "", "   ", "CON", "con.txt", "x" * 5000,
           "é" * 300, "../" * 100 + "deep", "name\nwith\nlines", "$x$", "-rf"]


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_a_safe_stem_is_one_plain_name_inside_its_folder(name: str, tmp_path: Path) -> None:
    stem = safe_stem(name)
    assert stem and "/" not in stem and "\\" not in stem and "\x00" not in stem
    assert not stem.startswith(".") and ".." not in stem
    assert len(stem.encode()) <= MAX_STEM_BYTES
    assert stem.split(".")[0].upper() not in {"CON", "NUL"}
    path = tmp_path / f"00-{stem}-memory_timeline.png"
    assert path.resolve().parent == tmp_path.resolve()
    path.write_bytes(b"")               # a name the file system takes
    assert path.exists()


def test_safe_names_keep_what_was_safe_and_long_ones_stay_apart() -> None:
    assert safe_stem("default-training") == "default-training"
    assert safe_stem("résnet_50.v2") == "résnet_50.v2"
    assert safe_stem("bfc:fraction=0.5") == "bfc_fraction_0.5"
    long_a, long_b = "a" * 400 + "1", "a" * 400 + "2"
    assert safe_stem(long_a) != safe_stem(long_b)


def _named(tmp: Path, file: str, name: str) -> Path:
    trace = synth.generate("random", seed=1, events=120)
    trace.metadata["name"] = name
    path = tmp / file
    formats.save(trace, path)
    return path


@pytest.mark.parametrize("name", ["/../../ESCAPED", "x/../../../ESCAPED", "..", ".hidden",
                                  "a" * 4000], ids=lambda n: repr(n[:20]))
def test_compare_of_traces_with_hostile_names_writes_only_inside_the_folder(
        name: str, tmp_path: Path, capsys) -> None:
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    first, second = _named(work, "one.csv", name), _named(work, "two.csv", name)
    out = work / "out"
    # Folders the unsafe name would walk through, made ready as an attacker would.
    for prefix in ("00-", "01-", "00-x", "01-x"):
        (out / prefix).mkdir(parents=True, exist_ok=True)
    before = set(tmp_path.rglob("*"))
    assert main(["compare", str(first), str(second), "--policies", "bfc", "-o", str(out)]) == 0
    capsys.readouterr()
    new = set(tmp_path.rglob("*")) - before
    assert new, "it wrote its files"
    outside = sorted(str(p) for p in new if out.resolve() not in p.resolve().parents)
    assert outside == []
    assert all(p.parent == out for p in new), sorted(str(p) for p in new)
    assert not any(p.name.startswith(".") for p in new)


def test_a_validation_report_of_a_hostile_trace_name_stays_in_its_folder(tmp_path: Path,
                                                                         capsys) -> None:
    trace = _named(tmp_path, "t.csv", "/../../ESCAPED")
    out = tmp_path / "reports" / "here"
    out.mkdir(parents=True)
    status = main(["validate", str(trace), "--policy", "bfc", "--backend", "host",
                   "-o", str(out)])
    capsys.readouterr()
    assert status in (0, 1)
    written = sorted(os.listdir(out))
    assert written and all(not name.startswith(".") for name in written), written
    assert not list(tmp_path.rglob("ESCAPED*")) or all(
        p.parent == out for p in tmp_path.rglob("*ESCAPED*"))
