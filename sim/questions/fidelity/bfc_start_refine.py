"""Deciding what a BFC allocator held at a profile's first record, with every later record.

What it is for
    :func:`~allocsim.sim.questions.fidelity.bfc_start.start_states` proposes start states whose
    free bytes lie in at most a few of the gaps between recorded chunks (whole gaps at a
    region's ends, and one more whole gap or one gap's low or high end). The real allocator
    may have held free bytes in many gaps; a gap's free bytes change nothing until a recorded
    chunk next to it is freed and BFC coalesces the two, which makes a larger chunk that best
    fit then passes over (a smaller one elsewhere fits better). So the records after the start
    decide: :func:`refine` replays a state and tries each gap otherwise (wholly live, wholly
    free, or free at its low or high end only, by 256 B times a power of two or all but
    that), keeps the change that matches furthest (more records matched without a break,
    then more records matched), and goes on until a state matches every record or no single
    change goes further. The states that match as far as the one kept are what the records
    leave open: they are counted and reported.

Bytes in use are compared net of what the model holds at the first record, so a gap
freed or taken changes no in-use comparison; it changes only where chunks lie and how they
coalesce, which is what the records show.

Cost: each round replays a prefix of the trace once per change tried (about 2 + 4·log2 of
a gap's size in 256-byte units, per gap) and the leaders whole. :data:`MAX_REPLAYED_EVENTS`
bounds a refinement (about 30 s of replay on one core at ~100,000 events/s); the report says
when it stopped there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from allocsim.sim.questions.fidelity.bfc_start import UNIT, StartState

__all__ = ["MAX_REPLAYED_EVENTS", "Refinement", "refine"]

MAX_REPLAYED_EVENTS = 3_000_000  # trace events one refinement may replay (then it stops)

Score = tuple[int, int]         # (last recorded event matched without a break, records matched)
R = TypeVar("R")


@dataclass
class Refinement(Generic[R]):
    """What :func:`refine` kept and what the records leave open."""

    state: StartState
    replay: R
    left: int                   # states of the last round that matched as far (kept included)
    changes: list[str]          # the changes kept, in words, in order
    stopped: bool               # MAX_REPLAYED_EVENTS reached before no change went further


def refine(state: StartState, replay: R, score: Callable[[R], Score], total: int,
           run: Callable[[StartState, int | None], R | None], events: int) -> Refinement[R]:
    """Improve ``state`` (whose whole replay is ``replay``) one gap at a time as the module
    docstring says. ``run(state, events)`` replays a state, the first ``events`` trace events
    only or all of them (None), or None when the state cannot be seeded; ``score`` reads a
    replay; ``total`` is the records matched when everything matches; ``events`` the
    trace's length (what a whole replay costs).

    Each round screens every change on a prefix of the trace (twice as far as the current
    state's match, and 256 events more), then replays the changes that went furthest whole;
    the first of those that goes further than the current state is kept."""
    best = score(replay)
    changes: list[str] = []
    left, spent = 1, 0
    while best[1] < total and state.gaps:
        horizon = 2 * (best[0] + 2) + 256
        screened: list[tuple[Score, str, StartState]] = []
        for k in range(len(state.gaps)):
            for candidate, said in _variants(state, k):
                if spent >= MAX_REPLAYED_EVENTS:
                    return Refinement(state, replay, left, changes, True)
                spent += min(horizon, events)
                result = run(candidate, horizon)
                if result is not None:
                    screened.append((score(result), said, candidate))
        top = max((s for s, _, _ in screened), default=best)
        leaders = [(said, candidate) for s, said, candidate in screened if s == top]
        whole = []
        for said, candidate in leaders:
            if spent >= MAX_REPLAYED_EVENTS:
                break
            spent += events
            result = run(candidate, None)
            if result is not None:
                whole.append((score(result), said, candidate, result))
        top = max((s for s, _, _, _ in whole), default=best)
        if top <= best:
            left = 1 + sum(1 for s, _, _, _ in whole if s == best)
            break
        kept = [w for w in whole if w[0] == top]
        best, said, state, replay = kept[0]
        changes.append(said)
        left = len(kept)
    return Refinement(state, replay, left, changes, spent >= MAX_REPLAYED_EVENTS)


Layout = tuple[int, int]        # a gap's free bytes at its low end and at its high end


def _layouts(state: StartState) -> list[Layout]:
    """Each gap's free bytes at its low and high end (the live range lies between them)."""
    ranges = state.live[state.known_live:]
    out = []
    for address, size in state.gaps:
        inside = sorted((a, n) for a, n, _ in ranges if address <= a < address + size)
        if not inside:
            out.append((size, 0))
        else:
            end = inside[-1][0] + inside[-1][1]
            out.append((inside[0][0] - address, address + size - end))
    return out


def _options(size: int, now: Layout) -> list[Layout]:
    """The layouts a gap of ``size`` is tried in: wholly live, wholly free, or free at one
    end by 256 B times a power of two or all but that."""
    amounts: set[int] = set()
    step = UNIT
    while step < size:
        amounts.update((step, size - step))
        step *= 2
    options = [(0, 0), (size, 0)] + [(a, 0) for a in sorted(amounts)] \
        + [(0, a) for a in sorted(amounts)]
    return [o for o in options if o != now]


def _absorbing(size: int, now: Layout, delta: int) -> list[Layout]:
    """How a gap with free bytes gives ``delta`` of them back (or takes ``-delta`` more) at
    the end that is free, so that the bytes live at the start stay what was in use."""
    low, high = now
    if low + high == 0:
        return []
    out = []
    if low and 0 <= low - delta and low - delta + high <= size:
        out.append((low - delta, high))
    if high and 0 <= high - delta and low + high - delta <= size:
        out.append((low, high - delta))
    if low == size and 0 <= size - delta <= size:       # wholly free: either end
        out.append((0, size - delta))
    return [o for o in out if o != now]


def _variants(state: StartState, k: int) -> list[tuple[StartState, str]]:
    """``state`` with gap ``k`` laid out otherwise (:func:`_options`), the bytes it frees or
    takes given back by, or taken from, another gap's free end (:func:`_absorbing`); each
    with a word on it."""
    layouts = _layouts(state)
    address, size = state.gaps[k]
    out = []
    for option in _options(size, layouts[k]):
        delta = sum(option) - sum(layouts[k])
        for r, (other, other_size) in enumerate(state.gaps):
            if r == k:
                continue
            for absorbed in _absorbing(other_size, layouts[r], delta):
                changed = list(layouts)
                changed[k], changed[r] = option, absorbed
                said = (f"the gap at {address:#x} ({size:,} B) {_said(size, option)}, the gap "
                        f"at {other:#x} ({other_size:,} B) {_said(other_size, absorbed)}")
                out.append((_with(state, changed), said))
    return out


def _said(size: int, layout: Layout) -> str:
    low, high = layout
    if low + high == 0:
        return "live"
    if low + high == size:
        return "free"
    return " and ".join(([f"free at its low {low:,} B"] if low else [])
                        + ([f"free at its high {high:,} B"] if high else []))


def _with(state: StartState, layouts: list[Layout]) -> StartState:
    live = list(state.live[:state.known_live])
    for (address, size), (low, high) in zip(state.gaps, layouts, strict=True):
        if low + high < size:
            live.append((address + low, size - low - high, size - low - high))
    return replace(state, live=live)
