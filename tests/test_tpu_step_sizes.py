"""jit, donation and remat on the chip at four sizes (experiments/tpu/step_sizes.py): the
committed table regenerates from the chip's records, and the tpu model places every record of
every run that completed."""

from __future__ import annotations

from experiments.tpu import step_sizes


def test_the_step_sizes_table_regenerates_from_the_chips_records() -> None:
    assert step_sizes.main(["--check"]) == 0


def test_the_tpu_model_places_every_record_of_the_runs_that_completed() -> None:
    found = step_sizes.compute()
    complete = [r for r in found["rows"] if "oom" not in r]
    assert len(complete) == 15
    assert all(r["records_matched"] == r["records"] > 0 for r in complete)


def test_a_footprint_on_a_tpu_is_peak_in_use_plus_scratch() -> None:
    row = next(r for r in step_sizes.compute()["rows"] if r["run"] == "125m-jit")
    assert row["footprint"] == row["peak_in_use"] + row["scratch"]
    assert 0 < row["scratch"] < row["temp"]   # the runtime holds a little under XLA's temp
