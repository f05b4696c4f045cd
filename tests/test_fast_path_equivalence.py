"""PyTorch's model decides the same whether memory_stats()'s own counters are kept or not.

There is one malloc and one free per policy (the Python models are the specification, written
once); what PyTorch's model may leave out when memory_stats() will not be read (the replay
engine's case, keep_memory_stats(False)) is only the counters that report reads
(policies/pytorch/stats.py's MEMORY_STATS_ONLY). Here a lean and a kept allocator run the
same random workloads, with and without expandable segments: the same addresses, the same
device calls, the same blocks, tables and every counter both keep, after every step
(tests/test_fast_paths.py holds both to results recorded before the speed work, when these
were two code paths).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from policy_checks import play_both, small_device, workload_actions

from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.policies.pytorch.stats import MEMORY_STATS_ONLY
from allocsim.sim.kernel.device import SimulatedDevice


def fast_pytorch(device: Any, **params: Any) -> PyTorchCachingAllocator:
    """PyTorch's defaults as the replay engine runs them: memory_stats() said not to be read,
    so its own counters are left out."""
    policy = PyTorchCachingAllocator(device, **params)
    policy.keep_memory_stats(False)
    assert not policy.memory_stats_kept
    return policy


def general_pytorch(device: Any, **params: Any) -> PyTorchCachingAllocator:
    """The same settings with every counter kept."""
    policy = PyTorchCachingAllocator(device, **params)
    assert policy.memory_stats_kept
    return policy


def replay_both(fast: Any, slow: Any, fast_view: Any, slow_view: Any, actions: Any,
                same_state: Any = None) -> None:
    for _ in play_both(fast, slow, actions):
        assert fast.stats() == slow.stats()
        assert (fast_view.reserved, fast_view.calls) == (slow_view.reserved, slow_view.calls)
        if same_state is not None:
            same_state(fast, slow)
        fast.check()
        slow.check()


def same_pytorch_state(fast: PyTorchCachingAllocator, slow: PyTorchCachingAllocator) -> None:
    """Every block with its state and request, every counter both keep and the block tables
    (the address-keyed views of the block records)."""
    assert fast.segments() == slow.segments()
    for table in ("size", "prev", "next", "pool_key", "requested"):
        assert dict(getattr(fast.pools, table)) == dict(getattr(slow.pools, table)), table
    assert set(fast.pools.unmapped) == set(slow.pools.unmapped)
    for lean, full in ((fast, slow), (fast.pools, slow.pools), (fast.counters, slow.counters)):
        kept = {name for name, value in vars(full).items()
                if isinstance(value, (int, dict, list, set)) and not isinstance(value, bool)
                and name not in MEMORY_STATS_ONLY
                # the block records themselves, and the dropped blocks kept for reuse (spare
                # objects, compared by identity: no state the allocator decides by)
                and name not in ("segment_map", "record", "_record", "_spare")}
        assert kept and {name: getattr(lean, name) for name in kept} == {
            name: getattr(full, name) for name in kept}


def views() -> tuple[Any, Any]:
    profile = small_device(capacity=256 << 20)
    return SimulatedDevice(profile).view(0), SimulatedDevice(profile).view(0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=workload_actions())
def test_pytorch_without_the_reports_counters_decides_as_with_them(actions: Any) -> None:
    fast_view, slow_view = views()
    replay_both(fast_pytorch(fast_view), general_pytorch(slow_view), fast_view, slow_view,
                actions, same_pytorch_state)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=workload_actions())
def test_expandable_segments_decide_the_same_without_the_counters(actions: Any) -> None:
    """Also across empty_cache() every 16 steps: its unmapped pages must not join mapped free
    blocks either way."""
    fast_view, slow_view = views()
    fast = fast_pytorch(fast_view, expandable_segments=True)
    slow = general_pytorch(slow_view, expandable_segments=True)
    for step in play_both(fast, slow, actions):
        if step % 16 == 15:
            fast.empty_cache()
            slow.empty_cache()
        assert fast.stats() == slow.stats()
        assert (fast_view.reserved, fast_view.calls) == (slow_view.reserved, slow_view.calls)
        same_pytorch_state(fast, slow)
        fast.check()
        slow.check()
