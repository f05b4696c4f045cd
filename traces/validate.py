"""Checking a trace before anything replays it: strict for made traces, lenient for recorded ones.

A trace is *valid* when every event has a known op, sizes are non-negative (a free may say
:data:`~allocsim.traces.model.SIZE_UNKNOWN`), time never goes backwards, every free closes a live
buffer of its id, no alloc reopens an id that is still live, and a free that states its size
states the size its alloc asked for. Buffers never freed are *leaks*: legal, they stay live to
the end, and the report counts them.

Two modes:

* ``strict=True`` (default): the first problem, by event index, raises :class:`TraceError`
  (``"FILE: event N: problem"``). The trace comes back unchanged.
* ``strict=False`` (lenient, for recorded traces, which often start mid-run): what can be
  repaired without changing a recorded number is repaired, on a *new* trace, and counted:

  - a free of an id that is not live is dropped (its alloc happened before recording began);
  - an alloc of an id that is still live keeps the earlier buffer live, as a leak, under a
    fresh unused id, so the live bytes stay what the recorded events imply;
  - a free of unknown size gets its alloc's size (filling in, not changing, a number).

  Everything else (unknown op, negative size, alloc of unknown size, time going backwards, a
  free whose stated size differs from its alloc's) is still an error: repairing it would mean
  inventing numbers.

Speed: the column checks are vectorised, and id matching is a stable sort by id after which,
per id, events must alternate alloc, free, alloc, ... . In sort order the first break of that
alternation within an id is exactly the first problem a sequential replay would meet for that
id, so the smallest event index over all breaks is the trace's first id problem; no Python
loop runs over a valid trace. Lenient mode falls back to one tight loop only when there is
something to repair other than free sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from allocsim.traces.model import COLUMN_DTYPES, OP_ALLOC, OP_FREE, SIZE_UNKNOWN, Trace, TraceError

__all__ = ["ValidationReport", "validate"]


@dataclass
class ValidationReport:
    """What :func:`validate` found. Event counts describe the trace it returned (after repairs)."""

    events: int = 0
    allocs: int = 0
    frees: int = 0
    leaks: int = 0  # buffers still live at the end (renamed duplicate allocs included)
    leaked_bytes: int = 0  # requested bytes those buffers hold
    unmatched_frees_dropped: int = 0
    duplicate_allocs_renamed: int = 0
    free_sizes_filled: int = 0
    unknown_actions_dropped: int = 0  # importer-side: snapshot entries of an unknown action
    # importer-side, logs that name buffers by address: frees of addresses never allocated
    # (opened as buffers live from the start) and allocs at a live address (the old one leaks)
    unknown_address_frees_opened: int = 0
    live_address_allocs_kept: int = 0
    # importer-side, CuPy logs: a free hook whose mem_size is not its malloc's (the malloc's
    # size is kept)
    free_size_mismatches_kept: int = 0
    strict: bool = True

    def repairs(self) -> dict[str, int]:
        """The repair counts that are nonzero, by field name."""
        counts = {
            "unmatched_frees_dropped": self.unmatched_frees_dropped,
            "duplicate_allocs_renamed": self.duplicate_allocs_renamed,
            "free_sizes_filled": self.free_sizes_filled,
            "unknown_actions_dropped": self.unknown_actions_dropped,
            "unknown_address_frees_opened": self.unknown_address_frees_opened,
            "live_address_allocs_kept": self.live_address_allocs_kept,
            "free_size_mismatches_kept": self.free_size_mismatches_kept,
        }
        return {name: count for name, count in counts.items() if count}

    def summary(self) -> str:
        """One line: event counts, leaks, and the repairs made (if any)."""
        mode = "strict" if self.strict else "lenient"
        text = (f"{self.events} events ({self.allocs} allocs, {self.frees} frees), "
                f"{self.leaks} leaks holding {self.leaked_bytes} bytes")
        repairs = self.repairs()
        if repairs:
            text += "; repairs: " + ", ".join(
                f"{count} {name.replace('_', ' ')}" for name, count in repairs.items())
        else:
            text += "; no repairs"
        return f"{text} ({mode})"


class _Problem(Exception):
    """An invalid event found while matching ids (internal; becomes a TraceError)."""

    def __init__(self, event: int, problem: str):
        super().__init__(problem)
        self.event = event
        self.problem = problem


def validate(trace: Trace, *, strict: bool = True,
             source: str | None = None) -> tuple[Trace, ValidationReport]:
    """Check ``trace``; in lenient mode also repair it. Returns ``(trace, report)``.

    Raises :class:`TraceError` naming ``source`` (default: the trace's ``metadata['source']``)
    and the event index of the first problem. The input is never modified: a repaired trace
    is a new :class:`Trace` (metadata and tags copied); when nothing needed repair the very
    same object comes back.

    Cost: O(n log n) vectorised (one stable argsort of the ids) for a valid trace.
    """
    where = source or str(trace.metadata.get("source", "<trace>"))
    # The columns as held (packed ones stay packed: a loaded trace is checked at ~18 bytes/
    # event plus the sort); a repair below reads the columns themselves.
    op, ids, size = trace.column("op"), trace.column("id"), trace.column("size")

    # Column problems (op, size, time), vectorised. Id matching only needs to look at the
    # events before the first of them: a later id problem can never be the first problem.
    limit, column_problem = _first_column_problem(trace)

    order = np.argsort(ids[:limit], kind="stable")
    s_ids, s_ops, s_size = ids[:limit][order], op[:limit][order], size[:limit][order]
    same = s_ids[1:] == s_ids[:-1]  # sorted row j+1 has the same id as row j
    # A break: a free opening an id's sequence, or two equal ops in a row for one id.
    breaks = np.empty(limit, dtype=bool)
    if limit:
        breaks[0] = s_ops[0] == OP_FREE
        breaks[1:] = np.where(same, s_ops[1:] == s_ops[:-1], s_ops[1:] == OP_FREE)
    # A free right after its alloc (the normal pair); its stated size must match.
    paired = np.zeros(limit, dtype=bool)
    if limit:
        paired[1:] = same & (s_ops[1:] == OP_FREE) & (s_ops[:-1] == OP_ALLOC)
    mismatched = paired.copy()
    if limit:
        mismatched[1:] &= (s_size[1:] != SIZE_UNKNOWN) & (s_size[1:] != s_size[:-1])

    report = ValidationReport(strict=strict, **_importer_repairs(trace, strict, where))
    try:
        if strict or not breaks.any():
            bad = breaks | mismatched if strict else mismatched
            if bad.any():
                positions = np.flatnonzero(bad)
                first = int(np.argmin(order[positions]))  # smallest event index
                raise _id_problem(int(positions[first]), order, s_ids, s_ops, s_size)
            if column_problem is not None:
                raise column_problem
            # Valid (bar free sizes): the sorted view already tells the leaks.
            _count_leaks(report, s_ids, s_ops, s_size)
            if strict:
                result = trace
            else:
                result = _fill_free_sizes(trace, paired, order, s_size, report)
        else:
            if column_problem is not None:
                # Still report the first problem: an id problem before it would win.
                _replay(op[:limit].tolist(), ids[:limit].tolist(), size[:limit].tolist())
                raise column_problem
            result = _repair(trace, report)
            order = np.argsort(result.id, kind="stable")
            _count_leaks(report, result.id[order], result.op[order], result.size[order])
    except _Problem as found:
        raise TraceError(found.problem, source=where, event=found.event) from None

    report.events = len(result)
    report.allocs = result.n_allocs
    report.frees = report.events - report.allocs
    return result, report


def validate_recording(trace: Trace, *, strict: bool = False,
                       source: str | None = None) -> tuple[Trace, ValidationReport]:
    """:func:`validate`, and, when lenient validation repaired anything, the report kept in
    the trace's ``metadata["validation"]`` (what ``allocsim info`` shows): how every reader
    and recorder of another tool's data hands over a trace."""
    trace, report = validate(trace, strict=strict, source=source)
    if not strict and report.repairs():
        # validate() returned a new trace with its own metadata dict; safe to annotate.
        trace.metadata["validation"] = {"summary": report.summary(),
                                        "repairs": report.repairs()}
    return trace, report


# What importers repair while reading, one record each in the trace's metadata (under the
# importer's key): ``{"count", "first_event", "problem"}``. Validation counts them as repairs
# or, when strict, fails at the first: (metadata key, record, report field, the repair made).
IMPORTER_REPAIRS = (
    ("address_anomalies", "frees_of_unknown_addresses", "unknown_address_frees_opened",
     "each opens a buffer live from the start"),
    ("address_anomalies", "allocs_at_live_addresses", "live_address_allocs_kept",
     "the old buffer is kept live as a leak"),
    ("entry_anomalies", "unknown_actions", "unknown_actions_dropped",
     "they are dropped and counted"),
    ("size_anomalies", "frees_of_another_size", "free_size_mismatches_kept",
     "the malloc's size is kept"),
)


def _importer_repairs(trace: Trace, strict: bool, where: str) -> dict[str, int]:
    """The counts of :data:`IMPORTER_REPAIRS` by report field (see
    :func:`allocsim.traces.formats.torch_profiler.build_trace` and
    :func:`allocsim.traces.formats.torch_snapshot.read_snapshot`). A trace that already
    carries a validation report (saved after a lenient load) had them counted then."""
    meta = trace.metadata
    counts: dict[str, int] = {}
    if "validation" in meta:
        return counts
    for key, kind, field_name, repair in IMPORTER_REPAIRS:
        found = meta.get(key)
        entry = found.get(kind) if isinstance(found, dict) else None
        count = int(entry.get("count", 0)) if isinstance(entry, dict) else 0
        if strict and count:
            assert isinstance(entry, dict)
            raise TraceError(f"{entry.get('problem', kind)} ({count} such; without --strict "
                             f"{repair})", source=where, event=entry.get("first_event"))
        counts[field_name] = count
    return counts


# ---------------------------------------------------------------------- column checks
def _first_column_problem(trace: Trace) -> tuple[int, _Problem | None]:
    """``(index, problem)`` of the first op/size/time problem, or ``(len, None)``."""
    n = len(trace)
    op, size, time_ns = trace.column("op"), trace.column("size"), trace.column("time_ns")
    bad_op = (op != OP_ALLOC) & (op != OP_FREE)
    # SIZE_UNKNOWN is legal on a free only; any other negative size is an error.
    bad_size = (size < 0) & ~((size == SIZE_UNKNOWN) & (op == OP_FREE))
    backwards = np.zeros(n, dtype=bool)
    backwards[1:] = time_ns[1:] < time_ns[:-1]
    bad = np.flatnonzero(bad_op | bad_size | backwards)
    if not len(bad):
        return n, None
    i = int(bad[0])
    # At one index, report in the order a reader would check: op, size, then time.
    if bad_op[i]:
        problem = f"unknown op {int(op[i])} (expected {OP_ALLOC}=alloc or {OP_FREE}=free)"
    elif bad_size[i] and size[i] == SIZE_UNKNOWN:
        problem = f"alloc of id {int(trace.column('id')[i])} with unknown size ({SIZE_UNKNOWN})"
    elif bad_size[i]:
        problem = f"negative size {int(size[i])}"
    else:
        problem = (f"time goes backwards: {int(time_ns[i])} ns after "
                   f"{int(time_ns[i - 1])} ns at event {i - 1}")
    return i, _Problem(i, problem)


def _id_problem(j: int, order: np.ndarray, s_ids: np.ndarray, s_ops: np.ndarray,
                s_size: np.ndarray) -> _Problem:
    """The problem at sorted row ``j`` (a break or a size mismatch), as text."""
    event, key = int(order[j]), int(s_ids[j])
    same_before = j > 0 and s_ids[j - 1] == key
    if s_ops[j] == OP_FREE and not (same_before and s_ops[j - 1] == OP_ALLOC):
        return _Problem(event, f"free of unknown id {key}")
    if s_ops[j] == OP_ALLOC:
        return _Problem(event, f"alloc of id {key} which is still live "
                               f"(allocated at event {int(order[j - 1])})")
    return _Problem(event, f"free of id {key} with size {int(s_size[j])} but it was "
                           f"allocated with size {int(s_size[j - 1])} at event "
                           f"{int(order[j - 1])}")


# ---------------------------------------------------------------------- repairs
def _replay(ops: list[int], ids: list[int], sizes: list[int]
            ) -> tuple[list[int], list[int], list[tuple[int, int]], dict[int, int]]:
    """Sequential lenient matching: ``(dropped frees, renamed allocs, fills, live)``.

    ``fills`` pairs a free of unknown size with its alloc's event index; ``live`` maps each id
    still live at the end to its alloc's event index. Raises :class:`_Problem` on a size
    mismatch, the one id problem lenient mode does not repair.
    """
    live: dict[int, int] = {}
    dropped: list[int] = []
    renamed: list[int] = []
    fills: list[tuple[int, int]] = []
    for i, (o, key) in enumerate(zip(ops, ids)):
        if o == OP_ALLOC:
            earlier = live.get(key)
            if earlier is not None:
                renamed.append(earlier)  # that buffer stays live as a leak under a new id
            live[key] = i
            continue
        alloc = live.pop(key, -1)
        if alloc < 0:
            dropped.append(i)
            continue
        stated = sizes[i]
        if stated != sizes[alloc]:
            if stated != SIZE_UNKNOWN:
                raise _Problem(i, f"free of id {key} with size {stated} but it was allocated "
                                  f"with size {sizes[alloc]} at event {alloc}")
            fills.append((i, alloc))
    return dropped, renamed, fills, live


def _repair(trace: Trace, report: ValidationReport) -> Trace:
    """Lenient repair of a trace whose ids do not alternate cleanly (see module docstring)."""
    dropped, renamed, fills, _ = _replay(trace.op.tolist(), trace.id.tolist(),
                                         trace.size.tolist())
    ids = trace.id.copy()
    size = trace.size.copy()
    if renamed:
        ids[renamed] = _fresh_ids(trace.id, len(renamed))
    if fills:
        free_at, alloc_at = np.array(fills, dtype=np.int64).T
        size[free_at] = size[alloc_at]
    report.unmatched_frees_dropped = len(dropped)
    report.duplicate_allocs_renamed = len(renamed)
    report.free_sizes_filled = len(fills)
    keep = np.ones(len(trace), dtype=bool)
    keep[dropped] = False
    columns = {name: getattr(trace, name) for name in COLUMN_DTYPES}
    columns.update(id=ids, size=size)
    return Trace(**{name: column[keep] for name, column in columns.items()},
                 tags=list(trace.tags), metadata=dict(trace.metadata))


def _fill_free_sizes(trace: Trace, paired: np.ndarray, order: np.ndarray,
                     s_size: np.ndarray, report: ValidationReport) -> Trace:
    """Lenient mode on a cleanly alternating trace: only free sizes may need filling in."""
    unknown = paired.copy()
    unknown[1:] &= s_size[1:] == SIZE_UNKNOWN
    rows = np.flatnonzero(unknown)
    if not len(rows):
        return trace
    size = trace.size.copy()
    size[order[rows]] = s_size[rows - 1]
    report.free_sizes_filled = len(rows)
    columns = {name: getattr(trace, name) for name in COLUMN_DTYPES}
    columns["size"] = size
    return Trace(**columns, tags=list(trace.tags), metadata=dict(trace.metadata))


def _fresh_ids(ids: np.ndarray, count: int) -> np.ndarray:
    """``count`` ids used nowhere in ``ids``: above the largest, else below the smallest."""
    top = int(ids.max())
    if top + count <= np.iinfo(np.int64).max:
        return np.arange(top + 1, top + 1 + count, dtype=np.int64)
    bottom = int(ids.min())
    if bottom - count >= np.iinfo(np.int64).min:
        return np.arange(bottom - count, bottom, dtype=np.int64)
    raise TraceError("no unused ids left to rename duplicate allocs")  # pragma: no cover


# ---------------------------------------------------------------------- counting
def _count_leaks(report: ValidationReport, s_ids: np.ndarray, s_ops: np.ndarray,
                 s_size: np.ndarray) -> None:
    """Leaks of a valid trace, given its events stably sorted by id: a leak is an id whose
    last event is an alloc (a renamed duplicate alloc is such an id too)."""
    last = np.ones(len(s_ids), dtype=bool)
    last[:-1] = s_ids[1:] != s_ids[:-1]
    leaked = last & (s_ops == OP_ALLOC)
    report.leaks = int(np.count_nonzero(leaked))
    report.leaked_bytes = int(s_size[leaked].sum())
