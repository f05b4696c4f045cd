"""allocsim's ``.jsonl`` trace files: one JSON object per event, read and written.

The format is described in ``allocsim.traces.formats.native``.
"""

from __future__ import annotations

import json
from itertools import chain
from typing import Any, BinaryIO

import numpy as np

from allocsim.traces.formats.native.common import (
    BOM,
    CSV_COLUMNS,
    MAX_LINE_BYTES,
    METADATA_KEY,
    TAGS_KEY,
    BadValue,
    TagTable,
    build_trace,
    check_ops,
    check_tag_column,
    decode_text,
    file_metadata,
    first_content_line,
    int_array,
    metadata_json,
    tags_are_canonical,
)
from allocsim.traces.model import COLUMN_DTYPES, OP_ALLOC, OP_CODES, SIZE_UNKNOWN, Trace, TraceError

__all__ = ["detect_jsonl", "read_jsonl", "write_jsonl"]


def detect_jsonl(path: str, head: bytes) -> bool:
    """Text whose first line that is not blank or a ``#`` comment starts with ``{``."""
    if b"\x00" in head:
        return False
    line = first_content_line(head)
    return line is not None and line.startswith(b"{")


def write_jsonl(trace: Trace, stream: BinaryIO) -> None:
    """Write one JSON object per event, after a metadata line."""
    check_ops(trace)
    check_tag_column(trace)
    meta = metadata_json(trace)
    extra = ""
    if not tags_are_canonical(trace):
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
    if not data.removeprefix(BOM).strip():  # as CSV: a header-only file is an empty trace
        raise TraceError("empty file (no header / no events)", source=source)
    lines = decode_text(data, source).split("\n")
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

    # The C scanner behind json.loads, through raw_decode (one thin call around it):
    # json.loads spends most of its time in Python-level wrapping (2-3x slower over a million
    # lines). A line it does not take whole (surrounding spaces, or an error to report) goes
    # through json.loads.
    scan = json.JSONDecoder().raw_decode
    if max(map(len, body), default=0) > MAX_LINE_BYTES:
        event = next(i for i, line in enumerate(body) if len(line) > MAX_LINE_BYTES)
        raise fail(event, f"longer than {MAX_LINE_BYTES:,} characters, which no trace row is")
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
                raise BadValue(event, f"missing field {field!r}") from None
            if field == "op":
                columns["op"] = _json_ops(values)
            else:
                columns[field] = _json_ints(values, field, COLUMN_DTYPES[field], None)
        ops = columns["op"]
        sizes = [r.get("size") for r in records]
        columns["size"] = _json_ints(sizes, "size", np.int64, SIZE_UNKNOWN)
        # size may be null or absent on a free; an alloc must at least say it.
        unsized = (ops == OP_ALLOC) & (columns["size"] == SIZE_UNKNOWN)
        for event in np.flatnonzero(unsized).tolist():
            if "size" not in records[event]:
                raise BadValue(event, "missing field 'size'")
        for field in ("stream", "process"):
            columns[field] = _json_ints([r.get(field, 0) for r in records], field,
                                        COLUMN_DTYPES[field], 0)
        raw_tags = [r.get("tag") for r in records]
        if set(map(type, raw_tags)) - {str, type(None)}:
            event = next(i for i, t in enumerate(raw_tags) if not isinstance(t, (str, type(None))))
            raise BadValue(event, f"tag {raw_tags[event]!r} is not a string")
        table = TagTable(tags)
        columns["tag"] = table.codes(raw_tags, None)
    except BadValue as bad:
        raise fail(bad.event or 0, bad.problem) from None
    return build_trace(columns, n, table.tags, file_metadata(metadata, source, name))


def _json_ops(values: list[Any]) -> np.ndarray:
    try:
        return np.array(list(map(OP_CODES.__getitem__, values)), dtype=np.int8)
    except (KeyError, TypeError):
        for i, value in enumerate(values):
            if not isinstance(value, str) or value not in OP_CODES:
                raise BadValue(i, f"op {value!r} is not 'alloc' or 'free'") from None
        raise  # pragma: no cover


def _json_ints(values: list[Any], name: str, dtype: type, none: int | None) -> np.ndarray:
    """Integers from JSON values; ``None`` becomes ``none`` where allowed. No bools, no floats."""
    kinds = set(map(type, values))
    if none is not None and type(None) in kinds:
        values = [none if v is None else v for v in values]
        kinds.discard(type(None))
    if kinds - {int}:
        i = next(i for i, v in enumerate(values) if type(v) is not int)
        raise BadValue(i, f"{name} {values[i]!r} is not an integer")
    return int_array(values, name, dtype, values)
