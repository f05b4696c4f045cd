"""Each allocator rule at its edge, worked by hand: the request or block one step either side of
the comparison the rule makes. Random workloads almost never land exactly on an edge, so these
are what tell ``>=`` from ``>`` (tests/rule_mutations.toml lists the mutations each must catch;
tests/test_rule_mutations.py applies them).

Sources followed: openxla/xla xla/tsl/framework/bfc_allocator.cc (FindChunkPtr's split test,
Extend); pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (should_split, get_free_block,
get_allocation_size, the expandable walk); cupy/cupy cupy/cuda/memory.pyx (_try_malloc's
limit); the stream-ordered pool's trim (cuMemPoolTrimTo) and growth; Knuth's buddy system.
"""

from __future__ import annotations

from typing import Any

from policy_checks import small_device

from allocsim.policies import parse_policy
from allocsim.policies.base import Policy
from allocsim.sim.kernel.device import SimulatedDevice

MiB = 1 << 20


def built(spec: str, capacity: int = 1 << 30) -> tuple[Any, Any]:
    """The policy of ``spec`` on a fresh device of ``capacity`` bytes, and the device's view."""
    view = SimulatedDevice(small_device(capacity)).view(0)
    return parse_policy(spec).build(view), view


def layout(policy: Policy) -> list[tuple[int, int, bool]]:
    """Every (mapped) block as (offset from the first, size, in use), in address order."""
    blocks = list(policy.blocks())
    base = blocks[0][0]
    return [(address - base, size, in_use) for address, size, in_use in blocks]


def malloc(policy: Policy, size: int, stream: int = 0) -> int:
    address = policy.malloc(size, stream)
    assert address is not None, f"{size} bytes were refused"
    policy.check()
    return address


# -- BFC: the split rule (FindChunkPtr) ------------------------------------------------------
def test_bfc_splits_when_the_slack_is_exactly_128_mib() -> None:
    """One region of 384 MiB; 256 MiB leaves 128 MiB, under twice the request: the slack rule
    alone (slack ≥ max_internal_fragmentation, 128 MiB) splits it."""
    bfc, _ = built("bfc:allow_growth=false,memory_limit=384MiB")
    malloc(bfc, 256 * MiB)
    assert layout(bfc) == [(0, 256 * MiB, True), (256 * MiB, 128 * MiB, False)]


def test_bfc_keeps_a_chunk_whole_when_the_slack_is_one_granule_short_of_128_mib() -> None:
    bfc, _ = built("bfc:allow_growth=false,memory_limit=384MiB")
    malloc(bfc, 256 * MiB + 1)          # rounded to 256 MiB + 256 B: slack 128 MiB − 256
    assert layout(bfc) == [(0, 384 * MiB, True)]
    assert bfc.bytes_in_use == 384 * MiB


def test_bfc_splits_a_chunk_of_exactly_twice_the_request() -> None:
    """4 MiB for 2 MiB: slack 2 MiB is far below 128 MiB; chunk ≥ 2 × rounded splits it."""
    bfc, _ = built("bfc:allow_growth=false,memory_limit=4MiB")
    malloc(bfc, 2 * MiB)
    assert layout(bfc) == [(0, 2 * MiB, True), (2 * MiB, 2 * MiB, False)]


def test_bfc_keeps_a_chunk_under_twice_the_request_whole() -> None:
    bfc, _ = built("bfc:allow_growth=false,memory_limit=4MiB")
    malloc(bfc, 2 * MiB + 1)
    assert layout(bfc) == [(0, 4 * MiB, True)]


def test_bfc_splits_when_the_slack_reaches_a_fractional_threshold_exactly() -> None:
    """fragmentation_fraction 0.25 of a 4 MiB limit: threshold 1 MiB; 3 MiB leaves exactly it."""
    bfc, _ = built("bfc:allow_growth=false,memory_limit=4MiB,fragmentation_fraction=0.25")
    malloc(bfc, 3 * MiB)
    assert layout(bfc) == [(0, 3 * MiB, True), (3 * MiB, 1 * MiB, False)]
    malloc(bfc, MiB)                                # the rest serves the next request
    assert bfc.pool_bytes == 4 * MiB


# -- BFC: Extend ------------------------------------------------------------------------------
def test_bfc_extends_for_a_request_of_exactly_the_bytes_the_limit_leaves() -> None:
    """available = memory_limit − pool; Extend fails only for a request above it."""
    bfc, _ = built("bfc:memory_limit=4MiB")
    malloc(bfc, 4 * MiB)
    assert bfc.pool_bytes == 4 * MiB
    assert bfc.malloc(256) is None                  # nothing left at all now


def test_bfc_does_not_double_for_a_request_of_exactly_the_region_size() -> None:
    """The region doubles only while the request is larger than it: 2 MiB takes the first
    2 MiB region as it is, and the size doubles afterwards (it did not grow for this one)."""
    bfc, _ = built("bfc")
    malloc(bfc, 2 * MiB)
    assert bfc.pool_bytes == 2 * MiB
    assert bfc.curr_region_allocation_bytes == 4 * MiB


# -- PyTorch: should_split, get_free_block, get_allocation_size -------------------------------
def test_pytorch_keeps_a_large_block_whole_when_exactly_1_mib_would_remain() -> None:
    """Large pool: split only when more than 1 MiB (kSmallSize) remains. A 20 MiB segment
    (made by a 2 MiB request, freed) serves 19 MiB whole."""
    torch, _ = built("pytorch")
    torch.free(malloc(torch, 2 * MiB))
    malloc(torch, 19 * MiB)
    assert layout(torch) == [(0, 20 * MiB, True)]


def test_pytorch_splits_a_large_block_when_just_over_1_mib_remains() -> None:
    torch, _ = built("pytorch")
    torch.free(malloc(torch, 2 * MiB))
    malloc(torch, 19 * MiB - 512)
    assert layout(torch) == [(0, 19 * MiB - 512, True), (19 * MiB - 512, MiB + 512, False)]


def test_pytorch_splits_a_small_block_when_exactly_512_bytes_remain() -> None:
    """Small pool: split when at least 512 bytes (kMinBlockSize) remain."""
    torch, _ = built("pytorch")
    malloc(torch, MiB)                              # a 2 MiB small segment: 1 MiB stays free
    malloc(torch, MiB - 512)
    blocks = list(torch.blocks())
    assert [(size, in_use) for _, size, in_use in blocks] == [
        (MiB, True), (MiB - 512, True), (512, False)]


def test_pytorch_serves_a_request_of_exactly_1_mib_from_the_small_pool() -> None:
    """rounded ≤ 1 MiB is small: a 2 MiB small segment, split, the rest free."""
    torch, _ = built("pytorch")
    malloc(torch, MiB)
    assert torch.pool_bytes == 2 * MiB and torch.bytes_in_use == MiB
    assert [(size, in_use) for _, size, in_use in torch.blocks()] == [(MiB, True), (MiB, False)]


def test_pytorch_segment_sizes_at_their_edges() -> None:
    """get_allocation_size: ≤ 1 MiB → 2 MiB; < 10 MiB → 20 MiB; else rounded to 2 MiB. So
    10 MiB exactly gets a segment of its own size."""
    torch, _ = built("pytorch")
    malloc(torch, 10 * MiB)
    assert torch.pool_bytes == 10 * MiB
    malloc(torch, 10 * MiB - 512)
    assert torch.pool_bytes == 30 * MiB


def test_pytorch_never_splits_a_block_of_exactly_max_split_size_for_a_smaller_request() -> None:
    """get_free_block: a request under max_split_size rejects a block ≥ max_split_size. A
    20 MiB block (max_split_size_mb=20) stays cached; a 2 MiB request takes a new segment."""
    torch, view = built("pytorch:max_split_size_mb=20")
    torch.free(malloc(torch, 20 * MiB))
    malloc(torch, 2 * MiB)
    assert view.mallocs == 2 and torch.pool_bytes == 40 * MiB


def test_pytorch_rejects_a_block_exactly_max_non_split_rounding_too_big() -> None:
    """A request ≥ max_split_size takes a block only if it is less than rounded +
    max_non_split_rounding (20 MiB) bigger: 40 MiB for 20 MiB is rejected."""
    torch, view = built("pytorch:max_split_size_mb=20")
    torch.free(malloc(torch, 40 * MiB))
    malloc(torch, 20 * MiB)
    assert view.mallocs == 2
    torch.free(malloc(torch, 22 * MiB))             # 40 MiB < 22 + 20: taken whole
    assert view.mallocs == 2


def _reserved_after_a_miss_holding_50_mib(allowed: int) -> int:
    """PyTorch collecting over half of ``allowed``: 30 and 20 MiB made, the 30 MiB freed (the
    only cached block, so at least the mean age), then 40 MiB misses with 50 MiB held; the
    bytes reserved after it."""
    torch, view = built("pytorch:per_process_memory_fraction=1.0,"
                        "garbage_collection_threshold=0.5", 100 * MiB)
    torch.release.allowed_memory_maximum = allowed
    a = malloc(torch, 30 * MiB)
    malloc(torch, 20 * MiB)
    torch.free(a)
    malloc(torch, 40 * MiB)
    return int(view.reserved)


def test_pytorch_collects_nothing_at_exactly_its_garbage_collection_threshold() -> None:
    # garbage_collect_cached_blocks: total_allocated_memory <= gc_threshold x allowed returns.
    # 50 MiB held at half of 100 MiB allowed: the cached 30 MiB block stays.
    assert _reserved_after_a_miss_holding_50_mib(100 * MiB) == 90 * MiB


def test_pytorch_collects_one_byte_over_its_garbage_collection_threshold() -> None:
    # 100 MiB - 2 B allowed: the threshold is 1 B under the 50 MiB held, and the cached block
    # goes before the new segment.
    assert _reserved_after_a_miss_holding_50_mib(100 * MiB - 2) == 60 * MiB


def test_pytorchs_expandable_walk_stays_on_a_tie() -> None:
    """get_free_block's expandable walk moves to the next bigger block only while its
    expandable size is smaller. On a 64 MiB device a large pool's range is 4 pages of 20 MiB.
    24 MiB freed at the bottom (a block in use behind it) ties with the 4 MiB free at the top
    of the mapped pages plus the 20 MiB unmapped behind them: the walk stays on the 4 MiB one."""
    torch, _ = built("pytorch:expandable_segments=true", 64 * MiB)
    first = malloc(torch, 24 * MiB)
    malloc(torch, 16 * MiB)
    malloc(torch, 16 * MiB)
    torch.free(first)
    malloc(torch, 3 * MiB)
    assert layout(torch) == [(0, 24 * MiB, False), (24 * MiB, 16 * MiB, True),
                             (40 * MiB, 16 * MiB, True), (56 * MiB, 3 * MiB, True),
                             (59 * MiB, MiB, False)]


def test_pytorchs_expandable_walk_moves_on_to_a_smaller_expandable_size() -> None:
    """The same with 22 MiB at the bottom: the third 16 MiB maps one page after the 2 MiB free
    block, leaving 6 MiB free at the top (expandable: 6 + 20 unmapped = 26 MiB). For 3 MiB the
    walk starts there and moves on to the 22 MiB block (expandable 22 < 26)."""
    torch, _ = built("pytorch:expandable_segments=true", 64 * MiB)
    first = malloc(torch, 22 * MiB)
    malloc(torch, 16 * MiB)
    malloc(torch, 16 * MiB)
    torch.free(first)
    malloc(torch, 3 * MiB)
    assert layout(torch) == [(0, 3 * MiB, True), (3 * MiB, 19 * MiB, False),
                             (22 * MiB, 16 * MiB, True), (38 * MiB, 16 * MiB, True),
                             (54 * MiB, 6 * MiB, False)]


# -- CuPy: the limit (_try_malloc) ------------------------------------------------------------
def test_cupy_serves_a_request_that_fills_its_limit_exactly() -> None:
    pool, _ = built("cupy:limit=2MiB")
    malloc(pool, 2 * MiB)
    assert pool.malloc(512) is None                 # one unit more is over it


# -- the stream-ordered pool: growth and the release threshold --------------------------------
def test_the_pool_maps_exactly_one_chunk_for_a_request_of_one_chunk() -> None:
    pool, _ = built("cuda-async")
    malloc(pool, 2 * MiB)
    assert pool.total_bytes() == 2 * MiB
    malloc(pool, 2 * MiB + 1)
    assert pool.total_bytes() == 6 * MiB


def test_the_pool_releases_down_to_its_threshold_exactly() -> None:
    """cuMemPoolTrimTo(threshold) may take the pool to exactly the threshold: with 2 MiB kept,
    a wholly free 2 MiB chunk of a 4 MiB pool goes at the sync after its free."""
    pool, view = built("cuda-async:release_threshold=2MiB")
    malloc(pool, 2 * MiB)
    pool.free(malloc(pool, 2 * MiB))
    pool.check()
    assert pool.total_bytes() == 2 * MiB and view.reserved == 2 * MiB


# -- buddy ------------------------------------------------------------------------------------
def test_buddy_gives_a_power_of_two_request_a_block_of_its_own_size() -> None:
    buddy, _ = built("buddy")
    malloc(buddy, 1024)
    assert buddy.bytes_in_use == 1024
    malloc(buddy, 1025)
    assert buddy.bytes_in_use == 1024 + 2048


def test_buddy_never_shrinks_an_arena_below_the_block_it_is_for() -> None:
    """Refused arenas are asked for in halves down to the block's own size, not below."""
    buddy, view = built("buddy", 8 * MiB)
    assert buddy.malloc(16 * MiB) is None
    buddy.check()
    assert view.reserved == 0


# -- best-fit: growth ---------------------------------------------------------------------
def test_best_fit_maps_only_what_the_free_top_of_the_heap_lacks() -> None:
    """1 MiB in use leaves 1 MiB free at the top of the first 2 MiB page; 3 MiB more needs
    only one more page, the free top joining it."""
    heap, view = built("best-fit")
    malloc(heap, MiB)
    malloc(heap, 3 * MiB)
    assert heap.mapped == 4 * MiB and view.reserved == 4 * MiB
    assert layout(heap) == [(0, MiB, True), (MiB, 3 * MiB, True)]
