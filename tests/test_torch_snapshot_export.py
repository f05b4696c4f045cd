"""Export of traces as PyTorch memory snapshots (allocsim.traces.formats.torch_snapshot), for
PyTorch's memory viewer: what is written, and that it reads back as the same trace.
"""

from __future__ import annotations

import collections
import io
import pickle

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from snapshot_checks import (
    MiB,
    PlainUnpickler,
    events_of,
    one_line_error,
    walk_plain,
)

import allocsim.traces.formats.torch_snapshot as ts
from allocsim.traces.formats import format_for, load
from allocsim.traces.model import OP_ALLOC, Trace
from allocsim.traces.validate import validate


# ====================================================================== export
def small_trace() -> Trace:
    trace = Trace.from_events([
        (0, "alloc", 1, 1000, 0), (1500, "alloc", 2, 513, 1), (2001, "free", 1, 1000, 0),
        (3000, "alloc", 3, 0, 0), (3000, "alloc", 1, 64, 1), (9999, "free", 2, None, 1),
        (10000, "free", 3, 0, 0)], name="small")
    trace.tags = ["aten::empty", "train.py:42:step"]
    trace.tag[:] = [0, 1, 0, -1, 1, 1, -1]
    return trace


def test_write_snapshot_is_plain_protocol_4_and_reads_back(tmp_path):
    trace = small_trace()
    buffer = io.BytesIO()
    ts.write_snapshot(trace, buffer)
    data = buffer.getvalue()
    assert data[:2] == b"\x80\x04"  # MemoryViz.js reads protocols 2 to 4
    snapshot = PlainUnpickler(io.BytesIO(data)).load()
    walk_plain(snapshot)
    assert set(snapshot) == {"allocsim_export", "segments", "device_traces", "allocator_settings"}
    assert next(iter(snapshot)) == "allocsim_export"      # first: how allocsim knows its own file
    actions = collections.Counter(e["action"] for e in snapshot["device_traces"][0])
    assert actions == {"alloc": 4, "free_requested": 3, "free_completed": 3}

    again = ts.read_snapshot(data, "x.pickle", "x")
    validate(again, strict=True)
    assert events_of(again) == [(o, s if o == OP_ALLOC else m, st, t) for (o, s, st, t), m in
                                zip(events_of(trace), trace.matched_sizes().tolist())]
    assert np.array_equal(again.live_bytes(), trace.live_bytes())
    assert [again.tag_name(t) for t in again.tag.tolist()] == \
        [trace.tag_name(t) for t in trace.tag.tolist()]
    # Through save/load by extension, once the integrator registers the module.
    path = tmp_path / "small.pickle"
    with open(path, "wb") as f:
        ts.write_snapshot(trace, f)
    assert events_of(load(path)) == events_of(again)


def test_export_lays_out_blocks_without_overlap():
    snapshot = ts.snapshot_of_run(small_trace())
    allocs = [e for e in snapshot["device_traces"][0] if e["action"] == "alloc"]
    addresses = [e["addr"] for e in allocs]
    assert addresses == sorted(set(addresses))  # bump pointer: never reused
    assert all(a % 512 == 0 for a in addresses)
    (seg,) = snapshot["segments"]
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    live = [b for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert [(b["address"], b["requested_size"]) for b in live] == [(addresses[3], 64)]


def test_snapshot_of_run_uses_addresses_and_device_calls():
    trace = Trace.from_events([
        (0, "alloc", 1, 100, 0), (10, "alloc", 2, 300, 0), (20, "free", 1, 100, 0),
        (30, "alloc", 3, 200, 0), (40, "free", 2, 300, 0), (50, "free", 3, 200, 0)])
    base = 0x7F0000000000
    addresses = {0: base, 1: base + 512, 3: base}
    calls = [{"action": "segment_alloc", "addr": base, "size": 2 * MiB, "stream": 0, "event": 0},
             {"action": "snapshot", "addr": 0, "size": 400, "stream": 0, "event": 3},
             {"action": "segment_free", "addr": base, "size": 2 * MiB, "stream": 0, "event": 6}]
    snapshot = ts.snapshot_of_run(trace, addresses, calls)
    walk_plain(snapshot)
    entries = snapshot["device_traces"][0]
    assert [e["action"] for e in entries] == [
        "segment_alloc", "alloc", "alloc", "free_requested", "free_completed", "snapshot",
        "alloc", "free_requested", "free_completed", "free_requested", "free_completed",
        "segment_free"]
    assert [e["addr"] for e in entries if e["action"] == "alloc"] == [base, base + 512, base]
    assert snapshot["segments"] == []

    again = ts.read_snapshot(pickle.dumps(snapshot, protocol=4), "run.pickle", "run")
    validate(again, strict=True)
    assert events_of(again) == events_of(trace)
    assert [{k: r[k] for k in ("action", "addr", "size", "stream", "event")}
            for r in again.metadata["reference_events"]] == calls
    assert again.metadata["initial_segments"] == [] and again.metadata["prologue_events"] == 0
    # A pure function of its inputs.
    assert ts.snapshot_of_run(trace, addresses, calls) == snapshot


def test_snapshot_of_run_refuses_what_the_viewer_cannot_draw():
    trace = Trace.from_events([(0, "alloc", 1, 100, 0), (5, "free", 1, 100, 0)])
    call = {"action": "segment_alloc", "addr": 4096, "size": 2 * MiB, "stream": 0, "event": 0}
    err = one_line_error(ts.snapshot_of_run, trace, {0: 1 << 40}, [call])
    assert "event 0" in str(err) and "in no segment" in str(err)
    assert "event 0" in str(one_line_error(ts.snapshot_of_run, trace, {}, None))
    assert "need the addresses" in str(one_line_error(ts.snapshot_of_run, trace, None, [call]))
    bad = dict(call, event=9)
    assert "'event' is 9" in str(one_line_error(ts.snapshot_of_run, trace, {0: 4096}, [bad]))
    # Without device calls, segments cover the given addresses.
    snapshot = ts.snapshot_of_run(trace, {0: np.int64(1 << 40)})
    assert snapshot["segments"][0]["address"] == 1 << 40


def test_detect():
    assert ts.detect_snapshot("whatever.bin", b"\x80\x04\x95")
    assert ts.detect_snapshot("old.pkl", b"(dp0\n")
    assert ts.detect_snapshot("X.PICKLE", b"")
    assert not ts.detect_snapshot("t.csv", b"time_ns,op,id,size\n")
    assert format_for("run.pickle", b"\x80\x04") == "torch-snapshot"


# ---------------------------------------------------------------------- property: round trip
@st.composite
def valid_traces(draw) -> Trace:
    steps = draw(st.lists(st.tuples(st.booleans(), st.integers(0, 5 * MiB), st.integers(0, 2),
                                    st.integers(0, 3000), st.integers(-1, 2)), max_size=40))
    live: list[int] = []
    rows, tags, time, next_id = [], [], 0, 0
    for is_alloc, size, stream, gap, tag in steps:
        time += gap
        if is_alloc or not live:
            rows.append((time, "alloc", next_id, size, stream))
            live.append(next_id)
            next_id += 1
        else:
            key = live.pop(size % len(live))
            rows.append((time, "free", key, None, 0))
        tags.append(tag)
    trace = Trace.from_events(rows)
    # A free's stream is its buffer's stream, as every importer writes it.
    stream_of = {}
    for i, (_, op, key, _, stream) in enumerate(rows):
        if op == "alloc":
            stream_of[key] = stream
        trace.stream[i] = stream_of[key]
    trace.tags = ["a.py:1:f", "x", "<odd tag>"]
    trace.tag[:] = tags
    return trace


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_traces())
def test_export_import_round_trip(trace):
    buffer = io.BytesIO()
    ts.write_snapshot(trace, buffer)
    again = ts.read_snapshot(buffer.getvalue(), "p.pickle", "p")
    validate(again, strict=True)
    # Times come back from the first event on (a snapshot's clock is absolute), and stream
    # ids in order of first appearance (the file holds raw handles only).
    start = int(trace.time_ns[0]) if len(trace) else 0
    renumber: dict[int, int] = {}
    streams = [renumber.setdefault(s_, len(renumber)) for s_ in trace.stream.tolist()]
    assert [(o, st_, t) for o, _, st_, t in events_of(again)] == \
        [(o, st_, t - start) for (o, _, _, t), st_ in zip(events_of(trace), streams)]
    allocs = trace.op == OP_ALLOC
    assert again.size[allocs].tolist() == trace.size[allocs].tolist()
    assert np.array_equal(again.live_bytes(), trace.live_bytes())
    assert [again.tag_name(t) for t in again.tag[allocs].tolist()] == \
        [trace.tag_name(t) for t in trace.tag[allocs].tolist()]
