"""CuPy's MemoryPool, rule by rule, with hand-worked cases (cupy/cupy cupy/cuda/memory.pyx:
_round_size, _Arena.get_chunk, _Chunk.split, try_merge_chunk, free_all_blocks, _try_malloc,
set_limit)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from policy_checks import Referee, build, free_blocks, play, small_device, workload_actions

from allocsim.policies import PolicySpecError, parse_policy
from allocsim.policies.cupy_pool import CuPyPoolAllocator, round_size
from allocsim.sim.kernel.device import SimulatedDevice

KiB, MiB = 1 << 10, 1 << 20


def pool(capacity: int = 1 << 30, **params) -> tuple[CuPyPoolAllocator, object]:
    return build(CuPyPoolAllocator, capacity, **params)


def free_chunks(policy: CuPyPoolAllocator) -> list[tuple[int, int]]:
    return free_blocks(policy)


def test_requests_round_up_to_multiples_of_512_and_zero_bytes_never_touch_the_pool() -> None:
    assert [round_size(n) for n in (0, 1, 511, 512, 513, 1000, 1024)] == [0, 512, 512, 512, 1024,
                                                                          1024, 1024]
    policy, view = pool()
    assert policy.malloc(0) is None and policy.num_ooms == 0 and view.calls == 0
    policy.malloc(1)
    assert policy.used_bytes() == 512 and policy.stats().bytes_requested == 1
    policy.malloc(513)
    assert policy.used_bytes() == 512 + 1024


def test_a_miss_calls_cudamalloc_for_exactly_the_rounded_size() -> None:
    policy, view = pool()
    policy.malloc(1000)
    policy.malloc(3 * MiB + 1)
    assert [n for _, n in view.holdings()] == [1024, 3 * MiB + 512]
    assert view.mallocs == 2 and policy.total_bytes() == 1024 + 3 * MiB + 512


def test_a_larger_chunk_is_always_split_and_the_caller_keeps_the_low_end() -> None:
    policy, view = pool()
    a = policy.malloc(1024)
    policy.free(a)
    b = policy.malloc(512)                       # split although 1024 < 2 × 512 (BFC would not)
    assert b == a and policy.used_bytes() == 512
    assert free_chunks(policy) == [(a + 512, 512)]
    c = policy.malloc(4 * MiB)
    policy.free(c)
    d = policy.malloc(MiB)
    assert d == c and free_chunks(policy)[-1] == (c + MiB, 3 * MiB)
    assert view.mallocs == 2


def test_search_takes_the_smallest_free_chunk_that_fits() -> None:
    policy, _ = pool()
    a, b, c, d = (policy.malloc(n) for n in (4 * KiB, 8 * KiB, 4 * KiB, 16 * KiB))
    for address in (a, b, c, d):
        policy.free(address)
    assert policy.malloc(4000) == a             # 4 KiB chunks a and c tie: the older object
    assert policy.malloc(4096) == c
    assert policy.malloc(5000) == b             # smallest ≥ 5120 is the 8 KiB one: split
    assert (b + 5120, 3 * KiB) in free_chunks(policy)
    assert policy.malloc(9000) == d


def test_ties_go_to_the_older_chunk_object_not_the_lower_address() -> None:
    # CuPy orders (size, id(chunk)); the model stands in creation order for id().
    policy, _ = pool()
    p = policy.malloc(8 * KiB)                  # block 1 (chunk object 0)
    q = policy.malloc(4 * KiB)                  # block 2 (object 1), higher address
    assert q > p
    policy.free(p)
    assert policy.malloc(4 * KiB) == p          # splits p: the remainder r is object 2
    r = p + 4 * KiB
    policy.free(q)
    assert sorted(free_chunks(policy)) == [(r, 4 * KiB), (q, 4 * KiB)]
    assert policy.malloc(4 * KiB) == q          # q (object 1) is older than r (object 2)


def test_a_chunk_freed_on_stream_1_is_not_used_by_stream_0() -> None:
    policy, view = pool()
    a = policy.malloc(MiB, stream=1)
    policy.free(a)
    b = policy.malloc(MiB, stream=0)
    assert b != a and view.mallocs == 2          # stream 0's arena was empty: cudaMalloc
    assert policy.malloc(MiB, stream=1) == a     # stream 1 gets its chunk back
    policy.free(b)
    assert policy.malloc(512, stream=1) != b     # b's block belongs to stream 0 for life
    assert view.mallocs == 3


def test_a_split_remainder_stays_in_its_blocks_stream() -> None:
    policy, view = pool()
    a = policy.malloc(4 * KiB, stream=1)
    policy.free(a)
    policy.malloc(KiB, stream=1)                 # splits: 3 KiB remainder in stream 1's arena
    policy.malloc(KiB, stream=0)                 # must not take it
    assert view.mallocs == 2
    assert policy.n_free_blocks() == 1


def test_free_merges_with_the_next_then_the_previous_chunk_of_the_same_block() -> None:
    policy, _ = pool()
    base = policy.malloc(4 * KiB)
    policy.free(base)
    a, b, c = (policy.malloc(KiB) for _ in range(3))   # [a][b][c][1 KiB free]
    assert (a, b, c) == (base, base + KiB, base + 2 * KiB)
    policy.free(a)
    policy.free(c)                               # c joins the free tail: 2 KiB at c
    assert sorted(free_chunks(policy)) == [(a, KiB), (c, 2 * KiB)]
    policy.free(b)                               # b joins c's chunk, then a's
    assert list(policy.blocks()) == [(base, 4 * KiB, False)]
    assert policy.n_free_blocks() == 1


def test_blocks_never_merge_even_when_both_are_free() -> None:
    policy, view = pool()
    a = policy.malloc(MiB)
    b = policy.malloc(MiB)
    policy.free(a)
    policy.free(b)
    assert sorted(size for _, size in free_chunks(policy)) == [MiB, MiB]
    policy.malloc(2 * MiB)
    assert view.mallocs == 3


def test_free_all_blocks_returns_only_whole_blocks() -> None:
    policy, view = pool()
    a = policy.malloc(4 * KiB)                   # block 1, will be wholly free
    b = policy.malloc(4 * KiB)                   # block 2, split and partly in use
    policy.free(a)
    policy.free(b)
    kept = policy.malloc(KiB)
    assert kept == a                             # a (older) is split, b stays whole
    policy.free_all_blocks()
    assert view.frees == 1 and [n for _, n in view.holdings()] == [4 * KiB]
    assert policy.total_bytes() == 4 * KiB and policy.free_bytes() == 3 * KiB
    policy.free(kept)
    policy.empty_cache()                         # = free_all_blocks
    assert view.reserved == 0 and policy.total_bytes() == 0 and policy.n_free_blocks() == 0


def test_free_all_blocks_can_be_limited_to_one_stream() -> None:
    policy, view = pool()
    policy.free(policy.malloc(KiB, stream=0))
    policy.free(policy.malloc(KiB, stream=1))
    policy.free_all_blocks(stream=1)
    assert view.frees == 1 and policy.n_free_blocks() == 1


def test_a_device_refusal_frees_all_blocks_and_retries() -> None:
    policy, view = pool(capacity=3 * MiB)
    policy.free(policy.malloc(2 * MiB))          # a cached 2 MiB block
    assert policy.malloc(2 * MiB + 512) is not None
    # cudaMalloc refused (2 MiB held), free_all_blocks cudaFree'd the cached block, retry won.
    assert (view.failed_mallocs, view.frees, view.mallocs) == (1, 1, 2)
    assert policy.total_bytes() == 2 * MiB + 512


def test_out_of_memory_after_three_device_attempts() -> None:
    policy, view = pool(capacity=3 * MiB)
    policy.malloc(2 * MiB)
    assert policy.malloc(2 * MiB) is None
    # attempt, free_all_blocks, attempt, gc.collect + free_all_blocks, attempt.
    assert (view.failed_mallocs, view.frees, view.mallocs) == (3, 0, 1)
    assert policy.num_ooms == 1 and policy.total_bytes() == 2 * MiB


def test_the_limit_counts_cached_blocks_and_a_limit_hit_frees_them_first() -> None:
    policy, view = pool(limit=4 * MiB)
    policy.free(policy.malloc(3 * MiB))          # 3 MiB cached
    assert policy.malloc(3 * MiB + 512) is not None
    # 3 + 3 MiB > limit: free_all_blocks returned the cached block, then cudaMalloc.
    assert (view.frees, view.mallocs, view.failed_mallocs) == (1, 2, 0)


def test_a_limit_hit_with_nothing_to_free_fails_without_calling_the_device() -> None:
    policy, view = pool(limit=4 * MiB)
    policy.malloc(3 * MiB)
    calls = view.calls
    assert policy.malloc(2 * MiB) is None
    assert view.calls == calls and policy.num_ooms == 1


def test_a_request_larger_than_the_limit_fails_at_once() -> None:
    policy, view = pool(limit=4 * MiB)
    policy.free(policy.malloc(MiB))              # a cached block that could be freed
    assert policy.malloc(5 * MiB) is None
    assert view.frees == 0 and policy.n_free_blocks() == 1   # no free_all_blocks


def test_set_limit_by_fraction_of_capacity_and_its_errors() -> None:
    policy, _ = pool(capacity=8 * MiB, fraction=0.5)
    assert policy.get_limit() == 4 * MiB
    policy.set_limit(size=MiB)
    assert policy.get_limit() == MiB
    policy.set_limit()
    assert policy.get_limit() == 0
    with pytest.raises(ValueError, match="cannot be specified at one time"):
        policy.set_limit(size=1, fraction=0.5)
    with pytest.raises(ValueError, match="out of range"):
        policy.set_limit(fraction=1.5)
    device = SimulatedDevice(small_device()).view(0)
    with pytest.raises(PolicySpecError, match="cannot be specified"):
        parse_policy("cupy:limit=1MiB,fraction=0.5").build(device)
    assert parse_policy("cupy:limit=64MiB").build(device).get_limit() == 64 * MiB


def test_used_total_free_bytes_and_free_block_count_mean_what_cupy_means() -> None:
    policy, _ = pool()
    a = policy.malloc(1000)                      # 1024-byte block
    b = policy.malloc(3000)                      # 3072-byte block
    policy.free(b)
    policy.malloc(1000)                          # splits b: 1024 used, 2048 free
    assert policy.used_bytes() == 2048
    assert policy.total_bytes() == 4096
    assert policy.free_bytes() == 2048
    assert policy.n_free_blocks() == 1
    stats = policy.stats()
    assert (stats.pool_bytes, stats.bytes_in_use, stats.largest_free_block) == (4096, 2048, 2048)
    policy.free(a)
    assert policy.n_free_blocks() == 2 and policy.free_bytes() == 3072


# -- invariants on random workloads -------------------------------------------------
SPECS = ["cupy", "cupy:limit=64MiB", "cupy:fraction=0.25"]
actions = workload_actions()


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=60, deadline=None)
@given(actions=actions)
def test_invariants_hold_after_every_event(spec: str, actions) -> None:
    referee = Referee.of(spec, small_device(capacity=256 << 20))
    play(referee, actions)
    referee.empty_cache()
    assert referee.view.reserved == 0


def test_streams_never_share_a_block_on_a_random_workload() -> None:
    rng = random.Random(3)
    policy, view = pool(capacity=64 * MiB)
    live: dict[int, int] = {}                       # address -> stream
    for _ in range(4000):
        if live and rng.random() < 0.5:
            address = rng.choice(sorted(live))
            del live[address]
            policy.free(address)
        else:
            stream = rng.randrange(3)
            address = policy.malloc(rng.choice([rng.randint(1, 8192), rng.randint(1, 2 * MiB)]),
                                    stream)
            if address is not None:
                live[address] = stream
        # Every block's chunks (in use or free) belong to one stream's arena.
        for base in policy.held:
            arenas = set()
            address = base
            while address != -1:
                if address in policy.in_use:
                    arenas.add(id(policy.in_use[address]))
                address = policy.next_of[address]
            assert len(arenas) <= 1
        assert policy.total_bytes() == view.reserved
        assert policy.used_bytes() + policy.free_bytes() == policy.total_bytes()
    for address in list(live):
        policy.free(address)
    assert policy.n_free_blocks() == len(policy.held)   # everything merged back into blocks
