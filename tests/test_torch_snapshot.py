"""Tests for allocsim.traces.formats.torch_snapshot (and the modules of its package): safe
unpickling, parsing, the backwards rebuild of the state at the start, reference events, tags,
and export for PyTorch's memory viewer.

Facts about the real snapshots are computed independently (tests/snapshot_checks.py), by a
plain walk over the pickle's entries, never by calling the module under test. Export is
tests/test_torch_snapshot_export.py's.
"""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from snapshot_checks import (
    EOR,
    LM,
    REFERENCE,
    MiB,
    active_requested_bytes,
    block,
    entry,
    events_of,
    need,
    one_line_error,
    raw_snapshot,
    read,
    segment,
)

import allocsim.traces.formats.torch_snapshot as ts
from allocsim.policies import parse_policy
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.questions.fidelity.start import sized_start_segments
from allocsim.traces.formats import format_for, load, load_with_report
from allocsim.traces.model import NO_TAG, OP_ALLOC, OP_FREE, Trace
from allocsim.traces.validate import validate


# ====================================================================== real snapshots
@pytest.fixture(scope="module")
def eor() -> tuple[Trace, dict]:
    path = need(EOR)
    return ts.read_snapshot(path.read_bytes(), str(path), path.stem), raw_snapshot(path)


@pytest.fixture(scope="module")
def lm() -> tuple[Trace, dict]:
    path = need(LM)
    return ts.read_snapshot(path.read_bytes(), str(path), path.stem), raw_snapshot(path)


def test_eor_file_facts(eor):
    trace, raw = eor
    entries = raw["device_traces"][0]
    counts = collections.Counter(e["action"] for e in entries)
    assert (len(entries), counts["alloc"], counts["segment_alloc"], counts["snapshot"]) == \
        (5803, 1935, 7, 9)
    assert trace.metadata["actions"] == dict(counts)
    # Ten segments at the end, seven of them allocated during the trace: three at the start.
    assert len(raw["segments"]) == 10
    assert len(trace.metadata["initial_segments"]) == 3


def test_lm_inference_file_facts(lm):
    trace, raw = lm
    assert len(raw["device_traces"][0]) == 3840
    assert len(raw["segments"]) == 98
    # No segment events: the 98 segments were all there when recording started.
    assert len(trace.metadata["initial_segments"]) == 98
    assert trace.metadata["allocator_settings"]["expandable_segments"] is False


@pytest.mark.parametrize("which", ["eor", "lm"])
def test_real_snapshot_rebuilds_the_start(which, request):
    trace, raw = request.getfixturevalue(which)
    meta = trace.metadata
    entries = raw["device_traces"][0]
    counts = collections.Counter(e["action"] for e in entries)

    validate(trace, strict=True)  # every free matches an alloc, time never goes back
    prologue = meta["prologue_events"]
    assert trace.n_allocs - prologue == counts["alloc"]
    assert trace.n_frees == counts["free_completed"]
    # The backwards rebuild is right iff the live bytes at the end are the active blocks'.
    assert int(trace.live_bytes()[-1]) == active_requested_bytes(raw)
    # The prologue: the first events, all allocs, at the first time, with their own tag.
    head = slice(0, prologue)
    assert np.all(trace.op[head] == OP_ALLOC)
    assert np.all(trace.time_ns[head] == 0)
    assert {trace.tags[t] for t in trace.tag[head].tolist()} == {ts.PROLOGUE_TAG}
    assert ts.PROLOGUE_TAG not in {trace.tags[t] for t in trace.tag[prologue:].tolist()
                                   if t != NO_TAG}
    # The initial segments tile their memory and hold exactly the prologue's bytes.
    held = 0
    for seg in meta["initial_segments"]:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert seg["blocks"][0]["address"] == seg["address"]
        held += sum(b["requested_size"] for b in seg["blocks"] if b["state"] != "inactive")
    assert held == int(trace.size[head].sum())
    # Times: nanoseconds from the first entry (the prologue sits there).
    last = [e for e in entries if e["action"] in ("alloc", "free_completed")][-1]
    assert trace.time_ns[-1] == (last["time_us"] - entries[0]["time_us"]) * 1000
    assert meta["time_origin_us"] == entries[0]["time_us"]
    assert meta["synthetic_times"] is False and meta["times_clamped"] == 0
    assert meta["stream_handles"] == {"0": 0}
    assert meta["devices"] == {"0": len(entries)}
    json.dumps(meta)


@pytest.mark.parametrize("which", ["eor", "lm"])
def test_real_snapshot_reference_events(which, request):
    trace, raw = request.getfixturevalue(which)
    refs = trace.metadata["reference_events"]
    expected = [e for e in raw["device_traces"][0] if e["action"] in REFERENCE]
    assert len(refs) == len(expected)
    assert [(r["action"], r["addr"], r["size"]) for r in refs] == \
        [(e["action"], e.get("addr"), e["size"]) for e in expected]
    assert all(0 <= r["event"] <= len(trace) for r in refs)
    assert [r["event"] for r in refs] == sorted(r["event"] for r in refs)


def test_eor_reference_event_points_at_the_next_event(eor):
    trace, raw = eor
    entries = raw["device_traces"][0]
    first = next(i for i, e in enumerate(entries) if e["action"] == "segment_alloc")
    allocs_before = sum(1 for e in entries[:first] if e["action"] == "alloc")
    frees_before = sum(1 for e in entries[:first] if e["action"] == "free_completed")
    ref = trace.metadata["reference_events"][0]
    assert ref["event"] == trace.metadata["prologue_events"] + allocs_before + frees_before
    assert ref["time_ns"] == (entries[first]["time_us"] - entries[0]["time_us"]) * 1000


def test_real_snapshot_tags_are_user_call_sites(lm):
    trace, _ = lm
    meta = trace.metadata
    k = meta["prologue_events"]
    tagged = [trace.tags[t] for t in trace.tag[k:][trace.op[k:] == OP_ALLOC].tolist()
              if t != NO_TAG]
    assert len(tagged) == trace.n_allocs - meta["prologue_events"]  # every alloc has one
    # The user's files, never torch/nn/modules/module.py that sits between them and the op.
    assert {t.split(":")[0] for t in tagged} == {"model.py", "nn_utils.py"}
    for stack in meta["tag_stacks"].values():
        assert 0 < len(stack) <= ts.MAX_STACK_FRAMES
        assert all(isinstance(frame, str) and frame.count(":") >= 2 for frame in stack)


def test_backward_pass_allocs_are_tagged_by_autograd_node(eor):
    trace, raw = eor
    allocs = [e for e in raw["device_traces"][0] if e["action"] == "alloc"]
    no_python = sum(1 for e in allocs
                    if not any(f["filename"].endswith(".py") for f in e["frames"]))
    k = trace.metadata["prologue_events"]
    tags = [trace.tag_name(t) for t in trace.tag[k:][trace.op[k:] == OP_ALLOC].tolist()]
    assert no_python > 1000  # the backward pass runs on the autograd engine's C++ thread
    assert None not in tags
    assert sum(1 for t in tags if t.startswith(("autograd:", "aten::"))) == no_python
    assert "autograd:ConvolutionBackward0" in tags


def test_real_snapshot_through_the_registry(eor):
    trace, _ = eor
    loaded, report = load_with_report(EOR)
    assert report.repairs() == {}  # nothing for lenient validation to repair
    assert "validation" not in loaded.metadata
    assert events_of(loaded) == events_of(trace)
    assert loaded.metadata["source"] == str(EOR)
    assert loaded.metadata["name"] == "torch-snapshot-eor"
    assert format_for(EOR, EOR.read_bytes()[:64]) == "torch-snapshot"


def test_truncated_real_file_is_one_line_error():
    data = need(EOR).read_bytes()[:5000]
    err = one_line_error(ts.read_snapshot, data, "cut.pickle", "cut")
    assert str(err).startswith("cut.pickle: not a readable pickle")


def test_a_huge_bytearray8_length_is_one_line_and_nothing_else_on_stderr(tmp_path, capfd):
    # Found by tests/test_fuzz_importers.py: CPython's C unpickler, asked for 2.5e18 bytes by
    # a BYTEARRAY8 op, printed a SystemError line of its own before our error.
    import subprocess
    import sys
    path = tmp_path / "fuzz.pickle"
    path.write_bytes(b"\x96\x06'N\\\xff\x8d\x1a#\xb1u?T")
    run = subprocess.run([sys.executable, "-m", "allocsim", "info", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"allocsim: error: {path}: not a readable pickle: expected 2529490268626757382 bytes "
        "in a bytearray8, but only 4 remain"]


@pytest.mark.parametrize("which", ["eor", "lm"])
def test_real_snapshot_export_round_trip(which, request):
    trace, _ = request.getfixturevalue(which)
    buffer = io.BytesIO()
    ts.write_snapshot(trace, buffer)
    again = ts.read_snapshot(buffer.getvalue(), "again.pickle", "again")
    validate(again, strict=True)
    assert again.metadata["prologue_events"] == 0  # every block is allocated in the trace
    assert events_of(again) == events_of(trace)
    assert np.array_equal(again.live_bytes(), trace.live_bytes())
    assert again.metadata["stream_handles"] == trace.metadata["stream_handles"]
    assert [again.tags[t] if t != NO_TAG else None for t in again.tag.tolist()] == \
        [trace.tags[t] if t != NO_TAG else None for t in trace.tag.tolist()]


# ====================================================================== safe loading
class _SystemCall:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _EvalCall:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


@pytest.mark.parametrize("payload", [_SystemCall, _EvalCall])
def test_malicious_pickle_runs_nothing(tmp_path, payload):
    marker = tmp_path / "marker"
    data = pickle.dumps(payload(marker), protocol=2)
    err = one_line_error(ts.read_snapshot, data, "evil.pickle", "evil")
    assert str(err).startswith("evil.pickle: refuses to load class ")
    assert "a snapshot holds only plain data" in str(err)
    assert not marker.exists()
    # Hidden inside an otherwise valid snapshot, and through load(): the same.
    nested = {"segments": [], "device_traces": [[entry("alloc", 1, 8, frames=[
        {"filename": "x.py", "line": 1, "name": payload(marker)}])]]}
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(nested, protocol=0))
    err = one_line_error(load, path)
    assert str(err).startswith(f"{path}: refuses to load class")
    assert not marker.exists()


def test_ordered_dicts_are_allowed():
    snap = collections.OrderedDict(segments=[], device_traces=[[
        collections.OrderedDict(entry("alloc", 4096, 100, t=1)),
        collections.OrderedDict(entry("free_requested", 4096, 100, t=2)),
        collections.OrderedDict(entry("free_completed", 4096, 100, t=3))]])
    trace = read(snap)
    assert events_of(trace) == [(OP_ALLOC, 100, 0, 0), (OP_FREE, 100, 0, 2000)]


@pytest.mark.parametrize("data", [b"", b"\x80\x04\x95garbage", b"not a pickle at all",
                                  pickle.dumps({"segments": []})[:-3]])
def test_garbage_is_one_line_error_naming_the_file(data):
    err = one_line_error(ts.read_snapshot, data, "bad.pickle", "bad")
    assert str(err).startswith("bad.pickle: ")


@pytest.mark.parametrize("obj, words", [
    ([1, 2, 3], "segments[0] is a int"),
    ("hello", "holds a str"),
    ({"foo": 1}, "no 'segments' or 'device_traces'"),
    ({"segments": [], "device_traces": [1]}, "one list of entries per device"),
    ({"segments": [], "device_traces": [[5]]}, "entry 0 is a int"),
    ({"segments": [], "device_traces": [[{"addr": 1}]]}, "'action' should be a string"),
    ({"segments": [], "device_traces": [[entry("alloc", 1, "big")]]}, "'size' is 'big'"),
    ({"segments": [], "device_traces": [[entry("alloc", 1, -5)]]}, "expected at least 0"),
    ({"segments": [], "device_traces": [[entry("alloc", None, 5)]]}, "'addr' is None"),
    ({"segments": [{"address": 0}], "device_traces": []}, "'total_size' is missing"),
    ({"segments": [], "device_traces": [[entry("alloc", 1, 8, t="x")]]}, "'time_us' is 'x'"),
    ({"segments": [], "device_traces": [[entry("alloc", 1, 8, t=float("inf"))]]},
     "'time_us' is inf, expected a finite number"),
    ({"segments": [], "device_traces": [[entry("alloc", 1, 8, t=0),
                                         entry("alloc", 2, 8, t=float("-inf"))]]},
     "entry 1: 'time_us' is -inf"),
    ({"segments": [], "device_traces": [[entry("alloc", 1, 8, t=float("nan"))]]},
     "'time_us' is nan"),
    ({"segments": [], "device_traces": [[entry("alloc", 1, 1 << 70)]]}, "fit in 64 bits"),
    ({"segments": [], "device_traces": [[entry("alloc", 1, 8, t=0),
                                         entry("alloc", 2, 8, t=1e30)]]}, "more than 64 bits"),
])
def test_wrong_shape_is_one_line_error(obj, words):
    err = one_line_error(read, obj)
    assert str(err).startswith("snap.pickle: ")
    assert words in str(err)


# ====================================================================== parsing
def test_times_without_time_us_are_synthetic():
    snap = {"segments": [], "device_traces": [[
        entry("alloc", 0x1000, 10), entry("alloc", 0x2000, 20),
        entry("free_requested", 0x1000, 10), entry("free_completed", 0x1000, 10)]]}
    trace = read(snap)
    assert trace.metadata["synthetic_times"] is True
    assert "time_origin_us" not in trace.metadata
    # One microsecond per entry, in file order (free_requested takes a tick too).
    assert trace.time_ns.tolist() == [0, 1000, 3000]
    validate(trace, strict=True)


def test_times_going_backwards_are_clamped_and_counted():
    snap = {"segments": [], "device_traces": [[
        entry("alloc", 0x1000, 10, t=100), entry("alloc", 0x2000, 20, t=99.5),
        entry("free_requested", 0x1000, 10, t=101), entry("free_completed", 0x1000, 10, t=98)]]}
    trace = read(snap)
    assert trace.time_ns.tolist() == [0, 0, 1000]
    assert trace.metadata["times_clamped"] == 2
    assert trace.metadata["times_clamped_max_ns"] == 3000
    validate(trace, strict=True)


def multi_device() -> dict:
    return {"segments": [segment(0x9000, 2 * MiB, [block(0x9000, 2 * MiB, 0, "inactive")],
                                 device=2)],
            "device_traces": [
                [entry("alloc", 0x1000, 1, t=1)],
                [entry("alloc", 0x1000, 1, t=1), entry("alloc", 0x2000, 2, t=2),
                 entry("free_requested", 0x2000, 2, t=3), entry("free_completed", 0x2000, 2, t=4)],
                [],
            ]}


def test_default_device_is_the_busiest():
    trace = read(multi_device())
    assert trace.metadata["device"] == 1
    assert trace.metadata["devices"] == {"0": 1, "1": 4, "2": 0}
    assert trace.n_allocs == 2


def test_default_device_is_the_one_holding_the_memory_not_the_one_with_markers():
    """`snapshot` markers land on whichever device is current when _dump_snapshot runs: a file
    whose segments are all on device 1 may hold entries only on device 0, and those markers
    must not make device 0 (with nothing on it) the default."""
    markers = [{"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": t}
               for t in (1, 2, 3)]
    snap = {"segments": [segment(0x9000 + i * 2 * MiB, 2 * MiB,
                                 [block(0x9000 + i * 2 * MiB, 2 * MiB, 1000, "active_allocated")],
                                 device=1) for i in range(5)],
            "device_traces": [markers, []]}
    trace = read(snap)
    assert trace.metadata["device"] == 1
    assert trace.n_allocs == 5
    assert trace.metadata["device_segments"] == {"0": 0, "1": 5}


def test_device_index_chooses_and_errors_list_devices(tmp_path):
    assert read(multi_device(), device_index=0).n_allocs == 1
    err = one_line_error(read, multi_device(), device_index=3)
    assert "device 7 has no trace entries and no segments" in str(
        one_line_error(read, multi_device(), device_index=7))
    assert read(multi_device(), device_index=2).metadata["device"] == 2  # its segment
    assert "0 (1 entries), 1 (4 entries)" in str(err)
    assert "device 7" in str(one_line_error(read, multi_device(), device_index=7))
    path = tmp_path / "multi.pkl"
    path.write_bytes(pickle.dumps(multi_device(), protocol=4))
    assert load(path, device_index=0).metadata["device"] == 0
    assert load(path).metadata["device"] == 1


def test_streams_become_small_ids_in_order_of_first_appearance():
    a, b = 0x7F00AA, 0x7F00BB
    snap = {"segments": [segment(0x100000, 2 * MiB, [block(0x100000, 2 * MiB, 0, "inactive")],
                                 stream=0x7F00CC)],
            "device_traces": [[
                entry("alloc", 0x1000, 10, stream=a, t=1),
                entry("alloc", 0x2000, 20, stream=0, t=2),
                entry("alloc", 0x3000, 30, stream=b, t=3),
                entry("free_requested", 0x1000, 10, stream=a, t=4),
                entry("free_completed", 0x1000, 10, stream=a, t=5)]]}
    trace = read(snap)
    assert trace.stream.tolist() == [0, 1, 2, 0]
    assert trace.metadata["stream_handles"] == {"0": a, "1": 0, "2": b, "3": 0x7F00CC}
    assert trace.metadata["initial_segments"][0]["stream"] == 3


def test_block_pending_since_before_recording_is_counted():
    snap = {"segments": [segment(0x100000, 2 * MiB, [
                block(0x100000, 512, 100, "active_pending_free"),
                block(0x100200, 2 * MiB - 512, 0, "inactive")], kind="small")],
            "device_traces": [[entry("alloc", 0x300000, 8, t=1),
                               entry("free_requested", 0x300000, 8, t=2),
                               entry("free_completed", 0x300000, 8, t=3)]]}
    trace = read(snap)
    assert trace.metadata["prologue_events"] == 1
    assert trace.metadata["frees_pending_at_end"] == 1
    assert trace.metadata["initial_segments"][0]["blocks"][0]["state"] == "active_pending_free"


def test_pending_free_at_the_end_stays_live():
    snap = {"segments": [segment(0x100000, 2 * MiB, [
                block(0x100000, 512, 100, "active_pending_free"),
                block(0x100200, 2 * MiB - 512, 0, "inactive")], kind="small")],
            "device_traces": [[entry("alloc", 0x100000, 100, t=1),
                               entry("free_requested", 0x100000, 100, t=2)]]}
    trace = read(snap)
    assert trace.metadata["frees_pending_at_end"] == 1
    assert trace.metadata["prologue_events"] == 0
    assert events_of(trace) == [(OP_ALLOC, 100, 0, 0)]
    assert int(trace.live_bytes()[-1]) == active_requested_bytes(snap)


def pre_recording_snapshot() -> dict:
    """Recording starts mid-run: block A (at base) was allocated before and is freed in the
    trace; block B (base + 3 MiB) was allocated before and is still live; C reuses A's
    memory."""
    base = 0x100000
    return {"segments": [segment(base, 20 * MiB, [
                block(base, 1 * MiB, 1 * MiB - 4, "active_allocated"),              # C
                block(base + 1 * MiB, 2 * MiB, 0, "inactive"),
                block(base + 3 * MiB, 4 * MiB, 4 * MiB - 100, "active_allocated"),  # B
                block(base + 7 * MiB, 13 * MiB, 0, "inactive")])],
            "device_traces": [[
                entry("free_requested", base, 3 * MiB - 1000, t=10),
                entry("free_completed", base, 3 * MiB - 1000, t=11),
                entry("alloc", base, 1 * MiB - 4, t=12),
                entry("oom", 0, 64 * MiB, t=13, device_free=5 * MiB),
                entry("segment_alloc", 0x9000000, 2 * MiB, t=14),
                entry("segment_free", 0x9000000, 2 * MiB, t=15)]]}


def test_blocks_from_before_recording_become_the_prologue():
    snap = pre_recording_snapshot()
    trace = read(snap)
    validate(trace, strict=True)
    meta = trace.metadata
    assert meta["prologue_events"] == 2
    assert events_of(trace) == [
        (OP_ALLOC, 3 * MiB - 1000, 0, 0),   # A, by address
        (OP_ALLOC, 4 * MiB - 100, 0, 0),    # B
        (OP_FREE, 3 * MiB - 1000, 0, 1000),
        (OP_ALLOC, 1 * MiB - 4, 0, 2000)]
    assert int(trace.live_bytes()[-1]) == active_requested_bytes(snap)
    (seg,) = meta["initial_segments"]  # the segment allocated and freed in the trace is gone
    base = 0x100000
    assert seg["address"] == base and seg["total_size"] == 20 * MiB
    # A's size is not in the file: the importer lays it out at its 512-rounded request and
    # marks it; the recording hands out nothing between A and B while A is live.
    assert [(b["address"], b["size"], b["requested_size"], b["state"]) for b in seg["blocks"]] == [
        (base, 3 * MiB - 512, 3 * MiB - 1000, "active_allocated"),
        (base + 3 * MiB - 512, 512, 0, "inactive"),
        (base + 3 * MiB, 4 * MiB, 4 * MiB - 100, "active_allocated"),
        (base + 7 * MiB, 13 * MiB, 0, "inactive")]
    assert seg["blocks"][0]["size_inferred"] and "carved_at" not in seg["blocks"][0]
    assert meta["initial_block_sizes_inferred"] == 1
    # The model's own split rule sizes it: 512 bytes before B are too little for the allocator
    # to split off a large-pool block (should_split), so A had them too.
    policy = parse_policy("pytorch").build(SimulatedDevice(DeviceProfile("d", 1 << 40)).view(0))
    (sized,) = sized_start_segments(meta["initial_segments"], policy)
    assert [(b["address"], b["size"], b["state"]) for b in sized["blocks"]] == [
        (base, 3 * MiB, "active_allocated"), (base + 3 * MiB, 4 * MiB, "active_allocated"),
        (base + 7 * MiB, 13 * MiB, "inactive")]
    assert "inconsistencies" not in meta


def test_reference_events_keep_file_order_and_point_at_the_next_event():
    trace = read(pre_recording_snapshot())
    refs = trace.metadata["reference_events"]
    assert refs == [
        {"action": "oom", "addr": None, "size": 64 * MiB, "stream": 0, "time_ns": 3000,
         "event": 4, "device_free": 5 * MiB},
        {"action": "segment_alloc", "addr": 0x9000000, "size": 2 * MiB, "stream": 0,
         "time_ns": 4000, "event": 4},
        {"action": "segment_free", "addr": 0x9000000, "size": 2 * MiB, "stream": 0,
         "time_ns": 5000, "event": 4}]


def test_alloc_before_its_segment_alloc_keeps_file_order():
    blocks = [block(0x200000, 512, 8, "active_allocated"),
              block(0x200200, 2 * MiB - 512, 0, "inactive")]
    snap = {"segments": [segment(0x200000, 2 * MiB, blocks, kind="small")],
            "device_traces": [[entry("alloc", 0x200000, 8, t=1),
                               entry("segment_alloc", 0x200000, 2 * MiB, t=1)]]}
    trace = read(snap)
    assert trace.metadata["reference_events"][0]["event"] == 1  # after the alloc, as in the file
    assert trace.metadata["initial_segments"] == []
    assert trace.metadata["prologue_events"] == 0


def test_expandable_segments_are_unmapped_backwards():
    base = 0x40000000
    snap = {"segments": [segment(base, 4 * MiB, [block(base, 3 * MiB, 3 * MiB, "active_allocated"),
                                                  block(base + 3 * MiB, MiB, 0, "inactive")],
                                 expandable=True)],
            "device_traces": [[entry("segment_map", base + 2 * MiB, 2 * MiB, t=1),
                               entry("alloc", base, 3 * MiB, t=2)]]}
    trace = read(snap)
    (seg,) = trace.metadata["initial_segments"]
    assert (seg["address"], seg["total_size"], seg["is_expandable"]) == (base, 2 * MiB, True)
    assert trace.metadata["prologue_events"] == 0


def test_legacy_list_is_the_state_only():
    snap = [segment(0x100000, 2 * MiB, [block(0x100000, 1024, 1000, "active_allocated"),
                                        block(0x100400, 2 * MiB - 1024, 0, "inactive")],
                    kind="small")]
    trace = read(snap)
    assert trace.metadata["legacy"] is True and "segments only" in trace.metadata["note"]
    assert events_of(trace) == [(OP_ALLOC, 1000, 0, 0)]
    assert trace.metadata["prologue_events"] == 1
    assert trace.metadata["reference_events"] == []


def test_inconsistent_files_are_counted_not_hidden():
    snap = {"segments": [], "device_traces": [[
        entry("alloc", 0x1000, 10, t=1), entry("free_completed", 0x1000, 10, t=2),
        entry("free_completed", 0x1000, 10, t=3)]]}
    trace = read(snap)
    validate(trace, strict=True)
    assert trace.metadata["inconsistencies"]["unmatched_frees_dropped"] == 1


def test_annotations_and_unknown_actions_are_counted_only():
    snap = {"segments": [], "device_traces": [[
        {"action": "annotate", "stream": 0x55, "time_us": 1},
        entry("alloc", 0x1000, 10, stream=0x66, t=2)]]}
    trace = read(snap)
    assert trace.metadata["actions"] == {"annotate": 1, "alloc": 1}
    assert trace.metadata["stream_handles"] == {"0": 0x66}


# ====================================================================== tags
CPP = [{"filename": "??", "line": 0, "name": "torch::unwind::unwind()"},
       {"filename": "CUDACachingAllocator.cpp", "line": 0, "name": "malloc"},
       {"filename": "", "line": 0, "name": "at::empty"},
       {"filename": "??", "line": 0, "name": "_PyEval_EvalFrameDefault"}]
TORCH = [{"filename": "/venv/lib/python3.12/site-packages/torch/nn/functional.py",
          "line": 2000, "name": "linear"},
         {"filename": "/usr/lib/python3.12/contextlib.py", "line": 81, "name": "inner"}]
USER = [{"filename": "/home/me/train.py", "line": 42, "name": "step"},
        {"filename": "/home/me/train.py", "line": 99, "name": "<module>"}]


def tagged(frames_per_alloc: list[list[dict]]) -> Trace:
    entries = [entry("alloc", 0x1000 * (i + 1), 8, t=i, frames=frames)
               for i, frames in enumerate(frames_per_alloc)]
    return read({"segments": [], "device_traces": [entries]})


def test_tag_is_the_first_user_frame():
    trace = tagged([CPP + TORCH + USER, CPP, CPP + TORCH, []])
    names = [trace.tag_name(t) for t in trace.tag.tolist()]
    # No user frame: the first kept Python frame (a torch call site); none at all: no tag.
    assert names == ["train.py:42:step", None, "functional.py:2000:linear", None]
    stack = trace.metadata["tag_stacks"]["train.py:42:step"]
    assert stack[0] == "CUDACachingAllocator.cpp:0:malloc"      # filtered like _memory_viz
    assert "/home/me/train.py:42:step" in stack
    assert not any("unwind" in f or "_PyEval" in f for f in stack)


def test_cpp_only_stacks_are_tagged_by_autograd_node_or_op():
    op = {"filename": "??", "line": 0, "name": "at::_ops::mul_Tensor::call(at::Tensor const&)"}
    node = {"filename": "??", "line": 0,
            "name": "torch::autograd::generated::MulBackward0::apply(std::vector<at::Tensor>&&)"}
    trace = tagged([[*CPP, op, node], [*CPP, op]])
    assert [trace.tag_name(t) for t in trace.tag.tolist()] == ["autograd:MulBackward0",
                                                               "aten::mul_Tensor"]


def test_tag_stacks_are_capped():
    deep = [{"filename": f"/home/me/m{i}.py", "line": i, "name": "f"} for i in range(200)]
    trace = tagged([deep])
    assert len(trace.metadata["tag_stacks"]["m0.py:0:f"]) == ts.MAX_STACK_FRAMES
