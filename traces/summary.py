"""Facts about a trace, computed with numpy (no replay): what ``allocsim info`` prints.

Events per op, processes and streams, duration, the live-bytes peak and when it happens, what is
still live at the end, a size histogram in powers of two, and — where the trace has tags — the
largest live allocations at the peak grouped by tag (who allocated the memory at the worst
moment, as PyTorch's memory viewer shows it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from allocsim.traces.model import NO_TAG, OP_ALLOC, OP_FREE, Trace


def live_at(trace: Trace, event: int) -> np.ndarray:
    """Indices of the alloc events whose buffers are live right after ``event``."""
    upto = slice(0, event + 1)
    ops, ids = trace.op[upto], trace.id[upto]
    alloc_index = np.flatnonzero(ops == OP_ALLOC)
    free_index = np.flatnonzero(ops == OP_FREE)
    # An alloc is live if no later free (up to ``event``) has its id: match each free to the
    # latest earlier alloc of that id by sorting (id, index).
    order = np.lexsort((np.concatenate([alloc_index, free_index]),
                        np.concatenate([ids[alloc_index], ids[free_index]])))
    is_alloc = np.concatenate([np.ones(len(alloc_index), bool),
                               np.zeros(len(free_index), bool)])[order]
    index = np.concatenate([alloc_index, free_index])[order]
    keys = np.concatenate([ids[alloc_index], ids[free_index]])[order]
    freed_next = np.zeros(len(order), dtype=bool)
    freed_next[:-1] = is_alloc[:-1] & ~is_alloc[1:] & (keys[:-1] == keys[1:])
    return np.sort(index[is_alloc & ~freed_next])


def size_histogram(sizes: np.ndarray) -> list[dict[str, int]]:
    """Counts of alloc sizes in power-of-two buckets ``(upper/2, upper]``."""
    if not len(sizes):
        return []
    exponents = np.ceil(np.log2(np.maximum(sizes, 1))).astype(np.int64)
    values, counts = np.unique(exponents, return_counts=True)
    return [{"upper": int(1 << int(v)), "count": int(c)} for v, c in zip(values, counts)]


def summarize(trace: Trace, *, top: int = 10) -> dict[str, Any]:
    """Everything ``allocsim info`` shows, as plain JSON-ready values."""
    peak, peak_event = trace.peak_live()
    alloc_sizes = trace.size[trace.op == OP_ALLOC]
    facts: dict[str, Any] = {
        "name": trace.name,
        "source": str(trace.metadata.get("source", "")),
        "events": len(trace),
        "allocs": trace.n_allocs,
        "frees": trace.n_frees,
        "duration_s": trace.duration_ns / 1e9,
        "processes": trace.processes(),
        "streams": trace.streams(),
        "events_per_stream": {int(s): int(c) for s, c in
                              zip(*np.unique(trace.stream, return_counts=True))},
        "peak_live": peak,
        "peak_event": peak_event,
        "size_histogram": size_histogram(alloc_sizes),
        "validation": trace.metadata.get("validation"),
    }
    unrecorded = trace.metadata.get("unrecorded_live_bytes")
    if unrecorded and unrecorded.get("max", 0) > 0:
        # A profiler trace whose Total Allocated is above the trace's own live bytes: memory
        # that was live before recording started and that the trace does not hold.
        facts["live_before_recording"] = {"min": int(unrecorded["min"]),
                                          "max": int(unrecorded["max"])}
        if "total_reserved_max" in trace.metadata:
            facts["reserved_max_recorded"] = int(trace.metadata["total_reserved_max"])
    still_live = live_at(trace, len(trace) - 1) if len(trace) else np.zeros(0, np.int64)
    facts["leaks"] = len(still_live)
    facts["leaked_bytes"] = int(trace.size[still_live].sum()) if len(still_live) else 0
    facts["top_live_at_peak"] = []
    if peak_event >= 0 and trace.tags and np.any(trace.tag != NO_TAG):
        live = live_at(trace, peak_event)
        tags = trace.tag[live]
        sizes = trace.size[live]
        groups: dict[int, list[int]] = {}
        for tag, size in zip(tags.tolist(), sizes.tolist()):
            entry = groups.setdefault(tag, [0, 0])
            entry[0] += 1
            entry[1] += size
        ranked = sorted(groups.items(), key=lambda kv: -kv[1][1])[:top]
        facts["top_live_at_peak"] = [
            {"tag": trace.tag_name(tag) or "(untagged)", "count": c, "bytes": b}
            for tag, (c, b) in ranked]
    return facts
