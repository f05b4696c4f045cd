"""The device's written-out calls give what its general path gives (issue 17).

ProcessDevice.reserve/release/address_range/map/unmap run a written-out body on the plain
device, view and cost model without a call log, and otherwise their ``_*_general`` twins, which
compose the device's pieces as written. Here every policy runs the same random workload on a
device of each kind — the second keeps a call log, which takes the general path — and after
every step the addresses, the device's counters, reserved bytes, peaks and the modelled cost
(exactly, as floats) must agree, including when the small device refuses calls.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from policy_checks import play_both, small_device, workload_actions

from allocsim.policies import parse_policy
from allocsim.sim.kernel.device import SimulatedDevice

SPECS = ["on-demand", "preallocate", "bfc", "bfc:garbage_collection=true", "best-fit",
         "best-fit:trim=true", "pytorch", "pytorch:expandable_segments=true", "cupy",
         "cuda-async", "cuda-async:fraction=0.5,preallocate=true", "cuda-async:sync=none",
         "buddy:release=true"]


def device_state(view: Any) -> tuple:
    return (view.reserved, view.peak_reserved, view.calls, view.mallocs, view.frees,
            view.failed_mallocs, view.cost_s, view.pending_cost_s, view.holdings(),
            view.device.used, view.device.peak_used, view.device._next_address)


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=workload_actions())
def test_the_written_out_device_calls_are_the_general_ones(spec: str, actions: Any) -> None:
    profile = small_device(capacity=48 << 20)
    fast_view, slow_view = SimulatedDevice(profile).view(0), SimulatedDevice(profile).view(0)
    slow_view.log = []                    # a call log: the general path
    assert fast_view._fast and not slow_view._fast
    policy = parse_policy(spec)
    fast, slow = policy.build(fast_view), policy.build(slow_view)
    for _ in play_both(fast, slow, actions):
        assert device_state(fast_view) == device_state(slow_view)
    assert slow_view.calls == len(slow_view.log)
    fast.check()
