"""The trace's period (sim/questions/capacity/period.py's find_period): the shortest shift,
among those at which four consecutive events from the middle recur, that maps the whole
second half onto itself, and the first event from which the trace repeats with it. The fast
search (masks, each candidate first tried on a prefix) must find what the definition finds:
held here to the search as first written (candidates by sorting and intersecting the shifts,
each compared over the whole half), on traces that repeat, that do not, and that repeat
except far from the anchor."""

from __future__ import annotations

import numpy as np
import pytest

from allocsim.sim.questions.capacity import period as period_module
from allocsim.sim.questions.capacity.period import (
    ANCHORS,
    MAX_CANDIDATES,
    MIN_PERIODS,
    find_period,
)
from allocsim.traces import synth
from allocsim.traces.model import Trace


def reference_period(trace: Trace) -> tuple[int, int] | None:
    """(start, length) by the search as first written."""
    n = len(trace)
    if n < 2 * MIN_PERIODS:
        return None
    op = trace.op.astype(np.int64)
    sizes = trace.matched_sizes().astype(np.int64)
    stream = trace.stream.astype(np.int64)
    anchor = n // 2
    candidates = None
    for j in range(ANCHORS):
        here = anchor + j
        same = ((op[here:] == op[here]) & (sizes[here:] == sizes[here])
                & (stream[here:] == stream[here]))
        shifts = np.flatnonzero(same)
        shifts = shifts[shifts > 0]
        candidates = shifts if candidates is None else np.intersect1d(candidates, shifts)
    assert candidates is not None
    length = 0
    for shift in candidates[:MAX_CANDIDATES].tolist():
        if shift * MIN_PERIODS > n:
            break
        tail, moved = slice(anchor, n - shift), slice(anchor + shift, n)
        if (np.array_equal(op[tail], op[moved]) and np.array_equal(sizes[tail], sizes[moved])
                and np.array_equal(stream[tail], stream[moved])):
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
    return start, length


def steps(count: int, *, step_events: int, odd_at: int | None = None, warmup: int = 0,
          seed: int = 0) -> Trace:
    """``count`` identical steps of ``step_events`` events (allocations then their frees,
    sizes drawn once), after ``warmup`` events of their own; with ``odd_at`` the event at
    that index has another size (a trace that repeats except there)."""
    rng = np.random.default_rng(seed)
    half = step_events // 2
    sizes = (rng.integers(1, 64, half) * 512).tolist()
    events: list[tuple[int, str, int, int | None]] = []
    buffer = 0
    for w in range(warmup):
        events.append((len(events), "alloc", buffer, 256 * (w + 1)))
        events.append((len(events), "free", buffer, None))
        buffer += 1
    for _ in range(count):
        first = buffer
        for size in sizes:
            events.append((len(events), "alloc", buffer, size))
            buffer += 1
        for b in range(first, buffer):
            events.append((len(events), "free", b, None))
    if odd_at is not None:
        t, op, b, size = events[odd_at]
        if op == "alloc":
            events[odd_at] = (t, op, b, (size or 0) + 512)
    return Trace.from_events(events)


TRACES = {
    "training": lambda: synth.generate("training", seed=1, events=60_000),
    "transformer": lambda: synth.generate("transformer", seed=2, events=60_000),
    "random": lambda: synth.generate("random", seed=3, events=20_000, live=40),
    "steps": lambda: steps(40, step_events=200),
    "steps after a warm-up": lambda: steps(40, step_events=200, warmup=700),
    "steps, one odd event late": lambda: steps(60, step_events=200, odd_at=11_001),
    "steps, one odd event early": lambda: steps(60, step_events=200, odd_at=1_001),
    "one step of two events": lambda: steps(500, step_events=2),
    "too short": lambda: steps(1, step_events=6),
}


@pytest.mark.parametrize("name", list(TRACES))
def test_the_fast_search_finds_what_the_first_one_found(name: str) -> None:
    trace = TRACES[name]()
    found = find_period(trace)
    assert (None if found is None else (found.start, found.length)) == reference_period(trace)


def test_a_candidate_that_holds_on_its_prefix_only_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The odd event lies beyond the prefix a candidate is first tried on: the step's length
    passes the prefix and fails on the whole half, and no other length holds."""
    monkeypatch.setattr(period_module, "PREFIX", 64)
    trace = steps(60, step_events=200, odd_at=11_001)
    assert find_period(trace) is None and reference_period(trace) is None
    clean = steps(60, step_events=200)
    found = find_period(clean)
    assert found is not None and found.length == 200 and found.start == 0


INT64 = np.iinfo(np.int64)
SPARSE = np.random.default_rng(5).integers(-(1 << 40), 1 << 40, size=300)


@pytest.mark.parametrize("ids", [
    [], [7], [3, 3, 1, 3, 1, 2, 9, 2, 3], list(range(50)) * 3,
    [-5, 1 << 40, -5, 1 << 40, 0, -5],                              # too sparse for an array
    [INT64.max, INT64.min + 1, INT64.max, 0, INT64.min + 1],         # the widest span
    [INT64.min, 3, INT64.min, 3],                                   # the id table's empty key
    np.random.default_rng(4).integers(0, 400, size=5000).tolist(),  # dense, many repeats
    np.concatenate([SPARSE, SPARSE[::-1], SPARSE]).tolist(),
])
@pytest.mark.parametrize("way", ["as found", "by sorting"])
def test_each_event_points_back_to_the_last_earlier_event_of_its_buffer(
        ids: list[int], way: str) -> None:
    """Either way (the native core's one pass where it is built, numpy's sort otherwise)."""
    last: dict[int, int] = {}
    expected = []
    for index, buffer in enumerate(ids):
        expected.append(last.get(buffer, -1))
        last[buffer] = index
    find = (period_module._previous_same_id if way == "as found"
            else period_module._previous_same_id_sorted)
    found = find(np.asarray(ids, dtype=np.int64))
    assert found.tolist() == expected
    if way == "as found" and ids and -(1 << 31) <= min(ids) and max(ids) < 1 << 31:
        assert find(np.asarray(ids, dtype=np.int32)).tolist() == expected   # as held


def _steps(ids_per_step: list[list[int]]) -> Trace:
    """Steps of alloc x (4 KiB), free x, alloc y (8 KiB), free y, with the ids given per
    step: the events repeat whatever the ids, so the period is the step's."""
    events: list[tuple[int, str, int, int | None]] = []
    for first, second in ids_per_step:
        for op, buffer, size in (("alloc", first, 4096), ("free", first, None),
                                 ("alloc", second, 8192), ("free", second, None)):
            events.append((len(events), op, buffer, size))
    return Trace.from_events(events, name="steps")


def test_a_step_of_fresh_buffers_every_time_repeats() -> None:
    trace = _steps([[2 * k, 2 * k + 1] for k in range(16)])
    period = find_period(trace)
    assert period is not None and period.length == 4
    assert all(period.repeats(b, {}, {}) for b in period.boundaries())


def test_a_free_that_names_another_buffer_than_its_mirror_does_not_repeat() -> None:
    """Steps of two 4 KiB buffers, allocated then freed; from step 12 on each step frees its
    second buffer first: the events (op, size) repeat, but the first free names the step's
    second allocation where its mirror named the first."""
    steps = [[2 * k, 2 * k + 1] for k in range(16)]
    events: list[tuple[int, str, int, int | None]] = []
    for k, (first, second) in enumerate(steps):
        order = ((first, second) if k < 12 else (second, first))
        events += [(0, "alloc", first, 4096), (0, "alloc", second, 4096),
                   (0, "free", order[0], None), (0, "free", order[1], None)]
    trace = Trace.from_events([(t, op, b, s) for t, (_, op, b, s) in enumerate(events)],
                              name="swapped")
    period = find_period(trace)
    assert period is not None and period.length == 4
    # Boundaries well before the swap: each check reads every event from its boundary on.
    assert [b for b in period.boundaries() if b + period.length <= 4 * 11]
    assert not any(period.repeats(b, {}, {}) for b in period.boundaries())


def test_a_fresh_buffer_whose_mirror_reuses_an_id_does_not_repeat() -> None:
    """The last step allocates its second buffer under the id it just freed: that allocation
    names a buffer of its own step where its mirror, a step earlier, named one never seen
    before (the last step has no mirror of its own, so only this reference tells)."""
    steps = [[2 * k, 2 * k + 1] for k in range(16)]
    steps[15] = [30, 30]
    trace = _steps(steps)
    period = find_period(trace)
    assert period is not None and period.length == 4
    assert not any(period.repeats(b, {}, {}) for b in period.boundaries())
