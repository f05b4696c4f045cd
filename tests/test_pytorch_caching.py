"""PyTorch's CUDA caching allocator, rule by rule, with hand-worked cases
(c10/cuda/CUDACachingAllocator.cpp, c10/core/AllocatorConfig.cpp)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_checks import Referee, small_device

from allocsim.policies.pytorch.caching import (
    PyTorchCachingAllocator,
    divisions_index,
    get_allocation_size,
    parse_roundup_power2_divisions,
    round_size,
    roundup_power2_next_division,
)
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def torch_alloc(capacity: int = GiB, **params) -> tuple[PyTorchCachingAllocator, object]:
    view = SimulatedDevice(DeviceProfile("t", capacity, granularity=512)).view(0)
    return PyTorchCachingAllocator(view, **params), view


def held(view) -> list[int]:
    return [n for _, n in view.holdings()]


def free_blocks(policy) -> list[tuple[int, int]]:
    return [(a, s) for a, s, used in policy.blocks() if not used]


# -- round_size --------------------------------------------------------------------------
@pytest.mark.parametrize("size, expected", [
    (1, 512), (511, 512), (512, 512), (513, 1024), (1000, 1024), (1536, 1536),
    (MiB + 1, MiB + 512), (7 * MiB + 100, 7 * MiB + 512)])
def test_sizes_round_up_to_multiples_of_512_with_512_the_minimum(size: int, expected: int) -> None:
    assert round_size(size) == expected


def test_power2_divisions_round_to_equal_steps_between_powers_of_two() -> None:
    four = [4] * 16
    # 1200 lies between 1024 and 2048; four steps: 1024, 1280, 1536, 1792 (PyTorch's example).
    assert roundup_power2_next_division(1200, 4) == 1280
    assert round_size(5 * MiB + 1, four) == 6 * MiB          # steps of 1 MiB between 4 and 8 MiB
    assert round_size(5 * MiB, four) == 5 * MiB              # already on a step
    assert round_size(8 * MiB, four) == 8 * MiB              # a power of two stays
    assert round_size(8 * MiB + 1, four) == 10 * MiB


def test_power2_divisions_apply_only_above_512_times_the_divisions() -> None:
    eight = [8] * 16
    # 2100 ≤ 512·8 = 4096: plain 512-byte rounding (2560), not the 256-byte step (2304).
    assert roundup_power2_next_division(2100, 8) == 2304
    assert round_size(2100, eight) == 2560
    assert round_size(4096 + 1, eight) == 4608     # above it: step 4096/8 = 512
    assert round_size(2100, [1] * 16) == 2560      # one division means no rounding


@pytest.mark.parametrize("size, index", [
    (1, 0), (MiB - 1, 0), (MiB, 0), (2 * MiB - 1, 0), (2 * MiB, 1), (3 * MiB, 1),
    (256 * MiB, 8), (32 * GiB, 15), (64 * GiB, 15), (1 << 40, 15)])
def test_the_divisions_table_has_16_intervals_from_1_mib_indexed_by_log2_minus_20(size,
                                                                                  index) -> None:
    assert divisions_index(size) == index


def test_divisions_list_syntax_fills_below_the_first_entry_and_after_the_last_with_gt() -> None:
    table = parse_roundup_power2_divisions("[256:1,512:2,>:8]")
    assert table == [1] * 9 + [2] + [8] * 6
    assert parse_roundup_power2_divisions("[256:1;512:2;>:8]") == table   # registry-safe form
    assert parse_roundup_power2_divisions("4") == [4] * 16
    assert parse_roundup_power2_divisions("") == [0] * 16
    assert round_size(300 * MiB + 1, table) == 300 * MiB + 512     # interval 8: 1 division
    assert round_size(600 * MiB + 1, table) == 768 * MiB           # interval 9: steps of 256 MiB
    assert round_size(1536 * MiB + 1, table) == 1664 * MiB         # interval 10: steps of 128 MiB


@pytest.mark.parametrize("text", ["3", "0", "[256:3]", "[100:2]", "[256:2", "[256,2]", "x"])
def test_divisions_must_be_powers_of_two_in_a_well_formed_list(text: str) -> None:
    with pytest.raises(ValueError):
        parse_roundup_power2_divisions(text)


def test_divisions_change_what_a_request_costs() -> None:
    policy, _ = torch_alloc(roundup_power2_divisions="4")
    policy.malloc(5 * MiB + 1)
    assert policy.bytes_in_use == 6 * MiB


# -- pools and segment sizes -------------------------------------------------------------
def test_exactly_1_mib_goes_to_the_small_pool_and_one_byte_more_to_the_large() -> None:
    policy, view = torch_alloc()
    policy.malloc(MiB)
    policy.malloc(MiB + 1)
    kinds = [(s["segment_type"], s["total_size"]) for s in policy.segments()]
    assert kinds == [("small", 2 * MiB), ("large", 20 * MiB)]
    assert held(view) == [2 * MiB, 20 * MiB]


@pytest.mark.parametrize("rounded, segment", [
    (512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),
    (10 * MiB, 10 * MiB), (11 * MiB, 12 * MiB), (100 * MiB + 512, 102 * MiB)])
def test_segment_sizes_2_mib_small_20_mib_below_10_mib_else_rounded_to_2_mib(rounded,
                                                                              segment) -> None:
    assert get_allocation_size(rounded) == segment
    policy, view = torch_alloc()
    policy.malloc(rounded)
    assert held(view) == [segment]


def test_small_requests_pack_into_one_2_mib_segment() -> None:
    policy, view = torch_alloc()
    addresses = [policy.malloc(100 * KiB) for _ in range(20)]     # 102400 is a multiple of 512
    assert held(view) == [2 * MiB]
    assert addresses == [addresses[0] + i * 100 * KiB for i in range(20)]


# -- search ------------------------------------------------------------------------------
def test_the_smallest_fitting_block_wins_and_the_lowest_address_on_ties() -> None:
    policy, view = torch_alloc()
    a, b, c, d = (policy.malloc(n * MiB) for n in (16, 12, 12, 40))    # one segment each
    for x in (a, b, c, d):
        policy.free(x)
    assert policy.malloc(11 * MiB) == b          # 12 MiB blocks tie: the lower address
    assert policy.malloc(11 * MiB) == c
    assert policy.malloc(13 * MiB) == a          # 16 MiB is the smallest that fits
    assert view.mallocs == 4


def test_a_free_block_on_another_stream_is_not_used() -> None:
    policy, view = torch_alloc()
    a = policy.malloc(12 * MiB, stream=1)
    policy.free(a)
    b = policy.malloc(12 * MiB, stream=0)
    assert b != a and view.mallocs == 2
    assert policy.malloc(12 * MiB, stream=1) == a
    assert {s["stream"] for s in policy.segments()} == {0, 1}


def test_max_split_size_keeps_oversize_blocks_from_requests_below_it() -> None:
    policy, view = torch_alloc(max_split_size_mb=64)
    policy.free(policy.malloc(100 * MiB))
    # 30 MiB < 64 MiB ≤ the 100 MiB block: rejected, no further search, a new segment.
    assert policy.malloc(30 * MiB) is not None
    assert held(view) == [100 * MiB, 30 * MiB]


def test_max_split_size_lets_a_big_request_round_up_by_less_than_20_mib() -> None:
    policy, view = torch_alloc(max_split_size_mb=64)
    big = policy.malloc(100 * MiB)
    policy.free(big)
    # 70 MiB ≥ 64 MiB, but 100 ≥ 70 + 20: rejected.
    assert policy.malloc(70 * MiB) != big and view.mallocs == 2
    # 85 MiB: 100 < 85 + 20, so the block is taken whole (never split: 85 ≥ max_split_size).
    assert policy.malloc(85 * MiB) == big
    assert policy.bytes_in_use == 70 * MiB + 100 * MiB
    assert policy.memory_stats()["oversize_allocations.current"] == 2


def test_max_non_split_rounding_widens_that_margin() -> None:
    policy, view = torch_alloc(max_split_size_mb=64, max_non_split_rounding_mb=40)
    big = policy.malloc(100 * MiB)
    policy.free(big)
    assert policy.malloc(70 * MiB) == big        # 100 < 70 + 40
    assert view.mallocs == 1


@pytest.mark.parametrize("params", [
    {"max_split_size_mb": 19}, {"max_split_size_mb": -1}, {"max_non_split_rounding_mb": 10},
    {"garbage_collection_threshold": 1.0}, {"garbage_collection_threshold": -0.5},
    {"per_process_memory_fraction": 1.5}])
def test_configuration_is_validated_as_pytorch_does(params) -> None:
    with pytest.raises(ValueError):
        torch_alloc(**params)


# -- splitting ---------------------------------------------------------------------------
def test_small_pool_splits_whenever_at_least_512_bytes_remain() -> None:
    policy, _ = torch_alloc()
    a = policy.malloc(MiB)
    b = policy.malloc(MiB - 512)                  # leaves exactly 512 bytes: still split
    assert b == a + MiB
    assert free_blocks(policy) == [(b + MiB - 512, 512)]
    assert policy.malloc(512) == b + MiB - 512    # and the last 512 bytes get used


def test_large_pool_splits_only_when_more_than_1_mib_remains() -> None:
    policy, _ = torch_alloc()
    policy.malloc(19 * MiB)                       # 20 MiB segment, 1 MiB left: not split
    assert policy.bytes_in_use == 20 * MiB and free_blocks(policy) == []
    policy2, _ = torch_alloc()
    a = policy2.malloc(19 * MiB - 512)            # 1 MiB + 512 left: split
    assert policy2.bytes_in_use == 19 * MiB - 512
    assert free_blocks(policy2) == [(a + 19 * MiB - 512, MiB + 512)]


def test_large_pool_does_not_split_for_requests_at_or_above_max_split_size() -> None:
    policy, _ = torch_alloc(max_split_size_mb=20)
    a = policy.malloc(5 * MiB)                    # 5 < 20: the 20 MiB segment is split
    assert free_blocks(policy) == [(a + 5 * MiB, 15 * MiB)]
    policy2, _ = torch_alloc(max_split_size_mb=40)
    big = policy2.malloc(90 * MiB)
    policy2.free(big)
    assert policy2.malloc(75 * MiB) == big        # 90 < 75 + 20, taken whole
    assert policy2.bytes_in_use == 90 * MiB


def test_freeing_merges_with_free_neighbours_in_the_same_segment() -> None:
    policy, _ = torch_alloc()
    a, b, c, d = (policy.malloc(2 * MiB) for _ in range(4))     # one 20 MiB segment
    policy.free(a)
    policy.free(c)
    stats = policy.memory_stats()
    assert stats["inactive_split.all.current"] == 3               # a, c and the 12 MiB tail
    assert stats["inactive_split_bytes.all.current"] == 16 * MiB
    policy.free(b)                                                # joins a … c
    assert free_blocks(policy) == [(a, 6 * MiB), (d + 2 * MiB, 12 * MiB)]
    policy.free(d)                                                # the whole segment again
    assert free_blocks(policy) == [(a, 20 * MiB)]
    stats = policy.memory_stats()
    assert stats["inactive_split.all.current"] == 0
    assert stats["inactive_split_bytes.all.current"] == 0
    assert stats["inactive_split_bytes.all.peak"] == 18 * MiB    # the tail after a alone


def test_segments_never_merge_with_each_other() -> None:
    policy, view = torch_alloc()
    a = policy.malloc(12 * MiB)
    b = policy.malloc(12 * MiB)
    policy.free(a)
    policy.free(b)
    assert sorted(s for _, s in free_blocks(policy)) == [12 * MiB, 12 * MiB]
    policy.malloc(24 * MiB)
    assert view.mallocs == 3


# -- the published anchors (reference/anchors.md) ----------------------------------------
def _anchor(first: list[int], then: list[int], **params) -> tuple[PyTorchCachingAllocator, object]:
    policy, view = torch_alloc(**params)
    for address in [policy.malloc(n * MiB) for n in first]:
        policy.free(address)
    for n in then:
        assert policy.malloc(n * MiB) is not None
    return policy, view


def test_anchor_8x16_mib_freed_then_4x32_mib_reserves_256_mib() -> None:
    policy, view = _anchor([16] * 8, [32] * 4)
    assert view.reserved == 256 * MiB and policy.pool_bytes == 256 * MiB


def test_anchor_4x32_mib_freed_then_8x16_mib_reserves_128_mib() -> None:
    _, view = _anchor([32] * 4, [16] * 8)
    assert view.reserved == 128 * MiB and view.mallocs == 4


def test_anchor_expandable_8x16_mib_maps_140_mib_and_4x32_mib_maps_nothing_new() -> None:
    policy, view = torch_alloc(expandable_segments=True)
    addresses = [policy.malloc(16 * MiB) for _ in range(8)]
    assert view.reserved == 140 * MiB                      # 7 pages of 20 MiB
    assert addresses == [addresses[0] + i * 16 * MiB for i in range(8)]
    calls = view.calls
    for address in addresses:
        policy.free(address)
    for _ in range(4):
        policy.malloc(32 * MiB)
    assert view.reserved == 140 * MiB and view.calls == calls


# -- the out-of-memory path --------------------------------------------------------------
def test_a_failed_cudamalloc_frees_all_cached_segments_and_retries_once() -> None:
    policy, view = torch_alloc(capacity=64 * MiB)
    view.log = []
    policy.free(policy.malloc(30 * MiB))
    assert policy.malloc(40 * MiB) is not None              # 30 + 40 > 64: free the 30, retry
    assert [(c.kind, c.nbytes >> 20, c.ok) for c in view.log] == [
        ("malloc", 30, True), ("malloc", 40, False), ("free", 30, True), ("malloc", 40, True)]
    stats = policy.memory_stats()
    assert stats["num_alloc_retries"] == 1 and stats["num_sync_all_streams"] == 1
    assert stats["num_ooms"] == 0 and stats["num_device_free"] == 1
    assert policy.malloc(30 * MiB) is None                   # nothing cached to free: OOM
    stats = policy.memory_stats()
    assert stats["num_ooms"] == 1 and stats["num_alloc_retries"] == 2
    assert policy.num_ooms == 1 and policy.stats().num_ooms == 1


def test_with_max_split_size_oversize_blocks_go_first_largest_down_without_a_retry() -> None:
    policy, view = torch_alloc(capacity=100 * MiB, max_split_size_mb=20)
    a, b = policy.malloc(30 * MiB), policy.malloc(40 * MiB)
    policy.free(a)
    policy.free(b)
    view.log = []
    assert policy.malloc(50 * MiB) is not None
    # No single block ≥ 50 MiB: free 40, then 30 (70 ≥ 50), then cudaMalloc again.
    assert [(c.kind, c.nbytes >> 20, c.ok) for c in view.log] == [
        ("malloc", 50, False), ("free", 40, True), ("free", 30, True), ("malloc", 50, True)]
    stats = policy.memory_stats()
    assert stats["num_alloc_retries"] == 0 and stats["num_sync_all_streams"] == 0


def test_with_max_split_size_the_smallest_block_covering_the_request_is_freed() -> None:
    policy, view = torch_alloc(capacity=100 * MiB, max_split_size_mb=20)
    small, big = policy.malloc(25 * MiB), policy.malloc(60 * MiB)
    policy.free(small)
    policy.free(big)
    view.log = []
    # 35 MiB: the 60 MiB block is rejected (60 ≥ 35 + 20); 26 + 60 + 36 > 100 → free the
    # smallest cached block ≥ max(35, 20) MiB — the 60 — and retry; the 26 MiB segment stays.
    assert policy.malloc(35 * MiB) is not None
    assert [(c.kind, c.nbytes >> 20, c.ok) for c in view.log] == [
        ("malloc", 36, False), ("free", 60, True), ("malloc", 36, True)]
    assert sorted(held(view)) == [26 * MiB, 36 * MiB]


def test_a_request_below_max_split_size_frees_an_oversize_block_of_at_least_max_split_size(
) -> None:
    policy, view = torch_alloc(capacity=64 * MiB, max_split_size_mb=40)
    policy.free(policy.malloc(60 * MiB))
    assert policy.malloc(12 * MiB) is not None     # 60 ≥ 40 rejected; 72 > 64; the 60 goes
    assert held(view) == [12 * MiB]


def test_split_segments_are_never_released_and_an_oom_counts_once() -> None:
    policy, view = torch_alloc(capacity=32 * MiB)
    live = [policy.malloc(3 * MiB) for _ in range(6)]        # 6 × 3 MiB in one 20 MiB segment
    assert held(view) == [20 * MiB]
    policy.free(live[0])
    assert policy.malloc(14 * MiB) is None                    # needs 14 MiB: 34 > 32
    assert held(view) == [20 * MiB] and policy.num_ooms == 1


# -- garbage collection ------------------------------------------------------------------
def _gc_scene(**params) -> tuple[PyTorchCachingAllocator, object, dict[str, int]]:
    policy, view = torch_alloc(capacity=GiB, **params)
    a, b, c, d = (policy.malloc(n * MiB) for n in (100, 100, 100, 12))   # 312 MiB
    policy.free(a)                               # a enters the pool at search count 4
    policy.free(d)
    for _ in range(10):                          # ten large-pool searches that hit d
        policy.free(policy.malloc(12 * MiB))
    policy.free(b)                               # b and d enter at count 14
    return policy, view, {"a": a, "b": b, "c": c, "d": d}


def test_gc_releases_blocks_at_least_as_old_as_the_mean_until_under_the_threshold() -> None:
    # allowed = 0.5 GiB; threshold = 0.5 × 512 = 256 MiB; reserved 312 MiB → reclaim ≥ 56 MiB.
    policy, view, blocks = _gc_scene(per_process_memory_fraction=0.5,
                                     garbage_collection_threshold=0.5)
    assert policy.malloc(120 * MiB) is not None  # ages: a 11, b 1, d 1; mean 4.33 → a goes
    bases = {base for base, _ in view.holdings()}
    assert blocks["a"] not in bases and {blocks["b"], blocks["c"], blocks["d"]} <= bases
    assert policy.memory_stats()["num_device_free"] == 1


def test_gc_repeats_with_the_new_mean_while_short_of_its_target() -> None:
    # threshold 0.3 × 512 MiB = 153.6 MiB: reclaim ≥ 158.4 MiB; a (100) is not enough, so the
    # next pass (mean of b and d = 1) takes both.
    policy, view, _ = _gc_scene(per_process_memory_fraction=0.5,
                                garbage_collection_threshold=0.3)
    policy.malloc(120 * MiB)
    assert sorted(held(view)) == [100 * MiB, 120 * MiB]        # c and the new one
    assert policy.memory_stats()["num_device_free"] == 3


def test_gc_does_nothing_unless_a_memory_fraction_is_set() -> None:
    policy, view, _ = _gc_scene(garbage_collection_threshold=0.5)
    policy.malloc(120 * MiB)
    assert view.reserved == 432 * MiB and policy.memory_stats()["num_device_free"] == 0


# -- memory fraction ---------------------------------------------------------------------
def test_memory_fraction_fails_cudamalloc_early_without_asking_the_device() -> None:
    policy, view = torch_alloc(capacity=100 * MiB, per_process_memory_fraction=0.5)
    assert policy.malloc(30 * MiB) is not None
    assert policy.malloc(5 * MiB) is not None      # a 20 MiB segment: 50 ≤ 50
    assert policy.malloc(MiB + 1) is not None      # fits in that segment's remainder
    assert policy.malloc(30 * MiB) is None         # 50 + 30 > 50: no device call at all
    assert view.failed_mallocs == 0 and view.mallocs == 2
    stats = policy.memory_stats()
    assert stats["num_ooms"] == 1 and stats["num_alloc_retries"] == 1


# -- expandable segments -----------------------------------------------------------------
def test_expandable_small_pool_maps_2_mib_pages_in_one_range_per_stream_and_pool() -> None:
    policy, view = torch_alloc(capacity=GiB, expandable_segments=True)
    a = policy.malloc(1000)
    assert view.reserved == 2 * MiB
    b = policy.malloc(MiB)                          # fits in the first page
    c = policy.malloc(MiB)                          # 1 MiB − 1024 left: map one more page
    assert view.reserved == 4 * MiB and (b, c) == (a + 1024, a + 1024 + MiB)
    policy.malloc(5 * MiB)                           # the large pool: its own range, 20 MiB pages
    policy.malloc(MiB, stream=1)                     # another stream: its own range
    assert view.reserved == 4 * MiB + 20 * MiB + 2 * MiB
    segments = policy.segment_map
    assert sorted(s.size for s in segments.values()) == [
        576 * 2 * MiB, 576 * 2 * MiB, 58 * 20 * MiB]     # ceil(1.125 GiB / page) pages
    assert all(s["is_expandable"] for s in policy.segments())


def test_expandable_growth_joins_the_free_tail_with_new_pages() -> None:
    policy, view = torch_alloc(expandable_segments=True)
    a = policy.malloc(30 * MiB)                      # 2 pages; 10 MiB free at the end
    b = policy.malloc(15 * MiB)                      # 10 free + one more page, right after a
    assert b == a + 30 * MiB and view.reserved == 60 * MiB
    assert free_blocks(policy) == [(b + 15 * MiB, 15 * MiB)]


def test_expandable_best_fit_prefers_a_bounded_block_over_a_growable_tail() -> None:
    policy, _ = torch_alloc(expandable_segments=True)
    a = policy.malloc(12 * MiB)                      # [0,12) + free tail [12,20)
    policy.malloc(4 * MiB)                           # [12,16) + free tail [16,20), 4 MiB
    policy.free(a)                                   # [0,12) free, bounded by the 4 MiB block
    # The 4 MiB tail is the smallest fit, but it can grow into the unmapped space: the
    # bounded 12 MiB block is chosen instead.
    assert policy.malloc(3 * MiB) == a


def test_empty_cache_unmaps_only_whole_free_pages_and_the_gap_is_mapped_again_first() -> None:
    policy, view = torch_alloc(expandable_segments=True)
    a = policy.malloc(15 * MiB)                      # [0,15)
    b = policy.malloc(30 * MiB)                      # [15,45) (pages 0-2 mapped)
    c = policy.malloc(20 * MiB)                      # [45,65) (page 3 mapped)
    assert view.reserved == 80 * MiB
    policy.free(b)                                   # [15,45) free: page 1 = [20,40) is whole
    policy.empty_cache()
    assert view.reserved == 60 * MiB
    assert [(x - a, s) for x, s in free_blocks(policy)] == [
        (15 * MiB, 5 * MiB), (40 * MiB, 5 * MiB), (65 * MiB, 15 * MiB)]
    assert policy.memory_stats()["num_device_free"] == 1
    # 20 MiB fits nowhere mapped; the lowest place with free + unmapped room is the gap,
    # together with the 5 MiB free block before it.
    assert policy.malloc(20 * MiB) == a + 15 * MiB
    assert view.reserved == 80 * MiB
    assert [(s["address"] - a, s["total_size"]) for s in policy.segments()] == [(0, 80 * MiB)]
    del c


def test_empty_cache_forgets_a_wholly_unmapped_expandable_segment() -> None:
    policy, view = torch_alloc(expandable_segments=True)
    a = policy.malloc(15 * MiB)
    b = policy.malloc(30 * MiB)
    policy.free(a)
    policy.empty_cache()                             # no whole free page: nothing unmapped
    assert view.reserved == 60 * MiB
    policy.free(b)
    policy.empty_cache()
    assert view.reserved == 0 and policy.segment_map == {} and list(policy.blocks()) == []


def test_expandable_oom_unmaps_free_pages_and_retries() -> None:
    policy, view = torch_alloc(capacity=100 * MiB, expandable_segments=True)
    a = policy.malloc(30 * MiB)                       # 40 MiB mapped on stream 0
    policy.free(a)
    assert policy.malloc(70 * MiB, stream=1) is not None    # 40 + 80 > 100: unmap, retry
    assert view.reserved == 80 * MiB
    stats = policy.memory_stats()
    assert stats["num_alloc_retries"] == 1 and stats["num_device_free"] == 1


# -- stats and snapshots -----------------------------------------------------------------
def test_memory_stats_use_pytorch_names_and_agree_with_the_blocks() -> None:
    policy, _ = torch_alloc()
    a = policy.malloc(1000)
    policy.malloc(3 * MiB)
    policy.free(a)
    stats = policy.memory_stats()
    assert stats["allocated_bytes.all.current"] == 3 * MiB
    assert stats["allocated_bytes.all.peak"] == 3 * MiB + 1024
    assert stats["allocated_bytes.all.freed"] == 1024
    assert stats["requested_bytes.all.current"] == 3 * MiB
    assert stats["reserved_bytes.all.current"] == 22 * MiB
    assert stats["reserved_bytes.small_pool.current"] == 2 * MiB
    assert stats["segment.all.current"] == 2
    assert stats["allocation.all.peak"] == 2
    assert stats["num_device_alloc"] == 2 and stats["max_split_size"] == -1


def test_segments_look_like_memory_snapshot() -> None:
    policy, _ = torch_alloc()
    a = policy.malloc(1000)
    [segment] = policy.segments()
    assert segment["address"] == a and segment["total_size"] == 2 * MiB
    assert segment["segment_type"] == "small" and segment["is_expandable"] is False
    assert segment["allocated_size"] == 1024 and segment["requested_size"] == 1000
    assert segment["blocks"] == [
        {"address": a, "size": 1024, "requested_size": 1000, "state": "active_allocated"},
        {"address": a + 1024, "size": 2 * MiB - 1024, "requested_size": 0, "state": "inactive"}]


def test_zero_bytes_is_null() -> None:
    policy, view = torch_alloc()
    assert policy.malloc(0) is None and view.calls == 0


# -- invariants on random workloads (tests/policy_checks.Referee) ------------------------
SPECS = ["pytorch", "pytorch:expandable_segments=true", "pytorch:max_split_size_mb=20",
         "pytorch:roundup_power2_divisions=[1:4;>:8]",
         "pytorch:garbage_collection_threshold=0.5,per_process_memory_fraction=0.5",
         "pytorch:max_split_size_mb=20,expandable_segments=true"]

sizes = st.one_of(st.integers(1, 4096), st.integers(4096, 1 << 20), st.integers(1 << 20, 24 << 20))
actions = st.lists(st.tuples(st.integers(0, 9), sizes, st.integers(0, 10**6), st.integers(0, 2)),
                   min_size=1, max_size=120)


def _drive(referee: Referee, actions) -> None:
    next_id = 0
    for kind, size, pick, stream in actions:
        if kind == 9:
            referee.empty_cache()
        elif kind < 5 or not referee.live:
            referee.malloc(next_id, size, stream)
            next_id += 1
        else:
            referee.free(sorted(referee.live)[pick % len(referee.live)])
        referee.check()
        stats = referee.policy.memory_stats()
        assert stats["reserved_bytes.all.current"] == referee.view.reserved
        assert stats["allocated_bytes.small_pool.current"] + \
            stats["allocated_bytes.large_pool.current"] == stats["allocated_bytes.all.current"]
        if "expandable" not in str(referee.spec):
            assert stats["inactive_split_bytes.small_pool.current"] + \
                stats["inactive_split_bytes.large_pool.current"] == \
                stats["inactive_split_bytes.all.current"]
    for ident in sorted(referee.live):
        referee.free(ident)
        referee.check()
    referee.check_fully_coalesced()
    referee.empty_cache()
    assert referee.view.reserved == 0 and list(referee.policy.blocks()) == []


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=60, deadline=None)
@given(actions=actions)
def test_invariants_hold_after_every_event(spec: str, actions) -> None:
    _drive(Referee.of(spec, small_device(capacity=256 << 20)), actions)


@pytest.mark.parametrize("spec", SPECS)
def test_invariants_hold_under_memory_pressure(spec: str) -> None:
    rng = random.Random(spec)
    acts = [(rng.randint(0, 9), rng.choice([rng.randint(1, 4096), rng.randint(1, 30 << 20)]),
             rng.randint(0, 10**6), rng.randint(0, 1)) for _ in range(1500)]
    referee = Referee.of(spec, small_device(capacity=96 << 20))
    _drive(referee, acts)
    assert referee.ooms > 0


@pytest.mark.parametrize("params", [{}, {"max_split_size_mb": 20},
                                    {"max_split_size_mb": 24, "max_non_split_rounding_mb": 30}])
def test_the_per_stream_lists_find_what_a_literal_search_of_the_snapshot_finds(params) -> None:
    rng = random.Random(11)
    policy, _ = torch_alloc(capacity=1 << 40, **params)      # never out of memory here
    max_split = policy.max_split_size
    live: list[int] = []
    for _ in range(3000):
        if live and rng.random() < 0.45:
            policy.free(live.pop(rng.randrange(len(live))))
            continue
        size = rng.choice([rng.randint(1, 8192), rng.randint(1, 2 * MiB),
                           rng.randint(1, 80 * MiB)])
        stream = rng.randint(0, 1)
        rounded = round_size(size)
        pool = "small" if rounded <= MiB else "large"
        fitting = sorted((b["size"], b["address"]) for s in policy.segments()
                         if s["segment_type"] == pool and s["stream"] == stream
                         for b in s["blocks"] if b["state"] == "inactive" and b["size"] >= rounded)
        expected = None
        if fitting:
            block_size, address = fitting[0]
            too_big = block_size >= rounded + policy.max_non_split_rounding
            if not (rounded < max_split <= block_size or (rounded >= max_split and too_big)):
                expected = address
        known = {b["address"] for s in policy.segments() for b in s["blocks"]}
        got = policy.malloc(size, stream)
        assert got is not None
        if expected is None:
            assert got not in known          # a miss: a new segment (never-reused addresses)
        else:
            assert got == expected
        live.append(got)
