"""Checks the synthetic generators' tests share (tests/test_synth.py, test_synth_modes.py).

The validity checker is deliberately independent of allocsim.traces.model's helpers: it walks
the events with a dict of live ids, so a bug shared by a generator and Trace.live_bytes cannot
hide.
"""

from __future__ import annotations

import numpy as np

from allocsim.traces.model import COLUMN_DTYPES, OP_ALLOC, OP_FREE, Trace


def check_valid(trace: Trace) -> dict[int, int]:
    """Assert the trace is a valid alloc/free sequence; return the ids live at the end -> size."""
    assert all(getattr(trace, c).dtype == d for c, d in COLUMN_DTYPES.items())
    assert np.all(np.diff(trace.time_ns) >= 0), "time goes backwards"
    assert np.all(trace.size > 0), "non-positive size"
    assert set(np.unique(trace.op).tolist()) <= {OP_ALLOC, OP_FREE}
    assert np.all((trace.tag >= 0) & (trace.tag < len(trace.tags))), "tag outside the table"
    live: dict[int, int] = {}
    seen: set[int] = set()
    for index, (op, ident, size) in enumerate(zip(trace.op.tolist(), trace.id.tolist(),
                                                   trace.size.tolist())):
        if op == OP_ALLOC:
            assert ident not in live, f"event {index}: alloc of live id {ident}"
            assert ident not in seen, f"event {index}: id {ident} reused"
            live[ident] = size
            seen.add(ident)
        else:
            assert ident in live, f"event {index}: free of id {ident} that is not live"
            assert live.pop(ident) == size, f"event {index}: free size differs from alloc"
    return live


def live_bytes(trace: Trace) -> np.ndarray:
    """Live bytes after each event, from the size column alone (frees carry their size)."""
    return np.cumsum(np.where(trace.op == OP_ALLOC, trace.size, -trace.size))


def tag_mask(trace: Trace, name: str) -> np.ndarray:
    return trace.tag == trace.tags.index(name)


def columns_equal(a: Trace, b: Trace) -> bool:
    return all(getattr(a, c).tobytes() == getattr(b, c).tobytes() for c in COLUMN_DTYPES)
