"""Importer for RAPIDS RMM ``logging_resource_adaptor`` CSV logs.

Follows ``shared/reference/trace-formats.md`` ("Other allocator-research formats") and RMM's
own reader (``benchmarks/utilities/log_parser.hpp``, used by ``REPLAY_BENCHMARK``). A log is::

    Thread,Time,Action,Pointer,Size,Stream
    140573312345856,11:21:37:466436,allocate,0x7f8a40000000,1024,0x7f8a38001020
    140573312345856,11:21:37:466502,allocate failure,0x0,1099511627776,0x7f8a38001020
    140573312345856,11:21:37:467001,free,0x7f8a40000000,1024,0x7f8a38001020

- ``Time`` is the logger's clock time ``HH:MM:SS:microseconds`` (also read with a ``.``
  before the microseconds) or a number of seconds (newer docs show seconds since the epoch).
  Clock times that jump back by more than 12 hours crossed midnight and get a day added.
  Times become nanoseconds from the first row. The log's row order is the order RMM replays;
  it is kept, and a row whose time is earlier than the row before it (threads logging out of
  order) gets the previous time (counted in ``metadata["times_clamped"]``).
- ``Action``: ``allocate``, ``free`` (``deallocate`` too); a failed allocation
  (``allocate failure``, or any ``... failure``) is no buffer event: it is kept as a
  ``metadata["reference_events"]`` entry ``{"action": "oom", "size": Size, "stream": s,
  "time_ns": t, "event": i}`` (``i``: the trace event it comes before; the shape of the
  snapshot importer's reference events).
- ``Pointer`` is hex, with or without ``0x``. Addresses are reused: every allocation gets a
  fresh id; a free of an address that is not live opens a prologue buffer at time 0 (see
  :mod:`allocsim.traces.formats.torch_profiler`), and a free whose size differs from its
  allocation's is an error.
- ``Stream`` (any text, normally a hex handle) becomes small ids 0, 1, ... in order of first
  use; ``metadata["stream_handles"]`` maps them back (``{"0": raw handle, ...}``, the handle
  as a number when it is hex). ``Thread`` is only counted (``metadata["threads"]``).

Errors name the file, the row (event, 0-based, counting data rows) and the line.

Note: a plain ``.csv`` name is owned by the native CSV format, which wins for such files;
name RMM logs ``*.rmm.csv`` (or read them with :func:`read_rmm_csv`).
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

import numpy as np

from allocsim.ascii_numbers import is_whole_number
from allocsim.traces.formats.native import file_metadata
from allocsim.traces.formats.native.common import check_line_lengths
from allocsim.traces.formats.registry import register_format
from allocsim.traces.formats.torch_profiler import AddressMatcher, build_trace
from allocsim.traces.model import NO_TAG, OP_ALLOC, OP_FREE, Trace, TraceError, int64_problem

__all__ = ["FORMAT_NAME", "HEADER", "detect_rmm_csv", "parse_time", "read_rmm_csv"]

FORMAT_NAME = "rmm-csv"
HEADER = ("thread", "time", "action", "pointer", "size", "stream")
_DAY_NS = 86_400 * 10**9
_ALLOC_ACTIONS = frozenset({"allocate", "alloc"})
_FREE_ACTIONS = frozenset({"free", "deallocate"})


def detect_rmm_csv(path: str, head: bytes) -> bool:
    """Text whose first content line is the RMM header (any case, spaces allowed)."""
    if b"\x00" in head:
        return False
    for line in head.lstrip(b"\xef\xbb\xbf").split(b"\n"):
        line = line.strip()
        if line and not line.startswith(b"#"):
            return _header_fields(line.decode("utf-8", "replace")) == HEADER
    return False


def _header_fields(line: str) -> tuple[str, ...]:
    return tuple(f.strip().lower() for f in line.split(","))


def parse_time(text: str) -> int:
    """Nanoseconds of an RMM ``Time`` cell: ``HH:MM:SS:ffffff`` (or ``.ffffff``), or seconds.

    Raises ValueError for anything else, and for a time beyond 64-bit nanoseconds.
    """
    return _fits(_parse_time(text), "Time")


def _parse_time(text: str) -> int:
    text = text.strip()
    parts = text.split(":")
    if len(parts) == 4:  # HH:MM:SS:microseconds, the logger's "%H:%M:%S:%f"
        hours, minutes, seconds, micros = (int(p) for p in parts)
        return ((hours * 60 + minutes) * 60 + seconds) * 10**9 + micros * 1000
    if len(parts) == 3:  # HH:MM:SS.fraction
        hours, minutes = int(parts[0]), int(parts[1])
        return (hours * 60 + minutes) * 60 * 10**9 + _seconds_ns(parts[2])
    if len(parts) == 1:
        return _seconds_ns(text)
    raise ValueError(text)


def _seconds_ns(text: str) -> int:
    """Seconds, possibly fractional, as integer nanoseconds without float rounding."""
    whole, _, fraction = text.partition(".")
    if not is_whole_number(whole) or (fraction and not is_whole_number(fraction)):
        raise ValueError(text)
    return int(whole) * 10**9 + int((fraction + "000000000")[:9])


def read_rmm_csv(data: bytes, source: str, name: str) -> Trace:
    """Read an RMM logging adaptor CSV (see the module docstring)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TraceError(f"not UTF-8 text (bad byte at offset {err.start})",
                         source=source) from None
    check_line_lengths(data, source, 0)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header, header_line = _read_header(reader, source)
        columns = {field: header.index(field) for field in HEADER}
        return _Rows(source, name, columns).read(reader, header_line)
    except csv.Error as err:  # a field over the csv module's limit, a stray quote
        raise TraceError(f"line {reader.line_num}: unreadable CSV: {err}",
                         source=source) from None


def _read_header(reader: Any, source: str) -> tuple[tuple[str, ...], int]:
    for row in reader:
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        fields = tuple(f.strip().lower() for f in row)
        if set(HEADER) - set(fields):
            raise TraceError(f"line {reader.line_num}: expected the RMM header "
                             f"Thread,Time,Action,Pointer,Size,Stream, found {','.join(row)!r}",
                             source=source)
        return fields, reader.line_num
    raise TraceError("empty file: no RMM header Thread,Time,Action,Pointer,Size,Stream",
                     source=source)


class _Rows:
    """Turns the data rows into trace columns."""

    def __init__(self, source: str, name: str, columns: dict[str, int]):
        self.source, self.name, self.col = source, name, columns
        self.width = max(columns.values()) + 1
        self.matcher = AddressMatcher()
        self.streams: dict[str, int] = {}
        self.threads: set[str] = set()
        self.out: dict[str, list[int]] = {k: [] for k in ("time_ns", "op", "id", "size",
                                                          "stream")}
        self.reference: list[dict[str, Any]] = []
        self.clamped = 0
        self.last_ns: int | None = None
        self.first_ns: int | None = None
        self.day_ns = 0

    def read(self, reader: Any, header_line: int) -> Trace:
        event = -1
        for row in reader:
            if not row or not "".join(row).strip():
                continue
            event += 1
            try:
                self.row(row, event)
            except ValueError as err:
                raise TraceError(f"line {reader.line_num}: {err}", source=self.source,
                                 event=event) from None
        return self.finish()

    def cell(self, row: list[str], field: str) -> str:
        return row[self.col[field]].strip()

    def row(self, row: list[str], event: int) -> None:
        if len(row) < self.width:
            raise ValueError(f"expected {self.width} fields, found {len(row)}")
        action = self.cell(row, "action").lower()
        size = _int(self.cell(row, "size"), "Size")
        self.threads.add(self.cell(row, "thread"))
        time_ns = self.time(self.cell(row, "time"))
        stream_text = self.cell(row, "stream").lower()
        stream = self.streams.setdefault(stream_text, len(self.streams))
        if action.endswith("failure"):
            self.reference.append({"action": "oom", "size": size, "stream": stream,
                                   "time_ns": time_ns, "event": len(self.out["op"])})
            return
        pointer = _hex(self.cell(row, "pointer"))
        if action in _ALLOC_ACTIONS:
            self.add(time_ns, OP_ALLOC, self.matcher.alloc(pointer, size, event), size, stream)
        elif action in _FREE_ACTIONS:
            buffer_id, alloc_size, alloc_event = self.matcher.free(pointer, size, stream=stream,
                                                                       event=event)
            if alloc_size != size:
                raise ValueError(f"free of {size} bytes at {pointer:#x}, which was allocated "
                                 f"with {alloc_size} bytes at event {alloc_event}")
            self.add(time_ns, OP_FREE, buffer_id, size, stream)
        else:
            raise ValueError(f"action {action!r} is not allocate, free or allocate failure")

    def time(self, text: str) -> int:
        try:
            ns = parse_time(text) + self.day_ns
        except ValueError:
            raise ValueError(f"Time {text!r} is not HH:MM:SS:microseconds or seconds") from None
        if self.last_ns is not None and ns < self.last_ns:
            if ":" in text and self.last_ns - ns > _DAY_NS // 2:
                self.day_ns += _DAY_NS  # the clock went past midnight
                ns += _DAY_NS
            else:
                self.clamped += 1  # keep log order; time may not go backwards
                ns = self.last_ns
        self.last_ns = ns
        if self.first_ns is None:
            self.first_ns = ns
        return ns

    def add(self, time_ns: int, op: int, buffer_id: int, size: int, stream: int) -> None:
        for key, value in (("time_ns", time_ns), ("op", op), ("id", buffer_id),
                           ("size", size), ("stream", stream)):
            self.out[key].append(value)

    def finish(self) -> Trace:
        out = self.out
        t0 = self.first_ns or 0
        times = np.asarray(out["time_ns"], dtype=np.int64) - t0
        meta = file_metadata({}, self.source, self.name)
        meta.update(format=FORMAT_NAME, threads=len(self.threads),
                    stream_handles={str(k): _handle(h) for h, k in self.streams.items()})
        n_pro = len(self.matcher.prologue)
        for ref in self.reference:
            ref["event"] += n_pro
            ref["time_ns"] -= t0
        if self.reference:
            meta["reference_events"] = self.reference
        meta["failed_allocations"] = len(self.reference)
        if self.clamped:
            meta["times_clamped"] = self.clamped
        n = len(times)
        return build_trace(self.matcher, time_ns=times, op=out["op"], ids=out["id"],
                           size=out["size"], stream=out["stream"],
                           process=np.zeros(n, dtype=np.int32),
                           tag=np.full(n, NO_TAG, dtype=np.int32), tags=[], metadata=meta,
                           unknown_frees_are_anomalies=True)


def _int(text: str, field: str) -> int:
    if not is_whole_number(text):
        raise ValueError(f"{field} {text!r} is not a non-negative integer")
    return _fits(int(text), field)


def _fits(value: int, field: str) -> int:
    problem = int64_problem(value)
    if problem:
        raise ValueError(f"{field} {problem}")
    return value


def _handle(text: str) -> int | str:
    """A stream handle as a number where it is hex (as RMM writes it), else the text."""
    try:
        return int(text, 16)
    except ValueError:
        return text


# What RMM writes for a pointer (``0x7f...``, or bare hex digits): int(text, 16) alone would
# also take a sign and underscores ("-0x10", "0x_10"), which no address has.
_HEX_ADDRESS = re.compile(r"\s*(?:0[xX])?[0-9a-fA-F]+\s*")


def _hex(text: str) -> int:
    if not _HEX_ADDRESS.fullmatch(text):
        raise ValueError(f"Pointer {text!r} is not a hex address")
    return _fits(int(text, 16), "Pointer")


register_format(FORMAT_NAME, (".rmm.csv", ".rmm.csv.gz"), read_rmm_csv, detect=detect_rmm_csv,
                recorded=True)
