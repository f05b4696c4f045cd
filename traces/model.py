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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(eq=False)
class Trace:
    """An allocation trace: one row per alloc/free event. See the module docstring for columns.

    ``metadata`` holds at least ``name`` and ``source`` (where the trace came from); importers
    may add ``device`` and anything else JSON-serialisable. ``tags`` is the interned string
    table that the ``tag`` column indexes.
    """

    time_ns: np.ndarray
    op: np.ndarray
    id: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    process: np.ndarray
    tag: np.ndarray
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.time_ns)
        for name, dtype in COLUMN_DTYPES.items():
            column: np.ndarray = np.ascontiguousarray(getattr(self, name), dtype=dtype)
            if column.ndim != 1 or len(column) != n:
                raise TraceError(f"column {name!r} has {len(column)} rows, expected {n}")
            setattr(self, name, column)
        self.metadata.setdefault("name", "trace")
        self.metadata.setdefault("source", "memory")

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
        return cls(
            time_ns=np.asarray(time_ns),
            op=np.asarray(op),
            id=np.asarray(id),
            size=np.asarray(size),
            stream=zeros if stream is None else np.asarray(stream),
            process=zeros.copy() if process is None else np.asarray(process),
            tag=np.full(n, NO_TAG, dtype=np.int32) if tag is None else np.asarray(tag),
            tags=list(tags or []),
            metadata=dict(metadata),
        )

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
        return len(self.time_ns)

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", "trace"))

    @property
    def n_allocs(self) -> int:
        return int(np.count_nonzero(self.op == OP_ALLOC))

    @property
    def n_frees(self) -> int:
        return len(self) - self.n_allocs

    @property
    def duration_ns(self) -> int:
        return int(self.time_ns[-1] - self.time_ns[0]) if len(self) else 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns (the in-memory cost of the trace)."""
        return sum(getattr(self, name).nbytes for name in COLUMN_DTYPES)

    def processes(self) -> list[int]:
        return sorted(int(p) for p in np.unique(self.process))

    def streams(self) -> list[int]:
        return sorted(int(s) for s in np.unique(self.stream))

    def tag_name(self, tag: int) -> str | None:
        return self.tags[tag] if 0 <= tag < len(self.tags) else None

    # ------------------------------------------------------------------ derived columns
    def matched_sizes(self) -> np.ndarray:
        """Requested size of the buffer each event is about, frees included.

        A free's size is taken from its matching alloc (the previous event with the same id),
        so this is right even where the source left free sizes unknown. Frees with no earlier
        alloc of their id get 0. Vectorised: stable sort by id, then look one row back.
        When every size is already known the ``size`` column itself is returned (no copy:
        treat it as read-only).
        """
        if not len(self) or int(self.size.min()) >= 0:
            return self.size
        sizes = self.size.copy()
        order = np.argsort(self.id, kind="stable")
        sorted_ids = self.id[order]
        sorted_ops = self.op[order]
        sorted_sizes = self.size[order]
        is_free = sorted_ops == OP_FREE
        prev_same = np.zeros(len(order), dtype=bool)
        prev_same[1:] = (sorted_ids[1:] == sorted_ids[:-1]) & (sorted_ops[:-1] == OP_ALLOC)
        resolved = np.where(is_free, 0, sorted_sizes)
        matched = is_free & prev_same
        resolved[1:][matched[1:]] = sorted_sizes[:-1][matched[1:]]
        sizes[order] = resolved
        return sizes

    def live_bytes(self) -> np.ndarray:
        """Live requested bytes after each event (int64), assuming a valid trace."""
        sizes = self.matched_sizes()
        signed = np.where(self.op == OP_ALLOC, sizes, -sizes)
        return np.cumsum(signed, dtype=np.int64)

    def peak_live(self) -> tuple[int, int]:
        """``(peak live bytes, index of the event after which it is first reached)``."""
        if not len(self):
            return 0, -1
        live = self.live_bytes()
        index = int(np.argmax(live))
        return int(live[index]), index

    # ------------------------------------------------------------------ selection
    def select(self, mask: np.ndarray, **metadata: Any) -> Trace:
        """The events where ``mask`` is true, as a new trace (tags table shared)."""
        meta = dict(self.metadata)
        meta.update(metadata)
        return Trace(
            **{name: getattr(self, name)[mask] for name in COLUMN_DTYPES},
            tags=list(self.tags),
            metadata=meta,
        )

    def for_process(self, process: int) -> Trace:
        return self.select(self.process == process, name=f"{self.name}[process {process}]")

    def equals(self, other: Trace, *, metadata: bool = True) -> bool:
        """Column-by-column equality (and tags/metadata unless told otherwise)."""
        same = all(np.array_equal(getattr(self, c), getattr(other, c)) for c in COLUMN_DTYPES)
        same = same and self.tags == other.tags
        return same and (not metadata or self.metadata == other.metadata)

    def __repr__(self) -> str:
        return (f"Trace(name={self.name!r}, events={len(self)}, allocs={self.n_allocs}, "
                f"processes={len(self.processes())}, streams={len(self.streams())})")
