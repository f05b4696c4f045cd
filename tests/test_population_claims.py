"""Findings over a population (experiments/preallocate_vs_grow/population.py): how a claim is
judged on members, and every shipped population section held to its population.json.

Reads files only for the shipped experiments: nothing is rerun.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from experiments.preallocate_vs_grow import population as pop

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
SHIPPED = sorted(p.parent.name for p in EXPERIMENTS.glob("*/population.toml"))
MiB = 1 << 20


def row(member: str, **capacities: int | None) -> dict[str, Any]:
    """A member with peak live 100 MiB, resolution 1 MiB and these minimum capacities (MiB)."""
    return {"member": member, "device": "a100-80g", "peak_live": 100 * MiB, "resolution": MiB,
            "events": 10, "peak_reserved": {},
            "min_capacity": {p: None if c is None else c * MiB for p, c in capacities.items()}}


def family(label: str, kind: str, *rows: dict[str, Any]) -> dict[str, Any]:
    return {"label": label, "kind": kind, "source": None, "note": "", "members": list(rows)}


CLAIM = {"text": "a below b", "lower": "a", "higher": "b"}


def test_a_claim_holding_on_every_member_is_supported() -> None:
    fams = [family("f", "generated", row("seed 0", a=110, b=130), row("seed 1", a=101, b=150))]
    judged = pop.judge(CLAIM, fams)
    assert (judged["verdict"], judged["holds"], judged["members"]) == ("supported", 2, 2)
    assert judged["gap"] == pytest.approx([0.2, 0.345, 0.49])


def test_a_claim_reversed_on_one_seed_depends_and_names_it() -> None:
    fams = [family("f", "generated", row("seed 0", a=110, b=130), row("seed 3", a=140, b=130))]
    judged = pop.judge(CLAIM, fams)
    assert (judged["verdict"], judged["holds"], judged["reversed"]) == ("depends", 1, 1)
    assert [o["member"] for o in judged["outcomes"] if o["outcome"] == "reversed"] == ["seed 3"]


def test_a_difference_within_the_resolution_is_a_tie_not_a_win() -> None:
    fams = [family("f", "generated", row("seed 0", a=130, b=131))]
    judged = pop.judge(CLAIM, fams)
    assert (judged["verdict"], judged["tie"]) == ("not supported", 1)


def test_never_fitting_is_above_every_size() -> None:
    fams = [family("f", "generated", row("seed 0", a=None, b=130))]
    judged = pop.judge(CLAIM, fams)
    assert (judged["verdict"], judged["reversed"], judged["gap"]) == ("not supported", 1, None)


def test_a_compiled_job_in_two_families_counts_once() -> None:
    job = row("1.3b-b8-t1024-h100-80g", a=110, b=130)
    fams = [family("sizes", "compiled", job), family("remat", "compiled", job,
                                                     row("1.3b-noremat", a=140, b=130))]
    judged = pop.judge(CLAIM, fams)
    assert (judged["members"], judged["holds"], judged["reversed"]) == (2, 1, 1)
    # ... while the same seed of two generated families is two members
    seeds = [family("g1", "generated", row("seed 0", a=1, b=3)),
             family("g2", "generated", row("seed 0", a=1, b=3))]
    assert pop.judge(CLAIM, seeds)["members"] == 2


def test_paired_families_compare_one_policy_member_by_member() -> None:
    static = family("static", "generated", row("seed 0", bfc=104), row("seed 1", bfc=104))
    dynamic = family("dynamic", "generated", row("seed 0", bfc=180), row("seed 1", bfc=101))
    claim = {"text": "dynamic hurts", "policy": "bfc", "pairs": [["static", "dynamic"]]}
    judged = pop.judge(claim, [static, dynamic])
    assert (judged["verdict"], judged["holds"], judged["reversed"]) == ("depends", 1, 1)
    assert judged["gap"][0] == pytest.approx(-0.03)


def test_an_unknown_family_is_a_definition_error() -> None:
    with pytest.raises(pop.DefinitionError, match="unknown family"):
        pop.judge({**CLAIM, "families": ["nope"]}, [family("f", "generated")])


def test_the_xla_plan_is_the_modules_allocations_rounded_up() -> None:
    from allocsim.traces.model import Trace
    trace = Trace.from_events([(0, "alloc", 1, 64), (1, "free", 1, 64)])
    trace.metadata["xla"] = {"total_bytes": 10 * MiB + 1}
    assert pop.xla_plan(trace, MiB) == 11 * MiB
    trace.metadata.pop("xla")
    assert pop.xla_plan(trace, MiB) is None


@pytest.mark.parametrize("name", SHIPPED)
def test_the_population_section_and_findings_agree_with_population_json(name: str) -> None:
    assert pop.population_problems(EXPERIMENTS / name) == []


@pytest.mark.parametrize("name", SHIPPED)
def test_no_result_names_a_machine_path(name: str) -> None:
    text = (EXPERIMENTS / name / "population.json").read_text()
    assert "/work/" not in text and "/tmp/" not in text and "/home/" not in text


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A shipped experiment folder's population.json and README, copied."""
    name = SHIPPED[0]
    folder = tmp_path / name
    folder.mkdir()
    for file in ("population.json", "README.md"):
        shutil.copy(EXPERIMENTS / name / file, folder / file)
    assert pop.population_problems(folder) == []
    return folder


def test_a_findings_number_no_table_has_fails(copy: Path) -> None:
    readme = copy / "README.md"
    readme.write_text(readme.read_text().replace("## Findings", "## Findings\n\nIt is +987.6%.\n",
                                                 1))
    assert any("987.6%" in p for p in pop.population_problems(copy))


def test_an_edited_population_table_fails(copy: Path) -> None:
    results = json.loads((copy / "population.json").read_text())
    results["families"][0]["members"][0]["peak_live"] += 1 << 30
    (copy / "population.json").write_text(json.dumps(results))
    assert any("not what population.json renders" in p for p in pop.population_problems(copy))


# --- method (issue 40, item 3) ---------------------------------------------------------------

def test_a_no_more_than_claim_counts_a_tie_as_holding() -> None:
    fams = [family("f", "generated", row("seed 0", a=130, b=130), row("seed 1", a=101, b=150))]
    judged = pop.judge({"text": "a needs no more than b", "lower": "a", "higher": "b",
                        "compare": "<="}, fams)
    assert (judged["verdict"], judged["holds"], judged["tie"]) == ("supported", 2, 0)
    assert "≤" in judged["test"]
    # ... while "less than" still needs a margin beyond the resolution
    assert pop.judge({**CLAIM}, fams)["verdict"] == "depends"


def test_a_no_more_than_claim_tested_strictly_is_a_definition_error() -> None:
    with pytest.raises(pop.DefinitionError, match="no more than"):
        pop.judge({"text": "a needs no more than b", "lower": "a", "higher": "b"},
                  [family("f", "generated", row("seed 0", a=1, b=3))])


def test_shipped_no_more_than_claims_are_non_strict() -> None:
    for name in SHIPPED:
        definition = pop.tomllib.loads((EXPERIMENTS / name / "population.toml").read_text())
        for claim in definition.get("claims", []):
            pop.comparison(claim)     # raises on a strict "no more than"


def test_members_whose_traces_differ_only_in_timing_count_once() -> None:
    from allocsim.traces.model import Trace
    events = [(0, "alloc", 1, 64), (5, "alloc", 2, 32), (9, "free", 1, 64), (12, "free", 2, 32)]
    slower = [(t * 3, op, i, s) for t, op, i, s in events]
    assert (pop.fingerprint(Trace.from_events(events))
            == pop.fingerprint(Trace.from_events(slower)))
    bigger = [(t, op, i, s * 2) for t, op, i, s in events]
    assert (pop.fingerprint(Trace.from_events(events))
            != pop.fingerprint(Trace.from_events(bigger)))
    same = [{**row("seed 0", a=110, b=130), "fingerprint": "x"},
            {**row("seed 1", a=110, b=130), "fingerprint": "x"},
            {**row("seed 2", a=140, b=130), "fingerprint": "y"}]
    judged = pop.judge(CLAIM, [family("f", "generated", *same)])
    assert (judged["members"], judged["holds"], judged["reversed"]) == (2, 1, 1)


def test_the_jitted_mlps_seeds_are_one_member_and_varlen_seeds_are_not() -> None:
    mlp = pop.members({"generate": "training", "seeds": 3,
                       "params": {"steps": 2, "pattern": "jax",
                                  "optimizer_mode": "functional", "donate": True}}, "a100-80g")
    varlen = pop.members({"generate": "transformer", "seeds": 3,
                          "params": {"steps": 2, "min_seq": 64, "max_seq": 1024}}, "a100-80g")
    def rows(found: list) -> list[dict[str, Any]]:
        return [{"fingerprint": pop.fingerprint(trace)} for _, _, trace in found]
    assert (len(mlp), pop.distinct_members(rows(mlp))) == (3, 1)   # the seed moves only times
    assert pop.distinct_members(rows(varlen)) == 3


def test_a_minimum_capacity_that_is_not_monotone_is_stored_as_a_range_with_its_failures() \
        -> None:
    from allocsim.sim.questions.capacity.minimum import CapacityAnswer
    answer = CapacityAnswer("jax:fraction=1.0", 110 * MiB, 100 * MiB, MiB, False, 30,
                            ["fails at 150.00MiB, above the answer 140.00MiB",
                             "completes at 110.00MiB, below the 140.00MiB the bisection found "
                             "(taken as the answer)"],
                            failed_above=[112 * MiB, 150 * MiB])
    stored = pop.capacity_record(answer)
    assert stored["monotone"] is False
    assert stored["exceptions"] == answer.exceptions
    assert stored["range"] == [110 * MiB, 151 * MiB]
    assert stored["failures"] == [112 * MiB, 150 * MiB]
    steady = pop.capacity_record(CapacityAnswer("bfc", 120 * MiB, 100 * MiB, MiB, True, 9))
    assert steady == {"monotone": True, "failures": [], "exceptions": [],
                      "range": [120 * MiB, 120 * MiB]}
    # failures the search's own check missed, found by the grid scan, make it not monotone
    scanned = pop.capacity_record(CapacityAnswer("jax", 120 * MiB, 100 * MiB, MiB, True, 9),
                                  [130 * MiB, 178 * MiB])
    assert (scanned["monotone"], scanned["range"]) == (False, [120 * MiB, 179 * MiB])


def test_the_grid_scan_finds_the_jitted_transformers_failures_above_its_answer() -> None:
    """Issue 40: ``jax:fraction=1.0`` on the jitted generated transformer (seed 11) completes
    at about +10% over peak live, fails again from +12%, and the search's check (a few 0.1%
    steps above its answer) calls it monotone; the 1% grid scan does not."""
    from dataclasses import replace

    from allocsim.sim.kernel.device import resolve_device
    from allocsim.traces import synth
    from experiments.runner.execute import resolution
    trace = synth.generate("transformer", seed=11, steps=30, min_seq=64, max_seq=1024,
                           pattern="jax", optimizer_mode="functional", donate=True)
    device = replace(resolve_device("a100-40g", None), context_bytes=0)
    answer = pop.min_capacity(trace, "jax:fraction=1.0", device,
                              resolution=resolution("auto", trace))
    record = pop.capacity_record(answer, pop.grid_failures(trace, "jax:fraction=1.0", device,
                                                           answer))
    assert record["monotone"] is False and len(record["failures"]) > 10
    low, high = record["range"]
    assert low == answer.min_capacity and high > low + trace.peak_live()[0] // 5


def test_the_headroom_table_shows_a_non_monotone_answer_as_a_range() -> None:
    member = row("seed 0", a=110)
    member["capacity"] = {"a": {"monotone": False, "exceptions": ["fails at ..."],
                                "failures": [130 * MiB],
                                "range": [110 * MiB, 179 * MiB]}}
    results = {"experiment": "x", "title": "t", "reserved": False, "skipped": [], "claims": [],
               "policies": ["a"], "families": [family("f", "generated", member)]}
    text = pop.markdown(results)
    assert "+10.0%–+79.0%" in text
    assert "not monotone" in text.lower()


def test_no_finding_calls_cuda_asyncs_release_threshold_a_cap() -> None:
    """policies/cuda_async.py: JAX sets the pool's release threshold to fraction × capacity —
    what it keeps cached at a synchronisation, not a limit on what it may hold."""
    for readme in [EXPERIMENTS / "README.md", *EXPERIMENTS.glob("*/README.md")]:
        for line in readme.read_text().splitlines():
            if "cuda_async" in line or "its pool" in line:
                assert "capped" not in line, f"{readme}: {line}"


def test_rejudging_changes_the_claims_and_nothing_measured() -> None:
    fams = [family("f", "recorded", row("train", a=130, b=130))]
    results = {"families": fams, "skipped": [], "claims": [pop.judge(CLAIM, fams)]}
    definition = {"device": "a100-80g", "families": [{"label": "f", "files": []}],
                  "claims": [{"text": "a needs no more than b", "lower": "a", "higher": "b",
                              "compare": "<="}]}
    again = pop.rejudge(definition, json.loads(json.dumps(results)))
    assert results["claims"][0]["verdict"] == "not supported"
    assert again["claims"][0]["verdict"] == "supported"
    assert again["families"] == results["families"]


def test_the_grid_scan_leaves_the_offline_plan_alone() -> None:
    """The offline plan is not an online policy: its minimum is the plan's size and every
    larger capacity holds it, so there is nothing to scan (fragmentation's population asks
    for ``offline`` and its regeneration stopped on the scan)."""
    from dataclasses import replace

    from allocsim.sim.kernel.device import resolve_device
    from allocsim.traces.model import Trace
    trace = Trace.from_events([(0, "alloc", 1, 64 * MiB), (5, "alloc", 2, 32 * MiB),
                               (9, "free", 1, 64 * MiB), (12, "free", 2, 32 * MiB)])
    device = replace(resolve_device("a100-80g", None), context_bytes=0)
    answer = pop.min_capacity(trace, "offline", device, resolution=MiB)
    assert pop.grid_failures(trace, "offline", device, answer) == []
