"""allocsim's ``.csv`` trace files (the documented interchange format), read and written.

The format is described in ``allocsim.traces.formats.native``. Reading takes a vectorised
path (:func:`_csv_fast`) on plain, well-formed files and falls back to the ``csv`` module
field by field (:func:`_csv_slow`), which finds the exact line of an error.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any, BinaryIO

import numpy as np

from allocsim.traces.formats.native_common import (
    BOM,
    CSV_COLUMNS,
    MAX_TAG_TEXT,
    METADATA_KEY,
    REQUIRED_COLUMNS,
    TAGS_KEY,
    ZIP_MAGIC,
    BadValue,
    TagTable,
    build_trace,
    check_line_lengths,
    check_ops,
    check_tag_column,
    decode_text,
    file_metadata,
    first_content_line,
    int_array,
    metadata_json,
    tag_text_problem,
    tags_are_canonical,
)
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

__all__ = ["detect_csv", "read_csv", "write_csv"]

_CSV_METADATA = f"# {METADATA_KEY}:"
_CSV_TAGS = f"# {TAGS_KEY}:"


def detect_csv(path: str, head: bytes) -> bool:
    """Text whose first line that is not blank or a ``#`` comment is a header naming
    ``time_ns`` — so another tool's CSV (an RMM log, say) is left to its own importer. A file
    no format claims is read by its extension's reader, which says what is wrong with it.
    """
    if b"\x00" in head or head.startswith(ZIP_MAGIC):
        return False
    line = first_content_line(head)
    if line is None or line.startswith((b"{", b"[")):
        return False
    return b"time_ns" in [field.strip().strip(b'"').lower() for field in line.split(b",")]


def _csv_quote(text: str) -> str:
    """A CSV field for ``text``, quoted when it holds a comma, quote or line break."""
    if not any(c in text for c in ',"\r\n'):
        return text
    return '"' + text.replace('"', '""') + '"'


def write_csv(trace: Trace, stream: BinaryIO) -> None:
    """Write the documented CSV: metadata comment, header, one row per event."""
    check_ops(trace)
    check_tag_column(trace)
    has_tags = bool(np.any(trace.tag != NO_TAG))
    header = [f"{_CSV_METADATA} {metadata_json(trace)}"]
    if not tags_are_canonical(trace):
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
    if data.startswith(BOM):
        data = data[len(BOM):]
    if not data.strip():
        raise TraceError("empty file (no header / no events)", source=source)

    # Preamble: comments and blank lines, then the header.
    metadata: Any = {}
    tags: list[str] = []
    pos, line_no, header_line = 0, 0, None
    while pos < len(data):
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        line_no += 1
        line = decode_text(data[pos:end], source).rstrip("\r")
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
    check_line_lengths(memoryview(data)[pos:], source, line_no)  # before any copy is made
    body = data[pos:]

    try:
        columns = _csv_fast(body, names)
        if columns is None:
            columns = _csv_slow(body, names, source, line_no)
        n = len(columns["time_ns"])
        raw_tags = columns.pop("tag", None)
        table = TagTable(tags)
        if raw_tags is not None:
            columns["tag"] = table.codes(raw_tags, "")
    except BadValue as bad:  # the tags' text budget (each other problem names its line)
        raise TraceError(bad.problem, source=source, event=bad.event) from None
    return build_trace(columns, n, table.tags, file_metadata(metadata, source, name))


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
    try:
        names = [name.strip() for name in next(csv.reader([line]))]
    except csv.Error as err:  # e.g. a bare carriage return inside the header line
        raise TraceError(f"line {line_no}: unreadable CSV header: {err}", source=source) from None
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
        values: np.ndarray | list[str] | None
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
    text = 0
    for field in dict.fromkeys(raw):
        text += len(field)
        if text > MAX_TAG_TEXT:
            raise BadValue(raw.index(field), tag_text_problem())
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
    text = decode_text(body, source)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        rows = [row for row in reader if not _blank(row)]
    except csv.Error as err:  # a field over the csv module's limit, a stray quote
        raise TraceError(f"line {header_line_no + reader.line_num}: unreadable CSV: {err}",
                         source=source) from None

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
    except BadValue as bad:
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
                raise BadValue(i, f"op {value!r} is not 'alloc' or 'free'") from None
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
                    raise BadValue(i, f"{name} {value!r} is not an integer") from None
                ints.append(empty)
    return int_array(ints, name, dtype, values)
