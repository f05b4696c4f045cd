"""Each specialised hot path gives, on random workloads, what its policy's general path gives.

PyTorch's default settings (when memory_stats() is not to be read, as in the replay engine),
the stream-ordered pool's default ``sync=free`` (its merges and the release of a region that
becomes wholly free) and BFC's malloc take hot paths written out for them (issue 17); the
general path stays, obviously correct, and is the referee here: the same
addresses, the same device calls, the same counters (PyTorch: every one both keep) and blocks,
after every step (tests/test_fast_paths.py holds both to results recorded before the split as
well).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from policy_checks import play_both, small_device, workload_actions

from allocsim.policies.bfc import BFCAllocator
from allocsim.policies.cuda_async import CudaAsyncAllocator
from allocsim.policies.pytorch_blocks import MEMORY_STATS_ONLY
from allocsim.policies.pytorch_caching import PyTorchCachingAllocator
from allocsim.sim.kernel.device import SimulatedDevice


def general_cuda_async(device: Any, **params: Any) -> CudaAsyncAllocator:
    """``sync=free`` through the class's general malloc and free (the owner-aware take and
    give-back, FreeIndex's own methods), not the written-out pair bound on the instance."""
    policy = CudaAsyncAllocator(device, **params)
    assert vars(policy)["malloc"] == policy._malloc_shared
    del policy.malloc, policy.free
    return policy


def fast_bfc(device: Any, **params: Any) -> BFCAllocator:
    """BFC as built: the written-out malloc (ChunkMap.allocate) bound on the instance."""
    policy = BFCAllocator(device, **params)
    assert "malloc" in vars(policy)
    return policy


def general_bfc(device: Any, **params: Any) -> BFCAllocator:
    """The class's general malloc: best-fit pop, the split rule, hand-out (what min-capacity's
    region watch runs); and the general free (ChunkMap.give_back_general)."""
    policy = BFCAllocator(device, **params)
    del policy.malloc
    policy.free = policy.free_general               # type: ignore[method-assign]
    return policy


def fast_pytorch(device: Any, **params: Any) -> PyTorchCachingAllocator:
    """PyTorch's defaults as the replay engine runs them: memory_stats() said not to be read,
    so the specialised methods are bound on the instance."""
    policy = PyTorchCachingAllocator(device, **params)
    policy.keep_memory_stats(False)
    assert "malloc" in vars(policy) and not policy.memory_stats_kept
    return policy


def general_pytorch(device: Any, **params: Any) -> PyTorchCachingAllocator:
    """The same settings with every counter kept: the class's general malloc and free."""
    policy = PyTorchCachingAllocator(device, **params)
    assert "malloc" not in vars(policy) and policy.memory_stats_kept
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
    for table in ("_size", "_prev", "_next", "_home", "_req"):
        assert dict(getattr(fast, table)) == dict(getattr(slow, table)), table
    assert set(fast._unmapped) == set(slow._unmapped)
    kept = {name for name, value in vars(slow).items()
            if isinstance(value, (int, dict, list, set)) and not isinstance(value, bool)
            and name not in MEMORY_STATS_ONLY and name != "segment_map"}
    assert {name: getattr(fast, name) for name in kept} == {
        name: getattr(slow, name) for name in kept}


def same_cuda_async_state(fast: CudaAsyncAllocator, slow: CudaAsyncAllocator) -> None:
    """Every chunk with its state, the free regions, the shared index's keys."""
    assert list(fast.blocks()) == list(slow.blocks())
    assert fast.free_regions == slow.free_regions
    assert list(fast.shared.keys()) == list(slow.shared.keys())
    assert dict(fast.requested) == dict(slow.requested)


def views() -> tuple[Any, Any]:
    profile = small_device(capacity=256 << 20)
    return SimulatedDevice(profile).view(0), SimulatedDevice(profile).view(0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=workload_actions())
def test_pytorchs_default_hot_path_is_its_general_path(actions: Any) -> None:
    fast_view, slow_view = views()
    replay_both(fast_pytorch(fast_view), general_pytorch(slow_view), fast_view, slow_view,
                actions, same_pytorch_state)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=workload_actions())
def test_pytorchs_expandable_segments_hot_path_is_its_general_path(actions: Any) -> None:
    """Also across empty_cache() every 16 steps: its unmapped pages must not join mapped free
    blocks on either path."""
    fast_view, slow_view = views()
    fast = fast_pytorch(fast_view, expandable_segments=True)
    slow = general_pytorch(slow_view, expandable_segments=True)
    assert vars(fast)["malloc"] == fast._malloc_expandable
    for step in play_both(fast, slow, actions):
        if step % 16 == 15:
            fast.empty_cache()
            slow.empty_cache()
        assert fast.stats() == slow.stats()
        assert (fast_view.reserved, fast_view.calls) == (slow_view.reserved, slow_view.calls)
        same_pytorch_state(fast, slow)
        fast.check()
        slow.check()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=workload_actions())
def test_the_pools_sync_on_free_hot_path_is_its_general_path(actions: Any) -> None:
    fast_view, slow_view = views()
    replay_both(CudaAsyncAllocator(fast_view), general_cuda_async(slow_view), fast_view,
                slow_view, actions, same_cuda_async_state)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=workload_actions())
def test_bfcs_written_out_malloc_is_its_general_malloc(actions: Any) -> None:
    for params in ({}, {"allow_growth": False}, {"garbage_collection": True,
                                                 "memory_limit": 64 << 20},
                   {"fragmentation_fraction": 0.01}):
        fast_view, slow_view = views()
        replay_both(fast_bfc(fast_view, **params), general_bfc(slow_view, **params), fast_view,
                    slow_view, actions)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=workload_actions())
def test_the_pools_threshold_hot_path_is_its_general_path(actions: Any) -> None:
    for params in ({"release_threshold": 8 << 20}, {"fraction": 0.25, "preallocate": True}):
        fast_view, slow_view = views()
        replay_both(CudaAsyncAllocator(fast_view, **params),
                    general_cuda_async(slow_view, **params), fast_view, slow_view, actions,
                    same_cuda_async_state)
