"""The sharing experiment's findings under memory outside each allocator (issue 40): offset
sweeps rerun with a context and a first-step load per process, scaled from a real card, and
verdict words computed from those runs, never written by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from allocsim.traces import Trace
from experiments.runner.sweeps import judge_finding, offset_sweep, scaled
from experiments.runner.verdict_words import verdict_word_problems

MiB = 1 << 20
GiB = 1 << 30
EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def test_amounts_keep_their_share_of_the_card() -> None:
    # 500 MiB of a 40 GiB A100 is 1.22%; at 112 MiB that is 1.37 MiB.
    assert scaled(500 * MiB, 112 * MiB, 40 * GiB) == 1_433_600
    assert scaled(0, 112 * MiB, 40 * GiB) == 0


def _job(label: str) -> Trace:
    trace = Trace.from_events([(0, "alloc", 1, 40 * MiB), (10_000_000, "free", 1, None)])
    trace.metadata["name"] = label
    return trace


def test_a_sweep_reruns_every_cell_with_memory_outside_each_allocator() -> None:
    """The hand-worked pair of tests/test_share_outside.py as a sweep: two 40 MiB jobs on
    100 MiB fit; a 150 MiB context on a 1 GiB card is 14.65 MiB at 100 MiB, and with one each
    (109.3 MiB in all) the second job's malloc fails; a 600 MiB first-step load is 58.59 MiB,
    and the second job's load is refused (58.59 + 40 + 58.59 > 100)."""
    sweep = {"label": "pair", "traces": ["a", "b"], "capacities": ["100MiB"], "offsets": [0],
             "configs": [["growth", "on-demand", "on-demand"]], "outside_card": "1GiB",
             "outside": [["0", "0"], ["150MiB", "0"], ["0", "600MiB"]]}
    result = offset_sweep(sweep, {"a": _job("a"), "b": _job("b")}, "a100-40g")
    levels = result["outside"]["levels"]
    assert [level["outcomes"] for level in levels] == [[["both"]], [["1st only"]],
                                                      [["1st only"]]]
    assert [level["failures"]["growth"] for level in levels] == [
        {}, {"allocator": 1}, {"first-step load": 1}]
    assert result["rows"][0]["cells"][0]["completed"] == [True, True]   # nothing outside
    assert result["outside"]["first_step_events"] == [0, 0]             # no train-step tags


def _results(outcomes_by_order: list[list[list[list[str]]]]) -> list[dict[str, Any]]:
    """Sweeps (one per start order) of one config over offsets at capacities 1 and 2 MiB;
    ``outcomes_by_order[order][level][offset]`` = outcome per capacity."""
    sweeps = []
    for per_level in outcomes_by_order:
        offsets = len(per_level[0])
        sweeps.append({
            "capacities": [MiB, 2 * MiB],
            "rows": [{"config": "c", "offset_s": float(k)} for k in range(offsets)],
            "outside": {"levels": [{"context": index * MiB, "first_step": 0,
                                    "outcomes": outcomes}
                                   for index, outcomes in enumerate(per_level)]}})
    return sweeps


BOTH, FIRST, SECOND = "both", "1st only", "2nd only"


def test_the_verdict_is_computed_from_where_the_finding_holds() -> None:
    finding = {"claim": "c shares", "config": "c", "capacities": [MiB, 2 * MiB]}
    # Level 0: both complete everywhere; level 1: at 2 MiB only, 1 of 2 offsets at 1 MiB.
    order = [[[BOTH, BOTH], [BOTH, BOTH]], [[BOTH, BOTH], [FIRST, BOTH]]]
    judged = judge_finding(finding, _results([order, order]))
    assert judged["verdict"] == "depends"
    assert [(c["level"], c["capacity"], c["both"], c["offsets"], c["holds"])
            for c in judged["cells"]] == [
        ("nothing outside", MiB, 4, 4, True), ("nothing outside", 2 * MiB, 4, 4, True),
        ("1.00MiB context", MiB, 2, 4, False), ("1.00MiB context", 2 * MiB, 4, 4, True)]
    everywhere = [[[BOTH, BOTH], [BOTH, BOTH]]] * 2
    assert judge_finding(finding, _results([everywhere]))["verdict"] == "supported"
    nowhere = [[[FIRST, SECOND], [SECOND, FIRST]]] * 2
    assert judge_finding(finding, _results([nowhere]))["verdict"] == "not supported"


def test_a_race_needs_both_outcomes_and_each_job_dying_alone_in_every_order() -> None:
    finding = {"claim": "c races", "config": "c", "capacities": [MiB], "kind": "race"}
    race = [[[BOTH, BOTH], [FIRST, BOTH], [SECOND, BOTH]]]
    one_dies = [[[BOTH, BOTH], [FIRST, BOTH], [FIRST, BOTH]]]
    assert judge_finding(finding, _results([race, race]))["verdict"] == "supported"
    assert judge_finding(finding, _results([race, one_dies]))["verdict"] == "not supported"


def _summary(tmp_path: Path, word: str) -> Path:
    (tmp_path / "sharing").mkdir(parents=True)
    shutil.copy(EXPERIMENTS / "sharing" / "results.json", tmp_path / "sharing" / "results.json")
    readme = tmp_path / "README.md"
    claim = "Two jobs at 75% each both complete at every offset on 112-160 MiB"
    readme.write_text("| claim | answer | evidence |\n| --- | --- | --- |\n"
                      f"| 75% each | **{word}** <!-- claim: sharing: {claim} --> | "
                      "[sharing](sharing/README.md) |\n")
    return readme


@pytest.mark.parametrize("word", ["supported", "not supported"])
def test_a_summary_word_the_sharing_data_does_not_compute_fails(tmp_path: Path,
                                                                word: str) -> None:
    [problem] = verdict_word_problems(_summary(tmp_path, word))
    assert "'depends' in results.json" in problem
    assert verdict_word_problems(_summary(tmp_path / "again", "depends")) == []


def test_the_committed_sharing_results_judge_the_75_percent_finding_by_its_population() -> None:
    results = json.loads((EXPERIMENTS / "sharing" / "results.json").read_text())
    finding = next(f for f in results["sweep_findings"] if "75%" in f["claim"])
    judged = judge_finding(finding, results["offset_sweeps"])
    nothing = [c for c in judged["cells"] if c["level"] == "nothing outside"]
    assert nothing and all(c["holds"] for c in nothing)      # the finding as first stated
    assert judged["verdict"] == "depends"                    # not with memory outside
