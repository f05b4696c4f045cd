"""A ChunkMap keeps its invariants through its own methods (take, give_back, growing and
shrinking a region), with check() after every step of random workloads; and ChunkPolicy rounds
to an alignment that is no power of two as to any other.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from policy_checks import small_device

from allocsim.policies.best_fit import BestFitAllocator
from allocsim.policies.chunks import BIN, KEY_SHIFT, NONE, ChunkMap, FreeIndex
from allocsim.policies.cupy_pool import BIT_LENGTH_BINS, new_arena
from allocsim.sim.kernel.device import SimulatedDevice


def test_an_alignment_that_is_no_power_of_two_rounds_as_any_other() -> None:
    view = SimulatedDevice(small_device()).view(0)
    odd = BestFitAllocator(view, alignment=768)
    assert odd.malloc(1000) == odd.heap_base and odd.chunks.size[odd.heap_base] == 2 * 768
    odd.check()


steps = st.lists(st.tuples(st.booleans(), st.integers(1, 6 << 20), st.integers(0, 10**6)),
                 min_size=1, max_size=150)


@settings(max_examples=100, deadline=None)
@given(steps=steps)
def test_chunkmaps_general_methods_keep_its_invariants(steps: Any) -> None:
    """take / give_back / grow and shrink on a bare ChunkMap: check() after every
    step, the views agree with the records, everything coalesces again at the end."""
    chunks = ChunkMap()
    next_base = 1 << 40
    live: list[int] = []
    for is_alloc, size, pick in steps:
        if is_alloc or not live:
            rounded = -(-size // 256) * 256
            found = chunks.best_fit(rounded)
            if found is None:
                chunks.add_region(next_base, 8 << 20)
                next_base += 16 << 20
                found = chunks.best_fit(rounded)
            if found is not None:
                address, chunk_size = found
                assert chunks.take(address, chunk_size, rounded, True, size) == min(
                    rounded, chunk_size)
                assert chunks.requested[address] == size
                live.append(address)
        else:
            chunks.give_back(live.pop(pick % len(live)))
        chunks.check()
        for address, chunk in chunks.record.items():
            assert chunks.size[address] == chunk.size
            assert (address in chunks.in_use) == (not chunk.key)
            if chunk.key:
                assert chunk.key == chunk.size << KEY_SHIFT | address
    for address in live:
        chunks.give_back(address)
    chunks.check()
    assert all(chunks.next[base] == NONE for base in chunks.regions)     # all coalesced again
    assert not chunks.in_use and not chunks.requested
    for base in list(chunks.regions):
        chunks.remove_region(base)
    assert not chunks.record and not chunks.ring and not chunks.free_index.nonempty


# -- the one binned index: its bins are a layout, its keys' order the rule ---------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 1 << 40), st.integers(0, 1 << 20)),
                max_size=80))
def test_the_binned_index_answers_alike_whatever_its_bins(ops: list[tuple[bool, int, int]]
                                                           ) -> None:
    """BFC's 21 bins and CuPy's bins by bit length hold the same keys in the same order: every
    best fit, largest and listing agrees (the core's SortedBins bins differently again)."""
    bfc, by_bit_length = FreeIndex(), FreeIndex(KEY_SHIFT, BIT_LENGTH_BINS, "by bit length")
    held: set[tuple[int, int]] = set()
    for take, size, tie in ops:
        if take:
            assert bfc.pop_best_fit(size) == by_bit_length.pop_best_fit(size)
            held = {(s, a) for s, a in bfc.keys()}
        elif (size, tie) not in held:
            assert bfc.add(size, tie) == by_bit_length.add(size, tie)
            held.add((size, tie))
        assert bfc.largest() == by_bit_length.largest()
        assert sorted(bfc.keys()) == sorted(by_bit_length.keys())
    bfc.check()
    by_bit_length.check()
    assert len(bfc.bins) == max(BIN) + 1 and new_arena().owner == "CuPy arena"
