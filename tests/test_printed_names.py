"""A file name is printed escaped: one line, no terminal codes (issue 36, item 12).

A name may hold a newline (allocsim's one-line message would become two) or an escape sequence
(``\\x1b[2J`` clears the reader's terminal). Wherever allocsim prints a path or a trace's name —
an error, ``wrote ...``, info's header, compare's table — such characters are written as Python
writes them in a string literal (``\\n``, ``\\x1b``); ordinary names print as they are.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from allocsim.printable import printable
from allocsim.sim.cli.main import main
from allocsim.traces import formats

HOSTILE = "a\nb\x1b[31m\r.npz"
SHOWN = "a\\nb\\x1b[31m\\r.npz"


@pytest.mark.parametrize(("name", "shown"), [
    ("run.npz", "run.npz"), ("my trace (v2) é 名前.npz", "my trace (v2) é 名前.npz"),
    (HOSTILE, SHOWN), ("x\udcff\u202e\x85\t", "x\\udcff\\u202e\\x85\\t"),
    ("back\\slash", "back\\slash")])
def test_printable_escapes_control_characters_and_nothing_else(name: str, shown: str) -> None:
    assert printable(name) == shown
    assert printable(Path(name)) == shown


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


def test_gen_info_convert_and_compare_print_the_name_escaped(tmp_path: Path, capsys,
                                                             monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["gen", "random", "events=50", "-o", HOSTILE]) == 0
    assert _lines(capsys.readouterr().out) == [f"wrote {SHOWN}: 50 events, peak live 37.23MiB"]
    trace = formats.load(HOSTILE)
    trace.metadata["name"] = "name\x1b]0;owned\x07"
    formats.save(trace, HOSTILE)
    assert main(["info", HOSTILE]) == 0
    assert _lines(capsys.readouterr().out)[0] == f"{SHOWN}: name\\x1b]0;owned\\x07 (synth:random)"
    assert main(["compare", HOSTILE, "--policies", "bfc"]) == 0
    assert _lines(capsys.readouterr().out)[0].startswith("trace  name\\x1b]0;owned\\x07: ")
    target = "c\n.csv"
    assert main(["convert", HOSTILE, target]) == 0
    assert _lines(capsys.readouterr().out) == ["wrote c\\n.csv: 50 events"]
    assert "\x1b" not in capsys.readouterr().err


def test_an_error_about_such_a_file_is_one_line(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope\n\x1b[2J.npz"
    assert main(["info", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err
    assert f"{tmp_path}/nope\\n\\x1b[2J.npz" in err


def test_a_refusal_to_overwrite_such_a_file_is_one_line(tmp_path: Path, capsys) -> None:
    theirs = tmp_path / "mine\n\x1b[2J.npz"
    theirs.write_text("my notes")
    assert main(["gen", "random", "events=50", "-o", str(theirs)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "not a trace allocsim wrote" in err
    assert theirs.read_text() == "my notes"
