"""A committed population is held to what its definition makes
(experiments/preallocate_vs_grow/verify.py): its settings digest, its members, each member's
data, its claims judged again, its README section, and the smallest member of each family
measured again."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.preallocate_vs_grow import population as pop
from experiments.preallocate_vs_grow.verify import population_regeneration_problems
from tests.test_population_pool import TINY, tiny


def measured(where: Path) -> Path:
    folder = tiny(where)
    pop.run(folder, say=lambda *a: None)
    return folder


def edit(folder: Path, change: object) -> None:
    stored = folder / "population.json"
    results = json.loads(stored.read_text())
    change(results)   # type: ignore[operator]
    stored.write_text(json.dumps(results, indent=1) + "\n")


def test_a_fresh_population_verifies(tmp_path: Path) -> None:
    assert population_regeneration_problems(measured(tmp_path)) == []


def test_an_edited_definition_makes_the_population_stale(tmp_path: Path) -> None:
    folder = measured(tmp_path)
    (folder / "population.toml").write_text(TINY.replace("steps = 2", "steps = 3"))
    problems = population_regeneration_problems(folder, rerun=False)
    assert any("measured from another population.toml" in p for p in problems)
    assert any("seed 0: the stored" in p and "fingerprint" in p for p in problems)


def test_a_verdict_word_the_rows_do_not_make_is_found(tmp_path: Path) -> None:
    folder = measured(tmp_path)
    edit(folder, lambda r: r["claims"][0].update(verdict="depends"))
    problems = population_regeneration_problems(folder, rerun=False)
    assert any("judged again from the stored rows" in p and "stored depends" in p
               for p in problems)


def test_a_measured_number_edited_by_hand_is_found_by_the_rerun(tmp_path: Path) -> None:
    folder = measured(tmp_path)
    edit(folder, lambda r: r["families"][0]["members"][0]["min_capacity"].update(bfc=1 << 40))
    problems = population_regeneration_problems(folder)
    assert any("mlp: seed 0 measured again differs in min_capacity" in p for p in problems)


def test_a_member_the_definition_does_not_have_is_found(tmp_path: Path) -> None:
    folder = measured(tmp_path)
    edit(folder, lambda r: r["families"][0]["members"].pop())
    problems = population_regeneration_problems(folder, rerun=False)
    assert any("the members are not the definition's" in p for p in problems)
