"""Every policy's ``check()``: its invariants hold on random workloads (tests/policy_checks.py's
Referee runs it after every event), and each invariant catches the corruption it names — a
free chunk left out of its bin, two neighbouring free chunks not merged, stats that disagree.
Also: ``check()`` survives ``python -O`` and never runs on the replay path, and every policy's
``PARAMS`` are its ``__init__`` defaults."""

from __future__ import annotations

import inspect
import random
import subprocess
import sys
from bisect import insort
from collections.abc import Callable
from typing import Any

import pytest
from policy_checks import Referee, build, small_device

from allocsim.policies import POLICIES, Policy
from allocsim.policies.base import params_of
from allocsim.policies.best_fit import BestFitAllocator
from allocsim.policies.bfc import BFCAllocator
from allocsim.policies.buddy import BuddyAllocator
from allocsim.policies.chunks import KEY_SHIFT, NONE, ChunkMap
from allocsim.policies.cuda_async import SHARED, CudaAsyncAllocator
from allocsim.policies.cupy_pool import CID_SHIFT, CuPyPoolAllocator
from allocsim.policies.on_demand import OnDemandAllocator
from allocsim.policies.pytorch.blocks import SHIFT
from allocsim.policies.pytorch.caching import PyTorchCachingAllocator

KiB, MiB = 1 << 10, 1 << 20


def broken(policy: Policy, corrupt: Callable[[], Any], invariant: str) -> None:
    """``policy`` passes check(); after ``corrupt()`` check() fails naming ``invariant``."""
    policy.check()
    corrupt()
    with pytest.raises(AssertionError, match=invariant):
        policy.check()


# -- parameters: one source of truth ------------------------------------------------------
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_params_are_the_constructor_defaults(name: str) -> None:
    cls = POLICIES[name]
    parameters = inspect.signature(cls.__init__).parameters
    defaults = {key: p.default for key, p in parameters.items() if key not in ("self", "device")}
    assert {key: param.default for key, param in cls.PARAMS.items()} == defaults


def test_params_of_refuses_a_declaration_that_disagrees_with_init() -> None:
    def init(self: Any, device: Any, alpha: int = 1, beta: bool = False) -> None: ...

    assert params_of(init, beta=("bool", "b"), alpha=("int", "a"))["alpha"].default == 1
    assert list(params_of(init, beta=("bool", "b"), alpha=("int", "a"))) == ["beta", "alpha"]
    with pytest.raises(TypeError, match="declared"):
        params_of(init, alpha=("int", "a"))
    with pytest.raises(TypeError, match="declared"):
        params_of(init, alpha=("int", "a"), beta=("bool", "b"), gamma=("int", "c"))

    def no_default(self: Any, device: Any, alpha: int) -> None: ...

    with pytest.raises(TypeError, match="without a default"):
        params_of(no_default, alpha=("int", "a"))


def test_the_base_check_is_a_documented_no_op() -> None:
    assert Policy.check.__doc__ and "AssertionError" in Policy.check.__doc__
    policy, _ = build(OnDemandAllocator)
    assert Policy.check(policy) is None


# -- check() after every event on several streams -----------------------------------------
@pytest.mark.parametrize("spec", ["cupy", "cuda-async:sync=none", "cuda-async", "pytorch",
                                  "pytorch:expandable_segments=true", "bfc", "buddy"])
def test_invariants_hold_on_several_streams_with_empty_cache(spec: str) -> None:
    rng = random.Random(spec)
    referee = Referee.of(spec, small_device(capacity=64 * MiB))
    for ident in range(1500):
        roll = rng.random()
        if roll < 0.02:
            referee.empty_cache()
        elif roll < 0.55 or not referee.live:
            size = rng.choice([rng.randint(1, 4 * KiB), rng.randint(1, 6 * MiB)])
            referee.malloc(ident, size, stream=rng.randint(0, 2))     # checks after the call
        else:
            referee.free(rng.choice(sorted(referee.live)))            # checks after the call
    assert referee.ooms > 0
    for ident in sorted(referee.live):
        referee.free(ident)
    referee.empty_cache()


def test_check_runs_under_python_minus_o() -> None:
    code = ("from allocsim.policies.bfc import BFCAllocator\n"
            "from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice\n"
            "p = BFCAllocator(SimulatedDevice(DeviceProfile('t', 1 << 30)).view(0))\n"
            "p.malloc(1000)\n"
            "p.bytes_in_use += 256\n"
            "try:\n    p.check()\nexcept AssertionError as err:\n    print('caught', err)\n")
    result = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.startswith("caught invariant broken: BFC: bytes_in_use")


@pytest.mark.parametrize("spec", ["bfc", "pytorch", "pytorch:expandable_segments=true", "cupy",
                                  "cuda-async", "buddy", "best-fit", "on-demand", "preallocate"])
def test_check_never_runs_on_the_replay_path(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from allocsim.policies import parse_policy
    from allocsim.sim.kernel.device import resolve_device
    from allocsim.sim.kernel.engine import replay
    from allocsim.traces import synth

    def boom(self: Policy) -> None:
        raise RuntimeError("check() ran during a replay")

    monkeypatch.setattr(parse_policy(spec).policy_class, "check", boom)
    result = replay(synth.generate("training", seed=0, events=2000), spec,
                    resolve_device("a100-80g"))
    assert result.completed


# -- the chunk structures (BFC, preallocate, best-fit) -------------------------------------
def bfc_with_a_hole() -> tuple[BFCAllocator, int, int, int]:
    """BFC with blocks a, b, c cut from one region and b freed: ``(policy, a, b, c)``."""
    policy, _ = build(BFCAllocator)
    a, b, c = (policy.malloc(4 * KiB) for _ in range(3))
    assert a is not None and b is not None and c is not None
    policy.free(b)
    return policy, a, b, c


def test_chunkmap_catches_a_free_chunk_left_out_of_its_bin() -> None:
    policy, _, b, _ = bfc_with_a_hole()
    chunks = policy.chunks
    broken(policy, lambda: chunks.free_index.remove(chunks.size[b], b),
           "free index is not the free chunks")


def test_chunkmap_catches_two_neighbouring_free_chunks_not_merged() -> None:
    policy, _, b, _ = bfc_with_a_hole()
    chunks = policy.chunks

    def split_the_hole() -> None:
        size, half = chunks.size[b], chunks.size[b] // 2
        upper = b + half
        chunks.free_index.remove(size, b)
        chunks.size[b] = half
        chunks.size[upper] = size - half
        chunks.prev[upper], chunks.next[upper] = b, chunks.next[b]
        chunks.prev[chunks.next[b]] = upper
        chunks.next[b] = upper
        chunks.free_index.add(half, b)
        chunks.free_index.add(size - half, upper)

    broken(policy, split_the_hole, "neighbouring free chunks")


def test_chunkmap_catches_broken_links_tails_and_bins() -> None:
    policy, a, b, c = bfc_with_a_hole()
    chunks = policy.chunks
    broken(policy, lambda: chunks.prev.__setitem__(c, a), "prev link")

    policy, a, b, c = bfc_with_a_hole()
    chunks = policy.chunks
    broken(policy, lambda: chunks.size.__setitem__(a, chunks.size[a] + 256), "not followed by")

    policy, *_ = bfc_with_a_hole()
    chunks = policy.chunks
    base = next(iter(chunks.regions))
    broken(policy, lambda: chunks.tail.__setitem__(base + chunks.regions[base], base), "tail")

    policy, _, b, _ = bfc_with_a_hole()
    index = policy.chunks.free_index
    size = policy.chunks.size[b]

    def wrong_bin() -> None:
        index.remove(size, b)
        index.bins[0].append(size << KEY_SHIFT | b)
        index.nonempty |= 1

    broken(policy, wrong_bin, "sits in bin 0")

    policy, *_ = bfc_with_a_hole()
    index = policy.chunks.free_index
    assert not index.bins[20]
    broken(policy, lambda: setattr(index, "nonempty", index.nonempty | 1 << 20), "bitmask")


def test_chunkmap_check_on_its_own() -> None:
    chunks = ChunkMap()
    chunks.add_region(1 << 30, 1 * MiB)
    chunks.take(1 << 30, 1 * MiB, 4 * KiB, split=True)
    chunks.check()
    chunks.in_use.add(123)
    with pytest.raises(AssertionError, match="in no region"):
        chunks.check()


def test_bfc_catches_stats_that_disagree() -> None:
    policy, *_ = bfc_with_a_hole()
    broken(policy, lambda: setattr(policy, "bytes_in_use", policy.bytes_in_use + 256),
           "bytes_in_use")
    policy, *_ = bfc_with_a_hole()
    broken(policy, lambda: setattr(policy, "pool_bytes", policy.pool_bytes - 256), "pool_bytes")
    policy, a, *_ = bfc_with_a_hole()
    broken(policy, lambda: policy.requested.pop(a), "requested table")


def test_best_fit_catches_a_heap_that_is_not_what_is_mapped() -> None:
    policy, _ = build(BestFitAllocator)
    policy.malloc(100)
    broken(policy, lambda: setattr(policy, "mapped", policy.mapped + policy.page), "mapped heap")


def test_best_fit_with_trim_catches_a_free_page_left_at_the_top() -> None:
    policy, view = build(BestFitAllocator, trim=True)
    address = policy.malloc(100)
    policy.malloc(5 * MiB)
    assert address is not None

    def grow_without_trim() -> None:
        view.map(policy.heap_base + policy.mapped, policy.page)
        policy.chunks.grow_region(policy.heap_base, policy.page)
        policy.mapped += policy.page

    broken(policy, grow_without_trim, "trim left a wholly free page")


def test_on_demand_catches_stats_that_disagree() -> None:
    policy, _ = build(OnDemandAllocator)
    policy.malloc(1000)
    broken(policy, lambda: setattr(policy, "bytes_in_use", 999), "bytes_in_use")


# -- buddy ----------------------------------------------------------------------------------
def test_buddy_catches_free_buddies_not_merged() -> None:
    policy, _ = build(BuddyAllocator, arena=64 * KiB)
    address = policy.malloc(512)
    assert address is not None

    def free_without_merging() -> None:
        order, base = policy.in_use.pop(address)
        del policy.requested[address]
        policy.bytes_in_use -= policy.min_block << order
        policy.num_frees += 1
        policy.free_lists[order][address] = base
        policy.nonempty |= 1 << order

    broken(policy, free_without_merging, "free buddies")


def test_buddy_catches_a_lost_block_and_wrong_stats() -> None:
    policy, _ = build(BuddyAllocator, arena=64 * KiB)
    address = policy.malloc(512)
    assert address is not None
    buddy = address + 512

    def lose_the_buddy() -> None:
        del policy.free_lists[0][buddy]
        policy.nonempty &= ~1

    broken(policy, lose_the_buddy, "no block at")
    policy, _ = build(BuddyAllocator, arena=64 * KiB)
    policy.malloc(512)
    broken(policy, lambda: setattr(policy, "pool_bytes", 0), "pool_bytes")


# -- CuPy -----------------------------------------------------------------------------------
def cupy_with_a_free_rest() -> tuple[CuPyPoolAllocator, int, int]:
    """A CuPy pool whose one block is a 512-byte chunk in use and a free rest: (policy, a, rest)."""
    policy, _ = build(CuPyPoolAllocator)
    whole = policy.malloc(64 * KiB)
    assert whole is not None
    policy.free(whole)
    address = policy.malloc(512)
    assert address == whole
    return policy, address, address + 512


def test_cupy_catches_a_free_chunk_left_out_of_its_arena() -> None:
    policy, _, rest = cupy_with_a_free_rest()
    arena = policy.arenas[0]
    size = policy.size_of[rest]
    broken(policy, lambda: arena.remove(size, policy.cid_of[rest] << CID_SHIFT | rest),
           "in no arena")


def test_cupy_catches_two_neighbouring_free_chunks_not_merged() -> None:
    policy, _, rest = cupy_with_a_free_rest()
    arena = policy.arenas[0]

    def split_the_rest() -> None:
        size = policy.size_of[rest]
        arena.remove(size, policy.cid_of[rest] << CID_SHIFT | rest)
        upper = rest + 512
        policy.size_of[rest] = 512
        policy.size_of[upper] = size - 512
        policy.prev_of[upper], policy.next_of[upper] = rest, NONE
        policy.next_of[rest] = upper
        policy.cid_of[upper] = policy._next_cid
        policy._next_cid += 1
        for chunk in (rest, upper):
            part = policy.size_of[chunk]
            arena.add(part, policy.cid_of[chunk] << CID_SHIFT | chunk)

    broken(policy, split_the_rest, "neighbouring free chunks")


def test_cupy_catches_shared_ids_and_wrong_totals() -> None:
    policy, address, rest = cupy_with_a_free_rest()
    broken(policy, lambda: policy.cid_of.__setitem__(address, policy.cid_of[rest]),
           "share a creation id")
    policy, *_ = cupy_with_a_free_rest()
    broken(policy, lambda: setattr(policy, "_total_bytes", policy._total_bytes + 512),
           "total_bytes")


# -- cuda-async -----------------------------------------------------------------------------
def test_cuda_async_catches_a_free_chunk_in_no_index_and_a_wrong_free_region() -> None:
    policy, _ = build(CudaAsyncAllocator)
    address = policy.malloc(4 * KiB)
    assert address is not None
    rest = address + 4 * KiB
    broken(policy, lambda: policy.shared.remove(policy.size_of[rest], rest), "in no index")
    policy, _ = build(CudaAsyncAllocator)
    address = policy.malloc(4 * KiB)
    broken(policy, lambda: policy.free_regions.add(address), "free_regions")


def test_cuda_async_sync_none_catches_an_owner_table_that_disagrees() -> None:
    policy, _ = build(CudaAsyncAllocator, sync="none")
    address = policy.malloc(4 * KiB, stream=1)
    assert address is not None
    policy.free(address)                     # the stream's own free memory now
    assert policy.owner_of[address] == 1
    broken(policy, lambda: policy.owner_of.__setitem__(address, SHARED), "owner table")


# -- PyTorch --------------------------------------------------------------------------------
def pytorch_with_a_hole(**params: Any) -> tuple[PyTorchCachingAllocator, int]:
    """Three 1,000-byte blocks of one small segment, the middle one freed: (policy, hole)."""
    policy, _ = build(PyTorchCachingAllocator, **params)
    blocks = [policy.malloc(1000) for _ in range(3)]
    assert None not in blocks
    hole = blocks[1]
    assert hole is not None
    policy.free(hole)
    return policy, hole


def test_pytorch_catches_a_free_block_left_out_of_its_free_list() -> None:
    policy, hole = pytorch_with_a_hole()
    keys = policy.pools.free_lists[policy.pools.pool_key[hole]]
    broken(policy, lambda: keys.remove(policy.pools.size[hole] << SHIFT | hole),
           "in no free list")


def test_pytorch_catches_two_neighbouring_free_blocks_not_merged() -> None:
    policy, hole = pytorch_with_a_hole()

    def split_the_hole() -> None:
        keys = policy.pools.free_lists[policy.pools.pool_key[hole]]
        keys.remove(policy.pools.size[hole] << SHIFT | hole)
        upper = hole + 512
        policy.pools.size[upper] = policy.pools.size[hole] - 512
        policy.pools.size[hole] = 512
        policy.pools.prev[upper], policy.pools.next[upper] = hole, policy.pools.next[hole]
        policy.pools.prev[policy.pools.next[hole]] = upper
        policy.pools.next[hole] = upper
        policy.pools.pool_key[upper] = policy.pools.pool_key[hole]
        insort(keys, 512 << SHIFT | hole)
        insort(keys, policy.pools.size[upper] << SHIFT | upper)

    broken(policy, split_the_hole, "neighbouring free blocks")


def test_pytorch_catches_counters_that_disagree() -> None:
    for counter, invariant in (("inactive_split", "inactive_split"),
                               ("bytes_in_use", "bytes_in_use"),
                               ("pool_bytes", "reserved"), ("num_segments", "segment count"),
                               ("requested", "requested bytes")):
        policy, _ = pytorch_with_a_hole()
        owner = policy if counter in ("bytes_in_use", "requested") else policy.counters
        broken(policy, lambda o=owner, c=counter: setattr(o, c, getattr(o, c) + 512), invariant)
    policy, _ = pytorch_with_a_hole()
    broken(policy, lambda: setattr(policy.counters, "peak_pool_bytes", 0), "peak")


def test_pytorch_catches_a_free_block_without_its_gc_stamp() -> None:
    policy, hole = pytorch_with_a_hole(garbage_collection_threshold=0.5,
                                       per_process_memory_fraction=0.5)
    broken(policy, lambda: policy.pools.gc_stamps.pop(hole), "GC stamp")


def test_pytorch_expandable_segments_catch_unmapped_bookkeeping_that_disagrees() -> None:
    policy, _ = pytorch_with_a_hole(expandable_segments=True)
    assert policy.expandable_segments is not None
    addresses = next(v for v in policy.expandable_segments.unmapped_lists.values() if v)
    broken(policy, addresses.pop, "unmapped list")
    policy, _ = pytorch_with_a_hole(expandable_segments=True)
    assert policy.expandable_segments is not None
    broken(policy, policy.expandable_segments.bases.clear, "expandable bases")
    policy, _ = pytorch_with_a_hole(expandable_segments=True)
    unmapped = next(iter(policy.pools.unmapped))
    broken(policy, lambda: policy.pools.requested.__setitem__(unmapped, 1), "unmapped")


def test_pytorch_check_holds_for_a_seeded_state_and_after_it() -> None:
    policy, view = build(PyTorchCachingAllocator, capacity=1 << 30)
    base = 1 << 40

    def block(address: int, size: int, state: str = "inactive", requested: int = 0) -> dict:
        return {"address": address, "size": size, "state": state, "requested_size": requested}

    large = {"address": base, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
             "blocks": [block(base, 4 * MiB, "active_allocated", 4 * MiB - 100),
                        block(base + 4 * MiB, 6 * MiB), block(base + 10 * MiB, 2 * MiB),
                        block(base + 12 * MiB, 8 * MiB, "active_pending_free", 8 * MiB)]}
    small = {"address": base + 64 * MiB, "total_size": 2 * MiB, "stream": 0,
             "segment_type": "small", "blocks": [block(base + 64 * MiB, 2 * MiB)]}
    mapping = policy.seed([small, large])
    policy.check()
    got = policy.malloc(8 * MiB)
    assert got is not None
    policy.check()
    for address in (got, *mapping.values()):
        policy.free(address)
        policy.check()
    policy.empty_cache()
    policy.check()
    assert view.reserved == 0
