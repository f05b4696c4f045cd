"""allocsim's ``.csv`` trace files (the documented interchange format), read and written.

The format is described in ``allocsim.traces.formats.native``. Reading takes a vectorised
path (:func:`_csv_fast`) on plain, well-formed files and falls back to the ``csv`` module
field by field (:func:`_csv_slow`), which finds the exact line of an error.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np

from allocsim.traces.formats.native.common import (
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
_LINE_END = re.compile(rb"\r\n|\r|\n")
_SCAN_BLOCK = 1 << 20   # bytes scanned for separators at a time (its masks: 2 bytes a byte)
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
    if not data or data.isspace():   # strip() would copy the whole file
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

    try:
        columns = _csv_fast(data, names, pos)     # the body in place: no copy of it
        if columns is None:
            columns = _csv_slow(data, names, source, line_no, pos)
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


def _csv_fast(body: bytes, names: list[str], start: int = 0) -> dict[str, Any] | None:
    """Vectorised parse of a plain, well-formed body (``body[start:]``: the caller's buffer is
    not copied); ``None`` if anything is unusual.

    Works on the bytes with numpy: separators give every field's span, integers are built
    digit by digit across all rows at once. Anything it does not expect (quotes outside a
    last ``tag`` column, spaces, blank lines, bad values, 19+ digit numbers) sends the caller
    to :func:`_csv_slow`, which parses the same grammar field by field and finds the exact
    error; so this path only has to be right on files it accepts.

    Memory: besides the buffer, the separators' positions (8 bytes each) and a block's masks;
    tags are checked against their text budget as each distinct one is met.
    """
    if body.find(b"\r", start) >= 0:
        body, start = body[start:].replace(b"\r\n", b"\n"), 0
    if start >= len(body):
        return {name: [] if name == "tag" else np.zeros(0, dtype=COLUMN_DTYPES[name])
                for name in names}
    tag_last = names[-1] == "tag"
    if (body.find(b"\r", start) >= 0 or body.find(b"\n\n", start) >= 0
            or body.startswith(b"\n", start) or (body.find(b'"', start) >= 0 and not tag_last)):
        return None
    b = np.frombuffer(body, dtype=np.uint8)
    width = len(names)
    newline_parts, comma_parts = [], []
    for at in range(start, len(b), _SCAN_BLOCK):
        block = b[at:at + _SCAN_BLOCK]
        newline_parts.append(np.flatnonzero(block == ord("\n")) + at)
        comma_parts.append(np.flatnonzero(block == ord(",")) + at)
    if not body.endswith(b"\n"):       # the last line's end, as if the newline were there
        newline_parts.append(np.array([len(b)], dtype=np.int64))
    newlines = np.concatenate(newline_parts).astype(np.int64, copy=False)
    commas = np.concatenate(comma_parts).astype(np.int64, copy=False)
    del newline_parts, comma_parts
    rows = len(newlines)
    # A comma's line: the number of newlines before it. Keep each line's first width-1 commas
    # (a last tag column may hold quoted commas); every line must have at least that many.
    line = np.searchsorted(newlines, commas)
    if len(commas) != rows * (width - 1):
        if not tag_last:
            return None
        rank = np.arange(len(commas)) - np.searchsorted(line, line)
        keep = rank < width - 1
        commas, line = commas[keep], line[keep]
        if len(commas) != rows * (width - 1):
            return None
    if np.any(np.bincount(line, minlength=rows) != width - 1):
        return None
    del line
    ends = np.empty((rows, width), dtype=np.int64)
    ends[:, :-1] = commas.reshape(rows, width - 1)
    ends[:, -1] = newlines
    starts = np.empty_like(ends)
    starts[:, 1:] = ends[:, :-1] + 1
    starts[0, 0] = start
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
    """Tag fields as strings; each distinct raw field is unquoted and decoded once, and the
    distinct text is held to its budget as it is met (no table of every row's field is built
    first: a file of long distinct tags stops at the budget, not at its own size)."""
    decoded: dict[bytes, str] = {}
    out: list[str] = []
    text = 0
    for row, (x, y) in enumerate(zip(s.tolist(), e.tolist())):
        field = body[x:y]
        value = decoded.get(field)
        if value is None:
            text += len(field)
            if text > MAX_TAG_TEXT:
                raise BadValue(row, tag_text_problem())
            if field.startswith(b'"'):
                inner = field[1:-1]
                if (len(field) < 2 or not field.endswith(b'"')
                        or b'"' in inner.replace(b'""', b"")):
                    return None
                field_value = inner.replace(b'""', b'"')
            elif b'"' in field or b"," in field:
                return None
            else:
                field_value = field
            try:
                value = decoded[field] = field_value.decode("utf-8").strip()
            except UnicodeDecodeError:
                return None
        out.append(value)
    return out


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


def _text_lines(body: bytes, start: int, source: str) -> Iterator[str]:
    """``body[start:]`` as decoded lines (line ends kept), one at a time: the csv module reads
    them as it would a file, and no copy of the whole text is made."""
    at = start
    while at < len(body):
        # Lines end as io.StringIO(newline="") ends them: at \n, \r\n or a lone \r.
        found = _LINE_END.search(body, at)
        end = len(body) if found is None else found.end()
        try:
            yield body[at:end].decode("utf-8")
        except UnicodeDecodeError as err:
            raise TraceError(f"not UTF-8 text (bad byte at offset {at - start + err.start})",
                             source=source) from None
        at = end


def _csv_slow(body: bytes, names: list[str], source: str, header_line_no: int,
              start: int = 0) -> dict[str, Any]:
    """Field-by-field parse with the csv module (``body[start:]``, read a line at a time);
    finds the exact event and line of an error. The tags' text budget is kept as rows come, so
    a file of long distinct tags stops at the budget, not at its own size."""
    if body.startswith(BOM, start):
        start += len(BOM)
    width = len(names)
    cells: list[list[str]] = [[] for _ in names]
    tag_at = names.index("tag") if "tag" in names else -1
    distinct: dict[str, str] = {}
    text = 0
    reader = csv.reader(_text_lines(body, start, source))

    def line_of(event: int) -> int:
        again = csv.reader(_text_lines(body, start, source))
        seen = -1
        for row in again:
            if not _blank(row):
                seen += 1
                if seen == event:
                    return header_line_no + again.line_num
        return header_line_no + again.line_num  # pragma: no cover

    def fail(event: int, problem: str) -> TraceError:
        return TraceError(f"line {line_of(event)}: {problem}", source=source, event=event)

    event = 0
    try:
        for row in reader:
            if _blank(row):
                continue
            if len(row) != width:
                raise TraceError(f"line {header_line_no + reader.line_num}: expected {width} "
                                 f"fields ({','.join(names)}), found {len(row)}",
                                 source=source, event=event)
            if tag_at >= 0:
                tag = row[tag_at].strip()
                kept = distinct.get(tag)
                if kept is None:
                    text += len(tag)
                    if text > MAX_TAG_TEXT:
                        raise BadValue(event, tag_text_problem())
                    kept = distinct[tag] = tag
                row[tag_at] = kept
            for column, value in zip(cells, row):
                column.append(value)
            event += 1
    except csv.Error as err:  # a field over the csv module's limit, a stray quote
        raise TraceError(f"line {header_line_no + reader.line_num}: unreadable CSV: {err}",
                         source=source) from None
    columns: dict[str, Any] = {}
    try:
        for name, values in zip(names, cells):
            if name == "op":
                columns[name] = _slow_ops(values)
            elif name == "tag":
                columns[name] = values
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
