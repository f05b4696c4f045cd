"""The offline optimum's stand-in: place every buffer knowing the whole trace in advance.

What compile-time planning does (XLA's buffer assignment, openxla/xla
xla/service/heap_simulator/heap_simulator.cc, GlobalDecreasingSizeBestFitHeap): take buffers
from the largest down; give each the best-fitting gap — the smallest free address range, lowest
offset on ties — among the buffers already placed whose lifetimes overlap its own; if none
fits, put it on top. It is a plan, not a bound: the exact optimum is NP-hard (MiniMalloc solves
it exactly) and an online allocator can beat this heuristic (best fit did on a donation trace,
1.11 GiB against 1.18 GiB). The lower bound is the peak of live bytes (XLA's
NoFragmentationStatsHeap); the gap between this heap and it is what the heuristic, knowing the
future, could not save.

The placement itself is :func:`allocsim.traces.plan.plan_lifetimes` (pure numpy over
lifetimes, shared with the synthetic generators' ``pattern=jax``); this module adds the trace's
lifetimes and the plan as a run. Cost: O(B · P) vector work for B buffers and P placed buffers
overlapping in time (numpy does the inner loop); a 10k-buffer trace plans in well under a
second, 500k buffers take minutes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from allocsim.policies.units import round_up
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.results import RunResult, Timeline
from allocsim.traces.model import OP_ALLOC, Trace
from allocsim.traces.plan import best_gap, plan_lifetimes

OFFLINE_NAME = "offline"


@dataclass
class OfflinePlan:
    """Where each buffer goes: ``offsets[i]`` for the buffer allocated at ``alloc_events[i]``."""

    alloc_events: np.ndarray
    free_events: np.ndarray    # the event that frees it, or len(trace) if never freed
    sizes: np.ndarray          # requested sizes (the bytes each buffer occupies)
    offsets: np.ndarray
    heap_size: int
    peak_live: int             # the lower bound (requested bytes)


def buffer_lifetimes(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(alloc event, free event, requested size)`` of every buffer with size > 0; buffers
    never freed live to ``len(trace)``."""
    order = np.argsort(trace.id, kind="stable")
    ops = trace.op[order]
    ids = trace.id[order]
    is_alloc = ops == OP_ALLOC
    next_same = np.zeros(len(order), dtype=bool)
    next_same[:-1] = (ids[:-1] == ids[1:]) & is_alloc[:-1] & ~is_alloc[1:]
    alloc_positions = np.flatnonzero(is_alloc)
    starts = order[alloc_positions]
    ends = np.where(next_same[alloc_positions],
                    order[np.minimum(alloc_positions + 1, len(order) - 1)], len(trace))
    sizes = trace.size[starts]
    keep = sizes > 0
    by_start = np.argsort(starts[keep], kind="stable")
    return starts[keep][by_start], ends[keep][by_start], sizes[keep][by_start]


def plan_offline(trace: Trace, alignment: int = 256) -> OfflinePlan:
    """Global decreasing-size best-fit placement over the trace's known lifetimes.

    As XLA's heap simulator does: every offset is a multiple of ``alignment``, a buffer
    occupies exactly its size from there (sizes are not padded), and the heap ends at the
    highest byte used — so a temp allocation of XLA's ends unaligned when its last buffer does
    (checked on a jax 0.10 CPU dump: allocation size = max(offset + size))."""
    starts, ends, requested = buffer_lifetimes(trace)
    sizes = requested.astype(np.int64)
    offsets, heap = plan_lifetimes(starts, ends, sizes, alignment)
    peak, _ = trace.peak_live()
    return OfflinePlan(starts, ends, sizes, offsets, heap, peak)


# The placement core lives in allocsim.traces.plan (the generators' pattern=jax plans each
# step's temp buffer with it, and traces/ may not import sim/); the old private name stays.
_best_gap = best_gap


def offline_result(trace: Trace, device: DeviceProfile, alignment: int = 256) -> RunResult:
    """The offline plan as a run: one region of the planned heap, reserved at the start."""
    plan = plan_offline(trace, alignment)
    region = round_up(plan.heap_size, device.granularity) if plan.heap_size else 0
    completed = region <= device.capacity
    live = trace.live_bytes() if len(trace) else np.zeros(0, np.int64)
    first_oom = None
    if not completed and len(plan.offsets):
        tops = plan.offsets + plan.sizes
        over = np.flatnonzero(tops > device.capacity)
        first = int(plan.alloc_events[over].min())
        first_oom = (first, int(trace.size[first]), int(live[first - 1]) if first else 0)
    n = len(trace)
    points = min(n, 2048)
    edges = (np.unique(np.linspace(0, n, points + 1).astype(np.int64)) if n
             else np.zeros(1, np.int64))
    starts_b = edges[:-1]
    last = edges[1:] - 1
    allocated = np.maximum.reduceat(live, starts_b) if n else np.zeros(0, np.int64)
    reserved = np.full(len(last), region if completed else 0, dtype=np.int64)
    times = trace.time_ns[last] - (trace.time_ns[0] if n else 0)
    timeline = Timeline(event=last, time_ns=times, allocated=allocated, reserved=reserved,
                        in_use=allocated.copy(), trace_time_ns=times.copy())
    cost = device.costs.malloc(region) if completed and region else 0.0
    return RunResult(
        policy=OFFLINE_NAME, trace=trace.name, device=device.label, process=0, events=n,
        allocs=trace.n_allocs, completed=completed, ooms=0 if completed else 1,
        first_oom_event=first_oom[0] if first_oom else None,
        first_oom_size=first_oom[1] if first_oom else None,
        first_oom_allocated=first_oom[2] if first_oom else None,
        first_oom_reserved=0 if first_oom else None, first_oom_largest_free=None,
        peak_allocated=plan.peak_live, peak_allocated_event=int(np.argmax(live)) if n else -1,
        peak_reserved=region if completed else 0, peak_reserved_event=0 if completed else -1,
        final_reserved=region if completed else 0,
        internal_fragmentation=0, external_fragmentation=max(0, region - plan.peak_live),
        external_fragmentation_mean=0.0,
        device_mallocs=1 if completed and region else 0, device_frees=0,
        failed_device_mallocs=0 if completed else 1, alloc_time_s=cost,
        trace_duration_s=trace.duration_ns / 1e9,
        policy_stats={"heap_size": plan.heap_size, "lower_bound": plan.peak_live,
                      "buffers": len(plan.sizes)},
        timeline=timeline,
    )
