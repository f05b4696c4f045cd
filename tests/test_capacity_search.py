"""min-capacity's search: which capacities it asks about, and in what order.

A failing replay stops at its first OOM and costs a few percent of a passing one, so the search
climbs from the lower bound in doubling steps and narrows an eighth of the way up (issue 27.4:
min-capacity's time is mostly its passing replays). These tests drive the search with a
pretend policy whose only rule is "completes from T up" and read the questions it asks.
"""

from __future__ import annotations

import pytest

from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.questions.capacity import minimum
from allocsim.sim.questions.capacity.minimum import (
    VERIFY_ABOVE,
    _bracket,
    _probe_point,
    min_capacity,
)
from allocsim.traces.bundled import load_default_trace

MiB = 1 << 20
GiB = 1 << 30


def test_the_next_point_is_an_eighth_of_the_way_up_on_the_grid() -> None:
    assert _probe_point(0, 80 * MiB, MiB) == 10 * MiB
    assert _probe_point(3 * MiB, 20 * MiB, MiB) == 5 * MiB       # 3 + 17/8 = 5.125 → 5
    assert _probe_point(7 * MiB, 9 * MiB, MiB) == 8 * MiB        # never the failing end itself


def test_the_climb_doubles_its_steps_until_the_guess() -> None:
    asked: list[int] = []

    def works(c: int) -> bool:
        asked.append(c)
        return c >= 40 * MiB

    low, high = _bracket(works, 10 * MiB, MiB, generous_peak=100 * MiB)
    # From the lower bound's failing neighbour (9): 9+2, 11+4, 15+8, 23+16, 39+32 = 71 works.
    assert asked == [11 * MiB, 15 * MiB, 23 * MiB, 39 * MiB, 71 * MiB]
    assert (low, high) == (39 * MiB, 71 * MiB)


def test_a_guess_that_fails_doubles_from_itself() -> None:
    asked: list[int] = []

    def works(c: int) -> bool:
        asked.append(c)
        return c >= 50 * MiB

    low, high = _bracket(works, 10 * MiB, MiB, generous_peak=12 * MiB)
    assert asked == [11 * MiB, 12 * MiB, 24 * MiB, 48 * MiB, 96 * MiB]
    assert (low, high) == (48 * MiB, 96 * MiB)


def test_nothing_works_up_to_the_probe_capacity() -> None:
    low, high = _bracket(lambda c: False, 10 * MiB, MiB, generous_peak=12 * MiB)
    assert high is None and low > 0


@pytest.mark.parametrize("threshold_mib", [1569, 1570, 1600, 1650, 2000, 3100])
def test_a_monotone_policy_costs_few_passing_replays(monkeypatch, threshold_mib: int) -> None:
    """With "completes from T up" the answer is T, and the search asks far fewer questions
    whose answer is "completes" than halving would (≈ log2 of the range ÷ 2): besides the
    answer and the checks above it, at most four."""
    trace = load_default_trace()
    threshold = threshold_mib * MiB
    asked: list[int] = []

    def completes(self, c: int) -> bool:
        asked.append(c)
        return c >= threshold

    monkeypatch.setattr(minimum.CompletionOracle, "completes", completes)
    answer = min_capacity(trace, "best-fit", DeviceProfile("test", 64 * GiB))
    assert answer.min_capacity == threshold and answer.monotone
    checks_above = {threshold + step * MiB for step in range(1, VERIFY_ABOVE + 1)}
    passing = {c for c in asked if c >= threshold} - checks_above - {threshold}
    assert len(passing) <= 4, sorted((c - threshold) // MiB for c in passing)
