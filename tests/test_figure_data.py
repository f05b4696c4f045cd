"""Each figure names the digest of the JSON it was drawn from, and the check holds every
committed figure to the committed JSON beside it (experiments/runner/figure_data.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.run import drawn_from_data, run_experiment
from experiments.runner.figure_data import KEY, digest, png_text

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
SHIPPED = sorted(p.parent for p in EXPERIMENTS.glob("*/experiment.toml"))


def tiny(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "experiment.toml").write_text(
        'title = "tiny"\ndevice = "a100-40g"\npolicies = ["bfc"]\nmin_capacity = true\n'
        '[[traces]]\nlabel = "t"\ngenerate = "training"\nparams = { steps = 1 }\n')
    run_experiment(folder, quiet=True)
    return folder


def test_a_drawn_figure_names_the_results_it_came_from(tmp_path: Path) -> None:
    folder = tiny(tmp_path)
    results = json.loads((folder / "results.json").read_text())
    for name in ("peak_reserved.png", "min_capacity.png"):
        assert png_text(folder / name)[KEY] == digest(results)
    assert drawn_from_data(folder) == []


def test_a_figure_the_data_moved_away_from_is_a_problem(tmp_path: Path) -> None:
    folder = tiny(tmp_path)
    results = json.loads((folder / "results.json").read_text())
    results["title"] = "edited"
    (folder / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    problems = drawn_from_data(folder)
    assert len(problems) == 2 and all("not the committed results.json" in p
                                      for p in problems)


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda f: f.name)
def test_every_shipped_figure_is_drawn_from_the_committed_data(folder: Path) -> None:
    assert drawn_from_data(folder) == []
