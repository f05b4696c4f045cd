"""A run is taken to repeat itself only when its whole decision state does (issue 17.3).

min-capacity stops a replay of a repeating trace once the policy's decision state and the live
buffers' places at one period boundary equal those one period later
(sim/questions/capacity/oracle.py). Leaving part of the state out would stop runs that do not
repeat. Here: a trace whose every step leaks one small buffer repeats event for event, but its
runs do not — the leaks fill the pool and, at a small capacity, end in an OOM many steps in.
Every policy whose state the oracle knows must give a plain replay's answer at every capacity
(a state without the chunks in use, the blocks or their ages would say "completes"); and the
stream-ordered pool's state, compared by place, must call two pools the same wherever their
regions lie, and two different pools different.
"""

from __future__ import annotations

import pytest

from allocsim.policies import parse_policy
from allocsim.policies.cuda_async import CudaAsyncAllocator
from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.kernel.engine import replay
from allocsim.sim.questions.capacity.oracle import CompletionOracle
from allocsim.sim.questions.capacity.period import find_period
from allocsim.sim.questions.run_repeats import DECISION_STATE, ORDER_ONLY_STATE
from allocsim.traces.model import Trace

KiB, MiB = 1 << 10, 1 << 20
DEVICE = DeviceProfile("test", 64 << 30)
STEPS = 1500


def leaking_steps() -> Trace:
    """Each step: a 64 KiB scratch buffer and a 4 KiB one that is never freed, then the scratch
    freed. The trace repeats every 3 events; the leaks add up to about 6 MiB."""
    events: list[tuple[int, str, int, int | None]] = []
    for step in range(STEPS):
        scratch, leak = 2 * step, 2 * step + 1
        events += [(len(events), "alloc", scratch, 64 * KiB), (len(events) + 1, "alloc", leak,
                                                                4 * KiB),
                   (len(events) + 2, "free", scratch, None)]
    return Trace.from_events(events, name="leaking-steps")


SPECS = ["bfc", "preallocate:fraction=0.5", "cupy", "pytorch",
         "pytorch:expandable_segments=true", "pytorch:per_process_memory_fraction=0.5",
         "cuda-async", "cuda-async:fraction=0.75,preallocate=true", "cuda-async:sync=none"]


def test_every_policy_whose_state_is_known_is_put_to_the_leak() -> None:
    known = set(DECISION_STATE) | set(ORDER_ONLY_STATE)
    assert {parse_policy(spec).resolved().policy_class for spec in SPECS} == known


@pytest.mark.parametrize("spec", SPECS)
def test_a_leaking_run_is_never_taken_for_a_repeating_one(spec: str) -> None:
    trace = leaking_steps()
    assert find_period(trace) is not None                  # the events do repeat
    policy = parse_policy(spec)
    failing = 0
    for capacity in [2 * MiB, 3 * MiB, 4 * MiB, 6 * MiB, 8 * MiB, 12 * MiB, 64 * MiB]:
        oracle = CompletionOracle(trace, policy, DEVICE)
        plain = replay(trace, policy, DEVICE.device_with(capacity), stop_on_oom=True)
        assert oracle.completes(capacity) == plain.completed, capacity
        failing += not plain.completed
    assert failing, "no capacity made the leaks fail: the test would prove nothing"


def _pool_with_regions_at(gap: int) -> CudaAsyncAllocator:
    """A stream-ordered pool holding two 2 MiB chunks, the second one's first 1 MiB in use;
    ``gap`` fresh virtual ranges are skipped before each chunk is mapped."""
    view = SimulatedDevice(DEVICE).view(0)
    pool = CudaAsyncAllocator(view, fraction=0.5)
    first = None
    for size in (2 * MiB, 1 * MiB):
        for _ in range(gap):
            view.address_range(2 * MiB)
        address = pool.malloc(size)
        first = first if first is not None else address
    assert first is not None
    pool.free(first)
    return pool


def test_the_pools_state_by_place_ignores_where_its_regions_lie() -> None:
    places_of = ORDER_ONLY_STATE[CudaAsyncAllocator]
    near, far = _pool_with_regions_at(0), _pool_with_regions_at(5)
    assert sorted(near.regions) != sorted(far.regions)
    assert places_of(near)[0] == places_of(far)[0]


def test_the_pools_state_by_place_tells_different_pools_apart() -> None:
    places_of = ORDER_ONLY_STATE[CudaAsyncAllocator]
    pool, other = _pool_with_regions_at(0), _pool_with_regions_at(0)
    assert places_of(pool)[0] == places_of(other)[0]
    other.malloc(512)                                      # one more chunk in use
    assert places_of(pool)[0] != places_of(other)[0]
    synced, unsynced = _pool_with_regions_at(0), _pool_with_regions_at(0)
    synced.free_regions.discard(min(synced.regions))       # a free region forgotten
    assert places_of(synced)[0] != places_of(unsynced)[0]


def _pytorch(**params: object) -> PyTorchCachingAllocator:
    return PyTorchCachingAllocator(SimulatedDevice(DEVICE).view(0), **params)


def test_pytorchs_state_holds_the_ages_garbage_collection_reads() -> None:
    """The same free blocks, one of them older in one allocator (a large-pool search since it
    entered, the other block taken and given back): garbage collection, which releases the
    blocks at least as old as the mean, would choose differently, so the states differ."""
    state_of = DECISION_STATE[PyTorchCachingAllocator]
    settings = {"per_process_memory_fraction": 0.5, "garbage_collection_threshold": 0.5}
    young, old = _pytorch(**settings), _pytorch(**settings)
    for pool in (young, old):
        blocks = [pool.malloc(30 * MiB), pool.malloc(40 * MiB)]
        for address in blocks:
            assert address is not None
            pool.free(address)
    assert state_of(young) == state_of(old)
    again = old.malloc(40 * MiB)                           # a search: the 30 MiB block ages
    assert again is not None
    old.free(again)
    assert sorted(old.segments(), key=str) == sorted(young.segments(), key=str)
    assert state_of(young) != state_of(old)


def test_pytorchs_state_tells_an_unmapped_block_from_a_free_one() -> None:
    state_of = DECISION_STATE[PyTorchCachingAllocator]
    mapped, unmapped = _pytorch(expandable_segments=True), _pytorch(expandable_segments=True)
    for pool in (mapped, unmapped):
        address = pool.malloc(30 * MiB)
        assert address is not None
        pool.free(address)
    unmapped.empty_cache()                                 # the pages go back to the device
    assert state_of(mapped) != state_of(unmapped)
