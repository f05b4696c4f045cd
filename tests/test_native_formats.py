"""Tests for allocsim.traces.formats: native .npz / .csv / .jsonl round trips, readers' errors,
load/save."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.traces.formats import (
    FORMATS,
    load,
    load_with_report,
    native,
    register_format,
    save,
)
from allocsim.traces.formats.native import csv as native_csv
from allocsim.traces.model import NO_TAG, OP_ALLOC, OP_FREE, SIZE_UNKNOWN, Trace, TraceError

EXTENSIONS = [".npz", ".csv", ".csv.gz", ".jsonl", ".jsonl.gz"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def one_line_error(call, *args, **kwargs) -> TraceError:
    with pytest.raises(TraceError) as caught:
        call(*args, **kwargs)
    assert "\n" not in str(caught.value)
    return caught.value


# ---------------------------------------------------------------------- random valid traces
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
# CSV strips tag cells and reads an empty one as no tag, so its tags are stripped, non-empty.
TAG_TEXT = TEXT.filter(lambda t: t == t.strip())
ANY_TAG_TEXT = TEXT | st.just("") | st.sampled_from([" x", "y\t", " "])


@st.composite
def valid_traces(draw, any_tags: bool = False) -> Trace:
    """A valid trace: allocs and frees of live buffers, ids reused, some free sizes unknown,
    tags (with commas, quotes, spaces, newlines, unicode) and a tags table that may hold
    unused entries in any order."""
    tags = draw(st.lists(ANY_TAG_TEXT if any_tags else TAG_TEXT,
                         max_size=5, unique=True))
    steps = draw(st.lists(st.tuples(st.booleans(), st.integers(0, 2**40),
                                    st.integers(0, 10**6), st.booleans(),
                                    st.integers(-1, len(tags) - 1),
                                    st.integers(0, 3), st.integers(0, 2**31 - 1)),
                          max_size=30))
    live: dict[int, int] = {}
    freed_ids: list[int] = []
    next_id = draw(st.integers(-5, 2**62))
    rows = []
    now = draw(st.integers(0, 2**40))
    for want_alloc, size, dt, unknown_size, tag, stream, process in steps:
        now += dt
        if want_alloc or not live:
            if freed_ids and unknown_size:  # reuse an id after its free
                key = freed_ids.pop()
            else:
                key = next_id
                next_id += 1
            live[key] = size
            rows.append((now, OP_ALLOC, key, size, stream, process, tag))
        else:
            key = sorted(live)[size % len(live)]
            freed = live.pop(key)
            freed_ids.append(key)
            rows.append((now, OP_FREE, key, SIZE_UNKNOWN if unknown_size else freed,
                         stream, process, tag))
    columns = list(zip(*rows)) if rows else [[]] * 7
    metadata = draw(st.dictionaries(st.text(max_size=8),
                                    st.integers(-10**12, 10**12) | TEXT | st.none(),
                                    max_size=3))
    metadata.update(name=draw(TEXT), source=draw(st.sampled_from(["memory", "a/b.csv"])))
    trace = Trace.from_columns(*columns[:4], stream=columns[4], process=columns[5],
                               tag=columns[6], tags=tags)
    trace.metadata = metadata
    return trace


def roundtrip_bytes(trace: Trace, fmt: str) -> Trace:
    buffer = io.BytesIO()
    FORMATS[fmt].writer(trace, buffer)
    return FORMATS[fmt].reader(buffer.getvalue(), "mem", "mem")


@settings(max_examples=150, deadline=None)
@given(valid_traces())
@pytest.mark.parametrize("fmt", ["npz", "csv", "jsonl"])
def test_roundtrip_in_memory_is_lossless(fmt, trace):
    back = roundtrip_bytes(trace, fmt)
    assert back.equals(trace), (trace.tags, back.tags)


@settings(max_examples=60, deadline=None)
@given(valid_traces(any_tags=True))
@pytest.mark.parametrize("fmt", ["npz", "jsonl"])
def test_any_tag_strings_roundtrip_in_npz_and_jsonl(fmt, trace):
    assert roundtrip_bytes(trace, fmt).equals(trace)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_traces())
def test_roundtrip_through_files_is_lossless(trace):
    with tempfile.TemporaryDirectory() as folder:
        for ext in EXTENSIONS:
            path = Path(folder) / f"t{ext}"
            save(trace, path)
            back = load(path)
            assert back.equals(trace), ext
            assert back.metadata == trace.metadata  # source/name came from the file


@settings(max_examples=150, deadline=None)
@given(valid_traces())
def test_csv_fast_and_slow_paths_agree(trace):
    buffer = io.BytesIO()
    native.write_csv(trace, buffer)
    text = buffer.getvalue()
    header_end = text.index(b"\ntime_ns") + 1
    body_start = text.index(b"\n", header_end) + 1
    names = text[header_end:body_start - 1].decode().split(",")
    fast = native_csv._csv_fast(text[body_start:], names)
    slow = native_csv._csv_slow(text[body_start:], names, "mem", 2)
    plain = not any(c in t for t in trace.tags for c in "\r\n")
    # The fast path declines numbers of 19+ digits (they might overflow int64) on purpose.
    short = all(int(np.abs(getattr(trace, c)).max(initial=0)) < 10**18
                for c in ("time_ns", "id", "size", "stream", "process"))
    assert fast is not None or not (plain and short)  # it takes every other file the writer makes
    if fast is not None:
        assert set(fast) == set(slow)
        for name in slow:
            assert list(fast[name]) == list(slow[name]), name


CELLS = ["0", "7", "-1", "-", "", "+3", " 4", "05", "1.5", "x", "alloc", "free", "Free",
         '"x,y"', 'x"y', '"a""b"', '"q"r', "99999999999999999999", "4294967296", "\u0663",
         '"two\nlines"', "\r"]
GOOD = {"time_ns": ["0", "7", "05"], "op": ["alloc", "free"], "id": ["7", "-1"],
        "size": ["", "7"], "stream": ["0", "3"], "tag": CELLS}


@st.composite
def csv_bodies(draw) -> tuple[list[str], bytes]:
    """CSV bodies that are mostly right, with the odd bad, quoted or strange cell."""
    names = draw(st.sampled_from([["time_ns", "op", "id", "size", "tag"],
                                  ["op", "size", "time_ns", "id", "stream"]]))
    rows = []
    for _ in range(draw(st.integers(0, 5))):
        row = [draw(st.sampled_from(GOOD[name]) | st.sampled_from(CELLS)) for name in names]
        if draw(st.integers(0, 9)) == 0:
            row = row[:-1] if draw(st.booleans()) else [*row, "7"]
        rows.append(",".join(row))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    if rows and draw(st.booleans()):
        rows.insert(draw(st.integers(0, len(rows))), "")  # a blank line
    body = newline.join(rows) + (newline if draw(st.booleans()) else "")
    return names, body.encode()


@settings(max_examples=500, deadline=None)
@given(csv_bodies())
def test_csv_fast_path_never_disagrees_with_slow_path(case):
    """On arbitrary bodies the fast path either declines or gives what the slow path gives."""
    names, data = case
    fast = native_csv._csv_fast(data, names)
    try:
        slow = native_csv._csv_slow(data, names, "mem", 1)
    except TraceError:
        assert fast is None
        return
    if fast is not None:
        for name in names:
            assert list(fast[name]) == list(slow[name]), name


def test_roundtrip_specifics_csv():
    trace = Trace.from_columns([0, 5, 9], [OP_ALLOC, OP_ALLOC, OP_FREE], [1, 2, 1],
                               [10, 20, SIZE_UNKNOWN], stream=[0, 3, 0], process=[1, 1, 2],
                               tag=[0, NO_TAG, 1], tags=['f(a, "b")', "two\nlines"],
                               name="t", source="memory", device="H200")
    buffer = io.BytesIO()
    native.write_csv(trace, buffer)
    text = buffer.getvalue().decode()
    lines = text.splitlines()
    assert lines[0].startswith("# allocsim-metadata: {")
    assert lines[1] == "time_ns,op,id,size,stream,process,tag"
    assert lines[2] == '0,alloc,1,10,0,1,"f(a, ""b"")"'
    assert lines[3] == "5,alloc,2,20,3,1,"
    assert lines[4] == '9,free,1,,0,2,"two' and lines[5] == 'lines"'
    assert native.read_csv(text.encode(), "m", "m").equals(trace)


def test_csv_without_tags_has_no_tag_column():
    trace = Trace.from_events([(0, "alloc", 1, 4), (1, "free", 1, None)])
    buffer = io.BytesIO()
    native.write_csv(trace, buffer)
    assert buffer.getvalue().decode().splitlines()[1:] == [
        "time_ns,op,id,size,stream,process", "0,alloc,1,4,0,0", "1,free,1,,0,0"]


@pytest.mark.parametrize("tag", ["", " padded", "x\n"])
def test_csv_refuses_tags_it_cannot_keep(tmp_path, tag):
    trace = Trace.from_columns([0], [OP_ALLOC], [1], [4], tag=[0], tags=[tag])
    error = one_line_error(save, trace, tmp_path / "t.csv")
    assert "save as .jsonl or .npz" in str(error) and str(tmp_path / "t.csv") in str(error)
    assert list(tmp_path.iterdir()) == []  # no temp file left behind
    # an unused tag like that is fine: the tag table travels as JSON
    save(Trace.from_events([(0, "alloc", 1, 4)], name="u"), tmp_path / "u.csv")
    unused = Trace.from_columns([0], [OP_ALLOC], [1], [4], tags=[tag], name="u")
    save(unused, tmp_path / "u.csv")
    assert load(tmp_path / "u.csv").equals(unused)


def test_jsonl_layout():
    trace = Trace.from_columns([0, 1], [OP_ALLOC, OP_FREE], [1, 1], [4, SIZE_UNKNOWN],
                               tag=[0, NO_TAG], tags=["x"], name="n", source="s")
    buffer = io.BytesIO()
    native.write_jsonl(trace, buffer)
    lines = [json.loads(line) for line in buffer.getvalue().decode().splitlines()]
    assert lines[0] == {"allocsim-metadata": {"name": "n", "source": "s"}}
    assert lines[1] == {"time_ns": 0, "op": "alloc", "id": 1, "size": 4, "stream": 0,
                        "process": 0, "tag": "x"}
    assert lines[2] == {"time_ns": 1, "op": "free", "id": 1, "size": None, "stream": 0,
                        "process": 0}


def test_npz_needs_no_pickle(tmp_path):
    trace = Trace.from_columns([0], [OP_ALLOC], [1], [4], tag=[0], tags=["t"], name="n")
    save(trace, tmp_path / "t.npz")
    with np.load(tmp_path / "t.npz", allow_pickle=False) as npz:
        for key in npz.files:
            assert npz[key].dtype != object
    assert load(tmp_path / "t.npz").equals(trace)


# ---------------------------------------------------------------------- hand-written files
def test_hand_written_csv_without_stream_and_process(tmp_path):
    path = write(tmp_path / "hand.csv",
                 "# my own trace\n\ntime_ns,op,id,size\n0,alloc,1,100\n5,alloc,2,50\n"
                 "7,free,1,\n9,free,2,50\n")
    before = digest(path)
    trace = load(path)
    assert digest(path) == before
    assert trace.stream.tolist() == [0] * 4 and trace.process.tolist() == [0] * 4
    assert trace.tag.tolist() == [NO_TAG] * 4 and trace.tags == []
    assert trace.size.tolist() == [100, 50, SIZE_UNKNOWN, 50]
    assert trace.metadata == {"name": "hand", "source": str(path)}


def test_hand_written_csv_any_order_spaces_crlf_and_tags(tmp_path):
    path = write(tmp_path / "x.csv",
                 "op, size, time_ns, tag, id\r\n"
                 "alloc, 64, 10, conv, 3\r\n"
                 "\r\n"
                 "free, , 20, , 3\r\n")
    trace = load(path)
    assert trace.time_ns.tolist() == [10, 20] and trace.id.tolist() == [3, 3]
    assert trace.size.tolist() == [64, SIZE_UNKNOWN]
    assert trace.tags == ["conv"] and trace.tag.tolist() == [0, NO_TAG]


def test_hand_written_jsonl(tmp_path):
    path = write(tmp_path / "x.jsonl",
                 '# comment\n{"time_ns": 0, "op": "alloc", "id": 1, "size": 8}\n\n'
                 '{"time_ns": 3, "op": "free", "id": 1, "tag": "t"}\n')
    trace = load(path)
    assert trace.size.tolist() == [8, SIZE_UNKNOWN]
    assert trace.tags == ["t"] and trace.tag.tolist() == [NO_TAG, 0]
    assert trace.metadata["name"] == "x"


def test_empty_csv_with_header_only(tmp_path):
    trace = load(write(tmp_path / "e.csv", "time_ns,op,id,size\n"))
    assert len(trace) == 0


# ---------------------------------------------------------------------- format detection
def test_content_decides_over_extension(tmp_path):
    trace = Trace.from_events([(0, "alloc", 1, 4), (1, "free", 1, 4)], name="d")
    for real, fake in [(".jsonl", "a.csv"), (".csv", "b.txt"), (".npz", "c.dat"),
                       (".csv.gz", "d.csv"), (".jsonl.gz", "e.log")]:
        save(trace, tmp_path / f"src{real}")
        os.replace(tmp_path / f"src{real}", tmp_path / fake)
        assert load(tmp_path / fake).equals(trace), fake


def test_unrecognised_content(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(b"\x00\x01\x02binary")
    error = one_line_error(load, path)
    assert "unrecognised trace format" in str(error) and ".csv" in str(error)


def test_register_a_format(tmp_path):
    def reader(data: bytes, source: str, name: str) -> Trace:
        events = [line.split() for line in data.decode().splitlines()]
        return Trace.from_events([(int(t), op, int(i), int(s)) for t, op, i, s in events],
                                 **native.file_metadata({}, source, name))

    register_format("toy", (".toy",), reader,
                    detect=lambda path, head: head.startswith(b"0 alloc"))
    try:
        path = write(tmp_path / "x.toy", "0 alloc 1 8\n1 free 1 8\n")
        assert load(path).size.tolist() == [8, 8]
        one_line_error(save, load(path), tmp_path / "y.toy")  # import-only format
    finally:
        FORMATS.pop("toy")


# ---------------------------------------------------------------------- reader errors
@pytest.mark.parametrize("name, text, event, needle", [
    ("bad_int.csv", "time_ns,op,id,size\n0,alloc,1,8\n1,alloc,2,abc\n", 1,
     "line 3: size 'abc' is not an integer"),
    ("bad_time.csv", "# c\ntime_ns,op,id,size\n0,alloc,1,8\n\n1.5,free,1,8\n", 1,
     "line 5: time_ns '1.5' is not an integer"),
    ("bad_op.csv", "time_ns,op,id,size\n0,malloc,1,8\n", 0,
     "line 2: op 'malloc' is not 'alloc' or 'free'"),
    ("fields.csv", "time_ns,op,id,size\n0,alloc,1,8\n1,free,1\n", 1,
     "line 3: expected 4 fields (time_ns,op,id,size), found 3"),
    ("range.csv", "time_ns,op,id,size,stream\n0,alloc,1,8,99999999999\n", 0,
     "line 2: stream '99999999999' does not fit in int32"),
    ("huge.csv", "time_ns,op,id,size\n0,alloc,1,99999999999999999999\n", 0,
     "line 2: size '99999999999999999999' does not fit in int64"),
    ("bad.jsonl", '{"time_ns":0,"op":"alloc","id":1,"size":8}\n{"time_ns":1,"op":"free",\n',
     1, "line 2: bad JSON: "),
    ("missing.jsonl", '{"allocsim-metadata": {}}\n{"time_ns":0,"id":1,"size":8}\n', 0,
     "line 2: missing field 'op'"),
    ("nosize.jsonl", '{"time_ns":0,"op":"alloc","id":1}\n', 0,
     "line 1: missing field 'size'"),
    ("float.jsonl", '{"time_ns":0.5,"op":"alloc","id":1,"size":8}\n', 0,
     "line 1: time_ns 0.5 is not an integer"),
    ("op.jsonl", '\n{"time_ns":0,"op":"alloc","id":1,"size":8}\n{"time_ns":0,"op":1,"id":1}\n',
     1, "line 3: op 1 is not 'alloc' or 'free'"),
    ("field.jsonl", '{"time_ns":0,"op":"alloc","id":1,"size":8,"addr":5}\n', 0,
     "line 1: unknown field(s) 'addr'"),
    ("array.jsonl", '{"time_ns":0,"op":"alloc","id":1,"size":8}\n[1,2]\n', 1,
     "line 2: expected a JSON object"),
])
def test_malformed_files_name_file_event_and_line(tmp_path, name, text, event, needle):
    path = write(tmp_path / name, text)
    before = digest(path)
    error = one_line_error(load, path)
    assert str(error).startswith(f"{path}: event {event}: {needle}")
    assert error.event == event and error.source == str(path)
    assert digest(path) == before


@pytest.mark.parametrize("text, needle", [
    ("time_ns,op,size\n0,alloc,8\n", "line 1: missing required column(s) 'id'"),
    ("# x\ntime_ns,op,id,size,addr,thread\n", "line 2: unknown column(s) 'addr', 'thread'"),
    ("time_ns,op,id,size,id\n", "line 1: column(s) given twice: 'id'"),
    ("# only comments\n", "no header line"),
    ("# allocsim-metadata: {nope\ntime_ns,op,id,size\n", "line 1: bad metadata JSON"),
])
def test_bad_csv_header(tmp_path, text, needle):
    path = write(tmp_path / "h.csv", text)
    error = one_line_error(load, path)
    assert str(error).startswith(f"{path}: {needle}")


def test_missing_file(tmp_path):
    path = tmp_path / "nope.csv"
    error = one_line_error(load, path)
    assert str(error) == f"{path}: no such file"


def test_directory_and_corrupt_files(tmp_path):
    assert "directory" in str(one_line_error(load, tmp_path))
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
    assert "not a readable .npz" in str(one_line_error(load, tmp_path / "bad.npz"))
    (tmp_path / "bad.csv.gz").write_bytes(b"\x1f\x8b\x08\x00 truncated")
    assert "corrupt gzip" in str(one_line_error(load, tmp_path / "bad.csv.gz"))
    (tmp_path / "latin.csv").write_bytes(b"time_ns,op,id,size,tag\n0,alloc,1,8,caf\xe9\n")
    assert "not UTF-8" in str(one_line_error(load, tmp_path / "latin.csv"))


def test_npz_missing_array(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, time_ns=np.zeros(1, np.int64))
    assert "missing array(s) 'op', 'id', 'size'" in str(one_line_error(load, path))


# ---------------------------------------------------------------------- validation via load
def test_validation_errors_name_file_and_event(tmp_path):
    path = write(tmp_path / "v.csv", "time_ns,op,id,size\n0,alloc,1,8\n1,free,2,8\n")
    error = one_line_error(load, path)
    assert str(error) == f"{path}: event 1: free of unknown id 2"


def test_lenient_load_records_repairs_and_keeps_file(tmp_path):
    path = write(tmp_path / "rec.csv",
                 "time_ns,op,id,size\n0,free,9,\n1,alloc,1,8\n2,alloc,1,4\n3,free,1,\n")
    before = digest(path)
    one_line_error(load, path)  # strict refuses
    trace, report = load_with_report(path, strict=False)
    assert digest(path) == before
    assert report.repairs() == {"unmatched_frees_dropped": 1, "duplicate_allocs_renamed": 1,
                                "free_sizes_filled": 1}
    validation = trace.metadata["validation"]
    assert validation["repairs"] == report.repairs()
    assert validation["summary"] == report.summary()
    assert trace.live_bytes().tolist() == [8, 12, 8]
    # nothing to repair: no validation entry
    clean = write(tmp_path / "clean.csv", "time_ns,op,id,size\n0,alloc,1,8\n")
    assert "validation" not in load(clean, strict=False).metadata


# ---------------------------------------------------------------------- save
def test_save_unknown_extension(tmp_path):
    error = one_line_error(save, Trace.empty(), tmp_path / "t.parquet")
    for ext in EXTENSIONS:
        assert ext in str(error)


def test_save_is_atomic_and_replaces(tmp_path):
    path = tmp_path / "t.csv"
    first = Trace.from_events([(0, "alloc", 1, 4)], name="one")
    save(first, path)
    save(Trace.from_events([(0, "alloc", 1, 8)], name="two"), path)
    assert load(path).name == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]
    # a failing write leaves the old file intact and no temporary file
    broken = Trace.from_events([(0, "alloc", 1, 4)], name="bad", when=object())
    error = one_line_error(save, broken, path)
    assert "not JSON-serialisable" in str(error)
    assert load(path).name == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]


def test_save_into_missing_directory(tmp_path):
    error = one_line_error(save, Trace.empty(), tmp_path / "no" / "t.npz")
    assert "does not exist" in str(error)


def test_gzip_output_is_reproducible(tmp_path):
    trace = Trace.from_events([(0, "alloc", 1, 4)], name="g")
    save(trace, tmp_path / "a.csv.gz")
    save(trace, tmp_path / "b.csv.gz")
    assert digest(tmp_path / "a.csv.gz") == digest(tmp_path / "b.csv.gz")
    assert gzip.decompress((tmp_path / "a.csv.gz").read_bytes()).startswith(b"# allocsim")


# ---------------------------------------------------------------------- scale
def test_a_million_events_round_trip_through_npz_and_csv(tmp_path):
    # Speed is measured by benchmarks/formats.py, not asserted here.
    from tests.test_validate import big_trace

    trace = big_trace(1_000_000)
    for ext in (".npz", ".csv"):
        path = tmp_path / f"big{ext}"
        save(trace, path)
        assert load(path).equals(trace, metadata=False)


# -- the .npz reader reads the open file, a column at a time -------------------------------
def test_load_streams_an_npz_and_reads_what_its_bytes_give(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    # load() hands the .npz reader the open file (never the file's bytes), and the reader
    # holds each column packed, read in pieces: the same trace as from the bytes, with pieces
    # of 7 values crossing every column's end and a constant column held as an int.
    from allocsim.traces import formats as formats_package
    from allocsim.traces.formats.native import npz as native_npz
    from allocsim.traces.synth import generate

    trace = generate("random", events=500, live=40, seed=5)
    path = tmp_path / "t.npz"
    save(trace, path)
    monkeypatch.setattr(native_npz, "_PIECE", 7)
    monkeypatch.setattr(formats_package, "_read_bytes", lambda *a: pytest.fail("read whole"))
    streamed = load(path)
    monkeypatch.undo()
    from_bytes = native_npz.read_npz(path.read_bytes(), str(path), "t")
    assert isinstance(streamed._held["process"], int)
    for name in ("time_ns", "op", "id", "size", "stream", "process", "tag"):
        assert streamed.column(name).dtype == from_bytes.column(name).dtype, name
        assert np.array_equal(streamed.column(name), from_bytes.column(name)), name
        assert np.array_equal(getattr(streamed, name), getattr(trace, name)), name  # unpacks
    assert streamed.tags == trace.tags


def test_a_streamed_npz_column_out_of_range_names_its_event(tmp_path: Path):
    # The range check runs piece by piece: the event index is the column's, not the piece's.
    from allocsim.traces.formats.native import npz as native_npz

    n = 50
    arrays = {"time_ns": np.arange(n, dtype=np.uint64), "op": np.zeros(n, dtype=np.int8),
              "id": np.arange(n, dtype=np.int64), "size": np.ones(n, dtype=np.int64)}
    arrays["time_ns"][37] = np.iinfo(np.uint64).max
    path = tmp_path / "wide.npz"
    np.savez(path, **arrays)
    native_npz_piece = native_npz._PIECE
    try:
        native_npz._PIECE = 8
        with pytest.raises(TraceError, match="event 37") as caught:
            load(path)
    finally:
        native_npz._PIECE = native_npz_piece
    assert "does not fit in int64" in str(caught.value)


def test_tag_indices_are_checked_a_piece_at_a_time_and_name_their_event() -> None:
    # No mask of the whole column (2 bytes/event at loading's peak); a bad index in a later
    # piece is still named by its event.
    from allocsim.traces.formats.native.npz import _PIECE, _check_tag_indices

    tag = np.zeros(3 * _PIECE, dtype=np.int16)
    _check_tag_indices(tag, 1, "t.npz")
    tag[_PIECE + 7] = 9
    with pytest.raises(TraceError, match=f"event {_PIECE + 7}: tag index 9 is not in the "
                                         "file's 3 tags"):
        _check_tag_indices(tag, 3, "t.npz")
