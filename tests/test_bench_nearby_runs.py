"""The nearby-runs measure (benchmarks/nearby_runs.py): when two runs' states count as the same
but the last chunk, and that a run compared with itself is alike at every checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.native import core
from allocsim.sim.questions.run_repeats import CoreMoment
from allocsim.traces import synth
from benchmarks.nearby_runs import nearby, same_but_the_last_chunk

MiB = 1 << 20


def moment(rows: list[tuple[int, int, int]], live: dict[int, object] | None = None) -> CoreMoment:
    array = np.array([(*row, 0, 0) for row in rows], dtype=np.int64).reshape(-1, 5)
    return CoreMoment(array, 0, live or {}, 0)


ANSWER = [(0, 4 * MiB, 1), (4 * MiB, 2 * MiB, 0), (6 * MiB, 10 * MiB, 0)]


def test_states_alike_but_the_last_chunks_size_count_as_alike() -> None:
    assert same_but_the_last_chunk(moment(ANSWER), moment(ANSWER))
    larger_tail = [*ANSWER[:2], (6 * MiB, 11 * MiB, 0)]
    assert same_but_the_last_chunk(moment(ANSWER), moment(larger_tail))


@pytest.mark.parametrize("other", [
    [(0, 4 * MiB, 1), (4 * MiB, 3 * MiB, 0), (7 * MiB, 9 * MiB, 0)],     # a chunk before it
    [*ANSWER[:2], (6 * MiB, 10 * MiB, 1)],                                # the last one in use
    ANSWER[:2],                                                           # a chunk fewer
], ids=["an earlier chunk", "in use", "fewer chunks"])
def test_any_other_difference_does_not(other: list[tuple[int, int, int]]) -> None:
    assert not same_but_the_last_chunk(moment(ANSWER), moment(other))


def test_a_live_buffer_elsewhere_does_not() -> None:
    assert not same_but_the_last_chunk(moment(ANSWER, {7: 0}), moment(ANSWER, {7: 4 * MiB}))


@pytest.mark.skipif(core() is None, reason="the native core is not built")
def test_a_run_against_itself_is_alike_at_every_checkpoint() -> None:
    trace = synth.generate("transformer", events=4000, seed=1)
    device = DeviceProfile("test", 80 << 30)
    [row] = nearby(trace, "bfc", device, 16 << 30, [0], every=100)
    assert row.checkpoints == len(trace) // 100
    assert row.alike == row.checkpoints and row.stretches == row.longest == 0


def test_each_search_keeps_its_own_decision_and_excludes_some_larger_region() -> None:
    """Every search's interval holds d = 0 (the run itself decides so); a larger region is
    excluded by more of them (each interval holds 0, so a larger d leaves more), and near the
    answer some exclude one 8 MiB larger (the last chunk chosen, or passed over)."""
    from allocsim.sim.questions.capacity.minimum import min_capacity
    from benchmarks.nearby_runs import forks

    trace = synth.generate("transformer", events=6000, seed=1)
    device = DeviceProfile("test", 80 << 30)
    answer = min_capacity(trace, "bfc", device).min_capacity
    assert answer is not None
    found = forks(trace, "bfc", device, answer, [0, 1, 2, 4, 8])
    assert found.watched > 0 and found.excluding[0] == 0
    assert found.excluding == sorted(found.excluding)
    assert 0 < found.excluding[-1] <= found.watched


def test_the_stretches_holding_the_excluding_searches_are_counted_once_each() -> None:
    """A stretch holding several excluding searches counts once: no more stretches than
    searches, at least one where there is a search, and one stretch as long as the trace
    holds them all."""
    from allocsim.sim.questions.capacity.minimum import min_capacity
    from benchmarks.nearby_runs import forks

    trace = synth.generate("transformer", events=6000, seed=1)
    device = DeviceProfile("test", 80 << 30)
    answer = min_capacity(trace, "bfc", device).min_capacity
    assert answer is not None
    steps = [0, 1, 2, 4, 8]
    fine = forks(trace, "bfc", device, answer, steps, segment=64)
    whole = forks(trace, "bfc", device, answer, steps, segment=len(trace))
    assert fine.excluding == whole.excluding
    assert all(k <= n for k, n in zip(fine.segments, fine.excluding, strict=True))
    assert whole.segments == [min(n, 1) for n in whole.excluding]
    assert fine.segments[-1] > whole.segments[-1]
