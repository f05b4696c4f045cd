"""ChunkMap's written-out hot path gives what its general composition gives (issue 17).

``ChunkMap.allocate`` is FreeIndex.pop_best_fit then ``hand_out`` with BFC's split rule, and
``ChunkMap.give_back`` is ``give_back_general`` with the free-index updates written inline. Two
maps run the same random workload — regions added as a policy would, requests with BFC's and
best-fit's split rules — one through each path; after every step the answer and the whole state
(chunks, links, tails, regions, the free index's bins and bitmask) must agree and check() hold.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.policies.chunks import NONE, ChunkMap

REGION = 8 << 20


def general_allocate(chunks: ChunkMap, rounded: int, max_slack: int) -> tuple[int, int] | None:
    found = chunks.free_index.pop_best_fit(rounded)
    if found is None:
        return None
    address, chunk_size = found
    split = chunk_size >= 2 * rounded or chunk_size - rounded >= max_slack
    return address, chunks.hand_out(address, chunk_size, rounded, split)


def state(chunks: ChunkMap) -> tuple:
    index = chunks.free_index
    return (chunks.size, chunks.prev, chunks.next, chunks.in_use, chunks.regions, chunks.tail,
            index.bins, index.nonempty)


steps = st.lists(st.tuples(st.booleans(), st.integers(1, 6 << 20), st.integers(0, 10**6),
                           st.sampled_from([0, 1 << 20, 128 << 20])),
                 min_size=1, max_size=150)


@settings(max_examples=150, deadline=None)
@given(steps=steps)
def test_allocate_and_give_back_are_their_general_paths(steps: Any) -> None:
    fast, slow = ChunkMap(), ChunkMap()
    next_base = 1 << 40
    live: list[int] = []
    for is_alloc, size, pick, max_slack in steps:
        if is_alloc or not live:
            rounded = -(-size // 256) * 256
            a = fast.allocate(rounded, max_slack)
            b = general_allocate(slow, rounded, max_slack)
            assert a == b
            if a is None:                       # grow, as a policy would, and retry
                fast.add_region(next_base, REGION)
                slow.add_region(next_base, REGION)
                next_base += 2 * REGION
                a = fast.allocate(rounded, max_slack)
                assert a == general_allocate(slow, rounded, max_slack)
            if a is not None:
                live.append(a[0])
        else:
            address = live.pop(pick % len(live))
            assert fast.give_back(address) == slow.give_back_general(address)
        assert state(fast) == state(slow)
        fast.check()
    for address in live:
        assert fast.give_back(address) == slow.give_back_general(address)
    assert state(fast) == state(slow)
    assert all(fast.next[base] == NONE for base in fast.regions)     # all coalesced again
