"""The binary buddy system (Knuth, TAOCP vol. 1 §2.5), rule by rule, with hand-worked cases."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from policy_checks import Referee, build, free_blocks, play, small_device, workload_actions

from allocsim.policies import PolicySpecError, parse_policy
from allocsim.policies.buddy import BuddyAllocator
from allocsim.sim.kernel.device import SimulatedDevice

KiB, MiB = 1 << 10, 1 << 20


def buddy(capacity: int = 1 << 30, **params) -> tuple[BuddyAllocator, object]:
    return build(BuddyAllocator, capacity, **params)


def test_splitting_a_64_kib_arena_for_3_kib_leaves_free_buddies_of_4_8_16_32_kib() -> None:
    policy, view = buddy(arena=64 * KiB)
    a = policy.malloc(3 * KiB)
    (base, nbytes), = view.holdings()
    assert nbytes == 64 * KiB and a == base                  # the 4 KiB block at offset 0
    assert policy.bytes_in_use == 4 * KiB
    assert free_blocks(policy) == [(base + 4 * KiB, 4 * KiB), (base + 8 * KiB, 8 * KiB),
                                   (base + 16 * KiB, 16 * KiB), (base + 32 * KiB, 32 * KiB)]
    policy.free(a)
    assert list(policy.blocks()) == [(base, 64 * KiB, False)]   # merged back into one arena
    assert policy.stats().free_blocks == 1


def test_blocks_are_powers_of_two_from_min_block() -> None:
    policy, _ = buddy(arena=64 * KiB)
    assert [policy.order_of(n) for n in (1, 512, 513, 1024, 4096, 4097)] == [0, 0, 1, 1, 3, 4]
    policy.malloc(1)
    policy.malloc(513)
    policy.malloc(5000)
    assert policy.bytes_in_use == 512 + 1024 + 8192
    assert policy.stats().bytes_requested == 1 + 513 + 5000
    policy2, _ = buddy(arena=64 * KiB, min_block=4 * KiB)
    policy2.malloc(1)
    assert policy2.bytes_in_use == 4 * KiB


def test_a_free_block_of_the_right_order_is_used_before_splitting_a_bigger_one() -> None:
    policy, _ = buddy(arena=64 * KiB)
    a = policy.malloc(4 * KiB)                 # free: 4K@4K, 8K@8K, 16K@16K, 32K@32K
    b = policy.malloc(4 * KiB)                 # takes the free 4 KiB buddy, no split
    assert b == a + 4 * KiB
    c = policy.malloc(4 * KiB)                 # splits 8K@8K: c at 8K, 4K@12K free
    assert c == a + 8 * KiB
    assert (a + 12 * KiB, 4 * KiB) in free_blocks(policy)


def test_only_buddies_merge() -> None:
    policy, _ = buddy(arena=64 * KiB)
    a, b, c, d = (policy.malloc(16 * KiB) for _ in range(4))
    base = a
    assert (b, c, d) == (base + 16 * KiB, base + 32 * KiB, base + 48 * KiB)
    policy.free(b)
    policy.free(c)                             # neighbours, but not buddies: no merge
    assert free_blocks(policy) == [(b, 16 * KiB), (c, 16 * KiB)]
    assert policy.stats().largest_free_block == 16 * KiB
    e = policy.malloc(32 * KiB)                # 32 KiB free in total, but no 32 KiB block
    assert len(policy.arenas) == 2
    policy.free(e)
    policy.free(a)                             # a + b → 32 KiB at base
    assert (base, 32 * KiB) in free_blocks(policy)
    policy.free(d)                             # c + d → 32 KiB, then the two halves → 64 KiB
    assert (base, 64 * KiB) in free_blocks(policy)


def test_the_buddy_address_is_base_plus_offset_xor_size() -> None:
    policy, view = buddy(arena=64 * KiB)
    blocks = [policy.malloc(8 * KiB) for _ in range(8)]
    (base, _), = view.holdings()
    for address in blocks:
        size = 8 * KiB
        buddy_address = base + ((address - base) ^ size)
        assert buddy_address in blocks and buddy_address != address


def test_the_last_freed_block_of_an_order_is_reused_first() -> None:
    policy, _ = buddy(arena=64 * KiB)
    a, _b, c, _d = (policy.malloc(16 * KiB) for _ in range(4))
    policy.free(a)
    policy.free(c)                             # AVAIL[16K] = [c, a] (LIFO)
    assert policy.malloc(16 * KiB) == c


def test_arenas_are_taken_on_demand_and_kept_when_free() -> None:
    policy, view = buddy(arena=64 * KiB)
    blocks = [policy.malloc(32 * KiB) for _ in range(3)]
    assert [n for _, n in view.holdings()] == [64 * KiB, 64 * KiB] and view.mallocs == 2
    for address in blocks:
        policy.free(address)
    assert view.reserved == 128 * KiB and view.frees == 0   # release=false keeps them
    policy.empty_cache()
    assert view.reserved == 0 and view.frees == 2 and policy.stats().pool_bytes == 0


def test_release_true_returns_an_arena_as_soon_as_it_is_wholly_free() -> None:
    policy, view = buddy(arena=64 * KiB, release=True)
    a = policy.malloc(KiB)
    b = policy.malloc(KiB)
    policy.free(a)
    assert view.reserved == 64 * KiB
    policy.free(b)
    assert view.reserved == 0 and view.frees == 1 and list(policy.blocks()) == []


def test_a_request_larger_than_an_arena_gets_its_own_power_of_two_arena() -> None:
    policy, view = buddy(arena=64 * KiB)
    a = policy.malloc(100 * KiB)
    assert [n for _, n in view.holdings()] == [128 * KiB]
    assert policy.bytes_in_use == 128 * KiB
    policy.free(a)
    b = policy.malloc(20 * KiB)                # the kept 128 KiB arena is split for it
    assert b == a and view.mallocs == 1
    assert sorted(size for _, size in free_blocks(policy)) == [32 * KiB, 64 * KiB]


def test_a_refused_arena_is_asked_for_in_halves_down_to_the_block() -> None:
    policy, view = buddy(capacity=40 * KiB, arena=64 * KiB)
    a = policy.malloc(3 * KiB)                 # 64 KiB refused, 32 KiB granted
    assert a is not None and [n for _, n in view.holdings()] == [32 * KiB]
    assert view.failed_mallocs == 1
    policy.malloc(16 * KiB)                    # the free 16 KiB buddy at +16 KiB
    assert policy.malloc(16 * KiB) is None     # 64, 32, 16 KiB refused: out of memory
    assert view.failed_mallocs == 4 and policy.num_ooms == 1


def test_free_arenas_go_back_before_a_big_arena_is_refused() -> None:
    policy, view = buddy(capacity=200 * KiB, arena=64 * KiB)
    policy.free(policy.malloc(KiB))            # a free 64 KiB arena is kept
    policy.free(policy.malloc(KiB + 64 * KiB))  # 128 KiB arena: 64 + 128 fit in 200
    # Both arenas are free. 256 KiB needs room: free arenas go back, then 256 is still refused,
    # and halving down to the 256 KiB block is not possible: out of memory.
    assert policy.malloc(200 * KiB) is None
    assert view.reserved == 0
    c = policy.malloc(150 * KiB)               # 256 KiB block > device: out of memory too
    assert c is None
    d = policy.malloc(100 * KiB)               # 128 KiB arena fits the empty device
    assert d is not None and view.reserved == 128 * KiB


@pytest.mark.parametrize("spec, message", [
    ("buddy:min_block=1000", "min_block must be a power of two"),
    ("buddy:arena=3MiB", "arena must be a power of two"),
    ("buddy:arena=256,min_block=512", "arena must be a power of two"),
])
def test_bad_parameters_are_refused(spec: str, message: str) -> None:
    with pytest.raises(PolicySpecError, match=message):
        parse_policy(spec).build(SimulatedDevice(small_device()).view(0))


# -- invariants on random workloads -------------------------------------------------
SPECS = ["buddy", "buddy:release=true", "buddy:arena=1MiB,min_block=4KiB"]
actions = workload_actions()


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=60, deadline=None)
@given(actions=actions)
def test_invariants_hold_after_every_event(spec: str, actions) -> None:
    referee = Referee.of(spec, small_device(capacity=256 << 20))
    play(referee, actions)
    blocks = list(referee.policy.blocks())
    assert len(blocks) == len(referee.policy.arenas)         # every arena merged back whole
    referee.empty_cache()
    assert referee.view.reserved == 0


def test_blocks_stay_aligned_to_their_size_within_the_arena() -> None:
    rng = random.Random(5)
    policy, _ = buddy(capacity=64 * MiB, arena=MiB)
    live = []
    for _ in range(3000):
        if live and rng.random() < 0.5:
            policy.free(live.pop(rng.randrange(len(live))))
        else:
            address = policy.malloc(rng.randint(1, 300 * KiB))
            if address is not None:
                live.append(address)
        for address, (order, base) in policy.in_use.items():
            assert (address - base) % (policy.min_block << order) == 0
