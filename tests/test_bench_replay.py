"""The replay benchmark's method (benchmarks/replay.py): what it times and against what.
Its figures are not asserted here; only that a ratio is to the floor measured beside it."""

from __future__ import annotations

import pytest

from allocsim.traces import synth
from benchmarks import replay as bench_replay


def test_a_policys_runs_alternate_with_the_floors() -> None:
    order: list[str] = []
    floor_s, run_s = bench_replay.best_beside(3, lambda: order.append("floor"),
                                              lambda: order.append("run"))
    assert order == ["floor", "run"] * 3
    assert 0 <= floor_s < 1 and 0 <= run_s < 1


def test_each_ratio_is_to_the_floor_measured_beside_it(capsys: pytest.CaptureFixture) -> None:
    trace = synth.generate("random", seed=0, events=2000, live=50)
    rows = bench_replay.measure_speed(trace, ["on-demand", "bfc"], "a100-80g", repeat=2)
    assert [row["policy"] for row in rows] == ["floor", "on-demand", "bfc"]
    for row in rows[1:]:
        floor_s = row["events"] / row["floor_events_per_s"]
        assert row["floor_ratio"] == pytest.approx(row["seconds"] / floor_s)
        assert row["events_per_s"] == pytest.approx(row["events"] / row["seconds"])
    printed = capsys.readouterr().out
    assert "dict loop (floor)" in printed and "bfc" in printed
