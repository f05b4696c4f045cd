"""No name reaches the terminal raw, from any command (issue 56, item 13).

A trace's name and tags, a device profile's name, a sweep's trace file names and the layout
suffix of a shape are the user's (or a recording's) to choose. Any of them may hold an escape
sequence (``\\x1b[31m`` colours the reader's terminal, ``\\x1b]0;...\\x07`` retitles it), a bell
or a bidi override (U+202E turns the rest of the line around). One rule shows them all:
:func:`allocsim.printable.printable` — the tables' cells, the figures' titles, the headings
(``sim/output/display_text.shown``), and, over everything a command prints, standard output
written through :class:`allocsim.printable.PrintableStream` (sim/cli/main.py). Each command that
prints a name is run here over such names; neither standard output nor standard error may hold
a raw ESC, BEL or RLO, and a name of a megabyte is not printed whole.
"""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import pytest

from allocsim.printable import PrintableStream, printable
from allocsim.sim.cli.main import main
from allocsim.sim.output.display_text import MAX_SHOWN, shown
from allocsim.sim.output.tables import format_table
from allocsim.traces import formats
from allocsim.traces.model import Trace

HOSTILE = "\x1b[31m\x07\u202e"
RAW = ("\x1b", "\x07", "\u202e")
ESCAPED = "\\x1b[31m\\x07\\u202e"


def _trace(name: str, tags: list[str]) -> Trace:
    """40 buffers of 1 to 7 MiB, all alive at once (155 MiB), then freed; tags alternate."""
    count = 40
    ops = [0] * count + [1] * count
    ids = list(range(count)) * 2
    sizes = [((i % 7) + 1) << 20 for i in range(count)] * 2
    tag = [i % len(tags) for i in range(count)] * 2
    return Trace.from_columns(list(range(0, 2 * count * 1000, 1000)), ops, ids, sizes, tag=tag,
                              tags=tags, name=name)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("injection")
    formats.save(_trace(f"run{HOSTILE}name", [f"layer{HOSTILE}a", f"opt{HOSTILE}b"]),
                 folder / "hostile.npz")
    formats.save(_trace("L" * 1_000_000, ["a", "b"]), folder / "long.npz")
    (folder / "device.json").write_text(json.dumps({"name": f"card{HOSTILE}",
                                                    "capacity": 96 << 20}))
    (folder / f"file{HOSTILE}.npz").write_bytes((folder / "hostile.npz").read_bytes())
    (folder / "grid.toml").write_text(
        'name = "grid"\noutput = "results.jsonl"\n[grid]\n'
        f'traces = ["hostile.npz", {json.dumps(f"file{HOSTILE}.npz")}]\n'
        'policies = ["bfc", "best-fit"]\ndevices = ["a100-80g"]\ncapacities = ["1GiB"]\n')
    return folder


COMMANDS = {
    "info": ["info", "hostile.npz"],
    "compare": ["compare", "hostile.npz", "--policies", "bfc", "pytorch"],
    "compare-device-profile": ["compare", "hostile.npz", "--device-profile", "device.json"],
    "compare-figures": ["compare", "hostile.npz", "--policies", "bfc", "-o", "compared"],
    "min-capacity": ["min-capacity", "hostile.npz", "--policies", "bfc", "--device-profile",
                     "device.json"],
    "share": ["share", "hostile.npz", "hostile.npz:bfc@1ms", "--device-profile", "device.json"],
    "explain-oom": ["explain-oom", "hostile.npz", "--capacity", "20MiB"],
    "explain-oom-device-profile": ["explain-oom", "hostile.npz", "--device-profile",
                                   "device.json"],
    "tune": ["tune", "hostile.npz", "--framework", "pytorch", "--capacity", "1GiB"],
    "tune-figures": ["tune", "hostile.npz", "--framework", "pytorch", "--capacity", "1GiB",
                     "-o", "tuned"],
    "tune-nothing-fits": ["tune", "hostile.npz", "--framework", "pytorch", "--device-profile",
                          "device.json"],
    "fidelity": ["fidelity", "hostile.pickle"],
    "sweep": ["sweep", "grid.toml", "--no-progress", "--workers", "1"],
    "sweep-report": ["sweep", "grid.toml", "--report"],
    "size": ["size", f"f32[2,3]{{{HOSTILE}}}", "bf16[3,5,7]"],
    "report": ["report", "compared/results.json", "-o", "report.html"],
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            status = main(argv)
        except SystemExit as ended:     # argparse's own exits
            status = int(ended.code or 0)
    out, err = capsys.readouterr()
    # A warning (matplotlib's "Glyph 27 (\x1b) missing from font") is printed on stderr.
    err += "".join(str(w.message) + "\n" for w in caught)
    return status, out, err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_command_prints_a_raw_control_character_of_a_name(
        command: str, work: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(work)
    if command == "fidelity" and not Path("hostile.pickle").exists():
        formats.save(formats.load("hostile.npz"), "hostile.pickle")
    if command == "report" and not Path("compared/results.json").exists():
        _run(COMMANDS["compare-figures"], capsys)
    if command == "sweep-report" and not Path("results.jsonl").exists():
        _run(COMMANDS["sweep"], capsys)
    status, out, err = _run(COMMANDS[command], capsys)
    assert status in (0, 1), (status, err)
    for stream, text in (("stdout", out), ("stderr", err)):
        raw = [char for char in RAW if char in text]
        assert not raw, f"{command}: raw {raw} on {stream}:\n{text!r}"
    assert ESCAPED in out or command in {"report", "compare-figures", "sweep"}, out


def test_the_commands_print_each_name_escaped_where_they_print_it(
        work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(work)
    _, out, _ = _run(COMMANDS["explain-oom-device-profile"], capsys)
    assert out.splitlines()[0].startswith(f"OOM in run{ESCAPED}name under pytorch on "
                                          f"card{ESCAPED} ")
    _, out, _ = _run(COMMANDS["tune-nothing-fits"], capsys)
    assert out.splitlines()[0] == f"tune run{ESCAPED}name as pytorch on card card{ESCAPED}"
    assert f"layer{ESCAPED}a" in out and f"opt{ESCAPED}b" in out
    _, out, _ = _run(COMMANDS["compare-device-profile"], capsys)
    assert f"device card{ESCAPED}: 96.00MiB" in out
    _, out, _ = _run(COMMANDS["size"], capsys)
    assert f"f32[2,3]{{{ESCAPED}}}" in out


def test_the_tables_stay_aligned_around_an_escaped_name(
        work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(work)
    _, out, _ = _run(COMMANDS["info"], capsys)
    table = out[out.index("    tag "):].splitlines()
    assert table[1].strip().startswith("-" * len(f"layer{ESCAPED}a") + "  ")
    assert {len(line) for line in table} == {len(table[1])}
    _, out, _ = _run(COMMANDS["sweep-report"], capsys)
    rows = [line for line in out.splitlines() if f"file{ESCAPED}.npz" in line]
    assert rows
    header = out.splitlines()[[line.startswith("trace") for line in out.splitlines()].index(True)]
    assert header.index("device") == rows[0].index("a100-80g")


def test_explain_oom_prints_a_long_name_cut_as_compare_does(
        work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(work)
    status, out, _ = _run(["explain-oom", "long.npz", "--capacity", "20MiB"], capsys)
    assert status == 0
    assert max(len(line) for line in out.splitlines()) < 1000
    assert f"OOM in {'L' * (MAX_SHOWN - 1)}… under pytorch" in out
    _, compared, _ = _run(["compare", "long.npz", "--policies", "bfc"], capsys)
    assert f"trace  {'L' * (MAX_SHOWN - 1)}…:" in compared


def test_one_rule_escapes_every_name() -> None:
    assert shown(f"a{HOSTILE}") == printable(f"a{HOSTILE}") == f"a{ESCAPED}"
    assert shown("x" * 500, 10) == printable("x" * 500, 10) == "x" * 9 + "…"
    assert shown("plain name é 名前") == "plain name é 名前"
    table = format_table([[f"p{HOSTILE}", "1"], ["bfc", "22"]], ["policy", "n"])
    width = len(f"p{ESCAPED}")
    assert table.splitlines() == ["policy".ljust(width) + "   n", "-" * width + "  --",
                                  f"p{ESCAPED}   1", "bfc".ljust(width) + "  22"]
    text = io.StringIO()
    stream = PrintableStream(text)
    print(f"a\tb{HOSTILE}\r", "c", file=stream)
    assert text.getvalue() == f"a\tb{ESCAPED}\\r c\n"
    assert stream.wrapped is text and stream.writable()


def test_a_recorded_scripts_own_output_is_written_as_the_script_writes_it(tmp_path) -> None:
    # The escaping is allocsim's rule for its own displays: a progress bar or colours the
    # user's script prints under `allocsim record` are the script's, passed on unchanged.
    import importlib.util
    import os
    import subprocess
    import sys
    if importlib.util.find_spec("jax") is None:
        import pytest
        pytest.skip("needs jax (the script records under --framework jax)")
    script = tmp_path / "colour.py"
    script.write_text('import jax\nprint("\\x1b[1mbold\\x1b[0m\\rdone")\n')
    done = subprocess.run([sys.executable, "-m", "allocsim", "record", "--framework", "jax",
                           "-o", str(tmp_path / "r.npz"), "--", sys.executable, str(script)],
                          capture_output=True, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                          timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-1000:]
    assert done.stdout == b"\x1b[1mbold\x1b[0m\rdone\n"
