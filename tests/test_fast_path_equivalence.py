"""Each specialised hot path gives, on random workloads, what its policy's general path gives.

PyTorch's default settings and the stream-ordered pool's default ``sync=free`` take hot paths
written out for those settings (issue 17); the general path stays, obviously correct, and is
the referee here: the same addresses, the same device calls, the same counters, after every
step (tests/test_fast_paths.py holds both to results recorded before the split as well).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from policy_checks import small_device, workload_actions

from allocsim.policies.cuda_async import SHARED, CudaAsyncAllocator
from allocsim.policies.pytorch_caching import PyTorchCachingAllocator
from allocsim.sim.kernel.device import SimulatedDevice


class GeneralCudaAsync(CudaAsyncAllocator):
    """``sync=free`` through the general owner-aware take and give-back."""

    def _take_shared(self, address: int, chunk_size: int, rounded: int) -> None:
        self._take(address, chunk_size, SHARED, rounded)

    def _give_back_shared(self, address: int, size: int) -> None:
        self._give_back(address, SHARED)


def general_pytorch(device: Any) -> PyTorchCachingAllocator:
    policy = PyTorchCachingAllocator(device)
    # The specialised methods are bound on the instance at construction; without them the
    # class's general malloc and free run.
    del policy.malloc, policy.free
    return policy


def replay_both(fast: Any, slow: Any, fast_view: Any, slow_view: Any, actions: Any) -> None:
    live: list[tuple[int, int]] = []
    for is_alloc, size, pick in actions:
        if is_alloc or not live:
            a, b = fast.malloc(size, 0), slow.malloc(size, 0)
            assert a == b
            if a is not None:
                live.append((a, b))
        else:
            a, b = live.pop(pick % len(live))
            fast.free(a)
            slow.free(b)
        assert fast.stats() == slow.stats()
        assert (fast_view.reserved, fast_view.calls) == (slow_view.reserved, slow_view.calls)
        fast.check()
        slow.check()


def views() -> tuple[Any, Any]:
    profile = small_device(capacity=256 << 20)
    return SimulatedDevice(profile).view(0), SimulatedDevice(profile).view(0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=workload_actions())
def test_pytorchs_default_hot_path_is_its_general_path(actions: Any) -> None:
    fast_view, slow_view = views()
    fast = PyTorchCachingAllocator(fast_view)
    assert "malloc" in vars(fast)              # the specialised path is the one in use
    replay_both(fast, general_pytorch(slow_view), fast_view, slow_view, actions)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=workload_actions())
def test_the_pools_sync_on_free_hot_path_is_its_general_path(actions: Any) -> None:
    fast_view, slow_view = views()
    replay_both(CudaAsyncAllocator(fast_view), GeneralCudaAsync(slow_view), fast_view,
                slow_view, actions)
