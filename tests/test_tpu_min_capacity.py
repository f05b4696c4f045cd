"""min-capacity's answer for a TPU step against the chip (experiments/tpu/min_capacity.py): the
step ran at allocsim's answer, and the earlier rule's answer was refused."""

from __future__ import annotations

from experiments.tpu import min_capacity


def test_the_min_capacity_table_regenerates_from_the_chips_records() -> None:
    assert min_capacity.main(["--check"]) == 0


def test_each_step_runs_on_the_chip_at_the_answer_and_the_earlier_rules_is_refused() -> None:
    found = min_capacity.compute()
    assert set(found) == {"small", "125m"}
    for facts in found.values():
        assert facts["runs_at_answer"]
        assert not facts["first_prediction_runs"]
        assert 0 <= facts["over_by_at_most"] <= 1024
        below = [t for t in facts["tried"] if t["offset"] <= -1536]
        assert below and all(t["ran_steps"] < t["steps"] for t in below)
