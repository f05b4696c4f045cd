"""The replay engine: what it counts, how it reports OOMs, time, and sharing a device."""

from __future__ import annotations

import json

import numpy as np
import pytest

from allocsim.errors import UserInputError
from allocsim.policies import parse_policy
from allocsim.sim.kernel.device import CostModel, DeviceProfile, SimulatedDevice
from allocsim.sim.kernel.engine import FirstOOM, ProcessReplay, SharedProcess, replay, run_shared
from allocsim.sim.questions.compare import compare, pick_winner
from allocsim.traces import Trace

# Every test here runs on both implementations (tests/conftest.py's `implementation`).
pytestmark = pytest.mark.usefixtures("implementation")

MiB = 1 << 20
GiB = 1 << 30


def device(capacity: int = GiB, **costs) -> DeviceProfile:
    return DeviceProfile("test", capacity, costs=CostModel(**costs) if costs else CostModel())


def staircase() -> Trace:
    """Three buffers up, then down; 1 ms apart."""
    return Trace.from_events([
        (0, "alloc", 1, 10 * MiB), (1_000_000, "alloc", 2, 20 * MiB),
        (2_000_000, "alloc", 3, 30 * MiB), (3_000_000, "free", 2, None),
        (4_000_000, "free", 3, None), (5_000_000, "free", 1, None)], name="staircase")


def test_allocated_is_counted_from_the_trace_and_reserved_from_the_device() -> None:
    result = replay(staircase(), "on-demand", device())
    assert result.peak_allocated == 60 * MiB and result.peak_allocated_event == 2
    assert result.peak_reserved == 60 * MiB
    assert result.device_mallocs == 3 and result.device_frees == 3
    assert result.final_reserved == 0 and result.completed


def test_utilization_and_fragmentation_follow_the_anchor_definitions() -> None:
    result = replay(staircase(), "bfc", device())
    # BFC regions: 10 MiB → 16 MiB region (curr 2→16, grew); 20 MiB → 32 MiB region (grew);
    # 30 MiB → 32 MiB (curr 32 → split? no: 32 < 60) → regions 16 + 32 + 32 = 80 MiB.
    assert result.peak_reserved == 80 * MiB
    assert result.utilization == pytest.approx(60 / 80)
    assert result.fragmentation == pytest.approx(20 / 80)
    assert result.waste == 20 * MiB
    assert result.internal_fragmentation == (16 + 32 + 32 - 60) * MiB   # unsplit slack at the peak


def test_modelled_time_of_device_calls_becomes_slowdown() -> None:
    profile = device(malloc_base_s=1e-3, malloc_per_gib_s=0.0, free_base_s=5e-4)
    result = replay(staircase(), "on-demand", profile)
    assert result.alloc_time_s == pytest.approx(3 * 1e-3 + 3 * 5e-4)
    assert result.trace_duration_s == pytest.approx(5e-3)
    assert result.slowdown == pytest.approx((5e-3 + 4.5e-3) / 5e-3)
    # The timeline's simulated time includes the delay of calls made so far.
    assert result.timeline.time_ns[-1] == 5_000_000 + 4_500_000


def test_an_oom_is_counted_reported_and_the_run_goes_on() -> None:
    trace = Trace.from_events([
        (0, "alloc", 1, 600 * MiB), (1, "alloc", 2, 600 * MiB), (2, "free", 2, None),
        (3, "free", 1, None), (4, "alloc", 3, 900 * MiB), (5, "free", 3, None)])
    result = replay(trace, "on-demand", device(GiB))
    assert not result.completed and result.ooms == 1
    assert (result.first_oom_event, result.first_oom_size) == (1, 600 * MiB)
    assert result.first_oom_allocated == 600 * MiB and result.first_oom_reserved == 600 * MiB
    assert result.peak_allocated == 900 * MiB          # the failed buffer never counted
    assert result.timeline.allocated.max() == 900 * MiB


def test_the_first_oom_is_kept_by_name_and_reported_in_the_result() -> None:
    trace = Trace.from_events([
        (0, "alloc", 1, 600 * MiB), (1, "alloc", 2, 600 * MiB), (2, "free", 2, None),
        (3, "alloc", 3, 700 * MiB)])
    run = ProcessReplay(trace, parse_policy("on-demand"), SimulatedDevice(device(GiB)))
    run.advance(len(trace))
    # on-demand holds exactly the one live buffer; no other process shares the device.
    assert run.report.first_oom == FirstOOM(event=1, size=600 * MiB, allocated=600 * MiB,
                                     reserved=600 * MiB, largest_free=0, others={})
    result = run.result("test")
    assert result.ooms == 2 and result.first_oom_event == 1
    assert result.first_oom_largest_free == 0 and result.first_oom_others is None


def test_stop_on_oom_ends_the_run_at_the_first_failure() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 2 * GiB), (1, "alloc", 2, 1), (2, "free", 2, None)])
    result = replay(trace, "on-demand", device(GiB), stop_on_oom=True)
    assert result.ooms == 1 and not result.completed and result.device_mallocs == 0


def test_zero_byte_buffers_take_no_memory_and_need_no_device_call() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 0), (1, "free", 1, None), (2, "alloc", 2, 5)])
    result = replay(trace, "on-demand", device())
    assert result.completed and result.device_mallocs == 1 and result.peak_allocated == 5


def test_one_process_gives_the_same_result_with_and_without_simpy() -> None:
    rng = np.random.default_rng(1)
    events, live, t = [], [], 0
    for i in range(3000):
        t += int(rng.integers(0, 3)) * 1000          # many events share a timestamp
        if live and rng.random() < 0.5:
            events.append((t, "free", live.pop(int(rng.integers(len(live)))), None))
        else:
            events.append((t, "alloc", i, int(rng.integers(1, 8 * MiB))))
            live.append(i)
    trace = Trace.from_events(events)
    for spec in ("bfc", "on-demand", "best-fit:trim=true"):
        fast = replay(trace, spec, device()).to_json_dict(timeline=True)
        alone = run_shared([SharedProcess(trace, spec)], device()).results[0]
        shared = alone.to_json_dict(timeline=True)
        assert fast == shared


def test_processes_race_for_the_device_in_simulated_time() -> None:
    first = Trace.from_events([(0, "alloc", 1, 700 * MiB), (10_000_000, "free", 1, None)])
    second = Trace.from_events([(0, "alloc", 1, 700 * MiB), (10_000_000, "free", 1, None)])
    early = run_shared([SharedProcess(first, "on-demand"),
                        SharedProcess(second, "on-demand", start_ns=1_000_000)], device(GiB))
    assert [r.completed for r in early.results] == [True, False]
    late = run_shared([SharedProcess(first, "on-demand", start_ns=1_000_000),
                       SharedProcess(second, "on-demand")], device(GiB))
    assert [r.completed for r in late.results] == [False, True]
    # Starting after the other has freed: both complete.
    apart = run_shared([SharedProcess(first, "on-demand"),
                        SharedProcess(second, "on-demand", start_ns=20_000_000)], device(GiB))
    assert all(r.completed for r in apart.results)
    assert apart.device_peak == 700 * MiB


def test_two_jax_style_preallocations_do_not_both_get_three_quarters() -> None:
    work = Trace.from_events([(0, "alloc", 1, 600 * MiB), (1000, "free", 1, None)])
    run = run_shared([SharedProcess(work, "preallocate"),
                      SharedProcess(work, "preallocate", start_ns=500)], device(GiB))
    assert run.results[0].completed and run.results[0].peak_reserved == 768 * MiB
    assert not run.results[1].completed            # back-off finds < 256 MiB, not 600 MiB
    assert run.device_peak <= GiB


def test_same_input_gives_byte_identical_json() -> None:
    trace = staircase()
    outputs = [json.dumps(compare(trace, ["on-demand", "bfc", "best-fit", "preallocate"],
                                  device()).to_json_dict(timeline=True)) for _ in range(2)]
    assert outputs[0] == outputs[1]


def test_the_winner_completes_then_holds_least_then_spends_least_time() -> None:
    result = compare(staircase(), ["preallocate", "bfc", "on-demand", "best-fit"], device())
    by_policy = {r.policy: r for r in result.results}
    assert result.winner == min((r for r in result.results if r.completed),
                                key=lambda r: (r.peak_reserved, r.alloc_time_s)).policy
    assert by_policy["preallocate"].peak_reserved == 768 * MiB
    winner, reason = pick_winner([by_policy["bfc"], by_policy["preallocate"]])
    assert winner.policy == "bfc" and "lowest peak reserved" in reason


def test_no_winner_when_every_policy_runs_out_of_memory() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 2 * GiB)])
    result = compare(trace, ["bfc", "on-demand"], device(GiB))
    assert result.winner is None and "no policy completes" in result.reason


def test_a_process_that_ends_gives_its_memory_back_to_the_device() -> None:
    # The first process never frees.
    keeps = Trace.from_events([(0, "alloc", 1, 700 * MiB), (1_000_000, "alloc", 2, 1)])
    later = Trace.from_events([(0, "alloc", 1, 700 * MiB)])
    run = run_shared([SharedProcess(keeps, "on-demand"),
                      SharedProcess(later, "on-demand", start_ns=5_000_000)], device(GiB))
    assert all(r.completed for r in run.results)
    assert run.results[0].final_reserved == 700 * MiB + 512     # what it held when it exited
    assert run.device_used[-1] == 0


def test_a_trace_of_several_processes_is_not_silently_reduced_to_one() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 10, 0, 0), (1, "alloc", 2, 10, 0, 1)])
    with pytest.raises(UserInputError, match="2 processes"):
        replay(trace, "bfc", device())
    both = run_shared([SharedProcess(trace.for_process(p), "bfc", process=p) for p in (0, 1)],
                      device())
    assert [r.peak_allocated for r in both.results] == [10, 10]


def test_traces_with_synthesised_times_are_judged_on_memory_alone() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 100), (1000, "free", 1, None)], synthetic_times=True)
    result = compare(trace, ["bfc", "on-demand"], device())
    assert result.winner == "on-demand" and "no slowdown budget" in result.reason
    assert result.to_json_dict()["max_slowdown"] is None


def test_shared_runs_know_whether_the_processes_ever_ran_together() -> None:
    """Each process's span is its first event to its exit in simulated time; two processes
    one after the other never shared the device, whatever "all complete" says."""
    trace = staircase()
    last = int(trace.time_ns[-1] - trace.time_ns[0])
    apart = run_shared([SharedProcess(trace, "on-demand"),
                        SharedProcess(trace, "on-demand", start_ns=last + 1)], device())
    assert [r.completed for r in apart.results] == [True, True]
    assert apart.spans_ns[0][0] == 0 and apart.spans_ns[0][1] >= last
    assert apart.spans_ns[1][0] == last + 1
    assert apart.ran_together() is (apart.spans_ns[1][0] < apart.spans_ns[0][1])
    far = run_shared([SharedProcess(trace, "on-demand"),
                      SharedProcess(trace, "on-demand", start_ns=10 * last + 10**9)], device())
    assert not far.ran_together()
    together = run_shared([SharedProcess(trace, "on-demand"),
                           SharedProcess(trace, "on-demand", start_ns=1)], device())
    assert together.ran_together()


@pytest.mark.parametrize("window", [1, 2, 3, 7, 1 << 16])
def test_batch_ends_are_the_same_whatever_the_window(window: int) -> None:
    """Where each timestamp's batch ends, worked out a window at a time (a shared run's
    memory), is what one pass over the whole trace gives, batches across windows included."""
    from allocsim.sim.kernel.engine import batch_ends
    rng = np.random.default_rng(window)
    for times in (np.array([5]), np.array([1, 1, 1]), np.array([0, 1, 2, 3]),
                  np.cumsum(rng.integers(0, 2, 50))):
        whole = np.append(np.flatnonzero(np.diff(times)) + 1, len(times)).tolist()
        assert list(batch_ends(times, window)) == whole
