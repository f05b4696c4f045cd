"""Every command that writes files says so (issue 37.5): each file it writes under ``-o`` (and
``--measurements``) is named in a ``wrote PATH`` line, escaped as every printed name is. With
``--json`` that line goes to stderr, so standard output stays one JSON document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocsim.sim.cli.main import main
from allocsim.traces.bundled import bundled_path

JAX_SAMPLE = str(bundled_path("sample-jax-cpu-train.npz"))
TORCH_SAMPLE = str(bundled_path("sample-torch-cpu-mlp.npz"))

# name: (commands that make its inputs, the command under test)
CASES: dict[str, tuple[list[list[str]], list[str]]] = {
    "compare": ([], ["compare", "default", "--policies", "bfc", "-o", "out"]),
    "compare --json": ([], ["compare", "default", "--policies", "bfc", "--json", "-o", "out"]),
    "min-capacity": ([], ["min-capacity", "default", "--policies", "bfc", "--resolution",
                          "256MiB", "-o", "out"]),
    "min-capacity --json": ([], ["min-capacity", "default", "--policies", "bfc",
                                 "--resolution", "256MiB", "--json", "-o", "out"]),
    "share": ([], ["share", "default:jax", "default:jax@10ms", "--capacity", "6GiB",
                   "-o", "out"]),
    "share --json": ([], ["share", "default:jax", "default:jax@10ms", "--capacity", "6GiB",
                          "--json", "-o", "out"]),
    "tune": ([], ["tune", JAX_SAMPLE, "--framework", "jax", "--capacity", "32MiB",
                  "-o", "out"]),
    "tune --json": ([], ["tune", JAX_SAMPLE, "--framework", "jax", "--capacity", "32MiB",
                         "--json", "-o", "out"]),
    "tune, several jobs": ([], ["tune", "default", JAX_SAMPLE, "--framework", "jax",
                                "--capacity", "2GiB", "-o", "out"]),
    "report": ([["compare", TORCH_SAMPLE, "--policies", "bfc", "--json", "-o", "in"]],
               ["report", "in/results.json", "-o", "page.html"]),
    "export-snapshot": ([], ["export-snapshot", "default", "-o", "run.pickle"]),
    "convert": ([], ["convert", TORCH_SAMPLE, "-o", "t.csv"]),
    "gen": ([], ["gen", "random", "events=100", "-o", "t.npz"]),
    "baseline": ([], ["baseline", TORCH_SAMPLE, "--policies", "bfc", "-o", "b.json"]),
    "validate": ([], ["validate", TORCH_SAMPLE, "--policy", "bfc", "--backend", "host",
                      "-o", "out"]),
    "validate --json": ([], ["validate", TORCH_SAMPLE, "--policy", "bfc", "--backend", "host",
                             "--json", "-o", "out"]),
    "sweep": ([], ["sweep", "grid.toml", "--workers", "1", "--no-progress", "-o", "r.jsonl"]),
}

GRID = f"""name = "wrote"
output = "unused.jsonl"
[grid]
traces = ["{TORCH_SAMPLE}"]
policies = ["bfc"]
devices = ["a100-80g"]
capacities = ["24GiB"]
"""


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def wrote_names(text: str) -> set[str]:
    """Every name a ``wrote A, B: detail`` line gives."""
    names = set()
    for line in text.splitlines():
        if line.startswith("wrote "):
            listed = line[len("wrote "):].split(": ")[0]
            names |= {name.strip() for name in listed.split(", ")}
    return names


@pytest.mark.parametrize("case", list(CASES))
def test_each_file_written_is_named(case: str, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.toml").write_text(GRID)
    setup, argv = CASES[case]
    for command in setup:
        assert main(command) == 0
    before = files_under(tmp_path)
    capsys.readouterr()
    assert main(argv) in (0, 1)             # share: 1 when a process runs out of memory
    out, err = capsys.readouterr()
    written = files_under(tmp_path) - before
    assert written, "it writes something"
    if "--json" in argv:
        json.loads(out)                      # stdout is the JSON alone
        assert not wrote_names(out)
    assert written <= wrote_names(out + err), (written, out, err)


def test_calibrate_names_its_profile_and_its_measurements(tmp_path, monkeypatch,
                                                          capsys) -> None:
    from tests.fake_gpu import install_fake_gpu
    install_fake_gpu(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", "-o", "fake.json", "--sizes", "4KiB", "1MiB", "--repeats", "2",
                 "--measurements", "raw.json"]) == 0
    out, err = capsys.readouterr()
    assert {"fake.json", "raw.json"} <= wrote_names(out + err)


def test_a_written_name_is_escaped(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["min-capacity", "default", "--policies", "bfc", "--resolution", "256MiB",
                 "-o", "a\nb"]) == 0
    out, err = capsys.readouterr()
    assert "wrote a\\nb/min_capacity.json" in out + err
