"""The offline plan: decreasing-size best fit over known lifetimes — a heuristic plan shown
beside the policies (not a bound: the bound is peak live), never the winner."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.questions.compare import compare
from allocsim.sim.questions.offline import _best_gap, plan_offline
from allocsim.traces import Trace

GiB = 1 << 30


def test_buffers_that_never_live_together_share_addresses() -> None:
    # A [e0, e2), B [e1, e4), C [e3, e5): A and C never overlap in time, B overlaps both.
    trace = Trace.from_events([(0, "alloc", 1, 100), (1, "alloc", 2, 50), (2, "free", 1, None),
                               (3, "alloc", 3, 100), (4, "free", 2, None), (5, "free", 3, None)])
    plan = plan_offline(trace, alignment=1)
    by_event = dict(zip(plan.alloc_events.tolist(), plan.offsets.tolist()))
    assert by_event == {0: 0, 3: 0, 1: 100}          # largest first; B goes on top of both
    assert plan.heap_size == 150 == plan.peak_live


def test_the_smallest_gap_that_fits_is_taken_lowest_offset_first() -> None:
    offsets = np.array([0, 300, 500])
    sizes = np.array([100, 100, 160])
    assert _best_gap(offsets, sizes, 150) == 100      # gaps: [100,300)=200, [400,500)=100
    assert _best_gap(offsets, sizes, 90) == 400       # the smaller gap wins
    assert _best_gap(offsets, sizes, 250) == 660      # nothing fits: on top
    # Overlapping intervals (placed buffers that never live together) are merged first.
    assert _best_gap(np.array([0, 50]), np.array([100, 100]), 10) == 150


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5000), st.integers(0, 10**6)),
                min_size=1, max_size=80))
def test_buffers_alive_together_never_overlap_and_the_heap_bounds_peak_live(actions) -> None:
    events, live, next_id = [], [], 0
    for t, (is_alloc, size, pick) in enumerate(actions):
        if is_alloc or not live:
            events.append((t, "alloc", next_id, size))
            live.append(next_id)
            next_id += 1
        else:
            events.append((t, "free", live.pop(pick % len(live)), None))
    plan = plan_offline(Trace.from_events(events), alignment=1)
    s, e, o, z = plan.alloc_events, plan.free_events, plan.offsets, plan.sizes
    for i in range(len(s)):
        for j in range(i + 1, len(s)):
            if s[i] < e[j] and s[j] < e[i]:
                assert o[i] + z[i] <= o[j] or o[j] + z[j] <= o[i]
    assert plan.heap_size >= plan.peak_live
    assert plan.heap_size == max((o + z).max(initial=0), 0)


def test_offline_is_shown_in_compare_never_the_winner() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 3 << 20), (10**6, "alloc", 2, 5 << 20),
                               (2 * 10**6, "free", 1, None), (3 * 10**6, "free", 2, None)])
    result = compare(trace, ["bfc", "offline"], DeviceProfile("d", GiB))
    offline = next(r for r in result.results if r.policy == "offline")
    assert offline.completed and offline.peak_reserved == 8 << 20
    assert result.winner == "bfc"
    assert "the offline plan (a heuristic, not a bound) needs 8.00MiB" in result.reason
    assert "peak live, the lower bound, is 8.00MiB" in result.reason


def test_a_winner_below_the_offline_plan_is_said_to_beat_a_heuristic() -> None:
    # The plan is not a bound: when an online policy needs less, the reason says so instead of
    # "at most 0B is left to win".
    from dataclasses import replace

    from allocsim.sim.questions.compare import _against_the_plan
    trace = Trace.from_events([(0, "alloc", 1, 3 << 20), (1, "free", 1, None)])
    plan = next(r for r in compare(trace, ["offline"], DeviceProfile("d", GiB)).results)
    winner = replace(plan, policy="best-fit", peak_reserved=plan.peak_reserved - (1 << 20))
    assert _against_the_plan(winner, plan) == (
        "; that is 1.00MiB less than the offline plan (3.00MiB), a heuristic, not a bound; "
        "peak live, the lower bound, is 3.00MiB")
    same = replace(plan, policy="best-fit")
    assert _against_the_plan(same, plan).startswith("; the offline plan needs the same 3.00MiB")


def test_offline_runs_out_of_memory_when_the_plan_does_not_fit() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 600 << 20), (1, "alloc", 2, 600 << 20)])
    result = compare(trace, ["offline"], DeviceProfile("d", GiB)).results[0]
    assert not result.completed and result.first_oom_event == 1


def test_a_winner_that_ties_on_memory_and_time_is_said_to_be_first_by_name() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 3 << 20), (1, "free", 1, None)])
    result = compare(trace, ["on-demand", "jax:allocator=platform"], DeviceProfile("d", GiB),
                     max_slowdown=None)
    assert result.winner == "jax:allocator=platform"   # the same allocator under two names
    assert "first by name" in result.reason and "spends less time" not in result.reason


def test_the_plan_aligns_offsets_but_not_sizes_as_xlas_heap_simulator() -> None:
    # Two buffers alive together, 100 B and 50 B, alignment 64: the larger goes at 0 and ends
    # at 100; the other starts at the next aligned offset, 128, and ends at 178. XLA's temp
    # allocation is that end, unpadded (a jax 0.10 CPU dump: size = max(offset + size)).
    from allocsim.sim.questions.offline import plan_offline
    trace = Trace.from_events([(0, "alloc", 1, 100), (1, "alloc", 2, 50),
                               (2, "free", 1, None), (3, "free", 2, None)])
    plan = plan_offline(trace, alignment=64)
    assert plan.offsets.tolist() == [0, 128] and plan.heap_size == 178
