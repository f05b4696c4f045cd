"""The rule edges of tests/test_rule_edges.py that the native core's policies have, worked by
hand and run through both implementations: whole replays (allocsim.sim.kernel.engine's
ProcessReplay for the Python models, the core through sim/kernel/native.py), each asserting
the hand-worked answer — the addresses handed out, the OOMs, the bytes reserved — rather than
the two implementations' agreement, so a mutation of either one's rule fails here
(tests/rule_mutations.toml lists the native mutations; tests/test_rule_mutations.py builds the
mutated core). Where the core is not built the native runs skip.

Sources followed: openxla/xla xla/tsl/framework/bfc_allocator.cc (FindChunkPtr's split
rule, Extend); pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (get_free_block's expandable
walk and max_split_size checks, should_split, get_pool, get_allocation_size); cupy/cupy
cupy/cuda/memory.pyx (_try_malloc's limit); the stream-ordered pool's growth and trim
(cuMemPoolTrimTo), as policies/cuda_async.py models them; best-fit's growth and the buddy
system's orders and arenas as policies/best_fit.py and policies/buddy.py model them; the TPU
runtime's rules as policies/tpu.py read them off the chip's records (its placements and
compactions are seen in the heap's blocks, so its edges assert those).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import native_cases as cases
from policy_checks import small_device

from allocsim.policies.tpu import compaction_seconds
from allocsim.sim.kernel.results import RunResult
from allocsim.traces.model import Trace

MiB = 1 << 20


@dataclass(frozen=True)
class Edge:
    spec: str
    capacity: int
    events: list[tuple[str, int, int]]          # (op, buffer id, bytes)
    holds: Callable[[RunResult, list[int]], bool]


def _offsets(addresses: list[int]) -> list[int]:
    return [a - addresses[0] if a >= 0 else -1 for a in addresses]


# The expandable walk (pytorch/expandable.py's _expandable_best_fit): on a 64 MiB device a
# large pool's range is 4 pages of 20 MiB. 24 MiB freed at the bottom (a block in use behind
# it) ties with the 4 MiB free at the top of the mapped pages plus the 20 MiB unmapped behind
# them: the walk stays on the 4 MiB one, so 3 MiB goes at 56 MiB. With 22 MiB at the bottom
# the top block's expandable size is 6 + 20 = 26 MiB: the walk moves on to the 22 MiB block.
_WALK = [("alloc", 2, 16 * MiB), ("alloc", 3, 16 * MiB), ("free", 1, 0), ("alloc", 4, 3 * MiB)]
EDGES = {
    "pytorch-expandable-walk-stays-on-a-tie": Edge(
        "pytorch:expandable_segments=true", 64 * MiB, [("alloc", 1, 24 * MiB), *_WALK],
        lambda result, addresses: _offsets(addresses)[3] == 56 * MiB),
    "pytorch-expandable-walk-moves-on": Edge(
        "pytorch:expandable_segments=true", 64 * MiB, [("alloc", 1, 22 * MiB), *_WALK],
        lambda result, addresses: _offsets(addresses)[3] == 0),
    # BFC's split rule (bfc_allocator.cc FindChunkPtr): split when the chunk is at least twice
    # the request, or when the slack reaches max_internal_fragmentation (128 MiB). One region
    # of 384 MiB: 256 MiB leaves exactly 128 MiB (under twice), which the slack rule splits
    # off to serve the next 128 MiB; unsplit, that request finds nothing.
    "bfc-splits-at-a-slack-of-exactly-128-mib": Edge(
        "bfc:allow_growth=false,memory_limit=384MiB", 1 << 30,
        [("alloc", 1, 256 * MiB), ("alloc", 2, 128 * MiB)],
        lambda result, addresses: result.ooms == 0 and _offsets(addresses)[1] == 256 * MiB),
    # A 4 MiB region for 2 MiB: exactly twice the request splits (slack 2 MiB is far under 128).
    "bfc-splits-a-chunk-of-exactly-twice-the-request": Edge(
        "bfc:allow_growth=false,memory_limit=4MiB", 1 << 30,
        [("alloc", 1, 2 * MiB), ("alloc", 2, 2 * MiB)],
        lambda result, addresses: result.ooms == 0 and _offsets(addresses)[1] == 2 * MiB),
    # Extend fails only for a request above what the limit leaves: 4 MiB fits a 4 MiB limit.
    "bfc-extends-for-exactly-what-the-limit-leaves": Edge(
        "bfc:memory_limit=4MiB", 1 << 30, [("alloc", 1, 4 * MiB)],
        lambda result, addresses: result.ooms == 0 and result.peak_reserved == 4 * MiB),
    # The region size doubles only while the request is larger: 2 MiB takes the first 2 MiB.
    "bfc-does-not-double-for-exactly-the-region-size": Edge(
        "bfc", 1 << 30, [("alloc", 1, 2 * MiB)],
        lambda result, addresses: result.peak_reserved == 2 * MiB),
    # best-fit maps only what the free top of the heap lacks: 1 MiB in use leaves 1 MiB free
    # at the top of the first 2 MiB page; 3 MiB more maps one more page, not two.
    "best-fit-maps-only-what-the-free-top-lacks": Edge(
        "best-fit", 1 << 30, [("alloc", 1, MiB), ("alloc", 2, 3 * MiB)],
        lambda result, addresses: (result.peak_reserved == 4 * MiB
                                   and _offsets(addresses)[1] == MiB)),
    # PyTorch's should_split (CUDACachingAllocator.cpp), large pool: split only when more
    # than 1 MiB (kSmallSize) remains. 19 MiB from a cached 20 MiB segment leaves exactly
    # 1 MiB: handed out whole, so 1 MiB is internal fragmentation at peak live.
    "pytorch-keeps-a-large-block-whole-at-exactly-1-mib-left": Edge(
        "pytorch", 1 << 30, [("alloc", 1, 2 * MiB), ("free", 1, 0), ("alloc", 2, 19 * MiB)],
        lambda result, addresses: result.internal_fragmentation == MiB),
    # Small pool: split when at least 512 bytes (kMinBlockSize) remain. 1 MiB, then 1 MiB −
    # 512 from a 2 MiB small segment leaves exactly 512, which serves the third request.
    "pytorch-splits-a-small-block-at-exactly-512-bytes-left": Edge(
        "pytorch", 1 << 30,
        [("alloc", 1, MiB), ("alloc", 2, MiB - 512), ("alloc", 3, 512)],
        lambda result, addresses: result.peak_reserved == 2 * MiB and result.device_mallocs == 1),
    # get_pool: rounded <= 1 MiB is the small pool, whose 2 MiB segment splits: two 1 MiB
    # requests share one segment.
    "pytorch-serves-1-mib-from-the-small-pool": Edge(
        "pytorch", 1 << 30, [("alloc", 1, MiB), ("alloc", 2, MiB)],
        lambda result, addresses: result.peak_reserved == 2 * MiB),
    # get_allocation_size: <= 1 MiB gets a 2 MiB segment (kSmallBuffer) ...
    "pytorch-gives-1-mib-a-2-mib-segment": Edge(
        "pytorch", 1 << 30, [("alloc", 1, MiB)],
        lambda result, addresses: result.peak_reserved == 2 * MiB),
    # ... < 10 MiB (kMinLargeAlloc) a 20 MiB one (kLargeBuffer), else its size rounded to
    # 2 MiB: 10 MiB exactly gets 10 MiB, 10 MiB − 512 gets 20 MiB.
    "pytorch-segment-sizes-at-10-mib": Edge(
        "pytorch", 1 << 30, [("alloc", 1, 10 * MiB), ("alloc", 2, 10 * MiB - 512)],
        lambda result, addresses: result.peak_reserved == 30 * MiB),
    # get_free_block: a request under max_split_size rejects a cached block of exactly
    # max_split_size (20 MiB): 2 MiB takes a new segment.
    "pytorch-rejects-a-block-of-exactly-max-split-size": Edge(
        "pytorch:max_split_size_mb=20", 1 << 30,
        [("alloc", 1, 20 * MiB), ("free", 1, 0), ("alloc", 2, 2 * MiB)],
        lambda result, addresses: result.device_mallocs == 2),
    # A request of at least max_split_size takes a block only if it is less than rounded +
    # max_non_split_rounding (20 MiB) bigger: 40 MiB for 20 MiB is rejected.
    "pytorch-rejects-a-block-exactly-max-non-split-rounding-too-big": Edge(
        "pytorch:max_split_size_mb=20", 1 << 30,
        [("alloc", 1, 40 * MiB), ("free", 1, 0), ("alloc", 2, 20 * MiB)],
        lambda result, addresses: result.device_mallocs == 2),
    # garbage_collect_cached_blocks collects only while total_allocated_memory is over
    # gc_threshold x allowed_memory_maximum: 50 MiB held at exactly half of a 100 MiB card
    # keeps its cached 30 MiB block, and 40 MiB more is a new segment (90 MiB reserved).
    "pytorch-collects-only-over-its-threshold": Edge(
        "pytorch:per_process_memory_fraction=1.0,garbage_collection_threshold=0.5", 100 * MiB,
        [("alloc", 1, 30 * MiB), ("alloc", 2, 20 * MiB), ("free", 1, 0), ("alloc", 3, 40 * MiB)],
        lambda result, addresses: result.device_frees == 0 and result.peak_reserved == 90 * MiB),
    # Buddy: a request takes the smallest power of two at least its size: 1024 a block of
    # 1024, 1025 one of 2048 (1023 bytes beyond the requests at peak live).
    "buddy-gives-a-power-of-two-a-block-of-its-own-size": Edge(
        "buddy", 1 << 30, [("alloc", 1, 1024), ("alloc", 2, 1025)],
        lambda result, addresses: result.internal_fragmentation == 1023),
    # Refused arenas are asked for in halves down to the block's own size, not below: 16 MiB
    # on an 8 MiB device is refused, and nothing is held.
    "buddy-never-shrinks-an-arena-below-its-block": Edge(
        "buddy", 8 * MiB, [("alloc", 1, 16 * MiB)],
        lambda result, addresses: result.ooms == 1 and result.peak_reserved == 0),
    # CuPy's limit holds total_bytes + size <= limit: 2 MiB fills a 2 MiB limit; 512 more not.
    "cupy-fills-its-limit-exactly": Edge(
        "cupy:limit=2MiB", 1 << 30, [("alloc", 1, 2 * MiB), ("alloc", 2, 512)],
        lambda result, addresses: addresses[0] >= 0 and addresses[1] == -1 and result.ooms == 1),
    # The pool grows by round_up(request, 2 MiB): 2 MiB maps one chunk, 2 MiB + 1 two more.
    "cuda-async-maps-one-chunk-for-one-chunk": Edge(
        "cuda-async", 1 << 30, [("alloc", 1, 2 * MiB), ("alloc", 2, 2 * MiB + 1)],
        lambda result, addresses: result.peak_reserved == 6 * MiB),
    # cuMemPoolTrimTo(2 MiB) may take a 4 MiB pool to exactly 2 MiB: the wholly free chunk goes.
    "cuda-async-releases-to-its-threshold-exactly": Edge(
        "cuda-async:release_threshold=2MiB", 1 << 30,
        [("alloc", 1, 2 * MiB), ("alloc", 2, 2 * MiB), ("free", 2, 2 * MiB)],
        lambda result, addresses: result.final_reserved == 2 * MiB and result.device_frees == 1),
}


def _trace(events: list[tuple[str, int, int]]) -> Trace:
    sizes: dict[int, int] = {}
    rows = []
    for time, (op, buffer, nbytes) in enumerate(events):
        nbytes = sizes.setdefault(buffer, nbytes) if op == "alloc" else sizes[buffer]
        rows.append((time, op, buffer, nbytes))
    return Trace.from_events(rows, name="edge")


@pytest.mark.parametrize("implementation", ["python", "native"])
@pytest.mark.parametrize("name", sorted(EDGES))
def test_the_rule_holds_at_its_edge(name: str, implementation: str) -> None:
    edge = EDGES[name]
    if implementation == "native":
        cases.need_core()
    run = cases.native_run if implementation == "native" else cases.python_run
    result, addresses = run(_trace(edge.events), edge.spec, small_device(edge.capacity))
    assert edge.holds(result, addresses), (name, implementation, _offsets(addresses), result)


# -- the tpu policy: its edges show in the heap's blocks and its compaction counters ---------
@dataclass(frozen=True)
class TpuEdge:
    capacity: int
    events: list[tuple[str, int, int]]
    holds: Callable[[RunResult, dict[str, Any]], bool]


def _layout(state: dict[str, Any]) -> list[tuple[int, int, bool]]:
    """The heap's blocks as (offset, size, in use), from its first (the heap's base)."""
    blocks = state["blocks"]
    return [(address - blocks[0][0], size, used) for address, size, used in blocks]


_EIGHT_THEN_EVERY_OTHER_FREED = ([("alloc", k, MiB) for k in range(8)]
                                 + [("free", k, 0) for k in (1, 3, 5, 7)])
TPU_EDGES = {
    # best_fit: the block at the bottom of HBM only when no other holds the request (the
    # chip: compaction-2, events 376-378). 3 + 3 MiB from the top of 8 leave 2 MiB at the
    # bottom; the top 3 MiB freed, 1 MiB goes to that hole's top, not to the smaller bottom.
    "tpu-takes-the-bottom-block-last": TpuEdge(
        8 * MiB, [("alloc", 1, 3 * MiB), ("alloc", 2, 3 * MiB), ("free", 1, 0),
                  ("alloc", 3, MiB)],
        lambda result, state: _layout(state) == [(0, 2 * MiB, False), (2 * MiB, 3 * MiB, True),
                                                 (5 * MiB, 2 * MiB, False),
                                                 (7 * MiB, MiB, True)]),
    # The OOM rule: a request fails only when the free total is short. 4 MiB free in four
    # 1 MiB holes: exactly 4 MiB compacts and fits.
    "tpu-fails-only-when-the-free-total-is-short": TpuEdge(
        8 * MiB, [*_EIGHT_THEN_EVERY_OTHER_FREED, ("alloc", 9, 4 * MiB)],
        lambda result, state: result.ooms == 0 and state["num_compactions"] == 1),
    # compact: only the bytes that move count: the top buffer is already at the top, so
    # 3 of the 4 live MiB move, and the modelled time is of those 3 MiB.
    "tpu-compaction-counts-only-what-moves": TpuEdge(
        8 * MiB, [*_EIGHT_THEN_EVERY_OTHER_FREED, ("alloc", 9, 2 * MiB)],
        lambda result, state: (state["compaction_moved_bytes"] == 3 * MiB
                               and state["compaction_s"] == compaction_seconds(3 * MiB)
                               and _layout(state)[-4:] == [(k * MiB, MiB, True)
                                                            for k in (4, 5, 6, 7)])),
    # round_to_granule: an exact multiple of 512 B takes no extra granule; 513 B takes two.
    "tpu-an-exact-granule-multiple-takes-no-extra": TpuEdge(
        1 * MiB, [("alloc", 1, 512), ("alloc", 2, 513)],
        lambda result, state: [size for _, size, used in _layout(state) if used]
        == [1024, 512]),
}


@pytest.mark.parametrize("implementation", ["python", "native"])
@pytest.mark.parametrize("name", sorted(TPU_EDGES))
def test_the_tpu_rule_holds_at_its_edge(name: str, implementation: str) -> None:
    edge = TPU_EDGES[name]
    if implementation == "native":
        cases.need_core()
    result, state = cases.tpu_run(_trace(edge.events), "tpu:runtime_bytes=0",
                                  small_device(edge.capacity), implementation)
    assert edge.holds(result, state), (name, implementation, _layout(state), result)
