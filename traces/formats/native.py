"""allocsim's own trace files: ``.npz`` (fast, exact) and ``.csv`` / ``.jsonl`` (interchange).

Every reader here has the signature ``reader(data, source, name) -> Trace``: ``data`` is the
file's bytes (already un-gzipped by :func:`allocsim.traces.formats.load`), ``source`` the path used in
error messages, ``name`` the default trace name (the file stem). Every writer is
``writer(trace, stream)`` writing bytes to a binary stream. Readers turn every user mistake into
one :class:`TraceError` line naming the file, the event (0-based) and, for text formats, the
line number; they do *not* validate the events (``load`` does that next).

``.npz``
    One array per column (``time_ns``, ``op``, ``id``, ``size``, ``stream``, ``process``,
    ``tag``) plus ``tags`` and ``metadata`` (JSON text in 0-d unicode arrays) and ``format``
    (``"allocsim-trace/1"``). Uncompressed, so loading is a memcpy; needs no pickle.

``.csv`` (and ``.csv.gz``) — the documented interchange format::

    # allocsim-metadata: {"name": "resnet", "source": "memory"}
    time_ns,op,id,size,stream,process,tag
    0,alloc,1,4096,0,0,aten::empty
    10,free,1,,0,0,

    One event per row. ``op`` is ``alloc`` or ``free``. ``size`` may be empty on a free
    (unknown). ``stream``, ``process`` and ``tag`` columns are optional (absent: 0, 0, no tag);
    ``tag`` holds the tag string, empty for none (surrounding spaces are ignored, so
    such tags and the empty tag cannot be written to CSV). Columns may come in any order; unknown
    columns are an error. Lines starting with ``#`` before the header are comments, except
    ``# allocsim-metadata: {json}`` (the trace metadata) and ``# allocsim-tags: [json]`` (the
    tag table, written only when it is not simply the used tags in first-use order). Blank
    lines are ignored.

``.jsonl`` (and ``.jsonl.gz``)::

    {"allocsim-metadata": {"name": "resnet", "source": "memory"}}
    {"time_ns": 0, "op": "alloc", "id": 1, "size": 4096, "stream": 0, "process": 0, "tag": "x"}
    {"time_ns": 10, "op": "free", "id": 1, "size": null, "stream": 0, "process": 0}

    One JSON object per line with the CSV's field names; ``size`` may be null or absent on a
    free, ``stream`` / ``process`` / ``tag`` may be absent. An optional first line holds
    ``allocsim-metadata`` (and, like CSV, ``allocsim-tags`` when needed). Blank lines and
    leading ``#`` lines are ignored.
"""

from __future__ import annotations

import csv
import io
import json
import zipfile
from collections.abc import Callable, Sequence
from itertools import chain
from json.scanner import make_scanner
from typing import Any, BinaryIO

import numpy as np

from allocsim.traces.model import (
    COLUMN_DTYPES,
    NO_TAG,
    OP_ALLOC,
    OP_CODES,
    OP_FREE,
    OP_NAMES,
    SIZE_UNKNOWN,
    Trace,
    TraceError,
)

__all__ = [
    "CSV_COLUMNS",
    "NPZ_FORMAT",
    "REQUIRED_COLUMNS",
    "detect_csv",
    "detect_jsonl",
    "detect_npz",
    "file_metadata",
    "read_csv",
    "read_jsonl",
    "read_npz",
    "write_csv",
    "write_jsonl",
    "write_npz",
]

NPZ_FORMAT = "allocsim-trace/1"
CSV_COLUMNS = ("time_ns", "op", "id", "size", "stream", "process", "tag")
REQUIRED_COLUMNS = ("time_ns", "op", "id", "size")
METADATA_KEY = "allocsim-metadata"
TAGS_KEY = "allocsim-tags"
_CSV_METADATA = f"# {METADATA_KEY}:"
_CSV_TAGS = f"# {TAGS_KEY}:"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_BOM = b"\xef\xbb\xbf"


class _Bad(Exception):
    """A bad value at event ``event`` (internal; the reader adds file and line)."""

    def __init__(self, event: int | None, problem: str):
        super().__init__(problem)
        self.event = event
        self.problem = problem


def file_metadata(carried: Any, source: str, name: str) -> dict[str, Any]:
    """The metadata a loaded trace gets: what the file carried, plus ``source`` and ``name``
    where the file did not say (so a saved-and-reloaded trace keeps its original ones)."""
    meta = dict(carried) if isinstance(carried, dict) else {}
    meta.setdefault("source", source)
    meta.setdefault("name", name)
    return meta


def _metadata_json(trace: Trace) -> str:
    """The metadata as one line of ASCII JSON (non-ASCII escaped, so no stray line breaks)."""
    try:
        return json.dumps(trace.metadata, ensure_ascii=True)
    except (TypeError, ValueError) as err:
        raise TraceError(f"metadata is not JSON-serialisable: {err}") from None


def _check_tag_column(trace: Trace) -> None:
    tag = trace.tag
    bad = np.flatnonzero((tag < NO_TAG) | (tag >= len(trace.tags)))
    if len(bad):
        i = int(bad[0])
        raise TraceError(f"tag index {int(tag[i])} is not in the trace's {len(trace.tags)} tags",
                         event=i)
    if not all(isinstance(t, str) for t in trace.tags):
        raise TraceError("tags must be strings")


def _tags_are_canonical(trace: Trace) -> bool:
    """Whether a reader rebuilds ``trace.tags`` from the tag column alone: the table holds
    exactly the used tags, in order of first use, each once."""
    used = trace.tag[trace.tag != NO_TAG]
    if len(set(trace.tags)) != len(trace.tags):
        return False
    if not len(used):
        return not trace.tags
    codes, first = np.unique(used, return_index=True)
    return np.array_equal(codes[np.argsort(first)], np.arange(len(trace.tags)))


def _check_ops(trace: Trace) -> None:
    bad = np.flatnonzero((trace.op != OP_ALLOC) & (trace.op != OP_FREE))
    if len(bad):
        i = int(bad[0])
        raise TraceError(f"unknown op {int(trace.op[i])} cannot be written", event=i)


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TraceError(f"not UTF-8 text (bad byte at offset {err.start})",
                         source=source) from None


class _TagTable:
    """Interns tag strings into indices, starting from an optional table read from the file.

    A string that appears twice in that table reads back as its first index.
    """

    def __init__(self, tags: list[str]):
        self.tags = list(tags)
        self.index: dict[str, int] = {}
        for i, tag in enumerate(self.tags):
            self.index.setdefault(tag, i)  # duplicates: the first one wins

    def codes(self, values: Sequence[Any], none: Any) -> np.ndarray:
        """Indices for ``values``; ``none`` (the no-tag marker) maps to NO_TAG."""
        index = dict(self.index)
        for value in dict.fromkeys(values):  # unique, in first-use order, at C speed
            if value != none and value not in index:
                index[value] = len(self.tags)
                self.tags.append(value)
        index[none] = NO_TAG
        return np.array(list(map(index.__getitem__, values)), dtype=np.int32)


def _build(columns: dict[str, np.ndarray], n: int, tags: list[str],
           metadata: dict[str, Any]) -> Trace:
    zeros = np.zeros(n, dtype=np.int32)
    return Trace(
        time_ns=columns["time_ns"], op=columns["op"], id=columns["id"], size=columns["size"],
        stream=columns.get("stream", zeros),
        process=columns.get("process", zeros.copy()),
        tag=columns.get("tag", np.full(n, NO_TAG, dtype=np.int32)),
        tags=tags, metadata=metadata)


# ====================================================================== .npz
def detect_npz(path: str, head: bytes) -> bool:
    """A zip archive (``.npz`` files are zips of ``.npy`` arrays)."""
    return head.startswith(_ZIP_MAGIC)


def write_npz(trace: Trace, stream: BinaryIO) -> None:
    """Write ``trace`` as an uncompressed ``.npz``: one array per column, JSON for the rest."""
    _check_tag_column(trace)
    arrays: dict[str, np.ndarray] = {name: getattr(trace, name) for name in COLUMN_DTYPES}
    arrays["tags"] = np.array(json.dumps(trace.tags, ensure_ascii=True))
    arrays["metadata"] = np.array(_metadata_json(trace))
    arrays["format"] = np.array(NPZ_FORMAT)
    np.savez(stream, **arrays)


def read_npz(data: bytes, source: str, name: str) -> Trace:
    """Read an ``.npz`` written by :func:`write_npz` (never unpickles anything)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as err:
        raise TraceError(f"not a readable .npz file: {err}", source=source) from None

    def text(key: str, default: Any) -> Any:
        if key not in arrays:
            return default
        value = arrays[key]
        if value.dtype.kind != "U" or value.size != 1:
            raise TraceError(f"array {key!r} should hold JSON text", source=source)
        try:
            return json.loads(str(value.reshape(())))
        except ValueError as err:
            raise TraceError(f"array {key!r} is not valid JSON: {err}", source=source) from None

    fmt = arrays.get("format")
    fmt = str(fmt.reshape(())) if fmt is not None and fmt.size == 1 else fmt
    missing = [c for c in REQUIRED_COLUMNS if c not in arrays]
    if missing:
        raise TraceError("not an allocsim trace .npz: missing array(s) "
                         + ", ".join(repr(c) for c in missing), source=source)
    if fmt not in (None, NPZ_FORMAT):
        raise TraceError(f"unsupported .npz format {fmt!r} (this version reads {NPZ_FORMAT!r})",
                         source=source)
    columns: dict[str, np.ndarray] = {}
    if arrays["time_ns"].ndim != 1:
        raise TraceError(f"array 'time_ns' has shape {arrays['time_ns'].shape}, expected 1-D",
                         source=source)
    n = len(arrays["time_ns"])
    for column, dtype in COLUMN_DTYPES.items():
        if column not in arrays:
            continue
        values = arrays[column]
        if values.ndim != 1 or len(values) != n:
            raise TraceError(f"array {column!r} has shape {values.shape}, expected ({n},)",
                             source=source)
        if values.dtype.kind not in "iu":
            raise TraceError(f"array {column!r} has dtype {values.dtype}, expected integers",
                             source=source)
        if values.dtype != dtype and len(values):
            info = np.iinfo(dtype)
            out = np.flatnonzero((values < info.min) | (values > info.max))
            if len(out):
                raise TraceError(f"{column} {values[out[0]]} does not fit in {np.dtype(dtype)}",
                                 source=source, event=int(out[0]))
        columns[column] = values.astype(dtype, copy=False)
    tags = text("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise TraceError("array 'tags' should be a JSON list of strings", source=source)
    metadata = text("metadata", {})
    if not isinstance(metadata, dict):
        raise TraceError("array 'metadata' should be a JSON object", source=source)
    return _build(columns, n, tags, file_metadata(metadata, source, name))


# ====================================================================== .csv
def detect_csv(path: str, head: bytes) -> bool:
    """Text whose first line that is not blank or a ``#`` comment is a header naming
    ``time_ns`` — so another tool's CSV (an RMM log, say) is left to its own importer. A file
    no format claims is read by its extension's reader, which says what is wrong with it.
    """
    if b"\x00" in head or head.startswith(_ZIP_MAGIC):
        return False
    line = _first_content_line(head)
    if line is None or line.startswith((b"{", b"[")):
        return False
    return b"time_ns" in [field.strip().strip(b'"').lower() for field in line.split(b",")]


def _first_content_line(head: bytes) -> bytes | None:
    if head.startswith(_BOM):
        head = head[len(_BOM):]
    for line in head.split(b"\n"):
        line = line.strip()
        if line and not line.startswith(b"#"):
            return line
    return None


def _csv_quote(text: str) -> str:
    """A CSV field for ``text``, quoted when it holds a comma, quote or line break."""
    if not any(c in text for c in ',"\r\n'):
        return text
    return '"' + text.replace('"', '""') + '"'


def write_csv(trace: Trace, stream: BinaryIO) -> None:
    """Write the documented CSV: metadata comment, header, one row per event."""
    _check_ops(trace)
    _check_tag_column(trace)
    has_tags = bool(np.any(trace.tag != NO_TAG))
    header = [f"{_CSV_METADATA} {_metadata_json(trace)}"]
    if not _tags_are_canonical(trace):
        header.append(f"{_CSV_TAGS} {json.dumps(trace.tags, ensure_ascii=True)}")
    used = [trace.tags[t] for t in np.unique(trace.tag).tolist() if t != NO_TAG]
    unwritable = [t for t in used if not t or t != t.strip()]
    if unwritable:
        # A CSV reader strips tag cells and reads an empty one as no tag (hand-written files
        # put spaces after commas); refusing beats writing a file that reads back different.
        raise TraceError(f"tag {unwritable[0]!r} is empty or has surrounding spaces, which "
                         "CSV cannot keep; save as .jsonl or .npz instead")
    names = list(CSV_COLUMNS if has_tags else CSV_COLUMNS[:-1])
    header.append(",".join(names))

    sizes = list(map(str, trace.size.tolist()))
    for i in np.flatnonzero(trace.size == SIZE_UNKNOWN).tolist():
        sizes[i] = ""
    op_names = [OP_NAMES[OP_ALLOC], OP_NAMES[OP_FREE]]
    columns: list[list[Any]] = [trace.time_ns.tolist(),
                                list(map(op_names.__getitem__, trace.op.tolist())),
                                trace.id.tolist(), sizes, trace.stream.tolist(),
                                trace.process.tolist()]
    if has_tags:
        # NO_TAG is -1, so the extra last entry '' serves untagged events.
        encoded = [_csv_quote(t) for t in trace.tags] + [""]
        columns.append(list(map(encoded.__getitem__, trace.tag.tolist())))
        rows = [f"{a},{b},{c},{d},{e},{f},{g}" for a, b, c, d, e, f, g in zip(*columns)]
    else:
        rows = [f"{a},{b},{c},{d},{e},{f}" for a, b, c, d, e, f in zip(*columns)]
    stream.write(("\n".join(header) + "\n").encode("utf-8"))
    if rows:
        stream.write(("\n".join(rows) + "\n").encode("utf-8"))


def read_csv(data: bytes, source: str, name: str) -> Trace:
    """Read the documented CSV (see the module docstring)."""
    if data.startswith(_BOM):
        data = data[len(_BOM):]

    # Preamble: comments and blank lines, then the header.
    metadata: Any = {}
    tags: list[str] = []
    pos, line_no, header_line = 0, 0, None
    while pos < len(data):
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        line_no += 1
        line = _decode(data[pos:end], source).rstrip("\r")
        pos = end + 1
        stripped = line.strip()
        if stripped.startswith(_CSV_METADATA):
            metadata = _json_field(stripped[len(_CSV_METADATA):], dict, "metadata",
                                   source, line_no)
        elif stripped.startswith(_CSV_TAGS):
            tags = _json_field(stripped[len(_CSV_TAGS):], list, "tags", source, line_no)
            if not all(isinstance(t, str) for t in tags):
                raise TraceError(f"line {line_no}: {TAGS_KEY} must be a list of strings",
                                 source=source)
        elif stripped and not stripped.startswith("#"):
            header_line = line
            break
    if header_line is None:
        raise TraceError("no header line (expected " + ",".join(CSV_COLUMNS[:-1]) + ")",
                         source=source)
    names = _csv_header(header_line, source, line_no)
    body = data[pos:]

    columns = _csv_fast(body, names)
    if columns is None:
        columns = _csv_slow(body, names, source, line_no)
    n = len(columns["time_ns"])
    raw_tags = columns.pop("tag", None)
    table = _TagTable(tags)
    if raw_tags is not None:
        columns["tag"] = table.codes(raw_tags, "")
    return _build(columns, n, table.tags, file_metadata(metadata, source, name))


def _json_field(text: str, kind: type, what: str, source: str, line_no: int) -> Any:
    try:
        value = json.loads(text)
    except ValueError as err:
        raise TraceError(f"line {line_no}: bad {what} JSON: {err}", source=source) from None
    if not isinstance(value, kind):
        expected = "an object" if kind is dict else "a list"
        raise TraceError(f"line {line_no}: {what} JSON should be {expected}", source=source)
    return value


def _csv_header(line: str, source: str, line_no: int) -> list[str]:
    names = [name.strip() for name in next(csv.reader([line]))]
    unknown = [name for name in names if name not in CSV_COLUMNS]
    if unknown:
        raise TraceError(f"line {line_no}: unknown column(s) "
                         + ", ".join(repr(u) for u in unknown)
                         + " (known: " + ", ".join(CSV_COLUMNS) + ")", source=source)
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise TraceError(f"line {line_no}: column(s) given twice: "
                         + ", ".join(repr(t) for t in twice), source=source)
    missing = [name for name in REQUIRED_COLUMNS if name not in names]
    if missing:
        raise TraceError(f"line {line_no}: missing required column(s) "
                         + ", ".join(repr(m) for m in missing), source=source)
    return names


def _csv_fast(body: bytes, names: list[str]) -> dict[str, Any] | None:
    """Vectorised parse of a plain, well-formed body; ``None`` if anything is unusual.

    Works on the bytes with numpy: separators give every field's span, integers are built
    digit by digit across all rows at once. Anything it does not expect (quotes outside a
    last ``tag`` column, spaces, blank lines, bad values, 19+ digit numbers) sends the caller
    to :func:`_csv_slow`, which parses the same grammar field by field and finds the exact
    error; so this path only has to be right on files it accepts.
    """
    if b"\r" in body:
        body = body.replace(b"\r\n", b"\n")
    if not body:
        return {name: [] if name == "tag" else np.zeros(0, dtype=COLUMN_DTYPES[name])
                for name in names}
    tag_last = names[-1] == "tag"
    if (b"\r" in body or b"\n\n" in body or body.startswith(b"\n")
            or (b'"' in body and not tag_last)):
        return None
    if not body.endswith(b"\n"):
        body += b"\n"
    b = np.frombuffer(body, dtype=np.uint8)
    width = len(names)
    is_newline = b == ord("\n")
    is_comma = b == ord(",")
    rows = int(np.count_nonzero(is_newline))
    if np.count_nonzero(is_comma) == rows * (width - 1):
        # Every line must then have exactly width-1 commas: each width-th separator ends a line.
        seps = np.flatnonzero(is_comma | is_newline).reshape(rows, width)
        if not np.all(is_newline[seps[:, -1]]):
            return None
        commas, newlines = seps[:, :-1], seps[:, -1]
    elif tag_last:
        # A last tag column may hold (quoted) commas: keep each line's first width-1 commas.
        newlines = np.flatnonzero(is_newline)
        commas = np.flatnonzero(is_comma)
        line = np.searchsorted(newlines, commas)
        rank = np.arange(len(commas)) - np.searchsorted(line, line)
        keep = rank < width - 1
        commas, line = commas[keep], line[keep]
        if len(commas) != rows * (width - 1) or np.any(
                np.bincount(line, minlength=rows) != width - 1):
            return None
    else:
        return None
    ends = np.empty((rows, width), dtype=np.int64)
    ends[:, :-1] = commas.reshape(rows, width - 1)
    ends[:, -1] = newlines
    starts = np.empty_like(ends)
    starts[:, 1:] = ends[:, :-1] + 1
    starts[0, 0] = 0
    starts[1:, 0] = newlines[:-1] + 1
    columns: dict[str, Any] = {}
    for j, name in enumerate(names):
        s, e = starts[:, j], ends[:, j]
        if name == "op":
            values = _fast_ops(b, s, e)
        elif name == "tag":
            values = _fast_tags(body, s, e)
        else:
            values = _fast_ints(b, s, e, COLUMN_DTYPES[name], empty_ok=name == "size")
        if values is None:
            return None
        columns[name] = values
    return columns


def _fast_tags(body: bytes, s: np.ndarray, e: np.ndarray) -> list[str] | None:
    """Tag fields as strings; each distinct raw field is unquoted and decoded once."""
    raw = [body[x:y] for x, y in zip(s.tolist(), e.tolist())]
    decoded: dict[bytes, str] = {}
    for field in dict.fromkeys(raw):
        if field.startswith(b'"'):
            inner = field[1:-1]
            if len(field) < 2 or not field.endswith(b'"') or b'"' in inner.replace(b'""', b""):
                return None
            field_value = inner.replace(b'""', b'"')
        elif b'"' in field or b"," in field:
            return None
        else:
            field_value = field
        try:
            decoded[field] = field_value.decode("utf-8").strip()
        except UnicodeDecodeError:
            return None
    return list(map(decoded.__getitem__, raw))


def _fast_ops(b: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray | None:
    length = e - s
    window = np.minimum(s[:, None] + np.arange(5), len(b) - 1)
    chars = b[window]
    is_alloc = (length == 5) & np.all(chars == np.frombuffer(b"alloc", np.uint8), axis=1)
    is_free = (length == 4) & np.all(chars[:, :4] == np.frombuffer(b"free", np.uint8), axis=1)
    if not np.all(is_alloc | is_free):
        return None
    return np.where(is_alloc, OP_ALLOC, OP_FREE).astype(np.int8)


def _fast_ints(b: np.ndarray, s: np.ndarray, e: np.ndarray, dtype: type,
               empty_ok: bool) -> np.ndarray | None:
    length = e - s
    empty = length == 0
    if empty.any() and not empty_ok:
        return None
    last = len(b) - 1
    negative = ~empty & (b[np.minimum(s, last)] == ord("-"))
    first = s + negative
    digits = e - first
    if len(digits) and (digits.max() > 18 or np.any(negative & (digits == 0))):
        return None  # 19+ digits might overflow int64: let the slow path decide
    value = np.zeros(len(s), dtype=np.int64)
    bad = np.zeros(len(s), dtype=bool)
    for k in range(int(digits.max()) if len(digits) else 0):
        has = k < digits
        d = b[np.minimum(first + k, last)] - np.uint8(ord("0"))  # uint8: below '0' wraps high
        bad |= has & (d > 9)
        value = np.where(has, value * 10 + d, value)
    if bad.any():
        return None
    value = np.where(negative, -value, value)
    value[empty] = SIZE_UNKNOWN
    info = np.iinfo(dtype)
    if len(value) and (value.min() < info.min or value.max() > info.max):
        return None
    return value.astype(dtype)


def _csv_slow(body: bytes, names: list[str], source: str, header_line_no: int
              ) -> dict[str, Any]:
    """Field-by-field parse with the csv module; finds the exact event and line of an error."""
    text = _decode(body, source)
    reader = csv.reader(io.StringIO(text, newline=""))
    rows = [row for row in reader if not _blank(row)]

    def line_of(event: int) -> int:
        again = csv.reader(io.StringIO(text, newline=""))
        seen = -1
        for row in again:
            if not _blank(row):
                seen += 1
                if seen == event:
                    return header_line_no + again.line_num
        return header_line_no + again.line_num  # pragma: no cover

    def fail(event: int, problem: str) -> TraceError:
        return TraceError(f"line {line_of(event)}: {problem}", source=source, event=event)

    width = len(names)
    if set(map(len, rows)) - {width}:
        event = next(i for i, row in enumerate(rows) if len(row) != width)
        raise fail(event, f"expected {width} fields ({','.join(names)}), "
                          f"found {len(rows[event])}")
    cells = list(zip(*rows)) if rows else [()] * width
    columns: dict[str, Any] = {}
    try:
        for name, values in zip(names, cells):
            if name == "op":
                columns[name] = _slow_ops(values)
            elif name == "tag":
                columns[name] = [value.strip() for value in values]
            else:
                columns[name] = _slow_ints(values, name, COLUMN_DTYPES[name],
                                           empty=SIZE_UNKNOWN if name == "size" else None)
    except _Bad as bad:
        raise fail(bad.event or 0, bad.problem) from None
    return columns


def _blank(row: list[str]) -> bool:
    """Blank lines (empty or only spaces) are ignored."""
    return not row or (len(row) == 1 and not row[0].strip())


def _slow_ops(values: Sequence[str]) -> np.ndarray:
    try:
        codes = list(map(OP_CODES.__getitem__, values))
    except KeyError:
        codes = []
        for i, value in enumerate(values):
            code = OP_CODES.get(value.strip().lower())
            if code is None:
                raise _Bad(i, f"op {value!r} is not 'alloc' or 'free'") from None
            codes.append(code)
    return np.array(codes, dtype=np.int8)


def _slow_ints(values: Sequence[str], name: str, dtype: type, empty: int | None) -> np.ndarray:
    try:
        ints = list(map(int, values))
    except ValueError:
        ints = []
        for i, value in enumerate(values):
            try:
                ints.append(int(value))
            except ValueError:
                if empty is None or value.strip():
                    raise _Bad(i, f"{name} {value!r} is not an integer") from None
                ints.append(empty)
    return _int_array(ints, name, dtype, values)


def _int_array(ints: list[int], name: str, dtype: type, shown: Sequence[Any]) -> np.ndarray:
    try:
        return np.array(ints, dtype=dtype)
    except OverflowError:
        info = np.iinfo(dtype)
        i = next(i for i, v in enumerate(ints) if not info.min <= v <= info.max)
        raise _Bad(i, f"{name} {shown[i]!r} does not fit in {np.dtype(dtype)}") from None


# ====================================================================== .jsonl
def detect_jsonl(path: str, head: bytes) -> bool:
    """Text whose first line that is not blank or a ``#`` comment starts with ``{``."""
    if b"\x00" in head:
        return False
    line = _first_content_line(head)
    return line is not None and line.startswith(b"{")


def write_jsonl(trace: Trace, stream: BinaryIO) -> None:
    """Write one JSON object per event, after a metadata line."""
    _check_ops(trace)
    _check_tag_column(trace)
    meta = _metadata_json(trace)
    extra = ""
    if not _tags_are_canonical(trace):
        extra = f', "{TAGS_KEY}": {json.dumps(trace.tags, ensure_ascii=True)}'
    header = f'{{"{METADATA_KEY}": {meta}{extra}}}\n'
    sizes = ["null" if s == SIZE_UNKNOWN else s for s in trace.size.tolist()]
    op_names = ['"alloc"', '"free"']
    ops = list(map(op_names.__getitem__, trace.op.tolist()))
    # NO_TAG is -1, so the extra last entry '' serves untagged events.
    encoded = [f',"tag":{json.dumps(t, ensure_ascii=True)}' for t in trace.tags] + [""]
    tags = map(encoded.__getitem__, trace.tag.tolist())
    rows = [f'{{"time_ns":{t},"op":{o},"id":{i},"size":{s},"stream":{st},"process":{p}{g}}}'
            for t, o, i, s, st, p, g in zip(trace.time_ns.tolist(), ops, trace.id.tolist(),
                                            sizes, trace.stream.tolist(),
                                            trace.process.tolist(), tags)]
    stream.write(header.encode("utf-8"))
    if rows:
        stream.write(("\n".join(rows) + "\n").encode("utf-8"))


_JSONL_FIELDS = frozenset(CSV_COLUMNS)


def read_jsonl(data: bytes, source: str, name: str) -> Trace:
    """Read JSON lines (see the module docstring)."""
    lines = _decode(data, source).split("\n")
    start = 0
    metadata: Any = {}
    tags: list[str] = []
    while start < len(lines) and (not lines[start].strip()
                                  or lines[start].lstrip().startswith("#")):
        start += 1
    if start < len(lines):
        try:
            first = json.loads(lines[start])
        except ValueError:
            first = None  # reported as the first event's bad JSON below
        if isinstance(first, dict) and METADATA_KEY in first:
            metadata = first[METADATA_KEY]
            if not isinstance(metadata, dict) or set(first) - {METADATA_KEY, TAGS_KEY}:
                raise TraceError(f"line {start + 1}: the {METADATA_KEY} line should be "
                                 f"{{\"{METADATA_KEY}\": {{...}}}}", source=source)
            tags = first.get(TAGS_KEY, [])
            if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                raise TraceError(f"line {start + 1}: {TAGS_KEY} must be a list of strings",
                                 source=source)
            start += 1
    body_at = [i for i in range(start, len(lines)) if lines[i].strip()]
    body = [lines[i] for i in body_at]

    def fail(event: int, problem: str) -> TraceError:
        return TraceError(f"line {body_at[event] + 1}: {problem}", source=source, event=event)

    # The C scanner behind json.loads, called directly: json.loads spends most of its time
    # in Python-level wrapping (2-3x slower over a million lines). A line it does not take
    # whole (surrounding spaces, or an error to report) goes through json.loads.
    scan = make_scanner(json.JSONDecoder())
    records: list[Any] = []
    append = records.append
    for event, line in enumerate(body):
        try:
            record, end = scan(line, 0)
            if end != len(line):
                raise ValueError
        except (StopIteration, ValueError):
            try:
                record = json.loads(line)
            except ValueError as err:
                raise fail(event, f"bad JSON: {err}") from None
        append(record)
    if set(map(type, records)) - {dict}:
        event = next(i for i, r in enumerate(records) if not isinstance(r, dict))
        raise fail(event, f"expected a JSON object, found {body[event].strip()[:40]!r}")
    unknown = set(chain.from_iterable(records)) - _JSONL_FIELDS
    if unknown:
        event = next(i for i, r in enumerate(records) if set(r) - _JSONL_FIELDS)
        names = ", ".join(repr(k) for k in sorted(set(records[event]) - _JSONL_FIELDS))
        raise fail(event, f"unknown field(s) {names} (known: {', '.join(CSV_COLUMNS)})")

    n = len(records)
    columns: dict[str, Any] = {}
    try:
        for field in ("time_ns", "op", "id"):
            try:
                values = [r[field] for r in records]
            except KeyError:
                event = next(i for i, r in enumerate(records) if field not in r)
                raise _Bad(event, f"missing field {field!r}") from None
            if field == "op":
                columns["op"] = _json_ops(values)
            else:
                columns[field] = _json_ints(values, field, COLUMN_DTYPES[field], None)
        ops = columns["op"]
        sizes = [r.get("size") for r in records]
        columns["size"] = _json_ints(sizes, "size", np.int64, SIZE_UNKNOWN)
        # size may be null or absent on a free; an alloc must at least say it.
        for event in np.flatnonzero((ops == OP_ALLOC) & (columns["size"] == SIZE_UNKNOWN)):
            if "size" not in records[event]:
                raise _Bad(int(event), "missing field 'size'")
        for field in ("stream", "process"):
            columns[field] = _json_ints([r.get(field, 0) for r in records], field,
                                        COLUMN_DTYPES[field], 0)
        raw_tags = [r.get("tag") for r in records]
        if set(map(type, raw_tags)) - {str, type(None)}:
            event = next(i for i, t in enumerate(raw_tags) if not isinstance(t, (str, type(None))))
            raise _Bad(event, f"tag {raw_tags[event]!r} is not a string")
    except _Bad as bad:
        raise fail(bad.event or 0, bad.problem) from None
    table = _TagTable(tags)
    columns["tag"] = table.codes(raw_tags, None)
    return _build(columns, n, table.tags, file_metadata(metadata, source, name))


def _json_ops(values: list[Any]) -> np.ndarray:
    try:
        return np.array(list(map(OP_CODES.__getitem__, values)), dtype=np.int8)
    except (KeyError, TypeError):
        for i, value in enumerate(values):
            if not isinstance(value, str) or value not in OP_CODES:
                raise _Bad(i, f"op {value!r} is not 'alloc' or 'free'") from None
        raise  # pragma: no cover


def _json_ints(values: list[Any], name: str, dtype: type, none: int | None) -> np.ndarray:
    """Integers from JSON values; ``None`` becomes ``none`` where allowed. No bools, no floats."""
    kinds = set(map(type, values))
    if none is not None and type(None) in kinds:
        values = [none if v is None else v for v in values]
        kinds.discard(type(None))
    if kinds - {int}:
        i = next(i for i, v in enumerate(values) if type(v) is not int)
        raise _Bad(i, f"{name} {values[i]!r} is not an integer")
    return _int_array(values, name, dtype, values)


Reader = Callable[[bytes, str, str], Trace]
Writer = Callable[[Trace, BinaryIO], None]
