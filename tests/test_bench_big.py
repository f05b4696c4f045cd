"""The large-trace benchmark's method (benchmarks/big.py) at a small size: it writes
the trace streamed, replays it in a process per policy and deletes the file. Its figures
are not asserted here, only what they are of."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import big as bench_big


def test_each_policy_loads_and_replays_the_streamed_trace_and_the_file_goes(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    report = tmp_path / "report.json"
    assert bench_big.main(["--events", "30000", "--kind", "training", "--dir", str(tmp_path),
                           "--policies", "bfc", "pytorch", "--json", str(report)]) == 0
    figures = json.loads(report.read_text())
    made = figures["generated"]
    assert [row["policy"] for row in figures["runs"]] == ["bfc", "pytorch"]
    for row in figures["runs"]:
        assert row["events"] == made["events"] and row["completed"]
        assert row["peak_rss_bytes"] >= row["load_peak_rss_bytes"] > row["baseline_rss_bytes"]
        assert row["bytes_per_event"] == pytest.approx(
            (row["peak_rss_bytes"] - row["baseline_rss_bytes"]) / row["events"])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["report.json"]
    assert "pytorch" in capsys.readouterr().out
