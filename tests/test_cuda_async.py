"""The CUDA stream-ordered pool (cudaMallocAsync) model: what is documented (release threshold,
trim never below it, per-stream reuse until a sync, sync-and-retry on OOM, JAX's fraction and
preallocation) and what is assumed (2 MiB chunks, best fit inside them), case by case."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from policy_checks import Referee, build, free_blocks, play, small_device, workload_actions

from allocsim.policies import PolicySpecError, parse_policy
from allocsim.policies.cuda_async import CudaAsyncAllocator
from allocsim.sim.kernel.device import SimulatedDevice

KiB, MiB = 1 << 10, 1 << 20


def pool(capacity: int = 1 << 30, **params) -> tuple[CudaAsyncAllocator, object]:
    return build(CudaAsyncAllocator, capacity, **params)


def free_chunks(policy: CudaAsyncAllocator) -> list[tuple[int, int]]:
    return free_blocks(policy)


def test_the_pool_grows_in_2_mib_chunks_and_big_requests_round_up_to_2_mib() -> None:
    policy, view = pool()
    a = policy.malloc(1000)
    assert [n for _, n in view.holdings()] == [2 * MiB]
    assert policy.used_bytes() == 1024 and policy.total_bytes() == 2 * MiB   # 512 B alignment
    policy.malloc(MiB)                             # fits in the first chunk: no device call
    assert view.mallocs == 1
    policy.malloc(3 * MiB)                         # a chunk of its own, 4 MiB
    assert sorted(n for _, n in view.holdings()) == [2 * MiB, 4 * MiB] and view.mallocs == 2
    assert policy.free_bytes() == 6 * MiB - 1024 - MiB - 3 * MiB
    assert a == min(base for base, _ in view.holdings())


def test_an_allocation_never_spans_two_chunks() -> None:
    policy, view = pool()
    policy.malloc(1536 * KiB)                      # 0.5 MiB left in chunk 1
    policy.malloc(MiB)                             # does not fit: chunk 2
    assert view.mallocs == 2 and policy.stats().largest_free_block == MiB


def test_threshold_0_releases_a_chunk_as_soon_as_it_is_wholly_free() -> None:
    policy, view = pool()                          # release_threshold=0, sync after each free
    a = policy.malloc(MiB)
    b = policy.malloc(MiB)
    policy.free(a)
    assert view.reserved == 2 * MiB                # b still lives in the chunk
    policy.free(b)
    assert view.reserved == 0 and view.frees == 1 and list(policy.blocks()) == []
    policy.malloc(MiB)
    assert view.mallocs == 2                       # mapped again


def test_memory_above_the_threshold_is_released_and_below_it_kept() -> None:
    policy, view = pool(release_threshold=4 * MiB)
    a, b, c = (policy.malloc(2 * MiB) for _ in range(3))      # three 2 MiB chunks
    policy.free(a)                                 # 6 > 4 MiB: release a's chunk
    assert view.reserved == 4 * MiB and view.frees == 1
    policy.free(b)
    policy.free(c)                                 # 4 MiB is not above the threshold: kept
    assert view.reserved == 4 * MiB and policy.used_bytes() == 0
    policy.malloc(2 * MiB)
    policy.malloc(2 * MiB)
    assert view.mallocs == 3                       # served from the kept chunks


def test_a_trim_never_goes_below_the_threshold() -> None:
    policy, view = pool(release_threshold=3 * MiB)
    a, b, _c = (policy.malloc(2 * MiB) for _ in range(3))
    policy.free(a)                                 # 6 MiB → 4 MiB (≥ 3 MiB)
    policy.free(b)                                 # 4 MiB > 3 MiB, but 2 MiB would be < 3: kept
    assert view.reserved == 4 * MiB and view.frees == 1
    policy.trim_to(0)                              # cudaMemPoolTrimTo(0): all free chunks go
    assert view.reserved == 2 * MiB and view.frees == 2


def test_newest_free_chunk_is_released_first() -> None:
    policy, view = pool(release_threshold=4 * MiB, sync="none")
    a, b, c = (policy.malloc(2 * MiB) for _ in range(3))
    policy.free(a)
    policy.free(c)                                 # no sync yet: nothing released
    assert view.reserved == 6 * MiB
    policy.synchronize()                           # 6 > 4 MiB: c (the newest) goes, then 4 ≤ 4
    assert [base for base, _ in view.holdings()] == [a, b]


def test_a_threshold_at_capacity_never_releases() -> None:
    for policy, view in (pool(capacity=64 * MiB, release_threshold=64 * MiB),
                         pool(capacity=64 * MiB, fraction=1.0)):
        blocks = [policy.malloc(3 * MiB) for _ in range(5)]
        for address in blocks:
            policy.free(address)
        assert view.reserved == 20 * MiB and view.frees == 0
        policy.empty_cache()                       # MemoryAsyncPool.free_all_blocks: trim to 0
        assert view.reserved == 0 and view.frees == 5


def test_jax_fraction_sets_the_threshold_and_preallocate_takes_it_up_front() -> None:
    policy, view = pool(capacity=64 * MiB, fraction=0.5, preallocate=True)
    assert policy.threshold == 32 * MiB and view.reserved == 0
    a = policy.malloc(MiB)                         # the preallocation, then the allocation in it
    assert [n for _, n in view.holdings()] == [32 * MiB] and view.mallocs == 1
    policy.free(a)
    assert view.reserved == 32 * MiB               # not above the threshold: kept
    assert policy.num_allocs == 1 and policy.num_frees == 1


def test_preallocate_pending_says_the_preallocation_is_still_to_come_and_is_read_only() -> None:
    policy, _ = pool(capacity=64 * MiB, fraction=0.5, preallocate=True)
    assert policy.preallocate_pending is True
    policy.free(policy.malloc(MiB))                # the first malloc makes the preallocation
    assert policy.preallocate_pending is False
    with pytest.raises(AttributeError):
        policy.preallocate_pending = True  # type: ignore[misc]
    assert pool(preallocate=True)[0].preallocate_pending is False     # no threshold: nothing
    assert pool(fraction=0.5)[0].preallocate_pending is False


def test_placement_is_best_fit_by_size_then_address_with_coalescing() -> None:
    policy, _ = pool()
    blocks = {}
    for name, size in [("A", 4 * KiB), ("x1", 512), ("B", 8 * KiB), ("x2", 512),
                       ("C", 4 * KiB), ("x3", 512), ("D", 16 * KiB), ("x4", 512)]:
        blocks[name] = policy.malloc(size)         # all in the first 2 MiB chunk
    for name in "ABCD":
        policy.free(blocks[name])
    assert policy.malloc(4000) == blocks["A"]      # A and C tie on size: lowest address
    assert policy.malloc(4096) == blocks["C"]
    assert policy.malloc(5000) == blocks["B"]      # 5120 from the 8 KiB chunk, split
    assert policy.malloc(9000) == blocks["D"]
    policy.free(blocks["x1"])
    policy.free(blocks["B"])                       # B merges with x1's chunk, then B's tail
    assert (blocks["B"] - 512, 8 * KiB + 512) in free_chunks(policy)


def test_without_syncs_memory_freed_on_a_stream_serves_only_that_stream() -> None:
    policy, view = pool(sync="none")
    a = policy.malloc(MiB, stream=1)               # chunk 1: a + 1 MiB shared remainder
    policy.free(a)                                 # 2 MiB of stream 1's (merged with the rest)
    assert free_chunks(policy) == [(a, 2 * MiB)] and view.reserved == 2 * MiB
    b = policy.malloc(2 * MiB, stream=0)           # stream 0 may not use it: new chunk
    assert view.mallocs == 2 and b != a
    assert policy.malloc(MiB, stream=1) == a       # stream 1 reuses it at once
    policy.free(b)
    policy.synchronize()                           # b's chunk is wholly free and now shared:
    assert view.frees == 1                         # released (threshold 0)


def test_a_synchronisation_makes_freed_memory_shared() -> None:
    policy, view = pool(sync="none", release_threshold=1 << 30)
    policy.malloc(512, stream=1)                   # keeps chunk 1 from being wholly free
    a = policy.malloc(MiB, stream=1)
    policy.free(a)                                 # a's chunk: 2 MiB − 512, stream 1's
    b = policy.malloc(1536 * KiB, stream=0)        # fits there, but not stream 0's: new chunk
    assert b != a and view.mallocs == 2
    policy.synchronize()
    assert policy.malloc(1536 * KiB, stream=0) == a and view.mallocs == 2


def test_without_syncs_nothing_is_released_until_empty_cache() -> None:
    policy, view = pool(sync="none")
    blocks = [policy.malloc(3 * MiB, stream=s % 2) for s in range(4)]
    for address in blocks:
        policy.free(address)
    assert view.reserved == 16 * MiB and view.frees == 0
    policy.empty_cache()
    assert view.reserved == 0 and view.frees == 4


def test_out_of_memory_syncs_then_remaps_cached_chunks_then_fails() -> None:
    policy, view = pool(capacity=8 * MiB, release_threshold=8 * MiB)
    a, _b, c, _d = (policy.malloc(2 * MiB) for _ in range(4))   # the device is full
    policy.free(a)
    policy.free(c)                                 # two cached 2 MiB chunks
    assert policy.malloc(4 * MiB) is not None
    # map refused → sync (nothing above the threshold) → no fit → release the free chunks →
    # map again.
    assert (view.failed_mallocs, view.frees, view.mallocs) == (1, 2, 5)
    assert policy.malloc(2 * MiB) is None          # refused, sync, refused again: out of memory
    assert view.failed_mallocs == 3 and policy.num_ooms == 1


def test_on_out_of_memory_the_sync_lets_other_streams_memory_serve() -> None:
    policy, view = pool(capacity=4 * MiB, sync="none", release_threshold=1 << 30)
    a = policy.malloc(2 * MiB, stream=1)
    policy.malloc(2 * MiB, stream=0)               # device full
    policy.free(a)                                 # stream 1's until a sync
    assert policy.malloc(MiB, stream=0) == a       # map refused → sync → a is shared now
    assert view.failed_mallocs == 1 and view.frees == 0


@pytest.mark.parametrize("spec, message", [
    ("cuda-async:fraction=1.5", "fraction must be in"),
    ("cuda-async:fraction=0.5,release_threshold=1MiB", "not both"),
    ("cuda-async:sync=sometimes", "sync must be one of"),
    ("cuda-async:chunk=1MiB", "multiple of the device's mapping granularity"),
])
def test_bad_parameters_are_refused(spec: str, message: str) -> None:
    with pytest.raises(PolicySpecError, match=message):
        parse_policy(spec).build(SimulatedDevice(small_device()).view(0))


def test_a_larger_chunk_parameter_grows_the_pool_in_bigger_steps() -> None:
    view = SimulatedDevice(small_device()).view(0)
    policy = parse_policy("cuda-async:chunk=8MiB").build(view)
    policy.malloc(1)
    assert [n for _, n in view.holdings()] == [8 * MiB]


# -- invariants on random workloads -------------------------------------------------
SPECS = ["cuda-async", "cuda-async:fraction=0.25", "cuda-async:release_threshold=1GiB",
         "cuda-async:sync=none", "cuda-async:fraction=0.5,preallocate=true"]
actions = workload_actions()


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=60, deadline=None)
@given(actions=actions)
def test_invariants_hold_after_every_event(spec: str, actions) -> None:
    referee = Referee.of(spec, small_device(capacity=256 << 20))
    play(referee, actions)
    policy = referee.policy
    assert policy.total_bytes() == referee.view.reserved
    if policy.sync_on_free:
        # After the last free's sync nothing above the threshold is left that could go.
        assert policy.total_bytes() <= policy.threshold or all(
            policy.total_bytes() - n < policy.threshold for n in policy.regions.values())
    policy.empty_cache()
    assert referee.view.reserved == 0


@pytest.mark.parametrize("sync", ["free", "none"])
def test_many_streams_keep_the_pool_consistent(sync: str) -> None:
    rng = random.Random(11)
    policy, view = pool(capacity=96 * MiB, sync=sync, release_threshold=8 * MiB)
    live: dict[int, int] = {}
    for step in range(3000):
        if live and rng.random() < 0.5:
            address = rng.choice(sorted(live))
            del live[address]
            policy.free(address)
        else:
            size = rng.choice([rng.randint(1, 8192), rng.randint(1, 3 * MiB)])
            address = policy.malloc(size, rng.randrange(3))
            if address is not None:
                live[address] = size
        if step % 500 == 0:
            policy.synchronize()
        blocks = list(policy.blocks())
        assert sum(size for _, size, _ in blocks) == policy.total_bytes() == view.reserved
        assert sorted(a for a, _, used in blocks if used) == sorted(live)
        stats = policy.stats()
        assert stats.free_blocks == sum(1 for _, _, used in blocks if not used)
        if sync == "none":
            assert set(policy.owner_of) == {a for a, _, used in blocks if not used}
    for address in list(live):
        policy.free(address)
    policy.synchronize()
    assert all(not used for _, _, used in policy.blocks())
    assert len(list(policy.blocks())) == len(policy.regions)   # merged back into whole chunks
