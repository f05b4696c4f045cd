"""Compile-time buffer placement over known lifetimes: XLA's heap simulator, as pure numpy.

What compile-time planning does (XLA's buffer assignment, openxla/xla
xla/service/heap_simulator/heap_simulator.cc, GlobalDecreasingSizeBestFitHeap): take buffers
from the largest down; give each the best-fitting gap -- the smallest free address range, lowest
offset on ties -- among the buffers already placed whose lifetimes overlap its own; if none
fits, put it on top. Every offset is a multiple of the alignment, a buffer occupies exactly its
size from there (sizes are not padded), and the heap ends at the highest byte used.

This module is the core only: lifetimes in, offsets and heap out, with no trace and no
simulator. Two users: ``allocsim.sim.questions.offline`` (the offline plan of a whole trace,
shown next to the online policies) and the synthetic generators' ``pattern=jax``
(:mod:`allocsim.traces.synth.jit`), which plan one compiled step's intermediates into the ONE
temp buffer XLA hands its allocator (BufferAssignment::CombineTempAllocations).

Cost: O(B * P) vector work for B buffers and P placed buffers overlapping in time.
"""

from __future__ import annotations

import numpy as np

__all__ = ["best_gap", "plan_lifetimes"]


def plan_lifetimes(starts: np.ndarray, ends: np.ndarray, sizes: np.ndarray,
                   alignment: int = 1) -> tuple[np.ndarray, int]:
    """``(offsets, heap)`` of the global decreasing-size best-fit placement.

    Buffer ``i`` lives over the half-open interval ``[starts[i], ends[i])`` (any ordered unit:
    event indices, schedule positions) and occupies ``sizes[i]`` bytes; two buffers conflict
    when their intervals overlap. Buffers are taken largest first, ties by earlier start, then
    by position (XLA sorts by size, then by the buffer's order). ``heap`` is
    ``max(offset + size)``, 0 for no buffers.
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    if not len(starts) == len(ends) == len(sizes):
        raise ValueError("starts, ends and sizes must have the same length")
    if alignment < 1:
        raise ValueError(f"alignment must be >= 1, got {alignment}")
    count = len(sizes)
    offsets = np.zeros(count, dtype=np.int64)
    placed = np.zeros(count, dtype=bool)
    heap = 0
    for index in np.lexsort((starts, -sizes)):
        start, end, size = starts[index], ends[index], sizes[index]
        overlapping = placed & (starts < end) & (ends > start)
        offset = best_gap(offsets[overlapping], sizes[overlapping], int(size), alignment)
        offsets[index] = offset
        placed[index] = True
        heap = max(heap, offset + int(size))
    return offsets, heap


def best_gap(offsets: np.ndarray, sizes: np.ndarray, size: int, alignment: int = 1) -> int:
    """Lowest aligned offset of the smallest gap that holds ``size`` bytes from an aligned
    start, between the given address intervals (which may overlap each other), or the aligned
    top of them all. A gap's size is counted from its aligned start."""
    if not len(offsets):
        return 0
    order = np.argsort(offsets, kind="stable")
    lows = offsets[order]
    highs = np.maximum.accumulate(lows + sizes[order])
    gap_starts = -(-np.concatenate([[0], highs[:-1]]) // alignment) * alignment
    gaps = lows - gap_starts
    fits = np.flatnonzero(gaps >= size)
    if not len(fits):
        return int(-(-int(highs[-1]) // alignment) * alignment)
    best = fits[np.argmin(gaps[fits])]   # argmin takes the first (lowest offset) on ties
    return int(gap_starts[best])
