"""When a run repeats itself: the decision state that shows it, and a repeating run's whole
result without running its tail.

A training loop's trace repeats a step (sim/questions/capacity/period.py finds the period,
``length`` events from ``start``). A run of it settles into repeating its own: if before event
``b`` and before ``b + length`` it holds the same decision state (the policy's structures,
without its statistics; no device call between — or, for a policy whose decisions read
addresses only through their order, the state named by place and the same memory handed out)
and the buffers the later events name sit at the same places, the run from ``b + length``
repeats the run from ``b`` event for event, OOMs included (period.py's argument). Two uses:

- min-capacity's probes stop there: a run that repeated completes
  (sim/questions/capacity/oracle.py);
- a whole result (:func:`repeated_state`; :class:`~allocsim.sim.questions.shared_runs.SharedRuns`'
  ``replay``, tune's settings): the core runs until it repeats, sees that by itself (its
  decision rows, below), records what each event of the last period did and copies that
  period to the end (native/src/engine.hpp, ``Engine::tape`` and ``Engine::repeat``) instead
  of running the policy there. The samples, buckets, peaks, device figures and allocated
  bytes are the whole replay's (they repeat with the run); the policy's statistics at the
  end are read where the run stood a whole number of periods earlier, its counts grown by one
  period's each period, its peaks those of ``b + length`` (a repeat reaches nothing new).
  Only runs whose period makes no device call are copied so (the device's figures stand
  still); a run of the stream-ordered pool may repeat by place with a trim and a map every
  period, and is run whole.

tests/test_capacity_repeats.py holds each state to a trace whose events repeat while its runs do
not; tests/test_run_repeats.py holds the core's rows to the Python twin's and to its whole
decision state, and a copied result to the replay of every event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from allocsim.policies import PolicySpec
from allocsim.policies.base import Policy
from allocsim.policies.bfc import BFCAllocator, PreallocateAllocator
from allocsim.policies.cuda_async import CudaAsyncAllocator
from allocsim.policies.cupy_pool import ADDRESS_MASK as CUPY_ADDRESS_MASK
from allocsim.policies.cupy_pool import CuPyPoolAllocator
from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.sim.kernel.engine import ProcessReplay
from allocsim.sim.kernel.native import NativeRun
from allocsim.sim.questions.capacity.period import Period
from allocsim.sim.questions.capacity.regions import bfc_state


def _cupy_streams(pool: CuPyPoolAllocator) -> tuple[dict[int, int], dict[int, int]]:
    """Each free chunk's and each chunk in use's arena, as its stream (address → stream)."""
    stream_of = {id(arena): stream for stream, arena in pool.arenas.items()}
    free = {tie & CUPY_ADDRESS_MASK: stream for stream, arena in pool.arenas.items()
            for _, tie in arena.keys()}
    in_use = {address: stream_of[id(arena)] for address, arena in pool.in_use.items()}
    return free, in_use


def _cupy_state(policy: Policy) -> object:
    """Everything CuPy's pool decides from (policies/cupy_pool.py): chunk sizes and links, the
    stream of each chunk's arena (free or in use), the cudaMalloc'd blocks, total bytes and the
    limit, and the creation ids only as their order (ties go to the older chunk; a new chunk
    is younger than all). Not: the statistics, the requested sizes."""
    pool: CuPyPoolAllocator = policy                                # type: ignore[assignment]
    free, in_use = _cupy_streams(pool)
    age = {address: rank for rank, (_, address) in
           enumerate(sorted((cid, address) for address, cid in pool.cid_of.items()))}
    return (dict(pool.size_of), dict(pool.prev_of), dict(pool.next_of), age, free, in_use,
            dict(pool.held), pool.total_bytes(), pool.get_limit(), sorted(pool.arenas))


def _pytorch_state(policy: Policy) -> object:
    """Everything PyTorch's caching allocator decides from (policies/pytorch/*.py): each
    block's size, pool key and state (allocated, free and mapped, unmapped; the links follow
    from the addresses and sizes within the segments, the free and unmapped lists from the
    states), the segments, the reserved bytes, the order of the free lists' pools (the release
    and garbage-collection passes walk them in it) and, with garbage collection on, the age of
    each free block (its pool's searches since it entered; an allocated block's old stamp is
    never read). Not: the statistics, the requested sizes. The settings are the run's own."""
    pool: PyTorchCachingAllocator = policy                          # type: ignore[assignment]
    pools = pool.pools
    blocks = {address: (block.size, block.pool_key, min(block.requested, 1))
              for address, block in pools.record.items()}
    segments = [(s.base, s.size, s.stream, s.small, s.expandable, s.page)
                for s in pools.segment_map.values()]
    ages: dict[int, int] = {}
    if pools.gc_on:
        searches = pools.gc_searches
        ages = {address: searches[state[1] & 1] - pools.gc_stamps[address]
                for address, state in blocks.items() if state[2] == 0}
    return blocks, segments, pool.pool_bytes, tuple(pools.free_lists), ages


def _cuda_async_places(policy: Policy) -> tuple[object, dict[int, object]]:
    """Everything the stream-ordered pool decides from (policies/cuda_async.py), with every
    address named by its place — (the rank of its region among the regions by address, its
    offset there) — and that naming (chunk address → place). Its decisions read addresses only
    through their order: best fit breaks ties by the lower address, a trim releases the highest
    regions first, and a fresh mapping (the device's next virtual range) lies above every
    region held; regions never overlap. So two states equal by place make the same decisions,
    wherever the regions lie. The state: each chunk's size and whether it is in use (links and
    the shared index follow within the regions), the regions' sizes in address order, the free
    regions, with ``sync=none`` each free chunk's owner, each live chunk's stream and the order
    of the owners' indexes (a synchronisation walks them in it), and whether preallocation is
    still to come. The threshold is the run's own. Not: the statistics, the requested sizes."""
    pool: CudaAsyncAllocator = policy                               # type: ignore[assignment]
    regions = pool.regions
    rank = {base: number for number, base in enumerate(sorted(regions))}
    places: dict[int, object] = {}
    chunks: dict[object, tuple[int, bool]] = {}
    for base in rank:
        place = rank[base]
        chunk = pool.chunks.record[base]
        ring = chunk.prev
        while chunk is not ring:
            address = chunk.address
            places[address] = name = (place, address - base)
            chunks[name] = (chunk.size, not chunk.key)
            chunk = chunk.next
    state = (chunks, [regions[base] for base in rank],
             frozenset(rank[base] for base in pool.free_regions),
             {places[address]: owner for address, owner in pool.owner_of.items()},
             {places[address]: stream for address, stream in pool.stream_of.items()},
             tuple(pool.indexes), pool.preallocate_pending)
    return state, places


# A policy's decision state, per class: two states equal here make the same decisions on the
# same events. Classes absent here and from ORDER_ONLY_STATE are never seen to repeat.
DECISION_STATE: dict[type[Policy], Callable[[Policy], object]] = {
    BFCAllocator: bfc_state,
    PreallocateAllocator: bfc_state,
    CuPyPoolAllocator: _cupy_state,
    PyTorchCachingAllocator: _pytorch_state,
}

# The same, for a policy whose decisions read its addresses only through their order: its
# state and a naming of its addresses by place (see _cuda_async_places), so that a run that
# maps and unmaps memory at fresh addresses every period can still be seen to repeat.
ORDER_ONLY_STATE: dict[type[Policy], Callable[[Policy], tuple[object, dict[int, object]]]] = {
    CudaAsyncAllocator: _cuda_async_places,
}


def moment(run: ProcessReplay) -> tuple[object, object, dict[int, object]]:
    """What must be equal at two boundaries for ``run`` to repeat: the policy's decision
    state, the device's side of it, and the live buffers' places. With an absolute state
    (:data:`DECISION_STATE`) the device's side is its call count (no call in between: its
    memory and the next fresh address stay as they were) and a buffer's place its address;
    with an order-only state (:data:`ORDER_ONLY_STATE`) the device's side is the memory it has
    handed out and a buffer's place the policy's order-only name for its address, so a period
    that maps and unmaps memory at fresh addresses can repeat."""
    state_of = DECISION_STATE.get(type(run.policy))
    if state_of is not None:
        return state_of(run.policy), run.view.calls, dict(run.live)
    state, places = ORDER_ONLY_STATE[type(run.policy)](run.policy)
    device = (run.view.device.used, run.view.reserved)
    return state, device, {buffer: places[address] for buffer, address in run.live.items()}


def knows(policy_class: type) -> bool:
    """Whether a run of ``policy_class`` can be seen to repeat (its decision state is known)."""
    return policy_class in DECISION_STATE or policy_class in ORDER_ONLY_STATE


# -- the core's own check -------------------------------------------------------------------
# A run in the core shows its decision state as rows (native/src: each policy's
# decision_rows), one per chunk or block: address, size, kind (1 in use, 0 free, -1 unmapped)
# and two of the policy's own. Only what a stretch with no device call can change is in them:
# the regions, segments, blocks held, pool and limits stay as they are without a call (each
# is made, grown or dropped by one), and a repeat is looked for only where the device made no
# call in between (an absolute state's condition). So two boundaries a period apart with the
# same calls and the same rows hold the same decision state (DECISION_STATE's), which
# tests/test_run_repeats.py holds rule for rule: the core's rows equal the Python twin's
# (chunk_rows, pytorch_rows, cupy_rows) after every event, and over every stretch without a
# call the Python state changes exactly when its rows do. A chunk in use whose buffer's id
# was taken again while it was live (the trace's leak) is in no row of the core's: it is never
# freed, so nothing it holds is ever decided on.
# The stream-ordered pool's rows (place_rows, cuda_async_rows) are its whole order-only state
# by place (ORDER_ONLY_STATE's), regions included, and its repeat is checked as moment()
# checks it: the same rows and the same memory handed out, device calls or not.
ROW_WIDTH = 5


def chunk_rows(policy: Policy) -> np.ndarray:
    """BFC's and preallocate's rows (ChunkPolicy::decision_rows' twin): each chunk's address,
    size and whether it is in use."""
    chunks = policy.chunks                                         # type: ignore[attr-defined]
    in_use = chunks.in_use
    return _rows([(address, size, int(address in in_use), 0, 0)
                  for address, size in chunks.size.items()])


def pytorch_rows(policy: Policy) -> np.ndarray:
    """PyTorch's rows (PyTorchPolicy::decision_rows' twin): each block's address, size, state
    (1 allocated, 0 free, -1 unmapped), pool key and, with garbage collection on, a free
    block's age (its pool kind's searches since it became free)."""
    pools = policy.pools                                           # type: ignore[attr-defined]
    rows = []
    for address, block in pools.record.items():
        kind = min(block.requested, 1)
        age = 0
        if pools.gc_on and kind == 0:
            age = pools.gc_searches[block.pool_key & 1] - pools.gc_stamps[address]
        rows.append((address, block.size, kind, block.pool_key, age))
    return _rows(rows)


def cupy_rows(policy: Policy) -> np.ndarray:
    """CuPy's rows (CuPyPolicy::decision_rows' twin): each chunk's address, size, whether it
    is in use, its arena's stream and its age (the rank of its creation id: ties go to the
    older chunk)."""
    pool: CuPyPoolAllocator = policy                                # type: ignore[assignment]
    free, in_use = _cupy_streams(pool)
    rows = [(address, size, int(address in in_use),
             in_use[address] if address in in_use else free[address], pool.cid_of[address])
            for address, size in pool.size_of.items()]
    return _ranked_ages(_rows(rows))


def cuda_async_rows(policy: Policy) -> np.ndarray:
    """The stream-ordered pool's rows (CudaAsyncPolicy::place_rows' twin), its whole decision
    state named by place (:func:`_cuda_async_places`): per chunk its region's rank among the
    regions by address, its offset there, its size, in use (1) or free (0) and, with
    ``sync=none``, a free chunk's owner (SHARED or a stream) or a chunk in use's stream; then
    a row per stream's own index, in the order made (-1, its number, its stream, 2, 0); and
    (-2, 0, 0, 3, 0) while preallocation is to come. The regions' sizes and which are wholly
    free follow from the chunks."""
    pool: CudaAsyncAllocator = policy                               # type: ignore[assignment]
    streams = not pool.sync_on_free
    rows = []
    for rank, base in enumerate(sorted(pool.regions)):
        chunk = pool.chunks.record[base]
        ring = chunk.prev
        while chunk is not ring:
            address, in_use = chunk.address, not chunk.key
            extra = 0
            if streams:
                extra = pool.stream_of[address] if in_use else pool.owner_of[address]
            rows.append((rank, address - base, chunk.size, int(in_use), extra))
            chunk = chunk.next
    rows += [(-1, number, stream, 2, 0) for number, stream in enumerate(pool.indexes) if number]
    if pool.preallocate_pending:
        rows.append((-2, 0, 0, 3, 0))
    return _by_place(np.array(rows, dtype=np.int64).reshape(-1, ROW_WIDTH))


def _by_place(rows: np.ndarray) -> np.ndarray:
    """Place rows in order: by rank, then offset."""
    return rows[np.lexsort((rows[:, 1], rows[:, 0]))]


def _rows(rows: list[tuple[int, int, int, int, int]]) -> np.ndarray:
    """Rows as an array, by address."""
    array = np.array(rows, dtype=np.int64).reshape(-1, ROW_WIDTH)
    return array[np.argsort(array[:, 0], kind="stable")]


def _ranked_ages(rows: np.ndarray) -> np.ndarray:
    """The last column's creation ids as their ranks (only their order decides)."""
    ranked = rows.copy()
    ranked[np.argsort(rows[:, 4], kind="stable"), 4] = np.arange(len(rows))
    return ranked


# The Python twin of each policy's rows, per class (the policies whose repeat the core checks).
PYTHON_ROWS: dict[type[Policy], Callable[[Policy], np.ndarray]] = {
    BFCAllocator: chunk_rows,
    PreallocateAllocator: chunk_rows,
    CuPyPoolAllocator: cupy_rows,
    PyTorchCachingAllocator: pytorch_rows,
    CudaAsyncAllocator: cuda_async_rows,
}


class CoreMoment(NamedTuple):
    """:func:`moment` of a run in the core (:func:`core_moment`), and its device calls."""

    rows: np.ndarray
    device: object                  # the call count; by place, the memory handed out
    live: dict[int, object]         # each live buffer's address; by place, (rank, offset)
    calls: int


def core_moment(run: NativeRun) -> CoreMoment | None:
    """:func:`moment` of a run in the core: its rows, the device's side (its call count, or
    for a policy whose rows are by place the memory it has handed out), each live buffer's
    address or place; with the device's call count. None for a policy without rows."""
    got = run.decision_state()
    if got is None:
        return None
    flat, calls, ids, addresses, used, reserved = got
    rows = np.asarray(flat).reshape(-1, ROW_WIDTH)
    family = run.config["family"]
    if family == "cuda-async":
        pairs = np.asarray(addresses).reshape(-1, 2).tolist()
        return CoreMoment(_by_place(rows), (int(used), int(reserved)),
                          dict(zip(ids.tolist(), map(tuple, pairs))), int(calls))
    rows = _rows(rows)                                              # type: ignore[arg-type]
    if family == "cupy":
        rows = _ranked_ages(rows)
    return CoreMoment(rows, int(calls), dict(zip(ids.tolist(), addresses.tolist())),
                      int(calls))


def core_repeats(period: Period, boundary: int, then: CoreMoment | None,
                 now: CoreMoment | None) -> bool:
    """Whether a run in the core repeats from ``boundary``: its :func:`core_moment` there
    (``then``) and a period later (``now``) hold the same rows and the same device side (no
    call between; by place, the same memory handed out), and the later events name their
    mirrors' buffers at the same addresses or places."""
    return (then is not None and now is not None and then.device == now.device
            and np.array_equal(then.rows, now.rows)
            and period.repeats(boundary, then.live, now.live))


def core_checks(policy_class: type) -> bool:
    """Whether a run of ``policy_class`` in the core can be seen to repeat by the core alone."""
    return policy_class in PYTHON_ROWS


def find_repeat(run: ProcessReplay, period: Period) -> int | None:
    """Advance ``run`` (a Python run of a policy :func:`knows`) boundary by boundary
    (``period.boundaries()``) until it repeats: the boundary ``b`` (the run then stands at
    ``b + period.length``). None where it ran out of memory first (``run.report.ooms``) or
    where no boundary showed a repeat."""
    for boundary in period.boundaries():
        run.advance(boundary)
        if run.report.ooms:
            return None
        then = moment(run)
        run.advance(boundary + period.length)
        if run.report.ooms:
            return None
        now = moment(run)
        if then[:2] == now[:2] and period.repeats(boundary, then[2], now[2]):
            return boundary
    return None


# The policy's statistics (PolicyStats' fields, as the core reports them) at a copied end:
# counts grow by one period's each period; peaks were reached by the end of the first copied
# period; the rest is the state's, read where the run stood a whole number of periods before
# its end.
_COUNTS = frozenset({"num_allocs", "num_frees", "num_ooms"})
_PEAKS = frozenset({"peak_bytes_in_use", "peak_pool_bytes"})
_NOW = frozenset({"bytes_in_use", "bytes_requested", "pool_bytes", "largest_free_block",
                  "free_blocks"})


def repeated_state(spec: PolicySpec, period: Period, run: NativeRun, *,
                   budget: int) -> dict[str, Any] | None:
    """The core's state at the end of a whole replay of a trace through ``spec`` with
    ``stop_on_oom``, its tail copied from a period (module docstring):
    :meth:`NativeRun.state`'s dict, as running every event leaves it. ``run`` is that replay
    in the core, opened and not yet advanced; the core alone sees it repeat. None where this
    does not apply: a policy without rows, a run that repeats with a device call in its period
    (by place), or a run that does not repeat within ``budget`` events or runs out of memory
    first — the caller replays it whole."""
    if not core_checks(spec.resolved().policy_class):
        return None
    length, n = period.length, run.n
    for boundary in period.boundaries():
        if boundary + length > budget:
            return None
        run.advance(boundary)
        then = core_moment(run) if not run.ooms else None
        if then is None:
            return None
        # Tape the period from here, noting the statistics at its start and where the run
        # will stand, a whole number of periods before its end, as at the end.
        at_boundary = run.state()["policy_stats"]
        run.tape(boundary + (n - boundary) % length, restart=True)
        at_mirror = run.state()["policy_stats"]
        run.tape(boundary + length)
        if run.ooms:
            return None
        now = core_moment(run)
        if core_repeats(period, boundary, then, now):
            break
    else:
        return None
    assert now is not None
    if now.calls != then.calls:
        # A run by place that repeats with device calls in its period (the stream-ordered
        # pool's trims and maps) makes them every period: the copy, which keeps the device's
        # figures still, never applies.
        return None
    if set(at_mirror) != _COUNTS | _PEAKS | _NOW:
        return None                             # statistics this module does not know how to copy
    if not run.repeat(length):
        raise RuntimeError(
            f"{spec}: the run repeats from event {boundary:,} every {length:,} events, but "
            "its tape is not that period (a defect)")
    at_end = run.state()
    after = at_end["policy_stats"]
    mirror = boundary + (n - boundary) % length
    periods = (n - mirror) // length
    merged = {}
    for name in at_mirror:
        if name in _COUNTS:
            merged[name] = at_mirror[name] + periods * (after[name] - at_boundary[name])
        elif name in _PEAKS:
            merged[name] = after[name]
        else:
            merged[name] = at_mirror[name]
    at_end["policy_stats"] = merged
    return at_end


__all__ = ["DECISION_STATE", "ORDER_ONLY_STATE", "PYTHON_ROWS", "ROW_WIDTH",
           "CoreMoment", "chunk_rows", "core_checks", "core_moment", "core_repeats",
           "cuda_async_rows", "cupy_rows", "find_repeat", "knows", "moment", "pytorch_rows",
           "repeated_state"]
