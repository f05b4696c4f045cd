"""Importer for CS:APP malloc-lab trace files (``.rep``), as read by the lab's ``mdriver``.

Follows ``shared/reference/trace-formats.md`` ("Other allocator-research formats"). A file is
four header lines, then one request per line::

    20000     <- suggested heap size (bytes)
    2         <- number of ids
    5         <- number of requests
    1         <- weight
    a 0 2040  <- allocate 2040 bytes as id 0
    a 1 2040
    r 0 48    <- realloc id 0 to 48 bytes
    f 1       <- free id 1
    f 0

- ``a id bytes`` becomes an alloc of trace id ``id``.
- ``r id bytes`` (realloc) becomes a free of the old block then an alloc of the new one with
  the same id, since an id may not be live twice; a realloc of an id that is not live is a
  plain alloc (``realloc(NULL, n)`` in mdriver).
- ``f id`` becomes a free (with the block's size); a free of an id that is not live frees
  nothing in mdriver and is kept as a free of unknown size, which lenient validation drops
  and counts. An ``a`` of an id still live is kept too: lenient validation keeps the old
  block live as a leak under a fresh id, as mdriver (which forgets the pointer) would.

The file has no times: events are 1 µs apart (``metadata["synthetic_times"]`` is True). The
header is kept as ``metadata["malloclab"] = {"heap_size", "ids", "ops", "weight"}``. An id
outside ``0 .. ids-1``, or a request count that differs from the header, is an error naming
the file, the request (event, 0-based) and the line.
"""

from __future__ import annotations

import numpy as np

from allocsim.traces.formats.native import file_metadata
from allocsim.traces.formats.registry import register_format
from allocsim.traces.model import OP_ALLOC, OP_FREE, SIZE_UNKNOWN, Trace, TraceError

__all__ = ["FORMAT_NAME", "detect_malloclab", "read_malloclab"]

FORMAT_NAME = "malloclab"
STEP_NS = 1000
_HEADER_NAMES = ("heap_size", "ids", "ops", "weight")


def _content_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, stripped text)`` of the non-blank lines."""
    return [(n, line.strip()) for n, line in enumerate(text.split("\n"), start=1)
            if line.strip()]


def detect_malloclab(path: str, head: bytes) -> bool:
    """Four integer lines, then a line starting with ``a``, ``r`` or ``f`` and a space."""
    if b"\x00" in head:
        return False
    lines = [line.strip() for line in head.split(b"\n") if line.strip()][:5]
    if len(lines) < 5:
        return False
    header_ok = all(line.split()[0].lstrip(b"-").isdigit() for line in lines[:4])
    return header_ok and lines[4][:2] in (b"a ", b"r ", b"f ")


def read_malloclab(data: bytes, source: str, name: str) -> Trace:
    """Read a malloc-lab ``.rep`` file (see the module docstring)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TraceError(f"not UTF-8 text (bad byte at offset {err.start})",
                         source=source) from None
    lines = _content_lines(text)
    header = _header(lines[:4], source)
    requests = lines[4:]
    if len(requests) != header["ops"]:
        raise TraceError(f"the header says {header['ops']} requests but the file has "
                         f"{len(requests)}", source=source)
    op: list[int] = []
    ids: list[int] = []
    size: list[int] = []
    live: dict[int, int] = {}
    for event, (number, line) in enumerate(requests):
        try:
            kind, block, nbytes = _request(line, header["ids"])
        except ValueError as err:
            raise TraceError(f"line {number}: {err}", source=source, event=event) from None
        if kind in "rf" and block in live:
            op.append(OP_FREE)
            ids.append(block)
            size.append(live.pop(block))
        elif kind == "f":
            op.append(OP_FREE)  # free of a block that is not live: lenient load drops it
            ids.append(block)
            size.append(SIZE_UNKNOWN)
        if kind in "ar":
            op.append(OP_ALLOC)
            ids.append(block)
            size.append(nbytes)
            live[block] = nbytes
    meta = file_metadata({}, source, name)
    meta.update(format=FORMAT_NAME, synthetic_times=True, malloclab=header)
    n = len(op)
    return Trace.from_columns(np.arange(n, dtype=np.int64) * STEP_NS, op, ids, size, **meta)


def _header(lines: list[tuple[int, str]], source: str) -> dict[str, int]:
    if len(lines) < 4:
        raise TraceError("a malloc-lab trace starts with 4 header lines (heap size, ids, "
                         "requests, weight)", source=source)
    values: dict[str, int] = {}
    for (number, line), key in zip(lines, _HEADER_NAMES):
        first = line.split()[0]
        try:
            values[key] = int(first)
        except ValueError:
            raise TraceError(f"line {number}: header value {key} {first!r} is not an "
                             "integer", source=source) from None
    return values


def _request(line: str, n_ids: int) -> tuple[str, int, int]:
    """``(kind, id, bytes)`` of one request line; bytes is 0 for a free."""
    fields = line.split()
    kind = fields[0]
    wanted = {"a": 3, "r": 3, "f": 2}.get(kind)
    if wanted is None:
        raise ValueError(f"request {kind!r} is not a (alloc), r (realloc) or f (free)")
    if len(fields) != wanted:
        raise ValueError(f"'{kind}' takes {wanted - 1} numbers, found {len(fields) - 1}")
    try:
        numbers = [int(f) for f in fields[1:]]
    except ValueError:
        raise ValueError(f"{line!r} has a value that is not an integer") from None
    block = numbers[0]
    if not 0 <= block < n_ids:
        raise ValueError(f"id {block} is outside 0..{n_ids - 1} (the header says {n_ids} ids)")
    nbytes = numbers[1] if kind != "f" else 0
    if nbytes < 0:
        raise ValueError(f"negative size {nbytes}")
    return kind, block, nbytes


register_format(FORMAT_NAME, (".rep", ".rep.gz"), read_malloclab, detect=detect_malloclab,
                recorded=True)
