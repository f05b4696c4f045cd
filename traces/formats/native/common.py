"""What allocsim's own trace files share: names, metadata, column checks, building the Trace.

The readers and writers of the native formats (``npz``, ``csv``, ``jsonl``
of this package; documented together in ``allocsim.traces.formats.native``) use these; so do
the importers of other tools' files, for :func:`file_metadata`. A reader is
``reader(data, source, name) -> Trace`` (:data:`Reader`), a writer ``writer(trace, stream)``
(:data:`Writer`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import numpy as np

from allocsim.traces.model import NO_TAG, OP_ALLOC, OP_FREE, Trace, TraceError

__all__ = [
    "BOM",
    "CSV_COLUMNS",
    "MAX_LINE_BYTES",
    "MAX_TAG_TEXT",
    "METADATA_KEY",
    "REQUIRED_COLUMNS",
    "TAGS_KEY",
    "ZIP_MAGIC",
    "BadValue",
    "Reader",
    "TagTable",
    "Writer",
    "build_trace",
    "check_line_lengths",
    "check_ops",
    "check_tag_column",
    "decode_text",
    "file_metadata",
    "first_content_line",
    "int_array",
    "metadata_json",
    "tag_text_problem",
    "tags_are_canonical",
]

Reader = Callable[[bytes, str, str], Trace]
Writer = Callable[[Trace, BinaryIO], None]

CSV_COLUMNS = ("time_ns", "op", "id", "size", "stream", "process", "tag")
REQUIRED_COLUMNS = ("time_ns", "op", "id", "size")
METADATA_KEY = "allocsim-metadata"
TAGS_KEY = "allocsim-tags"
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
BOM = b"\xef\xbb\xbf"


class BadValue(Exception):
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


def metadata_json(trace: Trace) -> str:
    """The metadata as one line of ASCII JSON (non-ASCII escaped, so no stray line breaks)."""
    try:
        return json.dumps(trace.metadata, ensure_ascii=True)
    except (TypeError, ValueError) as err:
        raise TraceError(f"metadata is not JSON-serialisable: {err}") from None


def check_tag_column(trace: Trace) -> None:
    tag = trace.tag
    bad = np.flatnonzero((tag < NO_TAG) | (tag >= len(trace.tags)))
    if len(bad):
        i = int(bad[0])
        raise TraceError(f"tag index {int(tag[i])} is not in the trace's {len(trace.tags)} tags",
                         event=i)
    if not all(isinstance(t, str) for t in trace.tags):
        raise TraceError("tags must be strings")


def tags_are_canonical(trace: Trace) -> bool:
    """Whether a reader rebuilds ``trace.tags`` from the tag column alone: the table holds
    exactly the used tags, in order of first use, each once."""
    used = trace.tag[trace.tag != NO_TAG]
    if len(set(trace.tags)) != len(trace.tags):
        return False
    if not len(used):
        return not trace.tags
    codes, first = np.unique(used, return_index=True)
    return np.array_equal(codes[np.argsort(first)], np.arange(len(trace.tags)))


def check_ops(trace: Trace) -> None:
    bad = np.flatnonzero((trace.op != OP_ALLOC) & (trace.op != OP_FREE))
    if len(bad):
        i = int(bad[0])
        raise TraceError(f"unknown op {int(trace.op[i])} cannot be written", event=i)


def decode_text(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TraceError(f"not UTF-8 text (bad byte at offset {err.start})",
                         source=source) from None


class TagTable:
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
        text = 0
        for value in dict.fromkeys(values):  # unique, in first-use order, at C speed
            if value != none and value not in index:
                text += len(value)
                if text > MAX_TAG_TEXT:
                    raise BadValue(list(values).index(value), tag_text_problem())
                index[value] = len(self.tags)
                self.tags.append(value)
        index[none] = NO_TAG
        return np.array(list(map(index.__getitem__, values)), dtype=np.int32)


def build_trace(columns: dict[str, np.ndarray], n: int, tags: list[str],
           metadata: dict[str, Any]) -> Trace:
    zeros = np.zeros(n, dtype=np.int32)
    return Trace(
        time_ns=columns["time_ns"], op=columns["op"], id=columns["id"], size=columns["size"],
        stream=columns.get("stream", zeros),
        process=columns.get("process", zeros.copy()),
        tag=columns.get("tag", np.full(n, NO_TAG, dtype=np.int32)),
        tags=tags, metadata=metadata)


def first_content_line(head: bytes) -> bytes | None:
    if head.startswith(BOM):
        head = head[len(BOM):]
    for line in head.split(b"\n"):
        line = line.strip()
        if line and not line.startswith(b"#"):
            return line
    return None



def int_array(ints: list[int], name: str, dtype: type, shown: Sequence[Any]) -> np.ndarray:
    try:
        return np.array(ints, dtype=dtype)
    except OverflowError:
        info = np.iinfo(dtype)
        i = next(i for i, v in enumerate(ints) if not info.min <= v <= info.max)
        raise BadValue(i, f"{name} {shown[i]!r} does not fit in {np.dtype(dtype)}") from None


# The longest data line a text trace may hold: a row is a few dozen bytes and a tag a call
# site; 128 KiB is the csv module's own field limit. A file of longer lines is no trace, and
# refusing it before parsing keeps the parse within a few times the file's size.
MAX_LINE_BYTES = 128 << 10
_LINE_BLOCK = 16 << 20
# The most text a trace's distinct tags may hold: a million call sites of 64 characters. Each
# tag is held a few times while a file is read, so a file of long distinct tags is refused
# here, not when it has filled memory.
MAX_TAG_TEXT = 64 << 20


def tag_text_problem() -> str:
    return (f"the distinct tags hold more than {MAX_TAG_TEXT:,} characters of text, which no "
            "trace's call sites do")


def check_line_lengths(body: bytes | memoryview, source: str, first_line_no: int) -> None:
    """Refuse (one line, naming the line) a ``body`` with a line over :data:`MAX_LINE_BYTES`;
    scanned in blocks, so the check itself holds a few MiB whatever the size."""
    if len(body) <= MAX_LINE_BYTES:
        return
    b = np.frombuffer(body, dtype=np.uint8)
    previous = -1      # position of the last newline seen
    lines_before = 0   # newlines before ``previous`` (inclusive)
    for start in range(0, len(b), _LINE_BLOCK):
        stop = min(start + _LINE_BLOCK, len(b))
        newlines = np.flatnonzero(b[start:stop] == ord("\n")) + start
        if len(newlines):
            gaps = np.diff(newlines, prepend=previous) - 1
            long = np.flatnonzero(gaps > MAX_LINE_BYTES)
            if len(long):
                _too_long(source, first_line_no + lines_before + int(long[0]) + 1)
            lines_before += len(newlines)
            previous = int(newlines[-1])
        if stop - previous - 1 > MAX_LINE_BYTES:
            _too_long(source, first_line_no + lines_before + 1)


def _too_long(source: str, line_no: int) -> None:
    raise TraceError(f"line {line_no}: longer than {MAX_LINE_BYTES:,} bytes, which no trace "
                     "row is", source=source)
