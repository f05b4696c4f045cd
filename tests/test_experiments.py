"""The experiment runner: definitions in, results/figures/README tables out, verdict kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.questions.share import ShareSpec
from experiments.run import END, START, main, run_experiment
from experiments.runner.execute import (
    DefinitionError,
    reversed_order,
    scaled_costs,
    sensitivity_grid,
)
from experiments.runner.readme_check import readme_problems

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

DEFINITION = '''
title = "tiny"
device = "a100-40g"
policies = ["bfc", "on-demand"]
min_capacity = true
capacity_policies = ["on-demand"]

[[traces]]
label = "mlp"
generate = "training"
params = { layers = 2, steps = 2 }

[[traces]]
label = "absent"
file = "no/such/file.npz"
optional = true

[[scenarios]]
label = "two"
capacity = "8GiB"
processes = ["mlp:on-demand", "mlp:on-demand@1ms"]
'''


def test_an_experiment_writes_results_figures_and_tables_and_keeps_the_verdict(
        tmp_path: Path) -> None:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "experiment.toml").write_text(DEFINITION)
    (folder / "README.md").write_text(f"# tiny\n\n{START}\nold\n{END}\n\n## Verdict\n\nkept.\n")
    results = run_experiment(folder, quiet=True)
    assert [r["policy"] for r in results["comparisons"][0]["results"]] == ["bfc", "on-demand"]
    assert results["capacities"][0]["min_capacity"] >= results["capacities"][0]["lower_bound"]
    assert results["skipped"] == ["absent: no/such/file.npz not present"]
    assert all(p["completed"] for p in results["scenarios"][0]["processes"])
    assert json.loads((folder / "results.json").read_text())["title"] == "tiny"
    readme = (folder / "README.md").read_text()
    assert "old" not in readme and "winner: `" in readme and readme.endswith("kept.\n")
    assert (folder / "peak_reserved.png").exists() and (folder / "min_capacity.png").exists()


def test_every_shipped_experiment_has_a_definition_and_a_verdict() -> None:
    root = Path(__file__).resolve().parents[1] / "experiments"
    folders = [p.parent for p in root.glob("*/experiment.toml")]
    assert len(folders) >= 6
    for folder in folders:
        readme = (folder / "README.md").read_text()
        assert START in readme and END in readme and "## Verdict" in readme, folder
        assert (folder / "results.json").exists(), folder


METHOD = '''
title = "method"
device = "a100-40g"
policies = ["bfc", "on-demand", "best-fit", "offline"]
min_capacity = true
capacity_policies = ["on-demand"]

[sensitivity]
cost_scale = [0.25, 1, 4]
max_slowdown = [1.05, 1.10, 1.25]

[[traces]]
label = "mlp"
generate = "training"
params = { layers = 2, steps = 2 }
note = "a tiny generated loop"

[[traces]]
label = "rec"
file = "traces/data/sample-torch-cpu-mlp.npz"

[[scenarios]]
label = "two"
capacity = "8GiB"
processes = ["mlp:on-demand", "rec:bfc@1ms"]
both_orders = true
'''


def test_the_method_keys_sensitivity_orders_kinds_and_notes(tmp_path: Path) -> None:
    folder = tmp_path / "method"
    folder.mkdir()
    (folder / "experiment.toml").write_text(METHOD)
    results = run_experiment(folder, quiet=True)
    grid = results["sensitivity"]
    assert grid["cost_scale"] == [0.25, 1, 4] and grid["max_slowdown"] == [1.05, 1.10, 1.25]
    for entry, comparison in zip(grid["traces"], results["comparisons"]):
        assert len(entry["winners"]) == 9
        default = next(w for w in entry["winners"]
                       if w["cost_scale"] == 1 and w["max_slowdown"] == 1.10)
        assert default["winner"] == comparison["winner"]
        assert entry["stable"] == (len({w["winner"] for w in entry["winners"]}) == 1)
    # Cheaper calls let on-demand into the budget on the small recording; dearer keep it out.
    rec = {(w["cost_scale"], w["max_slowdown"]): w["winner"] for w in grid["traces"][1]["winners"]}
    assert rec[(0.25, 1.25)] == "on-demand" and rec[(4, 1.25)] == "best-fit"
    assert results["traces"] == [
        {"label": "mlp", "kind": "generated", "source": "training",
         "note": "a tiny generated loop"},
        {"label": "rec", "kind": "recorded", "source": "traces/data/sample-torch-cpu-mlp.npz",
         "note": None}]
    scenario = results["scenarios"][0]
    assert [p["start_ns"] for p in scenario["processes"]] == [0, 1_000_000]
    assert [p["start_ns"] for p in scenario["reversed"]["processes"]] == [1_000_000, 0]
    readme = (folder / "README.md").read_text()
    assert "**rec** (recorded: `traces/data/sample-torch-cpu-mlp.npz`)" in readme
    assert "**mlp** (generated: `training`)" in readme
    assert "winner depends on costs/budget: " in readme and "`on-demand` at ×0.25/1.10x" in readme
    assert "Note on **mlp**: a tiny generated loop" in readme
    assert "trace  source     policy" in readme and "completed (reversed)" in readme
    assert readme_problems(folder) == []


def test_a_stable_winner_is_said_so(tmp_path: Path) -> None:
    folder = tmp_path / "stable"
    folder.mkdir()
    (folder / "experiment.toml").write_text(
        'policies = ["bfc", "best-fit"]\n[sensitivity]\nmax_slowdown = [1.5, 2]\n'
        '[[traces]]\nlabel = "rec"\nfile = "traces/data/sample-torch-cpu-mlp.npz"\n')
    results = run_experiment(folder, quiet=True)
    assert results["sensitivity"]["cost_scale"] == [1.0]
    assert ("winner: `best-fit` at every cost and budget tried."
            in (folder / "README.md").read_text())


def test_a_definition_without_the_method_keys_renders_as_before(tmp_path: Path) -> None:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "experiment.toml").write_text(DEFINITION)
    results = run_experiment(folder, quiet=True)
    assert list(results) == ["experiment", "title", "device", "skipped", "comparisons",
                             "capacities", "scenarios"]
    assert "reversed" not in results["scenarios"][0]
    readme = (folder / "README.md").read_text()
    assert "source" not in readme and "Sensitivity" not in readme and "generated:" not in readme


def test_reversed_order_gives_the_earliest_start_to_the_last_starter() -> None:
    specs = [ShareSpec("a", "bfc", 0), ShareSpec("b", "bfc", 5), ShareSpec("c", "bfc", 9)]
    assert [s.start_ns for s in reversed_order(specs)] == [9, 5, 0]
    assert [s.start_ns for s in reversed_order([ShareSpec("a", "bfc", 3),
                                                ShareSpec("b", "bfc", 3)])] == [3, 3]


def test_cost_scale_multiplies_every_device_call_cost() -> None:
    device = resolve_device("a100-40g")
    scaled = scaled_costs(device, 4).costs
    assert scaled.malloc(1 << 30) == pytest.approx(4 * device.costs.malloc(1 << 30))
    assert scaled.free(1 << 20) == pytest.approx(4 * device.costs.free(1 << 20))
    assert scaled.map(1 << 21) == pytest.approx(4 * device.costs.map(1 << 21))
    assert scaled.unmap(1) == pytest.approx(4 * device.costs.unmap(1))
    assert scaled_costs(device, 1) is device


@pytest.mark.parametrize("table", ['cost_scale = []', 'cost_scale = [0, 1]',
                                   'max_slowdown = ["1.1"]', 'budget = [1.1]'])
def test_a_bad_sensitivity_table_is_refused(table: str) -> None:
    with pytest.raises(DefinitionError, match=r"\[sensitivity\]"):
        sensitivity_grid(tomllib.loads(f"[sensitivity]\n{table}\n"))


def test_check_reports_a_readme_that_disagrees(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "experiment.toml").write_text(DEFINITION)
    run_experiment(folder, quiet=True)
    assert main(["--check", str(folder)]) == 0
    readme = folder / "README.md"
    readme.write_text(readme.read_text().replace(" yes ", " no  ", 1))
    assert main(["--check", str(folder)]) == 1
    assert "not what results.json renders" in capsys.readouterr().out
