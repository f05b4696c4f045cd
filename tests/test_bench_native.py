"""The native benchmark's floors (benchmarks/native.py, native/src/tuned_best_fit.cpp):
the tuned best fit does best-fit's work — the same peak as allocsim's best-fit policy — and
every policy's ratio is printed to it and to the read limit, with the machine's load. Figures
are not asserted (the machine is shared); only what is timed against what."""

from __future__ import annotations

import numpy as np
import pytest

from allocsim.sim.kernel.native import core
from allocsim.traces import synth
from allocsim.traces.model import Trace
from benchmarks import native as bench_native

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built")

MIB = 1 << 20


def tuned_peak(trace: Trace, page: int = 2 * MIB) -> int:
    columns = (trace.column("op"), trace.column("id"), trace.matched_sizes(packed=True))
    return int(core().tuned_best_fit(columns, len(trace), page))


def test_the_tuned_floor_maps_whole_pages_at_the_top_and_reuses_the_best_fit() -> None:
    # a 1 MiB; b 1.5 MiB (the first page's free 1 MiB is too small: the tail grows by one
    # page); free a; c 0.5 MiB fits a's hole; d 2.5 MiB needs the 0.5 MiB tail + 2 MiB more.
    trace = Trace.from_events([(0, "alloc", 1, MIB), (1, "alloc", 2, 3 * MIB // 2),
                               (2, "free", 1, MIB), (3, "alloc", 3, MIB // 2),
                               (4, "alloc", 4, 5 * MIB // 2)])
    assert tuned_peak(trace) == 6 * MIB


@pytest.mark.parametrize("kind", ["transformer", "training", "random"])
def test_the_tuned_floor_reaches_best_fits_peak(kind: str) -> None:
    from allocsim.sim.kernel.device import resolve_device
    from allocsim.sim.kernel.engine import replay

    trace = synth.generate(kind, seed=3, events=20_000)
    result = replay(trace, "best-fit", resolve_device("a100-80g"))
    assert result.completed
    assert tuned_peak(trace) == result.policy_stats["peak_pool_bytes"]


def test_the_read_limit_reads_every_column_value() -> None:
    trace = synth.generate("random", seed=0, events=5000, live=50)
    columns = (trace.column("op"), trace.column("id"), trace.matched_sizes(packed=True))
    op, ids, size = (column.astype(np.int64) for column in columns)
    assert core().read_columns(columns, len(trace)) == int((op ^ ids ^ size).sum())


def test_each_policy_is_set_against_the_tuned_floor_and_the_read_limit(
        capsys: pytest.CaptureFixture) -> None:
    trace = synth.generate("random", seed=0, events=3000, live=50)
    profile = bench_native.bench_profile("a100-80g", None)
    rows = bench_native.measure_speed(trace, ["bfc", "pytorch"], profile, repeat=2)
    floors = {row["policy"]: row for row in rows[:3]}
    assert set(floors) == {"tuned C++ best fit", "plain C++ best fit", "read limit"}
    for row in rows[3:]:
        tuned_s = row["events"] / row["tuned_events_per_s"]
        assert row["tuned_ratio"] == pytest.approx(row["cpu_s"] / tuned_s)
        read_s = row["events"] / row["read_events_per_s"]
        assert row["read_ratio"] == pytest.approx(row["cpu_s"] / read_s)
    printed = capsys.readouterr().out
    assert "load average" in printed and "× tuned" in printed and "× read" in printed


def test_the_free_blocks_a_policy_holds_are_averaged_over_even_stops_of_its_run() -> None:
    # Three 256-byte buffers, then the first freed. Best fit maps one 2 MiB page: after two
    # events its blocks are a, b and the free rest (1 free block); after four, a's hole and
    # the rest (2): mean 1.5. CuPy cudaMallocs each rounded request whole, so nothing is free
    # until a is freed: 0, 0, 0, 1 at four stops, mean 0.25.
    trace = Trace.from_events([(0, "alloc", 1, 256), (1, "alloc", 2, 256), (2, "alloc", 3, 256),
                               (3, "free", 1, 256)])
    profile = bench_native.bench_profile("a100-80g", None)
    assert bench_native.free_blocks_held(trace, "best-fit", profile, points=2) == 1.5
    assert bench_native.free_blocks_held(trace, "cupy", profile, points=4) == 0.25
