"""experiments/tpu/findings.py: the TPU findings regenerate from the chip's committed records
(findings.json and README.md's section are what the records give), and each verdict follows
the data it reads."""

from __future__ import annotations

import copy

from experiments.tpu import findings


def test_the_committed_findings_are_what_the_records_give() -> None:
    assert findings.main(["--check"]) == 0


def test_the_preallocation_verdict_follows_the_records() -> None:
    found = findings.compute()
    assert found["preallocation"]["preallocates"] is False
    changed = copy.deepcopy(found)
    changed["preallocation"]["preallocates"] = True
    assert "preallocates under at least one" in findings.markdown(changed)


def test_scratch_is_below_xlas_temp_on_every_step_that_has_one() -> None:
    steps = findings.steps()
    assert steps["scratch_below_temp"]
    assert len(steps["rows"]) == 7
    assert steps["in_use_off_by_at_most"] <= 1024
