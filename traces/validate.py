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

from allocsim.traces.model import (
    COLUMN_DTYPES,
    INT64_MAX,
    OP_ALLOC,
    OP_FREE,
    SIZE_UNKNOWN,
    Trace,
    TraceError,
)

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
    # event plus a few for the sort); a repair below reads the columns themselves.
    op, ids, size = trace.column("op"), trace.column("id"), trace.column("size")

    # Column problems (op, size, time), vectorised. Id matching only needs to look at the
    # events before the first of them: a later id problem can never be the first problem.
    limit, column_problem = _first_column_problem(trace)
    scan = _scan_ids(op, ids, size, limit)

    report = ValidationReport(strict=strict, **_importer_repairs(trace, strict, where))
    try:
        if strict or not scan.breaks:
            found = scan.first_problem if strict else scan.first_mismatch
            if found is not None:
                raise found
            if column_problem is not None:
                raise column_problem
            # Valid (bar free sizes): the sorted views already told the leaks.
            report.leaks, report.leaked_bytes = scan.leaks, scan.leaked_bytes
            if strict:
                result = trace
            else:
                result = _fill_free_sizes(trace, scan, report)
        else:
            if column_problem is not None:
                # Still report the first problem: an id problem before it would win.
                _replay(op[:limit].tolist(), ids[:limit].tolist(), size[:limit].tolist())
                raise column_problem
            result = _repair(trace, report)
            order = np.argsort(result.id, kind="stable")
            report.leaks, report.leaked_bytes = _count_leaks(result.id[order], result.op[order],
                                                             result.size[order])
    except _Problem as found:
        raise TraceError(found.problem, source=where, event=found.event) from None

    overflow = first_live_overflow(result)
    if overflow is not None:
        raise TraceError(f"the live bytes reach {overflow[1]:,}, more than a 64-bit count "
                         f"holds ({INT64_MAX:,}): no device has that much memory",
                         source=where, event=overflow[0])
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


# ---------------------------------------------------------------------- live bytes
def first_live_overflow(trace: Trace) -> tuple[int, int] | None:
    """``(event, live bytes)`` where the trace's live requested bytes first pass
    :data:`INT64_MAX`, or None when they never do (every count of live bytes — the summary's
    peak, the engine's allocated bytes, the native core's — is int64; four live 2**61-byte
    buffers would wrap to a negative number there). For a valid trace.

    Cost: O(1) when the largest size times the number of allocations fits (any real trace);
    else two int64 prefix sums over the sizes' high and low 32 bits, which cannot overflow."""
    n = len(trace)
    if not n:
        return None
    size = trace.column("size")
    if int(size.max()) * trace.n_allocs <= INT64_MAX:
        return None
    sizes = trace.matched_sizes(packed=True).astype(np.int64, copy=False)
    sign = np.where(trace.column("op") == OP_ALLOC, 1, -1).astype(np.int64)
    high = np.cumsum(sign * (sizes >> 32), dtype=np.int64)
    low = np.cumsum(sign * (sizes & 0xFFFFFFFF), dtype=np.int64)
    # live = high·2**32 + low = q·2**32 + r with 0 <= r < 2**32: above INT64_MAX iff q >= 2**31.
    quotient = high + (low >> 32)
    over = np.flatnonzero(quotient >= 1 << 31)
    if not len(over):
        return None
    event = int(over[0])
    return event, int(high[event]) * (1 << 32) + int(low[event])


# ---------------------------------------------------------------------- column checks
# Events checked at a time by the column checks (their masks are of this many events, not of
# the trace: a few bytes/event of a long trace would be most of what loading it holds).
_BLOCK = 1 << 16


def _first_column_problem(trace: Trace) -> tuple[int, _Problem | None]:
    """``(index, problem)`` of the first op/size/time problem, or ``(len, None)``."""
    n = len(trace)
    op, size, time_ns = trace.column("op"), trace.column("size"), trace.column("time_ns")
    for start in range(0, n, _BLOCK):
        stop = min(n, start + _BLOCK)
        block_op, block_size = op[start:stop], size[start:stop]
        bad_op = (block_op != OP_ALLOC) & (block_op != OP_FREE)
        # SIZE_UNKNOWN is legal on a free only; any other negative size is an error.
        bad_size = (block_size < 0) & ~((block_size == SIZE_UNKNOWN) & (block_op == OP_FREE))
        before = time_ns[max(start - 1, 0):stop]     # the event before the block too
        backwards = np.zeros(stop - start, dtype=bool)
        backwards[len(backwards) - len(before) + 1:] = before[1:] < before[:-1]
        bad = np.flatnonzero(bad_op | bad_size | backwards)
        if len(bad):
            return _column_problem(start + int(bad[0]), op, size, time_ns, trace)
    return n, None


def _column_problem(i: int, op: np.ndarray, size: np.ndarray, time_ns: np.ndarray,
                    trace: Trace) -> tuple[int, _Problem]:
    """The problem at event ``i`` (the first), reported in the order a reader would check
    at one index: op, size, then time."""
    if op[i] != OP_ALLOC and op[i] != OP_FREE:
        problem = f"unknown op {int(op[i])} (expected {OP_ALLOC}=alloc or {OP_FREE}=free)"
    elif size[i] < 0 and size[i] == SIZE_UNKNOWN and op[i] != OP_FREE:
        problem = f"alloc of id {int(trace.column('id')[i])} with unknown size ({SIZE_UNKNOWN})"
    elif size[i] < 0 and size[i] != SIZE_UNKNOWN:
        problem = f"negative size {int(size[i])}"
    else:
        problem = (f"time goes backwards: {int(time_ns[i])} ns after "
                   f"{int(time_ns[i - 1])} ns at event {i - 1}")
    return i, _Problem(i, problem)


# ---------------------------------------------------------------------- id matching
# Id matching sorts the events by id. A long trace is matched in parts of about this many
# events, each part the events of a range of ids (every event of an id in one part, so each
# part's sort is the whole sort restricted to its ids and finds the same problems and
# leaks): the sort's arrays (~40 bytes/event) are of a part, not of the trace.
_PART_EVENTS = 1 << 13
_MAX_PARTS = 128
_MASK_BLOCK = 1 << 18           # events a part's members are looked for at a time


@dataclass
class _IdScan:
    """What matching ids found over every part: the first problem by event index (a break
    or a size mismatch; and of mismatches alone, lenient mode's), whether any id's
    alternation breaks, the leaks, and the frees of unknown size with their alloc's size."""

    first_problem: _Problem | None = None
    first_mismatch: _Problem | None = None
    breaks: bool = False
    leaks: int = 0
    leaked_bytes: int = 0
    fill_events: list[np.ndarray] | None = None
    fill_sizes: list[np.ndarray] | None = None


def _scan_ids(op: np.ndarray, ids: np.ndarray, size: np.ndarray, limit: int) -> _IdScan:
    """Match the ids of the first ``limit`` events, part by part (see :data:`_PART_EVENTS`)."""
    scan = _IdScan(fill_events=[], fill_sizes=[])
    ids, op, size = ids[:limit], op[:limit], size[:limit]
    parts = min(_MAX_PARTS, limit // _PART_EVENTS)
    if parts <= 1:
        order = np.argsort(ids, kind="stable")
        _scan_part(scan, order, ids[order], op[order], size[order])
        return scan
    # Part boundaries at quantiles of a sample of the ids, so that parts are about even
    # whatever the ids' spread; an event's part is its id's, found a block at a time.
    sample = np.sort(ids[::max(1, limit // (parts * 64))])
    bounds = np.unique(sample[np.linspace(0, len(sample) - 1, parts + 1)[1:-1].astype(np.intp)])
    part = np.empty(limit, dtype=np.uint8)
    for start in range(0, limit, _BLOCK):
        part[start:start + _BLOCK] = np.searchsorted(bounds, ids[start:start + _BLOCK],
                                                     side="right")
    for number in range(len(bounds) + 1):
        # The part's events, found a block at a time (no mask of the whole trace).
        pieces = [np.flatnonzero(part[start:start + _MASK_BLOCK] == number) + start
                  for start in range(0, limit, _MASK_BLOCK)]
        events = np.concatenate(pieces)
        del pieces
        if not len(events):
            continue
        part_ids = ids[events]
        local = np.argsort(part_ids, kind="stable")
        order = events[local]
        del events
        _scan_part(scan, order, part_ids[local], op[order], size[order])
    return scan


def _scan_part(scan: _IdScan, order: np.ndarray, s_ids: np.ndarray, s_ops: np.ndarray,
               s_size: np.ndarray) -> None:
    """Match the ids of one part, its events stably sorted by id (``order``: their event
    indices), into ``scan``."""
    count = len(order)
    same = s_ids[1:] == s_ids[:-1]  # sorted row j+1 has the same id as row j
    # A break: a free opening an id's sequence, or two equal ops in a row for one id.
    breaks = np.empty(count, dtype=bool)
    if count:
        breaks[0] = s_ops[0] == OP_FREE
        breaks[1:] = np.where(same, s_ops[1:] == s_ops[:-1], s_ops[1:] == OP_FREE)
    # A free right after its alloc (the normal pair); its stated size must match.
    paired = np.zeros(count, dtype=bool)
    if count:
        paired[1:] = same & (s_ops[1:] == OP_FREE) & (s_ops[:-1] == OP_ALLOC)
    del same
    mismatched = paired.copy()
    if count:
        mismatched[1:] &= (s_size[1:] != SIZE_UNKNOWN) & (s_size[1:] != s_size[:-1])
    scan.breaks = scan.breaks or bool(breaks.any())
    scan.first_problem = _earliest(scan.first_problem, breaks | mismatched, order, s_ids,
                                   s_ops, s_size)
    scan.first_mismatch = _earliest(scan.first_mismatch, mismatched, order, s_ids, s_ops,
                                    s_size)
    leaks, leaked = _count_leaks(s_ids, s_ops, s_size)
    scan.leaks += leaks
    scan.leaked_bytes += leaked
    unknown = paired
    unknown[1:] &= s_size[1:] == SIZE_UNKNOWN
    rows = np.flatnonzero(unknown)
    if len(rows):
        assert scan.fill_events is not None and scan.fill_sizes is not None
        scan.fill_events.append(order[rows])
        scan.fill_sizes.append(s_size[rows - 1].astype(np.int64))


def _earliest(found: _Problem | None, bad: np.ndarray, order: np.ndarray, s_ids: np.ndarray,
              s_ops: np.ndarray, s_size: np.ndarray) -> _Problem | None:
    """The earlier (by event index) of ``found`` and the first of this part's ``bad`` rows."""
    if not bad.any():
        return found
    positions = np.flatnonzero(bad)
    first = int(np.argmin(order[positions]))  # smallest event index
    if found is not None and found.event < int(order[positions[first]]):
        return found
    return _id_problem(int(positions[first]), order, s_ids, s_ops, s_size)


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


def _fill_free_sizes(trace: Trace, scan: _IdScan, report: ValidationReport) -> Trace:
    """Lenient mode on a cleanly alternating trace: only free sizes may need filling in
    (the frees of unknown size the id scan found, each given its alloc's size)."""
    if not scan.fill_events:
        return trace
    assert scan.fill_sizes is not None
    size = trace.size.copy()
    events = np.concatenate(scan.fill_events)
    size[events] = np.concatenate(scan.fill_sizes)
    report.free_sizes_filled = len(events)
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
def _count_leaks(s_ids: np.ndarray, s_ops: np.ndarray, s_size: np.ndarray) -> tuple[int, int]:
    """``(leaks, leaked bytes)`` of a valid trace (or part of one: every event of its ids),
    given its events stably sorted by id: a leak is an id whose last event is an alloc (a
    renamed duplicate alloc is such an id too)."""
    last = np.ones(len(s_ids), dtype=bool)
    last[:-1] = s_ids[1:] != s_ids[:-1]
    leaked = last & (s_ops == OP_ALLOC)
    return int(np.count_nonzero(leaked)), int(s_size[leaked].astype(np.int64).sum())
