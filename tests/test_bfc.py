"""BFC, rule by rule, with hand-worked cases (xla/tsl/framework/bfc_allocator.cc)."""

from __future__ import annotations

import random

import pytest
from policy_checks import Referee, small_device

from allocsim.policies.bfc import BFCAllocator, bin_for_size, round_bytes
from allocsim.policies.chunks import ChunkMap
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice

MiB = 1 << 20


def bfc(capacity: int = 1 << 30, **params) -> tuple[BFCAllocator, object]:
    view = SimulatedDevice(small_device(capacity)).view(0)
    return BFCAllocator(view, **params), view


def test_requests_round_up_to_multiples_of_256_and_zero_bytes_is_null() -> None:
    assert [round_bytes(n) for n in (1, 255, 256, 257, 1000)] == [256, 256, 256, 512, 1024]
    policy, _ = bfc()
    assert policy.malloc(0) is None
    a = policy.malloc(1)
    assert policy.bytes_in_use == 256 and policy.stats().bytes_requested == 1
    b = policy.malloc(257)
    assert b == a + 256 and policy.bytes_in_use == 256 + 512


@pytest.mark.parametrize("size, expected", [
    (1, 0), (256, 0), (511, 0), (512, 1), (1023, 1), (1024, 2), (MiB, 12),
    (128 * MiB - 1, 18), (128 * MiB, 19), (256 * MiB - 1, 19), (256 * MiB, 20), (64 << 30, 20)])
def test_bins_double_from_256_bytes_and_the_last_holds_256_mib_and_up(size: int,
                                                                       expected: int) -> None:
    assert bin_for_size(size) == expected


def test_regions_grow_2_4_8_mib_then_jump_to_hold_a_big_request() -> None:
    policy, view = bfc()
    policy.malloc(100)             # 2 MiB region; curr doubles to 4 MiB afterwards
    policy.malloc(3 * MiB)         # 4 MiB region (no split: 4 < 2·3), curr → 8 MiB
    policy.malloc(5 * MiB)         # 8 MiB region, curr → 16 MiB
    policy.malloc(100 * MiB)       # curr 16→32→64→128 MiB while too small; 128 MiB region,
    policy.malloc(64 * MiB)        # ... and since it grew, curr stays 128: a 128 MiB region again
    sizes = [n for _, n in view.holdings()]
    assert sizes == [2 * MiB, 4 * MiB, 8 * MiB, 128 * MiB, 128 * MiB]
    assert policy.curr_region_allocation_bytes == 256 * MiB
    assert view.mallocs == 5


def test_without_growth_one_region_of_the_whole_limit_is_taken_at_the_first_allocation() -> None:
    policy, view = bfc(memory_limit=64 * MiB, allow_growth=False)
    assert view.reserved == 0                      # lazily, not at construction
    policy.malloc(1)
    assert [n for _, n in view.holdings()] == [64 * MiB]
    assert policy.malloc(64 * MiB) is None         # only 64 MiB − 256 left, and no growth
    assert view.mallocs == 1


def test_a_chunk_is_split_only_if_twice_the_request_or_the_slack_reaches_128_mib() -> None:
    policy, _ = bfc(memory_limit=1 << 30, allow_growth=False)
    policy.free(policy.malloc(1 << 30))             # the region is now one free 1 GiB chunk
    # 1 GiB free chunk, 600 MiB request: 1024 < 1200 but slack 424 MiB ≥ 128 MiB → split.
    a = policy.malloc(600 * MiB)
    assert policy.bytes_in_use == 600 * MiB
    policy.free(a)
    # 900 MiB request: 1024 < 1800 and slack 124 MiB < 128 MiB → the whole chunk is handed out.
    b = policy.malloc(900 * MiB)
    assert policy.bytes_in_use == 1 << 30
    assert policy.stats().largest_free_block == 0
    policy.free(b)
    # 512 MiB request: 1024 ≥ 2·512 → split, the caller keeps the low end.
    c = policy.malloc(512 * MiB)
    assert c == next(iter(policy.chunks.regions)) and policy.bytes_in_use == 512 * MiB


def test_fragmentation_fraction_moves_the_split_threshold() -> None:
    policy, _ = bfc(memory_limit=1 << 30, allow_growth=False, fragmentation_fraction=0.1)
    assert policy.max_internal_fragmentation == int(0.1 * (1 << 30))
    policy.malloc(900 * MiB)        # slack 124 MiB ≥ 102.4 MiB → split now
    assert policy.bytes_in_use == 900 * MiB


def test_unsplit_slack_counts_as_in_use_but_not_as_requested() -> None:
    policy, _ = bfc()
    policy.malloc(100)               # 2 MiB region split: 256 in use
    policy.malloc(3 * MiB)           # 4 MiB region, not split
    stats = policy.stats()
    assert stats.bytes_in_use == 256 + 4 * MiB
    assert stats.bytes_requested == 100 + 3 * MiB


def test_search_takes_the_smallest_fitting_chunk_and_the_lowest_address_on_ties() -> None:
    policy, _ = bfc(memory_limit=64 * MiB, allow_growth=False)
    # Carve: [A 4K][x][B 8K][x][C 4K][x][D 16K][x][rest]; then free A, B, C, D.
    blocks = {}
    for name, size in [("A", 4096), ("x1", 256), ("B", 8192), ("x2", 256), ("C", 4096),
                       ("x3", 256), ("D", 16384), ("x4", 256)]:
        blocks[name] = policy.malloc(size)
    for name in "ABCD":
        policy.free(blocks[name])
    assert policy.malloc(4000) == blocks["A"]      # 4K fits; A and C tie on size: lowest address
    assert policy.malloc(4096) == blocks["C"]
    assert policy.malloc(5000) == blocks["B"]      # smallest chunk ≥ 5000 is the 8K one
    assert policy.malloc(9000) == blocks["D"]


def test_free_merges_with_the_next_then_the_previous_chunk() -> None:
    policy, _ = bfc(memory_limit=64 * MiB, allow_growth=False)
    a, b, c, _guard = (policy.malloc(1024) for _ in range(4))
    policy.free(a)
    policy.free(c)
    policy.free(b)                                   # joins a … c into one 3 KiB chunk
    free_chunks = [(addr, size) for addr, size, used in policy.blocks() if not used]
    assert (a, 3072) in free_chunks
    assert policy.malloc(3072) == a


def test_regions_never_merge_even_when_both_are_free() -> None:
    policy, view = bfc()
    a = policy.malloc(MiB)                # region 1 (2 MiB)
    b = policy.malloc(3 * MiB)            # region 2 (4 MiB)
    policy.free(a)
    policy.free(b)
    free_chunks = [size for _, size, used in policy.blocks() if not used]
    assert sorted(free_chunks) == [2 * MiB, 4 * MiB]
    assert policy.malloc(5 * MiB) is not None and view.mallocs == 3   # needed a third region


def _shared(capacity: int, taken_by_other: int) -> tuple[SimulatedDevice, object]:
    device = SimulatedDevice(DeviceProfile("tiny", capacity, granularity=256))
    assert device.view(1).reserve(taken_by_other) is not None
    return device, device.view(0)


def test_back_off_asks_for_90_percent_until_the_device_accepts_with_strict_progress() -> None:
    # 4096-byte device, 2048 held by another process. BFC limit 2560, no growth:
    # ask 2560 (refused), round256(2304) = 2304 (refused), round256(2073) = 2304 is no progress,
    # so 2304 − 256 = 2048 (accepted).
    _, view = _shared(4096, 2048)
    policy = BFCAllocator(view, memory_limit=2560, allow_growth=False)
    assert policy.malloc(100) is not None
    assert view.failed_mallocs == 2 and view.mallocs == 1
    assert [n for _, n in view.holdings()] == [2048]


def test_back_off_gives_up_below_the_rounded_request() -> None:
    _, view = _shared(4096, 2048)
    policy = BFCAllocator(view, memory_limit=2560, allow_growth=False)
    assert policy.malloc(2304) is None      # 2560, 2304 refused; next try 2048 < 2304: fail
    assert view.failed_mallocs == 2 and policy.num_ooms == 1


def test_extend_fails_at_once_when_the_limit_leaves_too_little() -> None:
    policy, view = bfc(memory_limit=8 * MiB)
    policy.malloc(MiB)                       # 2 MiB region
    policy.malloc(3 * MiB)                   # 4 MiB region; 2 MiB of the limit left
    assert policy.malloc(3 * MiB) is None    # available 2 MiB < 3 MiB: no device call at all
    assert view.failed_mallocs == 0 and view.mallocs == 2


def test_garbage_collection_frees_wholly_free_regions_and_extends_again() -> None:
    for gc, expect_ok in ((False, False), (True, True)):
        policy, view = bfc(memory_limit=8 * MiB, garbage_collection=gc)
        a = policy.malloc(MiB)                 # 2 MiB region
        b = policy.malloc(3 * MiB)             # 4 MiB region (curr → 8 MiB)
        policy.free(a)
        policy.free(b)
        result = policy.malloc(7 * MiB)        # no chunk fits; only 2 MiB of the limit left
        assert (result is not None) == expect_ok
        if gc:
            assert view.frees == 2 and [n for _, n in view.holdings()] == [8 * MiB]


def test_bfc_reports_its_own_fragmentation_figure() -> None:
    policy, _ = bfc(memory_limit=64 * MiB, allow_growth=False)
    a = policy.malloc(MiB)
    policy.malloc(MiB)
    policy.free(a)
    free = 64 * MiB - MiB
    assert policy.fragmentation() == pytest.approx((free - (62 * MiB)) / free)


def _bin_walk(chunk_map: ChunkMap, rounded: int) -> tuple[int, int] | None:
    """BFC's literal search: bins of (size, address), walked upward from bin(rounded)."""
    bins: list[list[tuple[int, int]]] = [[] for _ in range(21)]
    for address, size, used in chunk_map.chunks():
        if not used:
            bins[bin_for_size(size)].append((size, address))
    for number in range(bin_for_size(rounded), 21):
        for size, address in sorted(bins[number]):
            if size >= rounded:
                return address, size
    return None


def test_one_ordered_index_finds_what_the_21_bin_walk_finds() -> None:
    rng = random.Random(7)
    referee = Referee.of("bfc", small_device(capacity=1 << 30))
    chunk_map = referee.policy.chunks
    for step in range(3000):
        if referee.live and rng.random() < 0.45:
            referee.free(rng.choice(sorted(referee.live)))
        else:
            referee.malloc(step, rng.choice([rng.randint(1, 4096), rng.randint(1, 8 * MiB)]))
        probe = round_bytes(rng.choice([rng.randint(1, 65536), rng.randint(1, 16 * MiB)]))
        assert chunk_map.best_fit(probe) == _bin_walk(chunk_map, probe)
