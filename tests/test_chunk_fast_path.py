"""ChunkPolicy's written-out hot path gives what its general path gives (issue 17).

``ChunkPolicy._malloc_fast`` is FreeIndex.pop_best_fit, the split rule and ChunkMap.hand_out,
and ``ChunkPolicy.free`` is ``free_general`` (ChunkMap.give_back_general), written out over
the chunk records and the FreeIndex bins. Two policies of each kind built on it — BFC (with
growth, without, with garbage collection, with a small split threshold) and best-fit (with
and without trim, at another alignment) — run the same random workload, one through each path;
after every step the answer, the device's calls and the whole state (every record's slots,
the rings, the regions, the free index's bins and bitmask, the counters) must agree and
check() hold. A ChunkMap on its own is held to the same through its general methods.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_checks import small_device, workload_actions

from allocsim.policies.best_fit import BestFitAllocator
from allocsim.policies.bfc import BFCAllocator
from allocsim.policies.chunk_policy import ChunkPolicy
from allocsim.policies.chunks import (
    ADDRESS,
    KEY,
    KEY_SHIFT,
    NEXT,
    NONE,
    PREV,
    REQUESTED,
    SIZE,
    ChunkMap,
)
from allocsim.sim.kernel.device import SimulatedDevice


def state(chunks: ChunkMap) -> tuple:
    """Everything a ChunkMap keeps, as plain values: each record's slots (neighbours by
    address), the rings' ends, the regions, the views, the free index's bins and bitmask."""
    index = chunks.free_index
    records = {address: (chunk[SIZE], chunk[PREV][ADDRESS], chunk[NEXT][ADDRESS], chunk[KEY],
                         chunk[REQUESTED] if not chunk[KEY] else None)
               for address, chunk in chunks.record.items()}
    rings = {base: (ring[PREV][ADDRESS], ring[NEXT][ADDRESS]) for base, ring in chunks.ring.items()}
    return (records, rings, dict(chunks.regions), dict(chunks.tail), set(chunks.in_use),
            dict(chunks.requested), [list(keys) for keys in index.bins], index.nonempty)


def counters(policy: ChunkPolicy) -> dict[str, Any]:
    return {name: value for name, value in vars(policy).items()
            if isinstance(value, int) and not isinstance(value, bool)}


def general(policy: ChunkPolicy) -> ChunkPolicy:
    """The same policy through its general path: the class's malloc, free_general."""
    vars(policy).pop("malloc", None)
    policy.free = policy.free_general               # type: ignore[method-assign]
    return policy


KINDS: list[tuple[type[ChunkPolicy], dict[str, Any]]] = [
    (BFCAllocator, {}),
    (BFCAllocator, {"allow_growth": False}),
    (BFCAllocator, {"garbage_collection": True, "memory_limit": 64 << 20}),
    (BFCAllocator, {"fragmentation_fraction": 0.01}),
    (BestFitAllocator, {}),
    (BestFitAllocator, {"trim": True}),
    (BestFitAllocator, {"alignment": 1024, "page": 4 << 20}),
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=workload_actions())
def test_the_hot_path_is_the_general_path(actions: Any) -> None:
    profile = small_device(capacity=256 << 20)
    for cls, params in KINDS:
        fast_view, slow_view = SimulatedDevice(profile).view(0), SimulatedDevice(profile).view(0)
        fast, slow = cls(fast_view, **params), general(cls(slow_view, **params))
        assert "malloc" in vars(fast) and "malloc" not in vars(slow)
        live: list[tuple[int, int]] = []
        for is_alloc, size, pick in [*actions, *[(False, 0, 0)] * len(actions)]:
            if is_alloc:
                a, b = fast.malloc(size, 0), slow.malloc(size, 0)
                assert a == b
                if a is not None:
                    live.append((a, b))
            elif live:
                a, b = live.pop(pick % len(live))
                fast.free(a)
                slow.free(b)
            assert state(fast.chunks) == state(slow.chunks)
            assert counters(fast) == counters(slow)
            assert (fast_view.reserved, fast_view.calls) == (slow_view.reserved, slow_view.calls)
            fast.check()
            slow.check()


def test_a_power_of_two_alignment_is_what_the_hot_path_needs() -> None:
    view = SimulatedDevice(small_device()).view(0)
    assert "malloc" in vars(BestFitAllocator(view, alignment=512))
    odd = BestFitAllocator(view, alignment=768)     # the general path rounds it
    assert "malloc" not in vars(odd)
    assert odd.malloc(1000) == odd.heap_base and odd.chunks.size[odd.heap_base] == 2 * 768


steps = st.lists(st.tuples(st.booleans(), st.integers(1, 6 << 20), st.integers(0, 10**6)),
                 min_size=1, max_size=150)


@settings(max_examples=100, deadline=None)
@given(steps=steps)
def test_chunkmaps_general_methods_keep_its_invariants(steps: Any) -> None:
    """take / give_back_general / grow and shrink on a bare ChunkMap: check() after every
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
            chunks.give_back_general(live.pop(pick % len(live)))
        chunks.check()
        for address, chunk in chunks.record.items():
            assert chunks.size[address] == chunk[SIZE]
            assert (address in chunks.in_use) == (not chunk[KEY])
            if chunk[KEY]:
                assert chunk[KEY] == chunk[SIZE] << KEY_SHIFT | address
    for address in live:
        chunks.give_back_general(address)
    chunks.check()
    assert all(chunks.next[base] == NONE for base in chunks.regions)     # all coalesced again
    assert not chunks.in_use and not chunks.requested
    for base in list(chunks.regions):
        chunks.remove_region(base)
    assert not chunks.record and not chunks.ring and not chunks.free_index.nonempty
