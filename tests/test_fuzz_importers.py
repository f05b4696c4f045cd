"""Fuzzing every importer (issue 16): numeric extremes, deep nesting, compression bombs.

The property, for every format: :func:`allocsim.traces.formats.load` either returns a Trace
or raises :class:`TraceError` whose text is one line starting with the file's name — never
any other exception; and ``allocsim info FILE`` exits 0, or 2 with exactly one stderr line,
never a traceback.

Each format gets a Hypothesis strategy that builds a small file of that format in the shape
the existing tests use (tests/test_importers.py, tests/test_native_formats.py,
tests/test_torch_snapshot.py, tests/test_xla_dump.py, tests/test_xplane.py) with its numbers
drawn from :data:`EXTREMES` (0, -1, 2**63-1, 2**63, 2**64, 1e300, NaN, inf, floats, strings,
booleans, None, containers) or plain integers and floats. Deep nesting (up to 10**5) and
gzip bombs are fixed cases per format.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import pickle
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.sim.cli.main import main
from allocsim.traces import formats
from allocsim.traces.formats.xla.xplane_proto import encode_xspace
from allocsim.traces.model import Trace, TraceError

EXAMPLES = int(os.environ.get("ALLOCSIM_FUZZ_EXAMPLES", "100"))  # more: a longer hunt
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

EXTREMES: list[Any] = [0, -1, 1, 7, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1,
                       10**30, 1e300, -1e300, 1e-300, math.nan, math.inf, -math.inf, 0.5,
                       -0.0, 4096.0, "12", "0x10", "x", "", True, False, None, [], {}, [1],
                       {"a": 1}]
INT_EXTREMES = [v for v in EXTREMES if isinstance(v, int) and not isinstance(v, bool)]

numbers = st.one_of(st.sampled_from(EXTREMES), st.integers(),
                    st.floats(allow_nan=True, allow_infinity=True))
ints = st.one_of(st.sampled_from(INT_EXTREMES), st.integers(min_value=-(2**70),
                                                            max_value=2**70))
small = st.integers(min_value=0, max_value=1 << 20)


def scalar_text(value: Any) -> str:
    """How a number is written in a text format (CSV, .rep): Python's own spelling."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def field(draw: st.DrawFn, good: Any) -> Any:
    """Mostly a good value (so files get past their headers), often an extreme one."""
    return draw(st.one_of(st.just(good), numbers))


# ------------------------------------------------------------------ the property
def check_file(path: Path, named: Path | None = None) -> None:
    """``load`` gives a Trace or a one-line TraceError naming the file (or, for one file of
    an XLA dump, ``named``: the folder, whose sibling file may be the one at fault); ``info``
    exits 0 or 2 with one stderr line and no traceback."""
    try:
        trace = formats.load(path)
    except TraceError as err:
        text = str(err)
        assert "\n" not in text, text
        assert text.startswith(str(named or path)), text
    else:
        assert isinstance(trace, Trace)
        n = len(trace)
        for column in ("time_ns", "op", "id", "size", "stream"):
            assert len(getattr(trace, column)) == n
        assert n == 0 or int(np.min(np.diff(trace.time_ns), initial=0)) >= 0
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["info", str(path)])
    stderr = err.getvalue()
    assert "Traceback" not in stderr, stderr
    assert code in (0, 2), (code, stderr)
    if code == 2:
        lines = stderr.strip().splitlines()
        assert len(lines) == 1, stderr
        assert lines[0].startswith("allocsim: error:"), stderr


def fresh(folder: Path, suffix: str) -> Path:
    return folder / f"f{uuid.uuid4().hex[:8]}{suffix}"


def write(folder: Path, suffix: str, data: bytes) -> Path:
    path = fresh(folder, suffix)
    path.write_bytes(data)
    return path


# ------------------------------------------------------------------ native formats
OPS = st.one_of(st.sampled_from(["alloc", "free", "ALLOC", "a", "f", ""]), numbers)


@st.composite
def native_csv(draw: st.DrawFn) -> bytes:
    columns = draw(st.sampled_from([["time_ns", "op", "id", "size"],
                                    ["time_ns", "op", "id", "size", "stream", "tag"],
                                    ["op", "size", "time_ns", "id", "process"]]))
    lines = [",".join(columns)]
    for i in range(draw(st.integers(1, 5))):
        good = {"time_ns": i, "op": "alloc" if i % 2 == 0 else "free", "id": i // 2,
                "size": 64 if i % 2 == 0 else "", "stream": 0, "tag": "t", "process": 0}
        row = []
        for c in columns:
            value = draw(OPS) if c == "op" and draw(st.booleans()) else field(draw, good[c])
            row.append(scalar_text(value).replace(",", ";").replace("\n", " "))
        lines.append(",".join(row))
    return ("\n".join(lines) + "\n").encode()


@st.composite
def native_jsonl(draw: st.DrawFn) -> bytes:
    lines = []
    if draw(st.booleans()):
        lines.append(json.dumps({"allocsim-trace": {"name": field(draw, "x"),
                                                    "tags": field(draw, [])}}))
    for i in range(draw(st.integers(1, 5))):
        event = {"time_ns": field(draw, i), "op": draw(st.one_of(
            st.sampled_from(["alloc", "free"]), OPS)), "id": field(draw, i // 2),
            "size": field(draw, 64), "stream": field(draw, 0)}
        if draw(st.booleans()):
            event["tag"] = field(draw, "t")
        lines.append(json.dumps(event))
    return ("\n".join(lines) + "\n").encode()


NPZ_DTYPES = ["int64", "uint64", "int8", "float64", "bool", "U4"]


@st.composite
def native_npz(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(0, 4))
    arrays: dict[str, np.ndarray] = {}
    for column in ("time_ns", "op", "id", "size", "stream", "tag"):
        if column not in ("time_ns", "op", "id", "size") and draw(st.booleans()):
            continue
        dtype = draw(st.sampled_from(NPZ_DTYPES))
        length = n if draw(st.integers(0, 5)) else n + 1
        if dtype == "U4":
            arrays[column] = np.array(["x"] * length)
        elif dtype == "float64":
            arrays[column] = np.array(draw(st.lists(st.floats(), min_size=length,
                                                    max_size=length)), dtype)
        else:
            info = np.iinfo(dtype) if dtype != "bool" else None
            lo, hi = (0, 1) if info is None else (int(info.min), int(info.max))
            values = draw(st.lists(st.one_of(st.sampled_from([lo, hi, 0]),
                                             st.integers(lo, hi)),
                                   min_size=length, max_size=length))
            arrays[column] = np.array(values, dtype=dtype)
    for key in ("tags", "metadata", "format"):
        if draw(st.booleans()):
            arrays[key] = np.array(draw(st.sampled_from(
                ["[]", "{}", '["a", 1]', '{"name": NaN}', "[[[[", "allocsim-trace/1", "1e999",
                 "-Infinity", '{"' + "a" * 50 + '": [' * 50 + "]" * 50 + "}"])))
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **arrays)
    return buffer.getvalue()


# ------------------------------------------------------------------ PyTorch profiler JSON
@st.composite
def torch_profiler(draw: st.DrawFn) -> bytes:
    events: list[Any] = [{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 7,
                          "tid": 1, "ts": field(draw, 0), "dur": field(draw, 5)}]
    for i in range(draw(st.integers(1, 5))):
        alloc = i % 2 == 0
        args = {"Addr": field(draw, 4096 * (i // 2 + 1)),
                "Bytes": field(draw, 512 if alloc else -512),
                "Total Allocated": field(draw, 512 if alloc else 0),
                "Total Reserved": field(draw, 2048), "Device Type": field(draw, 1),
                "Device Id": field(draw, 0)}
        if draw(st.integers(0, 4)) == 0:
            del args[draw(st.sampled_from(sorted(args)))]
        events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                       "pid": field(draw, 7), "tid": 1, "ts": field(draw, 10 * (i + 1)),
                       "args": args})
    bare = draw(st.integers(0, 5)) == 0
    return json.dumps(events if bare else {"schemaVersion": 1, "traceEvents": events}).encode()


# ------------------------------------------------------------------ PyTorch snapshot pickle
@st.composite
def torch_snapshot(draw: st.DrawFn) -> bytes:
    base = field(draw, 1 << 30)
    blocks = [{"address": field(draw, 1 << 30), "size": field(draw, 1024),
               "requested_size": field(draw, 1000), "state": draw(st.sampled_from(
                   ["active_allocated", "inactive", "active_pending_free", 3])),
               "frames": []}]
    segments = [{"device": field(draw, 0), "address": base, "total_size": field(draw, 2 << 20),
                 "stream": field(draw, 0), "segment_type": "large", "is_expandable": False,
                 "frames": [], "blocks": blocks}]
    entries = []
    for i in range(draw(st.integers(0, 5))):
        action = draw(st.sampled_from(["alloc", "free_requested", "free_completed",
                                       "segment_alloc", "segment_free", "oom", "snapshot"]))
        entry = {"action": action, "addr": field(draw, (1 << 30) + 1024 * (i + 1)),
                 "size": field(draw, 512), "stream": field(draw, 0), "frames": []}
        if draw(st.booleans()):
            entry["time_us"] = field(draw, 100 * i)
        entries.append(entry)
    snapshot: Any = {"segments": segments, "device_traces": [entries]}
    if draw(st.integers(0, 6)) == 0:
        snapshot = segments  # the legacy shape: a bare list of segments
    return pickle.dumps(snapshot, protocol=draw(st.integers(2, 5)))


# ------------------------------------------------------------------ CuPy hook log
@st.composite
def cupy_log(draw: st.DrawFn) -> bytes:
    lines = ['{"allocsim-cupy-log": 1, "metadata": {"recorder": "test"}}'] \
        if draw(st.booleans()) else []
    for i in range(draw(st.integers(1, 5))):
        hook = draw(st.sampled_from(["alloc", "malloc", "free", "malloc", "free"]))
        event = {"t": field(draw, 100 * i), "hook": hook, "device": field(draw, 0),
                 "mem_size": field(draw, 1024), "ptr": field(draw, 4096 * (i // 2 + 1))}
        if hook == "malloc":
            event["size"] = field(draw, 1000)
        if hook != "alloc":
            event["pmem_id"] = field(draw, i // 2)
            event["stream"] = field(draw, 0)
        if draw(st.integers(0, 3)) == 0:  # DebugPrintHook's spelling
            event["mem_ptr"] = event.pop("ptr")
            event["device_id"] = event.pop("device")
        lines.append(json.dumps(event))
    return ("\n".join(lines) + "\n").encode()


# ------------------------------------------------------------------ RMM CSV
@st.composite
def rmm_csv(draw: st.DrawFn) -> bytes:
    lines = ["Thread,Time,Action,Pointer,Size,Stream"]
    for i in range(draw(st.integers(1, 5))):
        time = draw(st.one_of(st.just(f"00:00:00:{i:06d}"), st.just(f"{i}.25"),
                              numbers.map(scalar_text),
                              st.sampled_from(["99:99:99:999999", "-1:00:00:0",
                                               f"{2**64}:00:00:0", "1e300"])))
        action = draw(st.sampled_from(["allocate", "free", "allocate failure", "x"]))
        pointer = draw(st.one_of(st.just(hex(4096 * (i // 2 + 1))),
                                 ints.map(lambda v: hex(v) if v >= 0 else str(v)),
                                 numbers.map(scalar_text)))
        row = [scalar_text(field(draw, 1)), time, action, pointer,
               scalar_text(field(draw, 1024)), scalar_text(field(draw, "0x0"))]
        lines.append(",".join(c.replace(",", ";").replace("\n", " ") for c in row))
    return ("\n".join(lines) + "\n").encode()


# ------------------------------------------------------------------ malloc-lab .rep
@st.composite
def malloclab(draw: st.DrawFn) -> bytes:
    ops = []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from("aarf"))
        index = scalar_text(field(draw, i // 2))
        ops.append(f"f {index}" if kind == "f" else
                   f"{kind} {index} {scalar_text(field(draw, 2040))}")
    header = [scalar_text(field(draw, good)) for good in (20000, 3, len(ops), 1)]
    return ("\n".join(header + ops) + "\n").encode()


# ------------------------------------------------------------------ XLA dump folders
XLA_DATA = Path(__file__).resolve().parent / "data" / "xla" / "cpu"
XLA_NAME = "module_0001.jit_f.gpu_after_optimizations"


@st.composite
def xla_dump(draw: st.DrawFn, huge: bool = True) -> dict[str, str]:
    """The two files of one module; ``huge=False`` keeps integers below 2**63 (for the cases
    that read one file of the module rather than the folder)."""
    def num(good: int) -> str:
        value = draw(st.one_of(st.just(good), ints, numbers))
        if not huge and isinstance(value, int) and abs(value) >= 2**63:
            value = good
        return scalar_text(value)

    live = (f"HloLiveRange (max {num(3)}):\n  InstructionSequence:\n    0:p\n    1:a\n    2:b\n"
            f"  BufferLiveRange:\n    p{{}}:{num(0)}-{num(3)}\n    a{{}}:{num(1)}-{num(3)}\n"
            f"    b{{}}:{num(2)}-{num(3)}\n  Live ranges at 2 (peak):\n")
    assignment = (f"BufferAssignment:\n"
                  f"allocation 0: size {num(256)}, parameter 0, shape |f32[64]| at "
                  f"ShapeIndex {{}}:\n"
                  f" value: <0 p @0> (size={num(256)},offset={num(0)}): f32[64]{{0}}\n"
                  f"allocation {num(1)}: size {num(1024)}, maybe-live-out:\n"
                  f" value: <1 a @0> (size={num(512)},offset={num(0)}): f32[128]{{0}}\n"
                  f" value: <2 b @0> (size={num(512)},offset={num(512)}): f32[128]{{0}}\n")
    files = {f"{XLA_NAME}-live-range.txt": live, f"{XLA_NAME}-buffer-assignment.txt": assignment}
    if draw(st.booleans()):
        files[f"{XLA_NAME}-memory-usage-report.txt"] = f"Total bytes used: {num(1280)}\n"
    return files


def write_folder(root: Path, files: dict[str, str]) -> Path:
    folder = fresh(root, "")
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


# ------------------------------------------------------------------ .xplane.pb
def stat_values() -> st.SearchStrategy[Any]:
    """What an XStat can hold: int64 (any int, wrapped to 64 bits), double, str, bytes."""
    return st.one_of(ints, st.floats(),
                     st.sampled_from([math.inf, -math.inf, 1e300, -0.0, 0.5]),
                     st.sampled_from(["", "x", "GPU_0_bfc"]), st.binary(max_size=8),
                     st.booleans())


@st.composite
def xplane(draw: st.DrawFn) -> bytes:
    events = []
    for i in range(draw(st.integers(1, 5))):
        alloc = i % 2 == 0
        stats: dict[str, Any] = {
            "allocator_name": "GPU_0_bfc", "bytes_reserved": 0,
            "bytes_allocated": 1024 if alloc else 0, "bytes_available": 1 << 30,
            "fragmentation": 0.0, "peak_bytes_in_use": 1024, "requested_bytes": 1000,
            "allocation_bytes": 1024, "addr": 0x7F00_0000_0000 + 1024 * (i // 2)}
        for key in draw(st.lists(st.sampled_from(sorted(stats)), max_size=4, unique=True)):
            if draw(st.integers(0, 5)) == 0:
                del stats[key]
            else:
                stats[key] = draw(stat_values())
        events.append({"name": "MemoryAllocation" if alloc else "MemoryDeallocation",
                       "offset_ps": draw(st.one_of(st.just(1000 * (i + 1)), ints)),
                       "stats": stats})
    data = encode_xspace([{"id": 0, "name": "/host:CPU", "lines": [
        {"id": 1, "name": "python", "timestamp_ns": draw(st.one_of(st.just(5000), ints)),
         "events": events}]}])
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return data if cut is None else data[:cut]


# ------------------------------------------------------------------ the fuzz tests
FILE_FORMATS: dict[str, tuple[Callable[[], st.SearchStrategy[bytes]], str]] = {
    "native-csv": (native_csv, ".csv"),
    "native-jsonl": (native_jsonl, ".jsonl"),
    "native-npz": (native_npz, ".npz"),
    "torch-profiler": (torch_profiler, ".json"),
    "torch-snapshot": (torch_snapshot, ".pickle"),
    "cupy-log": (cupy_log, ".log"),
    "rmm-csv": (rmm_csv, ".rmm.csv"),
    "malloclab": (malloclab, ".rep"),
    "xplane": (xplane, ".xplane.pb"),
}


@pytest.mark.parametrize("fmt", sorted(FILE_FORMATS))
def test_fuzzed_files_load_or_fail_in_one_line(tmp_path: Path, fmt: str) -> None:
    strategy, suffix = FILE_FORMATS[fmt]

    @FUZZ
    @given(data=strategy(), gz=st.booleans())
    def run(data: bytes, gz: bool) -> None:
        if gz and fmt not in ("native-npz", "torch-snapshot", "xplane"):
            check_file(write(tmp_path, suffix + ".gz", gzip.compress(data, mtime=0)))
        else:
            check_file(write(tmp_path, suffix, data))

    run()


@FUZZ
@given(files=xla_dump(huge=False))
def test_fuzzed_xla_dump_folders_load_or_fail_in_one_line(tmp_path: Path,
                                                         files: dict[str, str]) -> None:
    check_file(write_folder(tmp_path, files))
    # the same module as a single file: the importer reads its sibling files
    folder = write_folder(tmp_path, files)
    check_file(folder / f"{XLA_NAME}-buffer-assignment.txt", named=folder)


@FUZZ
@given(files=xla_dump())
def test_fuzzed_xla_dump_files_load_or_fail_in_one_line(tmp_path: Path,
                                                       files: dict[str, str]) -> None:
    folder = write_folder(tmp_path, files)
    check_file(folder / f"{XLA_NAME}-live-range.txt", named=folder)


def test_a_huge_number_in_an_xla_dump_folder_is_one_line(tmp_path: Path) -> None:
    live = ("HloLiveRange (max 3):\n  InstructionSequence:\n    0:p\n"
            "  BufferLiveRange:\n    p{}:9223372036854775808-3\n  Live ranges at 2 (peak):\n")
    assignment = ("BufferAssignment:\nallocation 0: size 256, parameter 0, shape |f32[64]| at "
                  "ShapeIndex {}:\n value: <0 p @0> (size=256,offset=0): f32[64]{0}\n")
    folder = write_folder(tmp_path, {f"{XLA_NAME}-live-range.txt": live,
                                     f"{XLA_NAME}-buffer-assignment.txt": assignment})
    with pytest.raises(TraceError):
        formats.load(folder)


@FUZZ
@given(suffix=st.sampled_from([s for _, s in FILE_FORMATS.values()]),
       data=st.binary(max_size=200))
def test_random_bytes_under_every_extension(tmp_path: Path, suffix: str, data: bytes) -> None:
    check_file(write(tmp_path, suffix, data))


def test_a_cr_in_the_csv_header_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, ".csv", b"time_ns,op\rid,size\n0,alloc,1,8\n")
    with pytest.raises(TraceError):
        formats.load(path)


# ------------------------------------------------------------------ deep nesting
DEEP = 100_000


def nested_json(depth: int, leaf: str = "0") -> str:
    return "[" * depth + leaf + "]" * depth


def deep_files() -> dict[str, tuple[str, bytes]]:
    deep = nested_json(DEEP)
    deep_objects = '{"a":' * DEEP + "0" + "}" * DEEP
    mem_args = ('{"Addr": ' + deep + ', "Bytes": 8, "Total Allocated": 8, "Total Reserved": 0,'
                ' "Device Type": 1, "Device Id": 0}')
    # a pickle of 10**5 nested lists, written opcode by opcode (pickle.dumps would recurse)
    deep_pickle = b"\x80\x02" + b"]" * DEEP + b"a" * (DEEP - 1) + b"."
    deep_dict_pickle = (b"\x80\x02}(X\x08\x00\x00\x00segments" + b"]" * DEEP
                        + b"a" * (DEEP - 1) + b"u.")
    return {
        "profiler-top": (".json", deep.encode()),
        "profiler-objects": (".json", deep_objects.encode()),
        "profiler-traceEvents": (".json", ('{"traceEvents": ' + deep + "}").encode()),
        "profiler-args": (".json", ('{"traceEvents": [{"ph": "i", "name": "[memory]", '
                                    '"pid": 1, "tid": 1, "ts": 1, "args": ' + mem_args
                                    + "}]}").encode()),
        "jsonl-line": (".jsonl", (deep + "\n").encode()),
        "jsonl-value": (".jsonl", ('{"time_ns": 0, "op": "alloc", "id": 1, "size": 8, '
                                   '"tag": ' + deep + "}\n").encode()),
        "jsonl-metadata": (".jsonl", ('{"allocsim-trace": ' + deep_objects + "}\n"
                                      '{"time_ns": 0, "op": "alloc", "id": 1, "size": 8}\n'
                                      ).encode()),
        "cupy-line": (".log", ('{"allocsim-cupy-log": 1, "metadata": ' + deep + "}\n").encode()),
        "cupy-value": (".log", ('{"t": 1, "hook": "malloc", "device": 0, "size": ' + deep
                                + ', "mem_size": 512, "ptr": 4096, "pmem_id": 1}\n').encode()),
        "snapshot-list": (".pickle", deep_pickle),
        "snapshot-segments": (".pickle", deep_dict_pickle),
        "csv-cell": (".csv", ("time_ns,op,id,size,tag\n0,alloc,1,8," + "[" * DEEP + "\n"
                              ).encode()),
    }


def deep_npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, time_ns=np.zeros(1, np.int64), op=np.zeros(1, np.int8),
             id=np.zeros(1, np.int64), size=np.full(1, 8, np.int64),
             metadata=np.array(nested_json(DEEP)), tags=np.array(nested_json(DEEP)))
    return buffer.getvalue()


@pytest.mark.parametrize("case", [*sorted(deep_files()), "npz-metadata"])
def test_deep_nesting_is_one_line(tmp_path: Path, case: str) -> None:
    if case == "npz-metadata":
        suffix, data = ".npz", deep_npz()
    else:
        suffix, data = deep_files()[case]
    check_file(write(tmp_path, suffix, data))


def test_deeply_nested_xplane_bytes_are_one_line(tmp_path: Path) -> None:
    # length-delimited fields wrapping each other 10**4 deep (field 3 = a plane's lines)
    data = b""
    for _ in range(10_000):
        data = b"\x1a" + _varint(len(data)) + data
    check_file(write(tmp_path, ".xplane.pb", b"\x0a" + _varint(len(data)) + data))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# ------------------------------------------------------------------ compression bombs
LIMIT = 10_000
BOMB_SUFFIXES = [".csv.gz", ".jsonl.gz", ".json.gz", ".log.gz", ".rmm.csv.gz", ".rep.gz",
                 ".csv", ".json", ".npz", ".pickle", ".xplane.pb"]


@pytest.fixture()
def small_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(formats.MAX_INPUT_ENV, str(LIMIT))


def bomb(payload: bytes, size: int = 1 << 22) -> bytes:
    """~4 MiB of ``payload`` repeated, gzipped to a few KiB."""
    return gzip.compress(payload * (size // len(payload)), compresslevel=9, mtime=0)


def assert_too_large(path: Path) -> None:
    with pytest.raises(TraceError, match="input limit") as caught:
        formats.load(path)
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)
    check_file(path)


@pytest.mark.usefixtures("small_limit")
@pytest.mark.parametrize("suffix", BOMB_SUFFIXES)
def test_a_gzip_bomb_stops_at_the_limit(tmp_path: Path, suffix: str) -> None:
    data = bomb(b"0,alloc,1,8\n")
    assert len(data) < LIMIT
    assert_too_large(write(tmp_path, suffix, data))


@pytest.mark.usefixtures("small_limit")
def test_a_bomb_of_many_gzip_members_stops_at_the_limit(tmp_path: Path) -> None:
    member = gzip.compress(b"\n" * 4096, mtime=0)
    data = member * (4 * LIMIT // 4096)
    assert_too_large(write(tmp_path, ".jsonl.gz", data))


@pytest.mark.usefixtures("small_limit")
def test_a_gzip_inside_gzip_is_one_line(tmp_path: Path) -> None:
    inner = bomb(b"\n", 1 << 24)
    check_file(write(tmp_path, ".csv.gz", gzip.compress(inner, mtime=0)))


@pytest.mark.usefixtures("small_limit")
@pytest.mark.parametrize("cut", [10, 100, -8])
def test_a_cut_gzip_bomb_is_one_line(tmp_path: Path, cut: int) -> None:
    check_file(write(tmp_path, ".json.gz", bomb(b'{"traceEvents": [')[:cut]))


@pytest.mark.usefixtures("small_limit")
def test_a_plain_file_over_the_limit_is_refused_up_front(tmp_path: Path) -> None:
    assert_too_large(write(tmp_path, ".csv", b"time_ns,op,id,size\n" + b"\n" * (2 * LIMIT)))


@pytest.mark.usefixtures("small_limit")
def test_an_xla_dump_folder_file_over_the_limit_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "dump"
    folder.mkdir()
    for part in XLA_DATA.glob("module_0000.*"):   # ~36 KB of real dump, over the 10 KB limit
        (folder / part.name).write_bytes(part.read_bytes())
    assert max(p.stat().st_size for p in folder.iterdir()) > LIMIT
    # The values file (op names, ~17 KB) is over the limit: the buffers view reads it; the
    # runtime view (the default) reads only the allocations, so a buffer-assignment file made
    # larger than the limit is refused there.
    with pytest.raises(TraceError, match="input limit"):
        formats.load(folder, view="buffers")
    assignment = next(folder.glob("*-buffer-assignment.txt"))
    assignment.write_bytes(assignment.read_bytes() * 2)
    assert assignment.stat().st_size > LIMIT
    with pytest.raises(TraceError, match="input limit"):
        formats.load(folder)


def test_a_nan_xplane_stat_is_one_line(tmp_path: Path) -> None:
    """A double ``addr`` stat of NaN (found by the fuzzer above)."""
    stats = {"allocator_name": "GPU_0_bfc", "bytes_reserved": 0, "bytes_allocated": 1024,
             "bytes_available": 1 << 30, "fragmentation": 0.0, "peak_bytes_in_use": 1024,
             "requested_bytes": 1000, "allocation_bytes": 1024, "addr": math.nan}
    data = encode_xspace([{"id": 0, "name": "/host:CPU", "lines": [
        {"id": 1, "name": "python", "timestamp_ns": 5000,
         "events": [{"name": "MemoryAllocation", "offset_ps": 1000, "stats": stats}]}]}])
    check_file(write(tmp_path, ".xplane.pb", data))


def test_a_negative_device_in_a_legacy_snapshot_is_one_line(tmp_path: Path) -> None:
    segments = [{"device": -1, "address": 1 << 30, "total_size": 2 << 20, "stream": 0,
                 "segment_type": "large", "is_expandable": False, "frames": [],
                 "blocks": [{"address": 1 << 30, "size": 1024, "requested_size": 1000,
                             "state": "active_allocated", "frames": []}]}]
    path = write(tmp_path, ".pickle", pickle.dumps(segments, protocol=2))
    with pytest.raises(TraceError):
        formats.load(path)
