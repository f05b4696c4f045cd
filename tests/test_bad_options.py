"""Bad option values and bad baseline files end in ONE `allocsim: error:` line and exit 2,
change no file, and never show a traceback (a traceback would be a bug)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from allocsim.sim.cli.main import main
from allocsim.traces import formats, synth


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(capsys, tmp_path: Path, *argv: Any) -> str:
    """Run ``allocsim ARGV``; assert one error line, exit 2, nothing written; the line."""
    capsys.readouterr()
    before = snapshot(tmp_path)
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse's own refusal
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("allocsim: error:"), err
    assert "Traceback" not in err
    assert snapshot(tmp_path) == before
    return lines[0]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.npz"
    formats.save(synth.generate("training", seed=1, events=300), path)
    return path


@pytest.fixture
def baseline(tmp_path: Path, trace: Path, capsys) -> Path:
    path = tmp_path / "baseline.json"
    assert main(["baseline", str(trace), "--policies", "bfc", "best-fit", "-o", str(path)]) == 0
    capsys.readouterr()
    return path


# -- 1. check on a baseline that is not one --------------------------------------------------

def edit(path: Path, change) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d["cells"][1].pop("ooms"), "cells[1].ooms"),
    (lambda d: d["cells"][0].update(ooms="3"), "cells[0].ooms"),
    (lambda d: d["cells"][0].update(ooms=True), "cells[0].ooms"),
    (lambda d: d["cells"][0].update(completed=1), "cells[0].completed"),
    (lambda d: d["cells"][0].update(peak_reserved=-1), "cells[0].peak_reserved"),
    (lambda d: d["cells"][0].update(alloc_time_s="fast"), "cells[0].alloc_time_s"),
    (lambda d: d["cells"][0].update(trace=7), "cells[0].trace"),
    (lambda d: d["cells"][0].update(fingerprint="xyz"), "cells[0].fingerprint"),
    (lambda d: d["cells"][0].update(extra=1), "cells[0].extra"),
    (lambda d: d.update(cells=[1]), "cells[0]"),
    (lambda d: d.update(cells={}), "cells"),
    (lambda d: d.pop("cells"), "cells"),
    (lambda d: d.pop("device"), "device"),
    (lambda d: d["device"].pop("capacity"), "device.capacity"),
    (lambda d: d["device"].update(capacity="80GiB"), "device.capacity"),
    (lambda d: d["device"].update(colour="green"), "device.colour"),
    (lambda d: d["device"].update(costs=[]), "device.costs"),
    (lambda d: d["device"]["costs"].update(malloc_base_s="x"), "device.costs.malloc_base_s"),
    (lambda d: d.update(policies=[]), "policies"),
    (lambda d: d.update(policies=[3]), "policies[0]"),
    (lambda d: d.update(allocsim_baseline=2), "allocsim_baseline"),
    (lambda d: d.pop("allocsim_baseline"), "allocsim_baseline"),
])
def test_check_refuses_a_malformed_baseline_naming_the_field(capsys, tmp_path, baseline,
                                                             change, field):
    edit(baseline, change)
    line = refused(capsys, tmp_path, "check", baseline)
    assert str(baseline) in line
    assert field in line


@pytest.mark.parametrize("text", ["not json {", "[1, 2]", "3", '"baseline"', "null", ""])
def test_check_refuses_a_file_that_is_not_a_json_object(capsys, tmp_path, text):
    path = tmp_path / "baseline.json"
    path.write_text(text)
    line = refused(capsys, tmp_path, "check", path)
    assert str(path) in line


def test_a_good_baseline_still_checks(capsys, baseline):
    assert main(["check", str(baseline)]) == 0
    assert "check passed" in capsys.readouterr().out


# -- 2. option values out of range -----------------------------------------------------------

@pytest.mark.parametrize("value", ["-5", "-5%", "-0.01", "nan", "abc", "inf", "%"])
def test_check_refuses_a_bad_tolerance(capsys, tmp_path, baseline, value):
    line = refused(capsys, tmp_path, "check", baseline, "--tolerance", value)
    assert "--tolerance" in line and ">= 0" in line and "1%" in line


@pytest.mark.parametrize("value", ["0", "5%", "0.01"])
def test_check_takes_a_good_tolerance(capsys, baseline, value):
    assert main(["check", str(baseline), "--tolerance", value]) == 0


@pytest.mark.parametrize("value", ["-1", "0.5", "0", "nan", "-inf"])
def test_compare_refuses_a_bad_max_slowdown(capsys, tmp_path, trace, value):
    line = refused(capsys, tmp_path, "compare", trace, "--out", tmp_path / "out",
                   f"--max-slowdown={value}")
    assert "--max-slowdown" in line and ">= 1" in line and "inf" in line


def test_compare_takes_an_infinite_max_slowdown(capsys, trace):
    assert main(["compare", str(trace), "--policies", "bfc", "--max-slowdown", "inf"]) == 0


@pytest.fixture
def sweep_file(tmp_path: Path, trace: Path) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(f'name = "s"\noutput = "out/results.jsonl"\n[grid]\n'
                    f'traces = ["{trace.name}"]\npolicies = ["bfc"]\n')
    return path


@pytest.mark.parametrize("value", ["0", "-1"])
def test_sweep_refuses_a_bad_worker_count(capsys, tmp_path, sweep_file, value):
    line = refused(capsys, tmp_path, "sweep", sweep_file, "--no-progress", "--workers", value)
    assert "--workers" in line and ">= 1" in line


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_sweep_refuses_a_bad_max_slowdown(capsys, tmp_path, sweep_file, value):
    line = refused(capsys, tmp_path, "sweep", sweep_file, "--no-progress",
                   "--max-slowdown", value)
    assert "--max-slowdown" in line and ">= 1" in line


# -- 3. sizes that start with "-" or do not parse --------------------------------------------

@pytest.mark.parametrize("spelling", ["separate", "equals"])
@pytest.mark.parametrize("value", ["-5GiB", "-5", "-0.5GiB", "0", "5XB", "lots"])
def test_a_bad_capacity_is_one_line_naming_the_option(capsys, tmp_path, trace, spelling, value):
    option = ["--capacity", value] if spelling == "separate" else [f"--capacity={value}"]
    line = refused(capsys, tmp_path, "compare", trace, "--out", tmp_path / "out", *option)
    assert line.startswith("allocsim: error: --capacity: "), line
    assert value in line


@pytest.mark.parametrize("command", [["baseline", "-o", "b.json"], ["share"], ["export-snapshot",
                                     "--policy", "bfc", "-o", "x.pickle"]])
def test_a_negative_capacity_is_one_line_on_every_command_with_the_option(capsys, tmp_path,
                                                                         trace, command):
    name, *rest = command
    rest = [str(tmp_path / r) if r.endswith((".json", ".pickle")) else r for r in rest]
    line = refused(capsys, tmp_path, name, trace, *rest, "--capacity", "-5GiB")
    assert line.startswith("allocsim: error: --capacity: "), line


# -- 4. argparse's own refusals are one line too ---------------------------------------------

@pytest.mark.parametrize(("argv", "needle"), [
    (["info", "{trace}", "--top", "abc"], "argument --top: invalid int value: 'abc'"),
    (["sweep", "x.toml", "--workers", "abc"], "argument --workers: invalid int value"),
    (["compare", "{trace}", "--max-slowdown", "abc"], "argument --max-slowdown: invalid float"),
    (["validate", "{trace}", "--policy", "bfc", "--backend", "nosuch"],
     "argument --backend: invalid choice: 'nosuch'"),
    (["nosuch"], "argument command: invalid choice: 'nosuch'"),
    (["info"], "the following arguments are required: trace"),
])
def test_an_argparse_type_or_choice_error_is_one_line(capsys, tmp_path, trace, argv, needle):
    line = refused(capsys, tmp_path, *[a.format(trace=trace) for a in argv])
    assert needle in line and line.endswith("--help)"), line


def test_help_still_prints_the_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: allocsim compare") and "--max-slowdown" in out


# -- 5. values that were silently taken --------------------------------------------------------

@pytest.mark.parametrize(("argv", "needle"), [
    (["info", "{trace}", "--top", "-1"], "--top: the number of tags to list must be >= 0"),
    (["compare", "{trace}", "--device", ""], "--device: an empty name; known devices: "),
    (["compare", "{trace}", "--policies", "bfc:fraction=0.5,fraction=0.9"],
     "policy 'bfc': parameter 'fraction' is given twice"),
    (["compare", "{trace}", "--policies", "jax:fraction=0.5,fraction=0.6"],
     "policy 'jax': parameter 'fraction' is given twice"),
    (["compare", "{trace}", "--policies", "best-fit:alignment=0"],
     "alignment must be a positive number of bytes, got 0"),
    (["export-snapshot", "{trace}", "--policy", "bfc", "-o", "{tmp}/e.txt"],
     "e.txt: a snapshot is a pickle: name it .pickle (or .pkl)"),
    (["gen", "training", "events=1e12", "-o", "{tmp}/x.csv"], "a generated trace holds at most"),
    (["gen", "kvcache", "events=1e12", "-o", "{tmp}/x.csv"], "a generated trace holds at most"),
    (["gen", "transformer", "steps=1e9", "-o", "{tmp}/x.csv"], "steps=1000000000 asks for"),
    (["gen", "random", "events=1e12", "-o", "{tmp}/x.csv"], "a generated trace holds at most"),
    (["gen", "random", "--seed", "-1", "-o", "{tmp}/x.csv"], "the seed must be a whole number"),
])
def test_a_value_that_was_taken_silently_or_crashed_is_one_line(capsys, tmp_path, trace, argv,
                                                                 needle):
    line = refused(capsys, tmp_path, *[a.format(trace=trace, tmp=tmp_path) for a in argv])
    assert needle in line, line


# -- 6. a sweep's grid: its size and every cell's values are checked before anything runs -----

@pytest.mark.parametrize(("grid", "needle"), [
    # 1,000 x 1,000 x 1,000: every range under the per-range limit, the product a billion
    ('traces = ["synth:random?events=300&seed=[1..1000]"]\n'
     'policies = ["pytorch:max_split_size_mb=[20..1019]"]\n'
     'capacities = ["[1..1000]MiB"]',
     "grid: 1,000,000,000 cells (1,000 traces x 1,000 policies x 1 devices x 1,000 capacities)"),
    ('traces = ["synth:random?events=300"]\npolicies = ["bfc:fraction=2"]',
     "grid.policies: policy 'bfc:fraction=2.0': fraction must be in (0, 1], got 2.0"),
    ('traces = ["synth:random?events=300"]\npolicies = ["bfc", "bfc:fraction=nan"]',
     "grid.policies: policy 'bfc:fraction=nan': fraction must be in (0, 1], got nan"),
    ('traces = ["synth:random?events=300"]\npolicies = ["best-fit:page=[2MiB,3MiB]"]',
     "page must be a multiple of the device's mapping granularity"),
    ('traces = ["synth:random?events=300", "synth:training?events=-5"]\npolicies = ["bfc"]',
     "grid.traces: events must be > 0, got -5"),
    ('traces = ["synth:kvcache?events=1e12"]\npolicies = ["bfc"]',
     "a generated trace holds at most 100,000,000"),
    ('traces = ["synth:random?events=300&seed=-1"]\npolicies = ["bfc"]',
     "the seed must be a whole number >= 0"),
], ids=["billion-cells", "fraction-2", "fraction-nan", "page-3MiB", "events-negative",
        "events-1e12", "seed-negative"])
def test_a_sweep_is_refused_whole_before_any_cell_runs(capsys, tmp_path, grid, needle):
    path = tmp_path / "s.toml"
    path.write_text(f'output = "out.jsonl"\n[grid]\n{grid}\n')
    line = refused(capsys, tmp_path, "sweep", path, "--no-progress", "--workers", "1")
    assert line.startswith(f"allocsim: error: {path}: ") and needle in line, line
    assert not (tmp_path / "out.jsonl").exists()
