"""A policy's own segment loop replays exactly what the engine's loop replays over that policy's
hot pair (issue 17): the stream-ordered pool's (policies/cuda_async_loop.py) and BFC's,
preallocate's and best-fit's (policies/chunk_loop.py). The same result and timeline, the same
per-event figures of the replay (peaks with their events, skipped frees, the first OOM,
samples), the same policy state and the same device counters — on random workloads with solo
and split chunks, zero-size allocs, frees of buffers never allocated, OOMs, stopping runs,
growth and BFC's garbage collection, every release threshold and a pending preallocation, over
segments of one event and of hundreds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from allocsim.policies import chunk_loop, cuda_async_loop, parse_policy, pytorch_loop
from allocsim.policies.base import Policy
from allocsim.policies.best_fit import BestFitAllocator
from allocsim.policies.bfc import BFCAllocator
from allocsim.policies.chunk_policy import ChunkPolicy
from allocsim.policies.cuda_async import CudaAsyncAllocator
from allocsim.policies.pytorch_caching import PyTorchCachingAllocator
from allocsim.sim.kernel import engine
from allocsim.sim.kernel.device import SimulatedDevice, resolve_device
from allocsim.sim.kernel.engine import ProcessReplay
from allocsim.traces.model import OP_ALLOC, Trace

MiB = 1 << 20
SETTINGS = ("cuda-async", "cuda-async:fraction=0.75", "cuda-async:release_threshold=24MiB",
            "cuda-async:fraction=0.5,preallocate=true", "cuda-async:chunk=4MiB,alignment=4096",
            "bfc", "bfc:allow_growth=false", "bfc:garbage_collection=true", "preallocate",
            "best-fit", "best-fit:page=4MiB,alignment=512", "pytorch",
            "pytorch:expandable_segments=true")


def random_events(seed: int, n: int = 3000) -> Trace:
    """Allocs of every kind of size the pool treats apart — small ones that split a chunk,
    whole multiples of the 2 MiB chunk (a region of their own), a few of size 0 — on two
    streams, freed in random order; a few frees of ids never allocated."""
    rng = np.random.default_rng(seed)
    events: list[tuple] = []
    live: list[tuple[int, int]] = []
    next_id = 1
    for time in range(n):
        roll = rng.random()
        if roll < 0.01:
            events.append((time, "free", 10**9 + time, None))
        elif live and (roll < 0.45 or len(live) > 60):
            buffer, size = live.pop(int(rng.integers(len(live))))
            events.append((time, "free", buffer, size))
        else:
            kind = rng.integers(5)
            size = (0 if kind == 0 and rng.random() < 0.1
                    else int(rng.integers(1, 4096)) if kind <= 1
                    else int(rng.integers(4096, 3 * MiB)) if kind == 2
                    else int(rng.integers(1, 4)) * 2 * MiB if kind == 3
                    else int(rng.integers(3 * MiB, 9 * MiB)))
            events.append((time, "alloc", next_id, size, int(rng.integers(2))))
            live.append((next_id, size))
            next_id += 1
    return Trace.from_events(events, name=f"random-{seed}")


def replay_state(trace: Trace, spec: str, capacity: str, *, own_loop: bool,
                 stop_on_oom: bool) -> dict[str, Any]:
    """Everything a replay leaves behind, by the pool's segment loop or by the engine's loop
    over the hot pair (the loop declined). Advances in uneven steps, as shared runs and
    min-capacity's probes do."""
    profile = resolve_device("t4-16g", capacity)
    run = ProcessReplay(trace, parse_policy(spec), SimulatedDevice(profile),
                        stop_on_oom=stop_on_oom, call_log=False)
    pool = run.policy
    segments = [0]
    if own_loop:
        loop = pool.segment_loop()
        assert loop is not None

        def counted(*args: Any) -> Any:
            replayed = loop(*args)
            segments[0] += replayed is not None
            return replayed

        pool.segment_loop = lambda: counted          # type: ignore[method-assign]
    else:
        pool.segment_loop = lambda: None             # type: ignore[method-assign]
    step = 0
    while run.next_index < run.n and not run.stopped:
        step = step % 5 + 1
        run.advance(min(run.n, run.next_index + step * 37))
    pool.check()
    view = run.view
    result = run.result("t4-16g") if not (stop_on_oom and run.stopped) else None
    return {
        "segments": segments[0],
        "result": None if result is None else result.to_json_dict(timeline=True),
        "replay": {name: getattr(run, name) for name in (
            "next_index", "stopped", "allocated", "peak_allocated", "peak_allocated_event",
            "in_use_at_peak_allocated", "reserved_at_peak", "peak_reserved_event",
            "in_use_at_peak_reserved", "ooms", "first_oom", "samples", "live")},
        "skipped": list(run.skipped_events),
        "buckets": [a.tolist() for a in run.buckets.arrays()] + [run.buckets.top,
                                                                  run.buckets.first_call],
        "policy": policy_state(pool),
        "device": (view.calls, view.reserved, view.peak_reserved, view.cost_s, view.mallocs,
                   view.frees, view.failed_mallocs),
    }


def policy_state(policy: Policy) -> tuple:
    """Its stats and blocks, every plain number it keeps, its free index's keys, its regions
    and requests (and the pool's free regions); PyTorch's segments, free lists and block
    tables."""
    numbers = {name: value for name, value in vars(policy).items()
               if isinstance(value, int) and not isinstance(value, bool)}
    if isinstance(policy, PyTorchCachingAllocator):
        return (policy.stats(), policy.segments(), list(policy.blocks()), numbers,
                {pool: list(keys) for pool, keys in policy._free.items()},
                *(dict(getattr(policy, table)) for table in ("_size", "_prev", "_next", "_home",
                                                             "_req")))
    assert isinstance(policy, (ChunkPolicy, CudaAsyncAllocator))
    chunks = policy.chunks
    extra = (sorted(policy.free_regions),) if isinstance(policy, CudaAsyncAllocator) else ()
    return (policy.stats(), list(policy.blocks()), numbers, list(chunks.free_index.keys()),
            dict(chunks.regions), dict(chunks.requested), *extra)


@pytest.fixture(params=[engine.TIMELINE_POINTS, 3], ids=["segments-of-one-event", "long"])
def timeline_points(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The default timeline (segments of one or two events on these short traces) and one of
    three buckets (segments of hundreds of events)."""
    monkeypatch.setattr(engine, "TIMELINE_POINTS", request.param)
    return int(request.param)


@pytest.mark.parametrize("spec", SETTINGS)
@pytest.mark.parametrize("capacity,stop_on_oom", [("1GiB", False), ("48MiB", False),
                                                  ("48MiB", True)])
@pytest.mark.parametrize("seed", range(3))
def test_the_segment_loop_replays_what_the_engines_loop_does(
        spec: str, capacity: str, stop_on_oom: bool, seed: int, timeline_points: int) -> None:
    trace = random_events(seed)
    own = replay_state(trace, spec, capacity, own_loop=True, stop_on_oom=stop_on_oom)
    engines = replay_state(trace, spec, capacity, own_loop=False, stop_on_oom=stop_on_oom)
    assert own.pop("segments") > 0 and engines.pop("segments") == 0
    assert own == engines


def test_the_workloads_reach_every_path_of_the_loop() -> None:
    """The cases above are only as good as what they reach: OOMs (and stops), skipped frees,
    releases at a free, a threshold's trim, solo regions and splits."""
    trace = random_events(0)
    tight = replay_state(trace, "cuda-async", "48MiB", own_loop=True, stop_on_oom=False)
    assert tight["replay"]["ooms"] > 0 and tight["skipped"]
    stopped = replay_state(trace, "cuda-async", "48MiB", own_loop=True, stop_on_oom=True)
    assert stopped["replay"]["stopped"] and stopped["result"] is None
    released = replay_state(trace, "cuda-async", "1GiB", own_loop=True, stop_on_oom=False)
    assert released["device"][5] > 0                    # unmaps at frees
    kept = replay_state(trace, "cuda-async:release_threshold=24MiB", "1GiB", own_loop=True,
                        stop_on_oom=False)
    assert 0 < kept["device"][5] < released["device"][5]     # the trim keeps 24 MiB
    sizes = trace.column("size")
    assert (sizes % (2 * MiB) == 0).any() and ((sizes % (2 * MiB)) != 0).any()


def test_the_pool_offers_its_loop_only_for_its_own_hot_pair() -> None:
    """sync=none has no loop; nor does a pool whose malloc or free was replaced on the
    instance (a test's general path, a profiler's wrapper): those must be what runs."""
    view = SimulatedDevice(resolve_device("t4-16g")).view(0)
    assert CudaAsyncAllocator(view).segment_loop() is not None
    assert CudaAsyncAllocator(view, sync="none").segment_loop() is None
    general = CudaAsyncAllocator(view)
    del general.malloc, general.free
    assert general.segment_loop() is None
    wrapped = CudaAsyncAllocator(view)
    inner = wrapped.free
    wrapped.free = lambda address: inner(address)    # type: ignore[method-assign]
    assert wrapped.segment_loop() is None


def test_the_engine_keeps_its_own_loop_where_it_logs_or_stops_at_calls() -> None:
    """A device-call log (the validator's, stop_on_oom's) and stop_on_call (shared runs) need
    the engine's loop: the pool's is not asked."""
    trace = random_events(1, 400)
    profile = resolve_device("t4-16g", "1GiB")
    asked: list[dict] = []
    for kwargs, stop_on_call in (({"call_log": True}, False), ({"stop_on_oom": True}, False),
                                 ({}, True)):
        run = ProcessReplay(trace, parse_policy("cuda-async"), SimulatedDevice(profile),
                            **kwargs)
        run.policy.segment_loop = lambda: asked.append({})   # type: ignore[method-assign]
        while run.next_index < run.n:
            run.advance(run.n, stop_on_call=stop_on_call)
    assert not asked


def test_the_loop_reads_the_traces_op_codes() -> None:
    """policies/ may not import traces/: the loop names the alloc op code itself."""
    assert cuda_async_loop.OP_ALLOC == OP_ALLOC


def test_the_chunk_policies_workloads_reach_growth_ooms_and_garbage_collection() -> None:
    trace = random_events(0)
    grown = replay_state(trace, "bfc", "1GiB", own_loop=True, stop_on_oom=False)
    assert grown["device"][4] > 1 and grown["replay"]["ooms"] == 0      # regions added
    tight = replay_state(trace, "bfc", "48MiB", own_loop=True, stop_on_oom=False)
    assert tight["replay"]["ooms"] > 0 and tight["skipped"]
    collected = replay_state(random_events(2), "bfc:garbage_collection=true", "48MiB",
                             own_loop=True, stop_on_oom=False)
    assert collected["device"][5] > 0                                   # regions freed
    heap = replay_state(trace, "best-fit", "1GiB", own_loop=True, stop_on_oom=False)
    assert heap["device"][4] > 1                                        # pages mapped


def test_the_chunk_policies_offer_their_loop_only_for_their_own_hot_pair() -> None:
    """Not with best-fit's trim (a free of its own), nor an alignment that is not a power of
    two (no written-out malloc), nor a general path put on the instance (min-capacity's
    region watch drops the instance's malloc; the tests' general free)."""
    view = SimulatedDevice(resolve_device("t4-16g")).view(0)
    assert BFCAllocator(view).segment_loop() is not None
    assert BestFitAllocator(view).segment_loop() is not None
    assert BestFitAllocator(view, trim=True).segment_loop() is None
    assert BestFitAllocator(view, alignment=384).segment_loop() is None
    watched = BFCAllocator(view)
    del watched.malloc
    assert watched.segment_loop() is None
    general_free = BFCAllocator(view)
    general_free.free = general_free.free_general      # type: ignore[method-assign]
    assert general_free.segment_loop() is None


def test_the_chunk_loop_reads_the_traces_op_codes() -> None:
    assert chunk_loop.OP_ALLOC == OP_ALLOC


def test_the_chunk_loop_splits_when_the_slack_reaches_the_threshold_exactly() -> None:
    """BFC's ShouldSplitChunk: a chunk under twice the request is split when its slack is at
    least the threshold. One 4 MiB region (made by a first request and free, so that the loop
    itself finds the chunk), threshold 1 MiB: 3 MiB leaves exactly 1 MiB, which the split makes
    a free chunk for the next request (random workloads never hit the edge)."""
    trace = Trace.from_events([(0, "alloc", 1, 256), (1, "free", 1, 256),
                               (2, "alloc", 2, 3 * MiB), (3, "alloc", 3, MiB),
                               (4, "free", 2, 3 * MiB), (5, "free", 3, MiB)])
    spec = "bfc:allow_growth=false,memory_limit=4MiB,fragmentation_fraction=0.25"
    own = replay_state(trace, spec, "1GiB", own_loop=True, stop_on_oom=False)
    assert own["replay"]["ooms"] == 0
    assert own.pop("segments") > 0
    engines = replay_state(trace, spec, "1GiB", own_loop=False, stop_on_oom=False)
    engines.pop("segments")
    assert own == engines


def test_pytorch_offers_its_loop_only_for_its_defaults_hot_pair() -> None:
    """Only with memory_stats() not to be read (the engine's case) and PyTorch's defaults, with
    or without expandable segments; not for other settings (the general path runs), nor when
    a general path is put back on the instance."""
    view = SimulatedDevice(resolve_device("t4-16g")).view(0)

    def built(**params: Any) -> PyTorchCachingAllocator:
        allocator = PyTorchCachingAllocator(view, **params)
        allocator.keep_memory_stats(False)
        return allocator

    assert built().segment_loop() is not None
    assert built(expandable_segments=True).segment_loop() is not None
    assert PyTorchCachingAllocator(view).segment_loop() is None       # memory_stats() kept
    assert built(max_split_size_mb=40).segment_loop() is None
    assert built(roundup_power2_divisions="4").segment_loop() is None
    general = built()
    del general.malloc, general.free
    assert general.segment_loop() is None


def test_pytorchs_workloads_reach_new_segments_and_the_release_path() -> None:
    trace = random_events(0)
    tight = replay_state(trace, "pytorch", "48MiB", own_loop=True, stop_on_oom=False)
    assert tight["replay"]["ooms"] > 0 and tight["skipped"]
    assert tight["device"][5] > 0                    # release_cached_blocks freed segments
    pages = replay_state(trace, "pytorch:expandable_segments=true", "48MiB", own_loop=True,
                         stop_on_oom=False)
    assert pages["replay"]["ooms"] > 0 and pages["device"][5] > 0   # pages unmapped


def test_the_pytorch_loop_reads_the_traces_op_codes() -> None:
    assert pytorch_loop.OP_ALLOC == OP_ALLOC


def both_loops(events: list[tuple], spec: str, capacity: str = "1GiB") -> dict[str, Any]:
    """The replay by the policy's loop, checked equal to the engine's; the loop's."""
    trace = Trace.from_events(events)
    own = replay_state(trace, spec, capacity, own_loop=True, stop_on_oom=False)
    engines = replay_state(trace, spec, capacity, own_loop=False, stop_on_oom=False)
    assert own.pop("segments") > 0
    engines.pop("segments")
    assert own == engines
    return own


def test_pytorchs_loop_keeps_a_large_block_whole_when_exactly_1_mib_would_remain() -> None:
    """should_split, large pool: remaining > 1 MiB. A 20 MiB segment (made by a first 2 MiB
    request and free) serves 19 MiB whole; its 1 MiB slack stays inside the block."""
    own = both_loops([(0, "alloc", 1, 2 * MiB), (1, "free", 1, 2 * MiB),
                      (2, "alloc", 2, 19 * MiB)], "pytorch")
    assert [(size, in_use) for _, size, in_use in own["policy"][2]] == [(20 * MiB, True)]


def test_pytorchs_expandable_walk_stays_on_a_tie() -> None:
    """get_free_block's expandable walk moves to the next bigger block only while its
    expandable size is smaller. On a 64 MiB device a large pool's range is 4 pages of 20 MiB.
    24 MiB freed at the bottom (a block in use behind it) ties with the 4 MiB free at the top
    of the mapped pages plus the 20 MiB unmapped behind them: the walk stays on the 4 MiB one."""
    own = both_loops([(0, "alloc", 1, 24 * MiB), (1, "alloc", 2, 16 * MiB),
                      (2, "alloc", 3, 16 * MiB), (3, "free", 1, 24 * MiB),
                      (4, "alloc", 4, 3 * MiB)], "pytorch:expandable_segments=true", "64MiB")
    blocks = own["policy"][2]
    base = blocks[0][0]
    assert [((address - base) // MiB, size // MiB, in_use) for address, size, in_use in blocks
            ] == [(0, 24, False), (24, 16, True), (40, 16, True), (56, 3, True), (59, 1, False)]
