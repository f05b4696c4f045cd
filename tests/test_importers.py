"""Tests for the importers of other tools' traces: PyTorch profiler, CuPy hook logs, RMM CSV,
malloc-lab .rep. Small hand-written files for each, plus the real profiler files in
shared/traces (skipped when that folder is absent)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from allocsim.traces.formats import (  # registers them
    cupy_log,
    format_for,
    load,
    load_with_report,
    malloclab,
    rmm_csv,
    torch_profiler,
)
from allocsim.traces.formats.cupy_log import read_cupy_log
from allocsim.traces.formats.malloclab import read_malloclab
from allocsim.traces.formats.rmm_csv import parse_time, read_rmm_csv
from allocsim.traces.formats.torch_profiler import PROLOGUE_TAG, read_torch_profiler
from allocsim.traces.model import OP_ALLOC, SIZE_UNKNOWN, Trace, TraceError
from allocsim.traces.validate import validate

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


def shared(name: str) -> Path:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} is not here")
    return path


def one_line_error(call, *args, **kwargs) -> str:
    with pytest.raises(TraceError) as caught:
        call(*args, **kwargs)
    text = str(caught.value)
    assert "\n" not in text
    return text


def rows(trace: Trace) -> list[tuple]:
    """(time, op, id, size, stream, tag name) per event."""
    return [(int(t), "alloc" if o == OP_ALLOC else "free", int(i), int(s), int(st),
             trace.tag_name(int(g))) for t, o, i, s, st, g in
            zip(trace.time_ns, trace.op, trace.id, trace.size, trace.stream, trace.tag)]


# ====================================================================== PyTorch profiler
def mem(ts, addr, nbytes, total, *, dev_type=0, dev_id=-1, tid=1, pid=7):
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": pid,
            "tid": tid, "ts": ts,
            "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": total,
                     "Total Reserved": 0, "Device Type": dev_type, "Device Id": dev_id}}


def op(name, ts, dur, *, tid=1, pid=7, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def profiler_bytes(events, bare: bool = False) -> bytes:
    return json.dumps(events if bare else {"schemaVersion": 1, "traceEvents": events}).encode()


def read_profiler(events, **options) -> Trace:
    return read_torch_profiler(profiler_bytes(events), "p.json", "p", **options)


def test_profiler_small_file_ops_as_tags_and_times_in_ns():
    events = [
        op("outer", 10.0, 20.0),
        op("inner", 12.0, 3.0),
        op("cudaMalloc", 12.5, 0.2, cat="cuda_runtime"),  # not an op: never a tag
        mem(12.5, 0x100, 64, 64),    # inside inner (and outer)
        mem(15.0, 0x200, 32, 96),    # at inner's end: still inside (inclusive)
        mem(20.0006, 0x100, -64, 32),  # only outer
        mem(31.0, 0x200, -32, 0),    # after outer: no op
    ]
    trace = read_profiler(events)
    assert rows(trace) == [
        (0, "alloc", 0, 64, 0, "inner"),
        (2500, "alloc", 1, 32, 0, "inner"),
        (7501, "free", 0, 64, 0, "outer"),
        (18500, "free", 1, 32, 0, None),
    ]
    meta = trace.metadata
    assert meta["format"] == "torch-profiler" and meta["device"] == "cpu"
    assert meta["devices"] == {"cpu": 4}
    assert meta["prologue_events"] == 0 and meta["reordered_events"] == 0
    assert meta["total_allocated_first"] == 64 and meta["total_reserved_max"] == 0
    assert meta["unrecorded_live_bytes"] == {"min": 0, "max": 0}
    assert meta["source"] == "p.json" and meta["name"] == "p"


def test_profiler_bare_list_and_nested_ops_with_same_start():
    events = [op("a", 0, 10), op("b", 0, 5), mem(1, 1, 8, 8), mem(7, 1, -8, 0)]
    trace = read_torch_profiler(profiler_bytes(events, bare=True), "p.json", "p")
    assert [trace.tag_name(int(g)) for g in trace.tag] == ["b", "a"]


def test_profiler_address_reuse_gives_fresh_ids():
    events = [mem(1, 0xA, 100, 100), mem(2, 0xA, -100, 0), mem(3, 0xA, 200, 200),
              mem(4, 0xA, -200, 0)]
    trace = read_profiler(events)
    assert trace.id.tolist() == [0, 0, 1, 1]
    assert trace.size.tolist() == [100, 100, 200, 200]
    validate(trace)  # strictly valid


def test_profiler_unknown_frees_become_a_prologue():
    # Recording started with 0xB (50 bytes) and 0xC (70 bytes) already live; 0xC is never
    # freed in the window, so only 0xB can be seen.
    events = [mem(1, 0xA, 100, 220), mem(2, 0xB, -50, 170), mem(3, 0xA, -100, 70)]
    trace = read_profiler(events)
    assert rows(trace) == [
        (0, "alloc", 1, 50, 0, PROLOGUE_TAG),
        (0, "alloc", 0, 100, 0, None),
        (1000, "free", 1, 50, 0, None),
        (2000, "free", 0, 100, 0, None),
    ]
    meta = trace.metadata
    assert meta["prologue_events"] == 1 and meta["prologue_bytes"] == 50
    # Total Allocated minus the trace's live bytes: 0xC's 70 bytes, at every event.
    assert meta["unrecorded_live_bytes"] == {"min": 70, "max": 70}
    _, report = validate(trace)
    assert report.leaks == 0


def test_profiler_sorts_threads_by_time_and_counts_reorderings():
    # The file lists thread 2's events after thread 1's, as real files do.
    events = [mem(5, 0xA, 10, 10, tid=1), mem(9, 0xA, -10, 0, tid=1),
              mem(6, 0xB, 20, 30, tid=2), mem(7, 0xB, -20, 10, tid=2)]
    trace = read_profiler(events)
    assert trace.time_ns.tolist() == [0, 1000, 2000, 4000]
    assert trace.size.tolist() == [10, 20, 20, 10]
    assert trace.metadata["reordered_events"] == 3  # all but the first moved
    validate(trace)


def test_profiler_device_selection():
    events = [mem(1, 1, 8, 8), mem(2, 1, -8, 0),
              mem(1, 0x10, 100, 100, dev_type=1, dev_id=0),
              mem(2, 0x20, 200, 300, dev_type=1, dev_id=1),
              mem(3, 0x20, -200, 100, dev_type=1, dev_id=1),
              mem(4, 0x30, 300, 400, dev_type=1, dev_id=1)]
    default = read_profiler(events)
    assert default.metadata["device"] == "cuda:1"  # the busiest CUDA device
    assert default.metadata["devices"] == {"cpu": 2, "cuda:0": 1, "cuda:1": 3}
    assert default.size.tolist() == [200, 200, 300]
    assert read_profiler(events, device_index="cpu").size.tolist() == [8, 8]
    assert read_profiler(events, device_index=0).size.tolist() == [100]
    assert read_profiler(events, device_index="cuda:0").metadata["device"] == "cuda:0"
    assert read_profiler(events, device_index="1").metadata["device"] == "cuda:1"
    text = one_line_error(read_profiler, events, device_index="cuda:5")
    assert "cuda:5" in text and "cuda:1 (3 events)" in text and text.startswith("p.json: ")
    assert "not 'cpu'" in one_line_error(read_profiler, events, device_index="gpu:x:1")
    # CPU only: the CPU is the default.
    assert read_profiler(events[:2]).metadata["device"] == "cpu"


def test_profiler_zero_byte_events_are_skipped():
    trace = read_profiler([mem(1, 1, 8, 8), mem(2, 2, 0, 8), mem(3, 1, -8, 0)])
    assert len(trace) == 2 and trace.metadata["zero_byte_events_skipped"] == 1


def test_profiler_errors_are_one_line_naming_file_and_event():
    no_addr = [op("x", 0, 1), mem(1, 1, 8, 8)]
    del no_addr[1]["args"]["Addr"]
    text = one_line_error(read_profiler, no_addr)
    assert text.startswith("p.json: event 1: ") and "cannot be replayed" in text
    bad_bytes = [mem(1, 1, "8", 8)]
    assert one_line_error(read_profiler, bad_bytes).startswith("p.json: event 0: ")
    mismatch = [mem(1, 1, 8, 8), mem(2, 1, -16, 0)]
    text = one_line_error(read_profiler, mismatch)
    assert text.startswith("p.json: event 1: ") and "allocated with 8 bytes" in text
    assert "no [memory] events" in one_line_error(read_profiler, [op("x", 0, 1)])
    assert "not a JSON" in one_line_error(read_torch_profiler, b"{oops", "p.json", "p")
    assert "not a chrome trace" in one_line_error(read_torch_profiler, b'{"a": 1}', "p.json",
                                                  "p")


def test_profiler_detection_by_content_and_gzip(tmp_path):
    events = [op("x", 0, 10), mem(1, 1, 8, 8), mem(2, 1, -8, 0)]
    gz = tmp_path / "run.json.gz"
    gz.write_bytes(gzip.compress(profiler_bytes(events)))
    trace = load(gz)
    assert trace.metadata["format"] == "torch-profiler" and len(trace) == 2
    odd = tmp_path / "run.pt.trace"  # unknown extension: the content decides
    odd.write_bytes(gzip.compress(profiler_bytes(events)))
    assert load(odd).metadata["format"] == "torch-profiler"
    assert load(gz, device_index="cpu").metadata["device"] == "cpu"
    assert torch_profiler.detect_torch_profiler("x", b' {\n "traceEvents": [')
    assert not torch_profiler.detect_torch_profiler("x", b'{"time_ns": 0}')


def test_profiler_real_mlp_trace():
    trace = load(shared("torch-profiler-cpu-mlp-train.json.gz"))
    assert (trace.n_allocs, trace.n_frees) == (549, 549)
    assert trace.peak_live()[0] == 471_089_352
    assert trace.metadata["device"] == "cpu" and trace.metadata["prologue_events"] == 0
    assert trace.metadata["unrecorded_live_bytes"] == {"min": 0, "max": 0}
    assert "Optimizer.step#AdamW.step" in trace.tags


def test_profiler_real_lstm_trace():
    trace = load(shared("torch-profiler-cpu-lstm-train.json.gz"))
    assert (trace.n_allocs, trace.n_frees) == (538, 538)
    assert trace.peak_live()[0] == 99_139_976


def test_profiler_real_cuda_trace_recorded_mid_run():
    trace, report = load_with_report(shared("torch-profiler-cuda-hta.json.gz"))
    meta = trace.metadata
    assert meta["device"] == "cuda:1"
    assert meta["devices"] == {"cpu": 1240, "cuda:1": 26770}
    assert len(trace) == 26770 and trace.n_allocs == trace.n_frees == 13385
    assert not report.repairs()
    # The file lists the forward thread's events, then the backward thread's: in time order
    # every free follows its allocation, so no prologue is needed ...
    assert meta["reordered_events"] > 20000 and meta["prologue_events"] == 0
    # ... and the 5.4 GB "Total Allocated" at the file's first event is buffers allocated
    # before recording and never freed in the window: a constant 4,096,614,400 bytes above
    # the trace's live bytes at every event.
    assert meta["unrecorded_live_bytes"] == {"min": 4_096_614_400, "max": 4_096_614_400}
    assert meta["total_allocated_first"] == 4_096_614_400 + int(trace.size[0])
    assert meta["total_reserved_max"] == 12_782_141_440
    assert trace.peak_live()[0] == 2_532_893_696


# ====================================================================== CuPy hook logs
RECORDER_LOG = "\n".join([
    '{"allocsim-cupy-log": 1, "metadata": {"recorder": "test"}}',
    '{"t": 100, "hook": "alloc", "device": 0, "mem_size": 1024, "ptr": 4096}',
    '{"t": 150, "hook": "malloc", "device": 0, "size": 1000, "mem_size": 1024, "ptr": 4096,'
    ' "pmem_id": 11, "stream": 0, "tag": "a.py:3:f"}',
    '{"t": 300, "hook": "malloc", "device": 0, "size": 24, "mem_size": 512, "ptr": 8192,'
    ' "pmem_id": 12, "stream": 77, "tag": "a.py:4:f"}',
    '{"t": 400, "hook": "free", "device": 0, "mem_size": 1024, "ptr": 4096, "pmem_id": 11,'
    ' "stream": 77}',
    '{"t": 500, "hook": "malloc", "device": 0, "size": 700, "mem_size": 1024, "ptr": 4096,'
    ' "pmem_id": 13, "stream": 77, "tag": "a.py:3:f"}',
    '{"t": 600, "hook": "free", "device": 0, "mem_size": 512, "ptr": 65536, "pmem_id": 9,'
    ' "stream": 0}',
    '{"t": 700, "hook": "malloc", "device": 0, "size": 0, "mem_size": 0, "ptr": 0,'
    ' "pmem_id": 14, "stream": 0}',
    '{"t": 800, "hook": "malloc", "device": 0, "size": 99999999, "mem_size": 100000256,'
    ' "ptr": 0, "pmem_id": 0, "stream": 0}',
    '{"t": 900, "hook": "malloc", "device": 1, "size": 8, "mem_size": 512, "ptr": 4096,'
    ' "pmem_id": 15, "stream": 0}',
    "",
])


def read_log(text: str, **options) -> Trace:
    return read_cupy_log(text.encode(), "c.log", "c", **options)


def test_cupy_recorder_log():
    trace = read_log(RECORDER_LOG)
    # The free of 0x10000 (malloc'ed before recording) opens a prologue buffer of mem_size.
    assert rows(trace) == [  # times count from the first line (the pool miss)
        (0, "alloc", 3, 512, 0, PROLOGUE_TAG),
        (50, "alloc", 0, 1000, 0, "a.py:3:f"),
        (200, "alloc", 1, 24, 1, "a.py:4:f"),
        (300, "free", 0, 1000, 0, None),  # allocated on stream 0, freed on 77
        (400, "alloc", 2, 700, 1, "a.py:3:f"),  # address 4096 again: a fresh id
        (500, "free", 3, 512, 0, None),
    ]
    meta = trace.metadata
    assert meta["recorder"] == "test" and meta["synthetic_times"] is False
    assert meta["device"] == "cuda:0" and meta["devices"] == {"cuda:0": 7, "cuda:1": 1}
    assert meta["stream_handles"] == {"0": 0, "1": 77}
    assert meta["prologue_events"] == 1 and meta["prologue_bytes"] == 512
    assert meta["zero_size_mallocs_skipped"] == 1 and meta["failed_mallocs"] == 1
    assert meta["reference_events"] == [  # the pool miss served trace event 1
        {"action": "segment_alloc", "addr": 4096, "size": 1024, "stream": 0, "time_ns": 0,
         "event": 1},
        {"action": "oom", "size": 99999999, "stream": 0, "time_ns": 700, "event": 6},
    ]
    # A free of an address the log never allocated: counted when lenient, an error when strict
    # (the recorder logs from the start, so it is an anomaly, not a recording window).
    _, report = validate(trace, strict=False)
    assert report.repairs() == {"unknown_address_frees_opened": 1}
    text = one_line_error(validate, trace)
    assert text.startswith("c.log: event 5: free of address 0x10000, which was never allocated")
    other = read_log(RECORDER_LOG, device_index=1)
    assert other.metadata["device"] == "cuda:1" and other.size.tolist() == [8]
    assert "cuda:3" in one_line_error(read_log, RECORDER_LOG, device_index="cuda:3")


DEBUG_PRINT_LOG = """\
starting the program
{"hook":"alloc","device_id":0,"mem_size":512,"mem_ptr":150496608256}
{"hook":"malloc","device_id":0,"size":24,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278"}
loss 0.25
{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":150496608768,"pmem_id":"0x7f39200c5300"}
{"hook":"free","device_id":0,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278"}
{"hook":"malloc","device_id":0,"size":500,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278"}
"""


def test_cupy_debug_print_hook_log_gets_synthetic_times():
    trace = read_log(DEBUG_PRINT_LOG)
    assert rows(trace) == [
        (0, "alloc", 0, 24, 0, None),
        (1000, "alloc", 1, 1000, 0, None),
        (2000, "free", 0, 24, 0, None),
        (3000, "alloc", 2, 500, 0, None),
    ]
    meta = trace.metadata
    assert meta["synthetic_times"] is True and meta["skipped_lines"] == 2
    assert meta["reference_events"] == [{"action": "segment_alloc", "addr": 150496608256,
                                         "size": 512, "stream": 0, "time_ns": 0, "event": 0}]
    assert "stream_handles" not in meta
    _, report = validate(trace)
    assert report.leaks == 2


def test_cupy_failed_cudamalloc_is_a_failed_segment_alloc():
    log = ('{"hook":"alloc","device_id":0,"mem_size":1024,"mem_ptr":0}\n'
           '{"hook":"alloc","device_id":0,"mem_size":1024,"mem_ptr":4096}\n'
           '{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":4096,'
           '"pmem_id":1}\n')
    assert [r["action"] for r in read_log(log).metadata["reference_events"]] == \
        ["segment_alloc_failed", "segment_alloc"]


def test_cupy_log_errors_are_one_line_naming_file_event_and_line():
    text = one_line_error(read_log, '{"hook": "malloc", "device_id": 0, "size": 8,'
                                    ' "mem_ptr": 1}\n{"hook": "malloc",\n')
    assert text.startswith("c.log: event 1: line 2: bad JSON")
    text = one_line_error(read_log, '{"hook": "realloc", "mem_ptr": 1}')
    assert text.startswith("c.log: event 0: line 1: ") and "realloc" in text
    text = one_line_error(read_log, '\n{"hook": "malloc", "mem_ptr": 1}')
    assert text.startswith("c.log: event 0: line 2: ") and "'size'" in text
    text = one_line_error(read_log, '{"hook": "malloc", "size": "x", "mem_ptr": 1}')
    assert "size 'x' is not an integer" in text
    mixed = ('{"t": 1, "hook": "malloc", "size": 8, "ptr": 1}\n'
             '{"hook": "free", "mem_size": 512, "ptr": 1}\n')
    assert "some lines have a time" in one_line_error(read_log, mixed)


def test_cupy_log_detection_by_content(tmp_path):
    path = tmp_path / "hooks.log"
    path.write_text(DEBUG_PRINT_LOG)
    assert load(path).metadata["format"] == "cupy-log"
    gz = tmp_path / "hooks.out"  # unknown extension, gzipped: the content decides
    gz.write_bytes(gzip.compress(RECORDER_LOG.encode()))
    trace = load(gz, device_index=0)
    assert trace.metadata["format"] == "cupy-log" and len(trace) == 6
    jsonl = tmp_path / "hooks.cupy.jsonl"
    jsonl.write_text(RECORDER_LOG)
    assert format_for(jsonl, RECORDER_LOG.encode()) == cupy_log.FORMAT_NAME


# ====================================================================== RMM CSV
RMM_LOG = """\
Thread,Time,Action,Pointer,Size,Stream
140573312345856,23:59:59:999000,allocate,0x7f8a40000000,1024,0x7f8a38001020
140573312345856,23:59:59:999500,allocate,7f8a40000400,2048,0x0
140573312345856,00:00:00:000100,allocate failure,0x0,1099511627776,0x0
140573312345857,00:00:00:000050,free,0x7f8a40000000,1024,0x7f8a38001020
140573312345856,00:00:00:000200,allocate,0x7f8a40000000,512,0x0
140573312345856,00:00:00:000300,free,0x7f8a50000000,4096,0x0
"""


def test_rmm_csv():
    trace = read_rmm_csv(RMM_LOG.encode(), "r.rmm.csv", "r")
    assert rows(trace) == [
        (0, "alloc", 3, 4096, 1, PROLOGUE_TAG),
        (0, "alloc", 0, 1024, 0, None),
        (500_000, "alloc", 1, 2048, 1, None),
        (1_100_000, "free", 0, 1024, 0, None),  # logged out of order: clamped, not moved
        (1_200_000, "alloc", 2, 512, 1, None),   # address reused: a fresh id
        (1_300_000, "free", 3, 4096, 1, None),
    ]
    meta = trace.metadata
    assert meta["format"] == "rmm-csv" and meta["threads"] == 2
    assert meta["stream_handles"] == {"0": 0x7f8a38001020, "1": 0}
    assert meta["times_clamped"] == 1 and meta["failed_allocations"] == 1
    assert meta["reference_events"] == [{"action": "oom", "size": 1099511627776,
                                         "stream": 1, "time_ns": 1_100_000, "event": 3}]
    assert meta["prologue_events"] == 1
    _, report = validate(trace, strict=False)
    assert report.repairs() == {"unknown_address_frees_opened": 1}
    assert one_line_error(validate, trace).startswith(
        "r.rmm.csv: event 5: free of address 0x7f8a50000000, which was never allocated")


def test_two_allocations_at_one_live_address_fail_strict_loading():
    # RMM: 0x10 is allocated twice with no free between (a missed free).
    log = ("Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x10,64,0x0\n"
           "1,0.2,allocate,0x10,32,0x0\n1,0.3,free,0x10,32,0x0\n")
    trace = read_rmm_csv(log.encode(), "r.rmm.csv", "r")
    _, report = validate(trace, strict=False)
    assert report.repairs() == {"live_address_allocs_kept": 1}
    assert one_line_error(validate, trace).startswith(
        "r.rmm.csv: event 1: alloc at address 0x10, which is still live (a missed free)")
    # The profiler: the same, and there a free of an unknown address stays the documented
    # recording window (a prologue), not an anomaly.
    events = [mem(1, 0xA, 100, 100), mem(2, 0xA, 50, 150), mem(3, 0xB, -8, 142)]
    profiled = read_profiler(events)
    assert "frees_of_unknown_addresses" not in profiled.metadata["address_anomalies"]
    assert "is still live" in one_line_error(validate, profiled)


def test_rmm_time_formats():
    assert parse_time("11:21:37:466436") == ((11 * 60 + 21) * 60 + 37) * 10**9 + 466436000
    assert parse_time("11:21:37.5") == ((11 * 60 + 21) * 60 + 37) * 10**9 + 500_000_000
    assert parse_time("1634567890.123456") == 1634567890123456000
    assert parse_time("12") == 12 * 10**9
    with pytest.raises(ValueError):
        parse_time("noon")
    seconds = "Thread,Time,Action,Pointer,Size,Stream\n1,100.25,allocate,0x10,8,0x0\n" \
              "1,100.5,free,0x10,8,0x0\n"
    trace = read_rmm_csv(seconds.encode(), "r.rmm.csv", "r")
    assert trace.time_ns.tolist() == [0, 250_000_000]


def test_rmm_errors_are_one_line_naming_file_event_and_line():
    head = "Thread,Time,Action,Pointer,Size,Stream\n"
    read = lambda text: read_rmm_csv(text.encode(), "r.rmm.csv", "r")  # noqa: E731
    text = one_line_error(read, head + "1,1,allocate,0x10,8,0\n\n1,2,resize,0x10,8,0\n")
    assert text.startswith("r.rmm.csv: event 1: line 4: ") and "resize" in text
    text = one_line_error(read, head + "1,1,allocate,0x10,8,0\n1,2,free,0x10,16,0\n")
    assert text.startswith("r.rmm.csv: event 1: line 3: ") and "allocated with 8" in text
    assert "Pointer 'zz'" in one_line_error(read, head + "1,1,allocate,zz,8,0\n")
    assert "Time 'x'" in one_line_error(read, head + "1,x,allocate,0x1,8,0\n")
    assert "Size '-8'" in one_line_error(read, head + "1,1,allocate,0x1,-8,0\n")
    assert "RMM header" in one_line_error(read, "a,b,c\n")
    assert "RMM header" in one_line_error(read, "")


def test_rmm_detection(tmp_path):
    path = tmp_path / "run.rmm.csv"
    path.write_text(RMM_LOG)
    assert load(path).metadata["format"] == "rmm-csv"
    other = tmp_path / "rmm_log.txt"  # no extension of its own: the header decides
    other.write_text(RMM_LOG)
    assert load(other).metadata["format"] == "rmm-csv"
    assert rmm_csv.detect_rmm_csv("x", b"thread, time, action, pointer, size, stream\n")
    assert not rmm_csv.detect_rmm_csv("x", b"time_ns,op,id,size\n")


# ====================================================================== malloc-lab
MALLOCLAB = """\
20000
3
7
1
a 0 2040
a 1 2040
r 0 48
f 1
r 2 16
f 0
f 1
"""


def test_malloclab_rep():
    trace = read_malloclab(MALLOCLAB.encode(), "t.rep", "t")
    assert [(t, o, i, s) for t, o, i, s, *_ in rows(trace)] == [
        (0, "alloc", 0, 2040),
        (1000, "alloc", 1, 2040),
        (2000, "free", 0, 2040),  # realloc: free of the old block ...
        (3000, "alloc", 0, 48),   # ... then the new one, same id
        (4000, "free", 1, 2040),
        (5000, "alloc", 2, 16),   # realloc of an id never allocated: a plain alloc
        (6000, "free", 0, 48),
        (7000, "free", 1, SIZE_UNKNOWN),  # id 1 is not live: dropped by lenient loading
    ]
    assert trace.metadata["malloclab"] == {"flavour": "cs:app", "heap_size": 20000, "ids": 3,
                                           "ops": 7, "weight": 1}
    assert trace.metadata["synthetic_times"] is True


def test_malloclab_load_and_detection(tmp_path):
    path = tmp_path / "short.rep"
    path.write_text(MALLOCLAB)
    trace, report = load_with_report(path)
    assert report.unmatched_frees_dropped == 1 and len(trace) == 7
    assert trace.metadata["validation"]["repairs"] == {"unmatched_frees_dropped": 1}
    other = tmp_path / "short.trace"
    other.write_text(MALLOCLAB)
    assert load(other).metadata["format"] == "malloclab"
    assert not malloclab.detect_malloclab("x", b"time_ns,op,id,size\n0,alloc,1,2\n")


AUTOLAB = """\
1
2
6
0
a 0 24
f -1
r 0 0
a 1 40
f -1
f 1
"""


def test_an_autolab_trace_names_its_header_and_frees_null_as_nothing():
    # The Autolab driver (the real-program traces bash.rep, chrome.rep, ...): the first line is
    # the weight, not a heap size; "f -1" is free(NULL); realloc to 0 bytes frees the block.
    trace = read_malloclab(AUTOLAB.encode(), "bash.rep", "bash")
    assert [(o, i, s) for _, o, i, s, *_ in rows(trace)] == [
        ("alloc", 0, 24), ("free", 0, 24), ("alloc", 1, 40), ("free", 1, 40)]
    assert trace.metadata["malloclab"] == {"flavour": "autolab", "weight": 1, "ids": 2,
                                           "ops": 6, "ignore_ranges": 0}
    assert trace.metadata["null_frees"] == 2
    assert "heap_size" not in trace.metadata["malloclab"]


def test_malloclab_errors():
    read = lambda text: read_malloclab(text.encode(), "t.rep", "t")  # noqa: E731
    text = one_line_error(read, "100\n2\n2\n1\na 0 8\na 5 8\n")
    assert text.startswith("t.rep: event 1: line 6: ") and "outside 0..1" in text
    assert "says 3 requests" in one_line_error(read, "100\n2\n3\n1\na 0 8\nf 0\n")
    text = one_line_error(read, "100\n2\n2\n1\na 0 8\nx 0\n")
    assert text.startswith("t.rep: event 1: line 6: ")
    assert "takes 1 numbers" in one_line_error(read, "100\n2\n1\n1\nf 0 8\n")
    assert "header" in one_line_error(read, "100\n2\n")
    assert "not an integer" in one_line_error(read, "100\nx\n1\n1\na 0 8\n")


def test_malloclab_requests_past_the_count_follow_each_driver():
    """CS:APP's mdriver asserts the count; Autolab's stops reading after num_ops requests."""
    read = lambda text: read_malloclab(text.encode(), "t.rep", "t")  # noqa: E731
    assert "says 2 requests but the file has 3" in one_line_error(
        read, "100\n2\n2\n1\na 0 8\nf 0\na 1 8\n")
    trace = read("1\n2\n2\n0\na 0 8\nf 0\na 1 8\n")          # Autolab header
    assert len(trace) == 2 and trace.metadata["malloclab"]["lines_after_requests"] == 1
    assert "says 3 requests but the file has 2" in one_line_error(
        read, "1\n2\n3\n0\na 0 8\nf 0\n")                     # fewer: an error in both


HTA = Path(__file__).resolve().parents[2] / "shared" / "traces" / "torch-profiler-cuda-hta.json.gz"


@pytest.mark.skipif(not HTA.exists(), reason="the shared HTA recording is absent")
def test_memory_live_before_recording_is_shown_and_can_be_the_start_state(capsys) -> None:
    from allocsim.sim.cli.main import main
    # The file's Total Allocated is 4,096,614,400 B above the trace's live bytes at every event.
    assert main(["info", str(HTA), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["live_before_recording"] == {"min": 4_096_614_400, "max": 4_096_614_400}
    assert main(["info", str(HTA)]) == 0
    assert "3.82GiB live before recording started" in capsys.readouterr().out
    assert main(["compare", str(HTA), "--policies", "bfc", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["trace"]["live_before_recording"]["in_replay"] is False
    assert main(["compare", str(HTA), "--policies", "bfc", "--json",
                 "--start-state", "unrecorded"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert full["trace"]["live_before_recording"]["in_replay"] is True
    assert full["trace"]["peak_live"] == plain["trace"]["peak_live"] + 4_096_614_400
    assert full["trace"]["events"] == plain["trace"]["events"] + 1


def test_a_start_state_for_a_file_that_has_none_is_one_line(capsys, tmp_path) -> None:
    from allocsim.sim.cli.main import main
    path = tmp_path / "t.csv"
    path.write_text("time_ns,op,id,size\n0,alloc,1,64\n1,free,1,\n")
    assert main(["info", str(path), "--start-state", "unrecorded"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not apply to csv files" in err
