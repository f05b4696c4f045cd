"""A replay that repeats itself: the trace's period, and when a run may skip to its end.

A training loop's trace repeats a step: from some event on, every event (operation, size,
stream) equals the one ``length`` events later, and each event refers to the buffer of its
mirror (the allocation it frees is the mirror's allocation, ``length`` events earlier, or a
buffer the run held at the start). A replay is a deterministic function of its state and the
events it is fed. So if a run holds, before event ``b`` and before ``b + length``, the same
decision state (the policy's structures, without its statistics; no device call between — or,
for a policy whose decisions read addresses only through their order, the state named by
place and the same memory handed out by the device) and the buffers the future events refer
to sit at the same addresses (places), the run from ``b + length``
repeats the run from ``b`` event for event, OOMs included: a run with no OOM up to
``b + length`` completes, and what it showed about other capacities it has shown already.

:func:`find_period` finds the period (numpy, O(n) once per trace);
:meth:`Period.repeats` checks the buffer part of the argument at a boundary, the policy's part
being the caller's (sim/questions/run_repeats.py, per policy).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from allocsim.sim.kernel.native import core
from allocsim.traces.model import Trace

MIN_PERIODS = 4          # a period must repeat at least this often to be worth finding
ANCHORS = 4              # consecutive events that pick candidate lengths
MAX_CANDIDATES = 64      # candidate lengths tried
PREFIX = 4096            # events a candidate is first tried on


@dataclass(frozen=True)
class Period:
    """Events ``[start, n)`` of a trace repeat every ``length`` events."""

    start: int
    length: int
    n: int
    ids: np.ndarray              # the trace's buffer ids
    previous: np.ndarray         # per event: the last earlier event with its id, or -1
    # The trace's part of repeats() per boundary, found once (_pairs).
    _pairs_at: dict[int, list[tuple[int, int]] | None] = field(
        default_factory=dict, compare=False, repr=False)

    def boundaries(self) -> list[int]:
        """Events ``b`` to check ``b`` against ``b + length``: ``start + m·length`` for
        m = 1, 2, 4, 8, … while a whole period follows (a run that settles at event e is
        caught by about 2e)."""
        found = []
        periods = 1
        while self.start + (periods + 1) * self.length <= self.n:
            found.append(self.start + periods * self.length)
            periods *= 2
        return found

    def repeats(self, boundary: int, live_then: Mapping[int, object],
                live_now: Mapping[int, object]) -> bool:
        """Whether every event from ``boundary`` on refers to its mirror's buffer: events that
        name a buffer touched since ``boundary`` name the mirror of that touch; the others name
        a buffer at the same address before ``boundary`` (``live_then``) and one period later
        (``live_now``), or nothing in both."""
        pairs = self._pairs(boundary)
        if pairs is None:
            return False
        return all(live_then.get(a) == live_now.get(b) for a, b in pairs)

    def _pairs(self, boundary: int) -> list[tuple[int, int]] | None:
        """The trace's part of :meth:`repeats` at ``boundary`` — None where some event does
        not name its mirror's buffer, else the pairs of buffer ids (one before the boundary,
        one a period later) whose places must agree. O(n) once per boundary, then kept: every
        run of one search checks the same boundaries."""
        if boundary in self._pairs_at:
            return self._pairs_at[boundary]
        length, n = self.length, self.n
        pairs: list[tuple[int, int]] | None = None
        if self.start <= boundary and boundary + length <= n:
            before = self.previous[boundary:n - length]
            mirrored = self.previous[boundary + length:n]
            inside = before >= boundary
            outside = ~inside
            # Elementwise over whole arrays, not masked copies (compacting two 1M-element
            # arrays took 20 ms of each boundary, a replay's worth over a search's runs).
            if (not np.any(inside & (mirrored != before + length))
                    and not np.any(outside & (mirrored >= boundary + length))):
                # Events whose buffer predates the boundary: the same address (or none) in
                # both. Buffers never seen before, in both, are nothing in both.
                ask = np.flatnonzero(outside & ~((before < 0) & (mirrored < 0)))
                ids_then = self.ids[boundary:n - length][ask].tolist()
                ids_now = self.ids[boundary + length:n][ask].tolist()
                pairs = list(dict.fromkeys(zip(ids_then, ids_now)))
        self._pairs_at[boundary] = pairs
        return pairs


def find_period(trace: Trace) -> Period | None:
    """The trace's repeating tail, if it repeats at least :data:`MIN_PERIODS` times.

    The candidate lengths are the shifts at which :data:`ANCHORS` consecutive events from the
    middle of the trace recur (one pass of masks; no sort), tried shortest first: a candidate
    must map the whole second half onto itself. Most candidates of a trace that does not
    repeat differ within a few events, so each is first tried on :data:`PREFIX` events and
    only then on the whole half. Search time on a 1M-event trace is a few milliseconds,
    against ~1.5 of the core's replays before (issue 39)."""
    n = len(trace)
    if n < 2 * MIN_PERIODS:
        return None
    op, sizes, stream = trace.op, trace.matched_sizes(), trace.stream
    anchor = n // 2
    # Shift s is a candidate where event anchor + j + s equals event anchor + j for every
    # anchor j; it must leave all of them inside the trace.
    shifts = n - anchor - (ANCHORS - 1)
    recurs = np.ones(shifts, dtype=bool)
    for here in range(anchor, anchor + ANCHORS):
        window = slice(here, here + shifts)
        recurs &= op[window] == op[here]
        recurs &= sizes[window] == sizes[here]
        recurs &= stream[window] == stream[here]
    recurs[0] = False
    length = 0
    for shift in np.flatnonzero(recurs)[:MAX_CANDIDATES].tolist():
        if shift * MIN_PERIODS > n:
            break
        if _maps_onto_itself(op, sizes, stream, anchor, min(n, anchor + shift + PREFIX), shift) \
                and _maps_onto_itself(op, sizes, stream, anchor, n, shift):
            length = shift
            break
    if not length:
        return None
    differs = ((op[:n - length] != op[length:]) | (sizes[:n - length] != sizes[length:])
               | (stream[:n - length] != stream[length:]))
    last = np.flatnonzero(differs[:anchor])
    start = int(last[-1]) + 1 if len(last) else 0
    if (n - start) < MIN_PERIODS * length:
        return None
    ids = np.asarray(trace.id, dtype=np.int64)
    return Period(start, length, n, ids, _previous_same_id(ids))


def _maps_onto_itself(op: np.ndarray, sizes: np.ndarray, stream: np.ndarray, begin: int,
                      end: int, shift: int) -> bool:
    """Whether every event in ``[begin, end - shift)`` equals the one ``shift`` later."""
    tail, moved = slice(begin, end - shift), slice(begin + shift, end)
    return (np.array_equal(op[tail], op[moved]) and np.array_equal(sizes[tail], sizes[moved])
            and np.array_equal(stream[tail], stream[moved]))


def _previous_same_id(ids: np.ndarray) -> np.ndarray:
    """For each event, the index of the last earlier event with the same buffer id, or -1:
    in one pass of the native core where it is built (native/src/previous_same_id.hpp, ~5×
    as fast), else by a stable sort of the ids. Its id table cannot hold the lowest int64."""
    module = core()
    if module is not None and len(ids) and int(ids.min()) != np.iinfo(np.int64).min:
        return np.asarray(module.previous_same_id(ids))
    return _previous_same_id_sorted(ids)


def _previous_same_id_sorted(ids: np.ndarray) -> np.ndarray:
    """:func:`_previous_same_id` by numpy: a stable argsort of the ids, then a scatter."""
    order = np.argsort(ids, kind="stable")
    if not len(order):
        return order
    sorted_ids = ids[order]
    previous = np.empty(len(ids), dtype=np.int64)
    previous[order[0]] = -1
    # One scatter, no masks: each event in id order takes the one before it, or -1 where
    # that one has another id.
    previous[order[1:]] = np.where(sorted_ids[1:] == sorted_ids[:-1], order[:-1], -1)
    return previous
