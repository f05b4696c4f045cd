"""Bad inputs to `allocsim record` and to the readers it feeds: each is refused in one line
(`allocsim: error: ...`, exit 2, no traceback, nothing written) or counted as a repair."""

from __future__ import annotations

import importlib.util
import pickle
import sys
from pathlib import Path

import pytest

from allocsim.sim.cli.main import main
from allocsim.traces.formats import load
from allocsim.traces.model import TraceError


def one_error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("allocsim: error: ") and "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------------- record
def test_record_names_a_missing_script(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(capsys, ["record", "-o", "out.npz", "--", "nosuch.py"])
    assert line == "allocsim: error: nosuch.py: no such script"
    assert list(tmp_path.iterdir()) == []


def test_record_refuses_without_cupy(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # not importable, installed or not
    monkeypatch.chdir(tmp_path)
    Path("script.py").write_text("print('ran')\n")
    line = one_error_line(capsys, ["record", "--framework", "cupy", "-o", "out.npz", "--",
                                   "python", "script.py"])
    assert line == ("allocsim: error: record: CuPy is not installed (pip install "
                    "cupy-cuda12x); the recorder hooks CuPy's allocator")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["script.py"]
    assert "ran" not in capsys.readouterr().out


# ---------------------------------------------------------------------- empty native files
@pytest.mark.parametrize("name", ["e.jsonl", "e.csv", "blank.jsonl"])
def test_an_empty_native_file_is_refused(tmp_path, capsys, name):
    path = tmp_path / name
    path.write_bytes(b"" if name.startswith("e.") else b"\n  \n")
    line = one_error_line(capsys, ["info", str(path)])
    assert line == f"allocsim: error: {path}: empty file (no header / no events)"
    with pytest.raises(TraceError):
        load(path)


@pytest.mark.parametrize("name, text", [("h.jsonl", '{"allocsim-metadata": {}}\n'),
                                        ("h.csv", "time_ns,op,id,size\n")])
def test_a_header_only_native_file_is_an_empty_trace(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    assert len(load(path)) == 0


# ---------------------------------------------------------------------- snapshot actions
def snapshot_with_unknown_action(path: Path) -> Path:
    def entry(action: str, t: int) -> dict:
        return {"action": action, "addr": 0x1000, "size": 10, "stream": 0, "frames": [],
                "time_us": t}
    snap = {"segments": [], "device_traces": [[
        entry("alloc", 1), entry("teleport", 2), entry("free_requested", 3),
        entry("free_completed", 4)]]}
    path.write_bytes(pickle.dumps(snap, protocol=2))
    return path


def test_unknown_snapshot_action_is_a_counted_repair(tmp_path, capsys):
    path = snapshot_with_unknown_action(tmp_path / "s.pickle")
    trace = load(path)
    assert len(trace) == 2
    assert trace.metadata["validation"]["repairs"] == {"unknown_actions_dropped": 1}
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 unknown actions dropped" in out


def test_unknown_snapshot_action_is_an_error_when_strict(tmp_path, capsys):
    path = snapshot_with_unknown_action(tmp_path / "s.pickle")
    line = one_error_line(capsys, ["info", "--strict", str(path)])
    assert line.startswith(f"allocsim: error: {path}: device 0 entry 1: unknown trace action")
    with pytest.raises(TraceError):
        load(path, strict=True)


def test_a_saved_lenient_snapshot_reloads_strictly(tmp_path):
    trace = load(snapshot_with_unknown_action(tmp_path / "s.pickle"))
    from allocsim.traces.formats import save
    save(trace, tmp_path / "s.npz")
    assert load(tmp_path / "s.npz", strict=True).equals(trace)


# ------------------------------------------------ record: what the user is told (issue 26.4)
def test_another_interpreter_named_is_said_to_be_replaced() -> None:
    """``-- /usr/bin/python3 x.py`` ran under allocsim's interpreter silently."""
    from allocsim.traces.record.script_args import interpreter_note
    other = "/opt/elsewhere/bin/python3.9"
    note = interpreter_note([other, "x.py"])
    assert note is not None and other in note and sys.executable in note
    assert interpreter_note([sys.executable, "x.py"]) is None
    assert interpreter_note(["python", "x.py"]) is None
    assert interpreter_note(["x.py"]) is None


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_a_program_that_holds_no_jax_array_is_warned_about(tmp_path, capsys) -> None:
    """It wrote a 0-event trace with no word."""
    script = tmp_path / "plain.py"
    script.write_text("print(sum(range(10)))\n")
    out = tmp_path / "run.npz"
    assert main(["record", "--framework", "jax", "-o", str(out), "--", "/opt/elsewhere/python3",
                 str(script)]) == 0
    err = capsys.readouterr().err
    assert f"wrote {out} with 0 events: the program held no JAX array" in err
    assert "not the interpreter recording" in err and "Traceback" not in err
    assert len(load(out)) == 0
