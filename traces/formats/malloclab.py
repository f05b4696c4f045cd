"""Importer for CS:APP malloc-lab trace files (``.rep``), as read by the lab's ``mdriver``.

Follows ``shared/reference/trace-formats.md`` ("Other allocator-research formats"). A file is
four header lines, then one request per line::

    20000     <- suggested heap size (bytes; CS:APP) -- or the weight, 0 or 1 (Autolab)
    2         <- number of ids
    5         <- number of requests
    1         <- weight (CS:APP) -- or ignore-ranges, 0 or 1 (Autolab)
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
  and counts. ``f -1`` is ``free(NULL)`` (the Autolab mdriver: "index (-1) is the null
  pointer"): a no-op, counted in ``metadata["null_frees"]``.
  An ``a`` of an id still live is kept too: lenient validation keeps the old block live as a
  leak under a fresh id, as mdriver (which forgets the pointer) would.
- ``r id 0`` (realloc to 0 bytes) frees the block and allocates nothing: mdriver requires
  ``mm_realloc(p, 0)`` to return NULL.

The file has no times: events are 1 µs apart (``metadata["synthetic_times"]`` is True). The
header has two flavours, told apart by its first and fourth lines: CS:APP's (``sugg_heapsize``,
``num_ids``, ``num_ops``, ``weight``; both read and unused by mdriver) and the Autolab
driver's (``weight``, ``num_ids``, ``num_ops``, ``ignore_ranges``, the first and last 0 or 1
— the real-program traces such as bash.rep start with ``1``). It is kept as
``metadata["malloclab"]``: ``{"flavour": "cs:app", "heap_size", "ids", "ops", "weight"}`` or
``{"flavour": "autolab", "weight", "ids", "ops", "ignore_ranges"}`` — a first line of 1 is
never called a heap size. An id
outside ``0 .. ids-1``, or fewer requests than the header says, is an error naming the file,
the request (event, 0-based) and the line; more is an error in CS:APP's flavour (its mdriver
asserts the count) but not in Autolab's, whose driver stops reading after ``ops`` requests:
the rest is left out and counted as ``lines_after_requests`` (four of the Autolab real-program
traces, lrucd, nlydf, qyqyc and rulsr, carry 201 requests under a header of 200).
"""

from __future__ import annotations

import numpy as np

from allocsim.traces.formats.native import file_metadata
from allocsim.traces.formats.registry import register_format
from allocsim.traces.model import (
    OP_ALLOC,
    OP_FREE,
    SIZE_UNKNOWN,
    Trace,
    TraceError,
    int64_problem,
)

__all__ = ["FORMAT_NAME", "detect_malloclab", "read_malloclab"]

FORMAT_NAME = "malloclab"
STEP_NS = 1000
_HEADER_NAMES = ("heap_size", "ids", "ops", "weight")
_AUTOLAB_NAMES = ("weight", "ids", "ops", "ignore_ranges")
NULL_ID = -1  # free(NULL) in the Autolab traces


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
    n_ops, n_ids = int(str(header["ops"])), int(str(header["ids"]))
    requests = lines[4:]
    if header["flavour"] == "autolab" and len(requests) > n_ops:
        # The Autolab driver's read_trace stops after num_ops requests ("if (op_index ==
        # trace->num_ops) break;"): what follows is not part of the trace. CS:APP's reads to
        # the end and asserts the count, as the check below does.
        header["lines_after_requests"] = len(requests) - n_ops
        requests = requests[:n_ops]
    if len(requests) != n_ops:
        raise TraceError(f"the header says {n_ops} requests but the file has "
                         f"{len(requests)}", source=source)
    op: list[int] = []
    ids: list[int] = []
    size: list[int] = []
    live: dict[int, int] = {}
    null_frees = 0
    for event, (number, line) in enumerate(requests):
        try:
            kind, block, nbytes = _request(line, n_ids)
        except ValueError as err:
            raise TraceError(f"line {number}: {err}", source=source, event=event) from None
        if kind == "f" and block == NULL_ID:
            null_frees += 1  # free(NULL): nothing happens
            continue
        if kind in "rf" and block in live:
            op.append(OP_FREE)
            ids.append(block)
            size.append(live.pop(block))
        elif kind == "f":
            op.append(OP_FREE)  # free of a block that is not live: lenient load drops it
            ids.append(block)
            size.append(SIZE_UNKNOWN)
        if kind == "a" or (kind == "r" and nbytes > 0):
            op.append(OP_ALLOC)
            ids.append(block)
            size.append(nbytes)
            live[block] = nbytes
    meta = file_metadata({}, source, name)
    meta.update(format=FORMAT_NAME, synthetic_times=True, malloclab=header)
    if null_frees:
        meta["null_frees"] = null_frees
    n = len(op)
    return Trace.from_columns(np.arange(n, dtype=np.int64) * STEP_NS, op, ids, size, **meta)


def _header(lines: list[tuple[int, str]], source: str) -> dict[str, object]:
    if len(lines) < 4:
        raise TraceError("a malloc-lab trace starts with 4 header lines (heap size, ids, "
                         "requests, weight)", source=source)
    numbers: list[int] = []
    for (number, line), key in zip(lines, _HEADER_NAMES):
        first = line.split()[0]
        try:
            numbers.append(int(first))
        except ValueError:
            raise TraceError(f"line {number}: header value {key} {first!r} is not an "
                             "integer", source=source) from None
    # Autolab's driver reads weight and ignore_ranges (each 0 or 1) first and last; CS:APP's
    # a suggested heap size (thousands of bytes) and a weight.
    autolab = numbers[0] in (0, 1) and numbers[3] in (0, 1)
    names = _AUTOLAB_NAMES if autolab else _HEADER_NAMES
    values: dict[str, object] = {"flavour": "autolab" if autolab else "cs:app"}
    values.update(zip(names, numbers))
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
    for number in numbers:
        problem = int64_problem(number)
        if problem:
            raise ValueError(problem)
    block = numbers[0]
    if kind == "f" and block == NULL_ID:
        return kind, block, 0
    if not 0 <= block < n_ids:
        raise ValueError(f"id {block} is outside 0..{n_ids - 1} (the header says {n_ids} ids)")
    nbytes = numbers[1] if kind != "f" else 0
    if nbytes < 0:
        raise ValueError(f"negative size {nbytes}")
    return kind, block, nbytes


register_format(FORMAT_NAME, (".rep", ".rep.gz"), read_malloclab, detect=detect_malloclab,
                recorded=True)
