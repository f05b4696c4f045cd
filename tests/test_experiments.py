"""The experiment runner: definitions in, results/figures/README tables out, verdict kept."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.run import END, START, run_experiment

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
