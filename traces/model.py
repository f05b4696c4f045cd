"""The one in-memory allocation trace: columnar numpy arrays plus metadata.

Every importer, generator and exporter converts to and from :class:`Trace`, so N formats and
M policies cost N + M code. The columns are plain numpy arrays (about 37 bytes per event) so a
10-million-event trace fits in well under 1 GB and whole-trace questions (live bytes over time,
size histograms) are vectorised instead of looped.

Columns, one row per event, in the order the program issued them:

============  =======  ==============================================================
column        dtype    meaning
============  =======  ==============================================================
``time_ns``   int64    when the event happened, nanoseconds from the trace's start
``op``        int8     :data:`OP_ALLOC` (0) or :data:`OP_FREE` (1)
``id``        int64    the buffer this event is about; an alloc opens it, a free closes
                       it, and the id may be reused after its free
``size``      int64    requested bytes; on a free the freed buffer's size, or
                       :data:`SIZE_UNKNOWN` (-1) when the source did not say
``stream``    int32    stream the buffer was allocated on (small ids, not raw handles)
``process``   int32    which process (program) issued the event
``tag``       int32    index into :attr:`Trace.tags` (call site / op), or :data:`NO_TAG`
============  =======  ==============================================================

How a column is held (issue 17.4, memory per event): read as an attribute (``trace.size``) a
column is always a writable array of the dtype above, the same array on every read. A trace
built from arrays it owns — a loaded ``.npz`` (:meth:`Trace.from_owned_columns`), the
defaulted columns of :meth:`Trace.from_columns`, a :meth:`Trace.select` — may hold a column
*packed* until then: a column with one value throughout as that number (no memory), any other
in the narrowest integer type that holds its values (a tag column of int8, ids and sizes of
int32 where they fit). The first attribute read unpacks it at its dtype for good, so every
writer (``trace.tag[:] = ...``) works as before. Whole-trace work that only reads — the
replay engine, validation, the summaries here — goes through :meth:`Trace.column`, which
hands out the held values read-only without unpacking them: a 10M-event training trace is
then ~18 bytes/event instead of 37. Files keep the dtypes above.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, overload

import numpy as np

from allocsim.errors import UserInputError

OP_ALLOC = 0
OP_FREE = 1
OP_NAMES = {OP_ALLOC: "alloc", OP_FREE: "free"}
OP_CODES = {"alloc": OP_ALLOC, "free": OP_FREE}
SIZE_UNKNOWN = -1
# The columns are int64: a number a format writes outside this range cannot be held, and an
# importer refuses it by name (file, event, field) rather than overflow or wrap.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def int64_problem(value: int) -> str | None:
    """Why ``value`` cannot be a trace number, or None when it can."""
    if not INT64_MIN <= value <= INT64_MAX:
        shown = str(value) if len(str(value)) <= 24 else f"{float(value):.3e}"
        return f"{shown} does not fit in 64 bits"
    return None
NO_TAG = -1

COLUMN_DTYPES: dict[str, type] = {
    "time_ns": np.int64,
    "op": np.int8,
    "id": np.int64,
    "size": np.int64,
    "stream": np.int32,
    "process": np.int32,
    "tag": np.int32,
}


class TraceError(UserInputError):
    """A trace is malformed. ``str(err)`` is one line naming the file, the event and the problem."""

    def __init__(self, problem: str, *, source: str | None = None, event: int | None = None):
        self.problem = problem
        self.source = source
        self.event = event
        super().__init__(self.format())

    def format(self) -> str:
        where = self.source or "<trace>"
        if self.event is not None:
            where += f": event {self.event}"
        return f"{where}: {self.problem}"

    def located(self, source: str) -> TraceError:
        """The same error, naming ``source`` as the file it came from."""
        return TraceError(self.problem, source=source, event=self.event)


# What a column may be held as besides its own dtype: narrower signed integer types (tried in
# this order), or one Python int for a column with a single value (``Held``).
_NARROW_DTYPES = (np.int8, np.int16, np.int32)
Held = np.ndarray | int
# Events per block of the whole-trace reductions below (live bytes' peak): bounds temporaries.
_BLOCK_EVENTS = 1 << 16


def pack_column(values: np.ndarray, dtype: type, *, copy: bool = True) -> Held:
    """``values`` (integers that fit ``dtype``) held in the least memory: one int when every
    value is the same, else the narrowest of int8/int16/int32 narrower than ``dtype`` that holds
    them, else ``dtype`` itself (the array itself when it already is of ``dtype``). Without
    ``copy``, an array already of the narrow dtype is held as it is (an owner's array)."""
    values = np.asarray(values)
    if values.ndim == 1 and len(values):
        lo, hi = int(values.min()), int(values.max())
        held = packed_dtype(lo, hi, dtype)
        if held is None:
            return lo
        if held is not dtype:
            return values.astype(held, copy=copy)
    return np.ascontiguousarray(values, dtype=dtype)


def packed_dtype(lo: int, hi: int, dtype: type) -> type | None:
    """The dtype :func:`pack_column` holds a column of values from ``lo`` to ``hi`` in: None
    for one value (held as an int), else the narrowest of int8/int16/int32 narrower than
    ``dtype`` that holds them, else ``dtype``. (A reader that streams a column reads its
    range first, then fills an array of this dtype.)"""
    if lo == hi:
        return None
    width = np.dtype(dtype).itemsize
    for narrow in _NARROW_DTYPES:
        info = np.iinfo(narrow)
        if info.bits // 8 >= width:
            break
        if info.min <= lo and hi <= info.max:
            return narrow
    return dtype


def _unpack(held: Held, dtype: type, n: int) -> np.ndarray:
    """The column held as ``held`` as a fresh array of ``dtype``."""
    if isinstance(held, np.ndarray):
        return held.astype(dtype)
    return np.full(n, held, dtype=dtype)


class _Column:
    """A column attribute of :class:`Trace`: reading it unpacks a packed column, for good."""

    name: str
    dtype: type

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.dtype = COLUMN_DTYPES[name]

    @overload
    def __get__(self, trace: None, owner: type | None = None) -> _Column: ...
    @overload
    def __get__(self, trace: Trace, owner: type | None = None) -> np.ndarray: ...
    def __get__(self, trace: Trace | None, owner: type | None = None) -> _Column | np.ndarray:
        if trace is None:
            return self
        held = trace._held[self.name]
        if isinstance(held, np.ndarray) and held.dtype == self.dtype:
            return held
        full = _unpack(held, self.dtype, len(trace))
        trace._held[self.name] = full
        return full

    def __set__(self, trace: Trace, value: np.ndarray) -> None:
        trace._held[self.name] = np.asarray(value)
        if self.name == "time_ns":
            trace._n = len(value)


class Trace:
    """An allocation trace: one row per alloc/free event. See the module docstring for columns
    and how they are held.

    ``metadata`` holds at least ``name`` and ``source`` (where the trace came from); importers
    may add ``device`` and anything else JSON-serialisable. ``tags`` is the interned string
    table that the ``tag`` column indexes.
    """

    time_ns = _Column()
    op = _Column()
    id = _Column()
    size = _Column()
    stream = _Column()
    process = _Column()
    tag = _Column()

    def __init__(self, time_ns: Any, op: Any, id: Any, size: Any, stream: Any, process: Any,
                 tag: Any, tags: list[str] | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        given = {"time_ns": time_ns, "op": op, "id": id, "size": size, "stream": stream,
                 "process": process, "tag": tag}
        n = len(time_ns)
        self._n = n
        self._held: dict[str, Held] = {}
        for name, dtype in COLUMN_DTYPES.items():
            column: np.ndarray = np.ascontiguousarray(given[name], dtype=dtype)
            if column.ndim != 1 or len(column) != n:
                raise TraceError(f"column {name!r} has {len(column)} rows, expected {n}")
            self._held[name] = column
        self.tags: list[str] = [] if tags is None else tags
        self.metadata: dict[str, Any] = {} if metadata is None else metadata
        self.metadata.setdefault("name", "trace")
        self.metadata.setdefault("source", "memory")

    @classmethod
    def from_owned_columns(cls, columns: Mapping[str, np.ndarray | int], n: int, *,
                           tags: list[str] | None = None,
                           metadata: dict[str, Any] | None = None) -> Trace:
        """A trace of ``n`` events that takes ``columns`` over and holds each packed (module
        docstring): integer arrays whose values fit the column's dtype, of any integer dtype,
        or an int for a column of one value. Absent stream and process are 0, tag
        :data:`NO_TAG`. Only for arrays nobody else holds or writes (a reader's own)."""
        trace = cls.__new__(cls)
        trace._n = n
        trace._held = {}
        defaults = {"stream": 0, "process": 0, "tag": NO_TAG}
        for name, dtype in COLUMN_DTYPES.items():
            values = columns.get(name, defaults.get(name))
            if values is None:
                raise TraceError(f"column {name!r} is missing")
            if isinstance(values, (int, np.integer)):
                held: Held = int(values) if n else np.zeros(0, dtype=dtype)
            else:
                values = np.asarray(values)
                if values.ndim != 1 or len(values) != n:
                    raise TraceError(f"column {name!r} has {len(values)} rows, expected {n}")
                # The caller's own arrays: one already packed is held as it is, not copied
                # (a copy of each would double the trace while `columns` holds them all).
                held = pack_column(values, dtype, copy=False)
            trace._held[name] = held
        trace.tags = [] if tags is None else tags
        trace.metadata = {} if metadata is None else metadata
        trace.metadata.setdefault("name", "trace")
        trace.metadata.setdefault("source", "memory")
        return trace

    def __copy__(self) -> Trace:
        other = type(self).__new__(type(self))
        other.__dict__.update(self.__dict__)
        other._held = dict(self._held)
        return other

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "_held" not in state:        # pickled when the columns were plain attributes
            state = dict(state)
            state["_held"] = {name: state.pop(name) for name in COLUMN_DTYPES}
            state["_n"] = len(state["_held"]["time_ns"])
        self.__dict__.update(state)

    def column(self, name: str) -> np.ndarray:
        """Column ``name`` as held, read-only, without unpacking it: its values, but in a
        narrower integer dtype where the trace holds it packed, and a broadcast view (no
        memory) for a column of one value. For whole-trace work that only reads; do
        arithmetic that could overflow the held dtype at the column's own dtype."""
        held = self._held[name]
        if isinstance(held, np.ndarray):
            view = held.view()
            view.flags.writeable = False
            return view
        return np.broadcast_to(np.asarray(held, dtype=COLUMN_DTYPES[name]), (self._n,))

    def _distinct(self, name: str) -> list[int]:
        held = self._held[name]
        if isinstance(held, np.ndarray):
            return sorted(int(v) for v in np.unique(held))
        return [held] if self._n else []

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_columns(
        cls,
        time_ns: Sequence[int] | np.ndarray,
        op: Sequence[int] | np.ndarray,
        id: Sequence[int] | np.ndarray,
        size: Sequence[int] | np.ndarray,
        stream: Sequence[int] | np.ndarray | None = None,
        process: Sequence[int] | np.ndarray | None = None,
        tag: Sequence[int] | np.ndarray | None = None,
        tags: list[str] | None = None,
        **metadata: Any,
    ) -> Trace:
        """Build a trace from columns; absent stream/process default to 0, tag to NO_TAG."""
        n = len(time_ns)
        zeros = np.zeros(n, dtype=np.int32)
        trace = cls(
            time_ns=np.asarray(time_ns),
            op=np.asarray(op),
            id=np.asarray(id),
            size=np.asarray(size),
            stream=zeros if stream is None else np.asarray(stream),
            process=zeros if process is None else np.asarray(process),
            tag=zeros if tag is None else np.asarray(tag),
            tags=list(tags or []),
            metadata=dict(metadata),
        )
        # The defaulted columns are the trace's own: held as one value until read.
        for name, value, absent in (("stream", 0, stream), ("process", 0, process),
                                    ("tag", NO_TAG, tag)):
            if absent is None and n:
                trace._held[name] = value
        return trace

    @classmethod
    def from_events(cls, events: Iterable[tuple], **metadata: Any) -> Trace:
        """Build a small trace from tuples
        ``(time_ns, "alloc"|"free", id, size[, stream[, process]])``.

        Meant for tests and examples; importers of large files build columns directly.
        """
        rows = [tuple(e) for e in events]
        columns: list[list[int]] = [[], [], [], [], [], []]
        for index, row in enumerate(rows):
            if len(row) < 4:
                raise TraceError("an event needs time_ns, op, id and size", event=index)
            op = OP_CODES.get(row[1]) if isinstance(row[1], str) else int(row[1])
            if op not in OP_NAMES:
                raise TraceError(f"unknown op {row[1]!r} (expected alloc or free)", event=index)
            size = SIZE_UNKNOWN if row[3] is None else int(row[3])
            values = [int(row[0]), op, int(row[2]), size,
                      int(row[4]) if len(row) > 4 else 0, int(row[5]) if len(row) > 5 else 0]
            for column, value in zip(columns, values):
                column.append(value)
        times, ops, ids, sizes, streams, processes = columns
        return cls.from_columns(times, ops, ids, sizes, streams, processes, **metadata)

    @classmethod
    def empty(cls, **metadata: Any) -> Trace:
        return cls.from_columns([], [], [], [], **metadata)

    # ------------------------------------------------------------------ basic facts
    def __len__(self) -> int:
        return self._n

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", "trace"))

    @property
    def n_allocs(self) -> int:
        # OP_ALLOC is 0: the allocs are the events whose op is not nonzero (no temporary).
        held = self._held["op"]
        if not isinstance(held, np.ndarray):
            return len(self) if held == OP_ALLOC else 0
        return len(self) - int(np.count_nonzero(held))

    @property
    def n_frees(self) -> int:
        return len(self) - self.n_allocs

    @property
    def duration_ns(self) -> int:
        if not len(self):
            return 0
        time_ns = self.column("time_ns")
        return int(np.int64(time_ns[-1]) - np.int64(time_ns[0]))

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns (the in-memory cost of the trace; packed columns count
        what they hold)."""
        return sum(held.nbytes for held in self._held.values() if isinstance(held, np.ndarray))

    def processes(self) -> list[int]:
        return self._distinct("process")

    def streams(self) -> list[int]:
        return self._distinct("stream")

    def tag_name(self, tag: int) -> str | None:
        return self.tags[tag] if 0 <= tag < len(self.tags) else None

    # ------------------------------------------------------------------ derived columns
    def matched_sizes(self, *, packed: bool = False) -> np.ndarray:
        """Requested size of the buffer each event is about, frees included.

        A free's size is taken from its matching alloc (the previous event with the same id),
        so this is right even where the source left free sizes unknown. Frees with no earlier
        alloc of their id get 0. Vectorised: stable sort by id, then look one row back.
        When every size is already known the ``size`` column itself is returned (no copy:
        treat it as read-only). int64; with ``packed``, in the dtype the size column is held
        in (narrower where it fits, read-only when it is the column; what the replay engine
        keeps), the size column never unpacked.
        """
        size = self.column("size")
        if not len(self) or int(size.min()) >= 0:
            return size if packed else self.size
        sizes = self._matched(size)
        return sizes if packed else sizes.astype(np.int64, copy=False)

    def _matched(self, size: np.ndarray) -> np.ndarray:
        """:meth:`matched_sizes` where some size is unknown, in ``size``'s dtype; each
        temporary dropped as soon as it is used (the sort order, 8 bytes/event, is the
        largest)."""
        ids, ops = self.column("id"), self.column("op")
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        sorted_ops = ops[order]
        prev_same = np.zeros(len(order), dtype=bool)
        prev_same[1:] = (sorted_ids[1:] == sorted_ids[:-1]) & (sorted_ops[:-1] == OP_ALLOC)
        del sorted_ids
        matched = sorted_ops == OP_FREE
        del sorted_ops
        sorted_sizes = size[order]
        resolved = np.where(matched, 0, sorted_sizes).astype(sorted_sizes.dtype, copy=False)
        matched &= prev_same
        del prev_same
        resolved[1:][matched[1:]] = sorted_sizes[:-1][matched[1:]]
        del sorted_sizes, matched
        sizes = np.empty(len(order), dtype=resolved.dtype)
        sizes[order] = resolved
        return sizes

    def live_bytes(self) -> np.ndarray:
        """Live requested bytes after each event (int64), assuming a valid trace."""
        sizes = self.matched_sizes(packed=True).astype(np.int64, copy=False)
        signed = np.where(self.column("op") == OP_ALLOC, sizes, -sizes)
        return np.cumsum(signed, dtype=np.int64)

    def peak_live(self) -> tuple[int, int]:
        """``(peak live bytes, index of the event after which it is first reached)``.
        Computed block by block: the temporaries stay a few MB whatever the length."""
        if not len(self):
            return 0, -1
        sizes, ops = self.matched_sizes(packed=True), self.column("op")
        running, peak, at = 0, None, -1
        for lo in range(0, len(self), _BLOCK_EVENTS):
            block = sizes[lo:lo + _BLOCK_EVENTS].astype(np.int64)
            signed = np.where(ops[lo:lo + _BLOCK_EVENTS] == OP_ALLOC, block, -block)
            live = np.cumsum(signed, dtype=np.int64) + np.int64(running)
            index = int(np.argmax(live))
            if peak is None or int(live[index]) > peak:
                peak, at = int(live[index]), lo + index
            running = int(live[-1])
        assert peak is not None
        return peak, at

    # ------------------------------------------------------------------ selection
    def select(self, mask: np.ndarray, **metadata: Any) -> Trace:
        """The events where ``mask`` is true, as a new trace (tags table shared)."""
        meta = dict(self.metadata)
        meta.update(metadata)
        # Fresh arrays (a mask or an index array copies), the new trace's own: held packed.
        columns = {name: self.column(name)[mask] for name in COLUMN_DTYPES}
        return Trace.from_owned_columns(columns, len(columns["time_ns"]), tags=list(self.tags),
                                        metadata=meta)

    def for_process(self, process: int) -> Trace:
        return self.select(self.column("process") == process,
                           name=f"{self.name}[process {process}]")

    def equals(self, other: Trace, *, metadata: bool = True) -> bool:
        """Column-by-column equality (and tags/metadata unless told otherwise)."""
        same = len(self) == len(other) and all(
            np.array_equal(self.column(c), other.column(c)) for c in COLUMN_DTYPES)
        same = same and self.tags == other.tags
        return same and (not metadata or self.metadata == other.metadata)

    def __repr__(self) -> str:
        return (f"Trace(name={self.name!r}, events={len(self)}, allocs={self.n_allocs}, "
                f"processes={len(self.processes())}, streams={len(self.streams())})")
