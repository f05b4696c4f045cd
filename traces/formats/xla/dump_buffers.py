"""The buffers of an XLA dump module: values that are the same bytes, grouped.

Used by :mod:`allocsim.traces.formats.xla.dump` (whose docstring says what counts as the same
bytes). Vectorised over the values: one sort and a running maximum, so 100,000 values group
in a few milliseconds; the fallback merge (bytes shared at other offsets) is quadratic in an
allocation's buffers and runs only where a check says it is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from allocsim.traces.formats.xla.dump_files import Assignment, LiveRanges
from allocsim.traces.model import TraceError

__all__ = ["Buffers", "module_buffers"]


@dataclass
class Buffers:
    """The module's buffers: one row per group of values that are the same bytes."""

    alloc: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    start: np.ndarray
    end: np.ndarray
    first_value: np.ndarray     # row in the assignment of the buffer's first value
    n_values: np.ndarray
    overlap_merges: int = 0


def _group(alloc: np.ndarray, offset: np.ndarray, size: np.ndarray, start: np.ndarray,
           end: np.ndarray, rows: np.ndarray, length: int) -> Buffers:
    """Values at the same offset of the same allocation whose ranges overlap or touch are
    one buffer (a sweep over them sorted by allocation, offset and start)."""
    if not len(alloc):
        empty = np.zeros(0, np.int64)
        return Buffers(empty, empty, empty, empty, empty, empty, empty)
    order = np.lexsort((rows, end, start, offset, alloc))
    a, o, s, e, z = alloc[order], offset[order], start[order], end[order], size[order]
    key_change = np.ones(len(a), bool)
    key_change[1:] = (a[1:] != a[:-1]) | (o[1:] != o[:-1])
    key = np.cumsum(key_change) - 1
    span = length + 2
    running = np.maximum.accumulate(key * span + e)
    new = key_change.copy()
    new[1:] |= key[1:] * span + s[1:] > running[:-1]
    heads = np.flatnonzero(new)
    return Buffers(a[heads], o[heads], np.maximum.reduceat(z, heads), s[heads],
                    np.maximum.reduceat(e, heads), rows[order][heads],
                    np.diff(np.append(heads, len(a))))


def _allocation_peaks(buffers: Buffers, n_allocs: int) -> np.ndarray:
    """The most bytes each allocation's buffers have live at once."""
    if not len(buffers.alloc):
        return np.zeros(n_allocs, np.int64)
    allocs = np.concatenate([buffers.alloc, buffers.alloc])
    times = np.concatenate([2 * buffers.start, 2 * buffers.end + 1])
    deltas = np.concatenate([buffers.size, -buffers.size])
    order = np.lexsort((times, allocs))
    live = np.cumsum(deltas[order])   # each allocation's events sum to zero
    peaks = np.zeros(n_allocs, np.int64)
    np.maximum.at(peaks, allocs[order], live)
    return peaks


def _merge_overlaps(buffers: Buffers, over: np.ndarray) -> Buffers:
    """In the allocations ``over`` (whose buffers would not fit at once), merge every pair of
    buffers that overlap in time and in bytes (union-find; rare, so quadratic is fine)."""
    parent = np.arange(len(buffers.alloc))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = int(parent[i])
        return i

    merges = 0
    for a in over:
        members = np.flatnonzero(buffers.alloc == a)
        lo, hi = buffers.offset[members], buffers.offset[members] + buffers.size[members]
        s, e = buffers.start[members], buffers.end[members]
        for k, i in enumerate(members):
            touching = members[(s <= e[k]) & (e >= s[k]) & (lo < hi[k]) & (hi > lo[k])]
            for j in touching:
                ri, rj = find(int(i)), find(int(j))
                if ri != rj:
                    parent[max(ri, rj)] = min(ri, rj)
                    merges += 1
    roots = np.array([find(i) for i in range(len(parent))], np.int64)
    heads, inverse = np.unique(roots, return_inverse=True)
    lows = np.full(len(heads), np.iinfo(np.int64).max)
    highs = np.zeros(len(heads), np.int64)
    starts = np.full(len(heads), np.iinfo(np.int64).max)
    ends = np.zeros(len(heads), np.int64)
    np.minimum.at(lows, inverse, buffers.offset)
    np.maximum.at(highs, inverse, buffers.offset + buffers.size)
    np.minimum.at(starts, inverse, buffers.start)
    np.maximum.at(ends, inverse, buffers.end)
    n_values = np.bincount(inverse, weights=buffers.n_values).astype(np.int64)
    return Buffers(buffers.alloc[heads], lows, highs - lows, starts, ends,
                    buffers.first_value[heads], n_values, merges)


def check_same_compilation(live: LiveRanges, assignment: Assignment, assign_path: Path) -> None:
    """Every value of the live-range file is in an allocation (else the buffer-assignment file
    is cut short or from another compilation)."""
    assigned = set(assignment.names)
    missing = next((name for name in live.names if name not in assigned), None)
    if missing is not None:
        raise TraceError(f"value {missing} of the live-range file is in no allocation: the "
                         "file is cut short or from another compilation", source=str(assign_path))


def module_buffers(live: LiveRanges, assignment: Assignment,
                    assign_path: Path) -> tuple[Buffers, dict[str, int]]:
    check_same_compilation(live, assignment, assign_path)
    index = {name: i for i, name in enumerate(live.names)}
    at = np.fromiter((index.get(name, -1) for name in assignment.names), np.int64,
                     len(assignment.names))
    allocs = assignment.allocations
    thread_local = np.array([a.thread_local for a in allocs], bool)
    local = thread_local[assignment.allocation] if len(at) else np.zeros(0, bool)
    other_space = assignment.colors != 0
    no_range = at < 0
    empty = assignment.sizes <= 0
    keep = ~(local | other_space | no_range | empty)
    left_out = {"thread_local": int(np.count_nonzero(local)),
                "no_live_range": int(np.count_nonzero(no_range & ~local)),
                "other_memory_space": int(np.count_nonzero(other_space & ~local & ~no_range)),
                "zero_size": int(np.count_nonzero(empty & ~local & ~no_range & ~other_space))}
    rows = np.flatnonzero(keep)
    buffers = _group(assignment.allocation[rows], assignment.offsets[rows],
                     assignment.sizes[rows], live.starts[at[rows]], live.ends[at[rows]], rows,
                     live.length)
    sizes = np.array([a.size for a in allocs], np.int64)
    over = np.flatnonzero(_allocation_peaks(buffers, len(allocs)) > sizes)
    if len(over):
        buffers = _merge_overlaps(buffers, over)
    return buffers, left_out
