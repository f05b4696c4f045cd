"""Sensitivity as an output (experiments/runner/sensitivity.py): each finding judged again under
each value of each assumption it rests on; the table in experiments/README.md is what
sensitivity.json renders, and names where a verdict flips."""

from __future__ import annotations

import json
from pathlib import Path

from allocsim.traces.model import Trace
from experiments.runner import sensitivity as sens

MiB = 1 << 20


def test_a_workspace_is_held_from_the_first_event_to_the_last() -> None:
    trace = Trace.from_events([(10, "alloc", 1, 64 * MiB), (20, "free", 1, 64 * MiB)])
    more = sens.with_workspace(trace, 32 * MiB)
    assert len(more) == 4 and more.peak_live()[0] == 96 * MiB
    assert (int(more.time_ns[0]), int(more.time_ns[-1])) == (10, 20)
    assert sens.with_workspace(trace, 0) is trace


def results(flip: bool) -> dict:
    values = {"512": {"holds": 3, "tie": 0, "reversed": 0, "verdict": "supported"},
              "2097152": ({"holds": 2, "tie": 0, "reversed": 1, "verdict": "depends"} if flip
                          else {"holds": 3, "tie": 0, "reversed": 0, "verdict": "supported"})}
    return {"sample": "s", "findings": [
        {"population": "p", "claim": "a needs less than b", "assumption": "granularity",
         "baseline": 512, "values": values, "flips_at": 2 * MiB if flip else None}]}


def test_the_table_says_where_a_verdict_flips_and_where_it_does_not() -> None:
    flipped, steady = sens.markdown(results(True)), sens.markdown(results(False))
    assert "| 2.00MiB |" in flipped and "2.00MiB: depends 2/3" in flipped
    assert "no flip in the range tried" in steady


def test_the_check_holds_the_table_to_the_json(tmp_path: Path) -> None:
    readme, stored = tmp_path / "README.md", tmp_path / "sensitivity.json"
    readme.write_text("# x\n")
    stored.write_text(json.dumps(results(True)))
    sens.update_readme(readme, sens.markdown(results(True)))
    assert sens.sensitivity_problems(readme, stored) == []
    stored.write_text(json.dumps(results(False)))
    assert "not what sensitivity.json renders" in sens.sensitivity_problems(readme, stored)[0]


def test_a_verdict_is_the_datas() -> None:
    assert sens.verdict({"holds": 2, "tie": 1, "reversed": 0}) == "depends"
    assert sens.verdict({"holds": 0, "tie": 1, "reversed": 2}) == "not supported"
    assert sens.verdict({"holds": 3, "tie": 0, "reversed": 0}) == "supported"


def test_every_finding_names_a_claim_of_its_population_and_known_assumptions() -> None:
    for population, text, assumed in sens.FINDINGS:
        sens._claim(population, text)
        assert set(assumed) <= set(sens.ASSUMPTIONS)


def test_the_shipped_table_is_what_sensitivity_json_renders() -> None:
    assert sens.sensitivity_problems() == []
