"""Tests for allocsim.traces.validate: one-line errors at the first bad event, lenient repairs,
speed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.traces.model import COLUMN_DTYPES, OP_ALLOC, OP_FREE, SIZE_UNKNOWN, Trace, TraceError
from allocsim.traces.validate import ValidationReport, validate


def trace_of(*events, **metadata) -> Trace:
    metadata.setdefault("source", "run.csv")
    return Trace.from_events(events, **metadata)


def snapshot(trace: Trace) -> dict[str, np.ndarray]:
    return {name: getattr(trace, name).copy() for name in COLUMN_DTYPES}


def unchanged(trace: Trace, before: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(getattr(trace, name), before[name]) for name in COLUMN_DTYPES)


# ---------------------------------------------------------------------- valid traces
def test_valid_trace_comes_back_unchanged_with_counts():
    trace = trace_of((0, "alloc", 1, 100), (1, "alloc", 2, 50), (2, "free", 1, 100),
                     (3, "alloc", 1, 30), (4, "free", 2, None))
    for strict in (True, False):
        result, report = validate(trace, strict=strict)
        if strict:
            assert result is trace
        assert (report.events, report.allocs, report.frees) == (5, 3, 2)
        assert (report.leaks, report.leaked_bytes) == (1, 30)
        assert report.strict is strict


def test_id_reuse_after_free_is_fine():
    trace = trace_of((0, "alloc", 7, 8), (1, "free", 7, 8), (2, "alloc", 7, 16),
                     (3, "free", 7, 16))
    result, report = validate(trace)
    assert result is trace and report.leaks == 0 and report.repairs() == {}


def test_empty_trace_is_valid():
    _, report = validate(Trace.empty())
    assert report.events == 0 and report.leaks == 0 and "0 events" in report.summary()


def test_lenient_with_nothing_to_repair_returns_same_object():
    trace = trace_of((0, "alloc", 1, 10), (1, "free", 1, 10))
    result, report = validate(trace, strict=False)
    assert result is trace and report.repairs() == {}


# ---------------------------------------------------------------------- one-line errors
ERRORS = [
    # (events, event index, exact problem text)
    ([(0, "alloc", 1, 10), (1, "free", 42, 10)], 1, "free of unknown id 42"),
    ([(0, "alloc", 42, 10), (1, "free", 42, 10), (2, "free", 42, None)], 2,
     "free of unknown id 42"),
    ([(0, "alloc", 3, 10), (1, "alloc", 5, 1), (2, "alloc", 3, 20)], 2,
     "alloc of id 3 which is still live (allocated at event 0)"),
    ([(0, "alloc", 3, 10), (5, "free", 3, 11)], 1,
     "free of id 3 with size 11 but it was allocated with size 10 at event 0"),
    ([(0, "alloc", 3, -5)], 0, "negative size -5"),
    ([(0, "alloc", 3, 5), (1, "free", 3, -7)], 1, "negative size -7"),
    ([(0, "alloc", 1, 5), (1, "alloc", 3, None)], 1, "alloc of id 3 with unknown size (-1)"),
    ([(0, "alloc", 1, 5), (100, "alloc", 2, 5), (50, "free", 1, 5)], 2,
     "time goes backwards: 50 ns after 100 ns at event 1"),
]


@pytest.mark.parametrize("events, index, problem", ERRORS)
def test_each_problem_has_its_one_line_message(events, index, problem):
    with pytest.raises(TraceError) as caught:
        validate(trace_of(*events))
    message = str(caught.value)
    assert message == f"run.csv: event {index}: {problem}"
    assert "\n" not in message
    assert caught.value.event == index and caught.value.source == "run.csv"


def test_unknown_op_message():
    trace = Trace.from_columns([0, 1], [OP_ALLOC, 7], [1, 1], [5, 5], source="x.npz")
    with pytest.raises(TraceError, match=r"^x\.npz: event 1: unknown op 7 \(expected"):
        validate(trace)


def test_source_argument_overrides_metadata():
    trace = trace_of((0, "free", 1, 4))
    with pytest.raises(TraceError) as caught:
        validate(trace, source="/data/other.csv")
    assert str(caught.value) == "/data/other.csv: event 0: free of unknown id 1"


@pytest.mark.parametrize("strict", [True, False])
def test_first_problem_wins_column_problem_first(strict):
    # negative size at event 1, unknown size on an alloc at 3, time backwards at 4
    trace = trace_of((0, "alloc", 1, 5), (1, "alloc", 2, -3), (2, "alloc", 1, 5),
                     (3, "alloc", 9, None), (1, "free", 1, 5))
    with pytest.raises(TraceError) as caught:
        validate(trace, strict=strict)
    assert caught.value.event == 1


def test_strict_first_problem_wins_id_problem_first():
    # alloc of live id 1 at event 2 comes before the time going backwards at event 3
    trace = trace_of((0, "alloc", 1, 5), (1, "free", 9, 5), (2, "alloc", 1, 5),
                     (0, "free", 1, 5))
    with pytest.raises(TraceError) as caught:
        validate(trace)
    assert caught.value.event == 1 and "free of unknown id 9" in str(caught.value)


def test_strict_reports_lowest_index_across_ids():
    # id 5 breaks at event 4, id 2 at event 3: event 3 must be reported
    trace = trace_of((0, "alloc", 5, 1), (1, "alloc", 2, 1), (2, "free", 2, 1),
                     (3, "free", 2, 1), (4, "alloc", 5, 1))
    with pytest.raises(TraceError) as caught:
        validate(trace)
    assert caught.value.event == 3


# ---------------------------------------------------------------------- lenient repairs
def test_lenient_drops_unmatched_frees():
    trace = trace_of((0, "free", 99, 64), (1, "alloc", 1, 10), (2, "free", 1, 10),
                     (3, "free", 1, None))
    before = snapshot(trace)
    result, report = validate(trace, strict=False)
    assert result is not trace and unchanged(trace, before)
    assert report.unmatched_frees_dropped == 2
    assert report.repairs() == {"unmatched_frees_dropped": 2}
    assert result.op.tolist() == [OP_ALLOC, OP_FREE] and result.time_ns.tolist() == [1, 2]
    assert (report.events, report.allocs, report.frees) == (2, 1, 1)
    # the repaired trace is valid
    assert validate(result)[0] is result


def test_lenient_renames_duplicate_alloc_and_keeps_bytes():
    trace = trace_of((0, "alloc", 1, 100), (1, "alloc", 2, 7), (2, "alloc", 1, 50),
                     (3, "free", 1, 50), (4, "free", 2, 7), (5, "alloc", 1, 30))
    before = snapshot(trace)
    result, report = validate(trace, strict=False)
    assert unchanged(trace, before)
    assert report.duplicate_allocs_renamed == 1
    # The recorded events imply: 100 + 7 + 50 - 50 - 7 + 30 = 130 live bytes at the end,
    # the first buffer of id 1 (100 bytes) never having been freed.
    assert result.live_bytes().tolist() == [100, 107, 157, 107, 100, 130]
    assert (report.leaks, report.leaked_bytes) == (2, 130)
    new_id = int(result.id[0])
    assert new_id not in trace.id.tolist()
    assert result.id.tolist()[1:] == trace.id.tolist()[1:]
    assert result.size.tolist() == trace.size.tolist()
    assert validate(result)[0] is result


def test_lenient_fills_free_sizes():
    trace = trace_of((0, "alloc", 1, 100), (1, "alloc", 2, 7), (2, "free", 1, None),
                     (3, "free", 2, 7))
    result, report = validate(trace, strict=False)
    assert result.size.tolist() == [100, 7, 100, 7]
    assert trace.size.tolist() == [100, 7, SIZE_UNKNOWN, 7]
    assert report.free_sizes_filled == 1 and report.repairs() == {"free_sizes_filled": 1}
    # strict mode accepts unknown free sizes as they are
    assert validate(trace)[0] is trace


def test_lenient_fills_sizes_when_other_repairs_happen_too():
    trace = trace_of((0, "free", 5, None), (1, "alloc", 1, 9), (2, "free", 1, None))
    result, report = validate(trace, strict=False)
    assert result.size.tolist() == [9, 9]
    assert report.repairs() == {"unmatched_frees_dropped": 1, "free_sizes_filled": 1}


def test_lenient_keeps_metadata_and_tags_as_copies():
    trace = Trace.from_columns([0, 1], [OP_FREE, OP_ALLOC], [5, 1], [3, 3], tag=[-1, 0],
                               tags=["aten::empty"], name="rec", source="rec.csv")
    result, _ = validate(trace, strict=False)
    assert result.tags == ["aten::empty"] and result.tag.tolist() == [0]
    assert result.metadata == trace.metadata and result.metadata is not trace.metadata
    assert result.tags is not trace.tags


@pytest.mark.parametrize("events, index", [
    ([(0, "alloc", 3, 10), (1, "free", 3, 11)], 1),  # size mismatch: never changed
    ([(5, "alloc", 3, 10), (1, "free", 3, 10)], 1),  # time backwards
    ([(0, "alloc", 3, -2)], 0),  # negative size
    ([(0, "alloc", 3, None)], 0),  # alloc of unknown size
    ([(0, "free", 8, 1), (1, "alloc", 3, 10), (2, "alloc", 3, 10), (3, "free", 3, 9)], 3),
])
def test_lenient_still_raises_what_cannot_be_repaired(events, index):
    with pytest.raises(TraceError) as caught:
        validate(trace_of(*events), strict=False)
    assert caught.value.event == index and "\n" not in str(caught.value)


def test_lenient_reports_id_problem_before_later_column_problem():
    # a size mismatch at event 3 (after a repairable duplicate) beats time backwards at 4
    trace = trace_of((0, "alloc", 1, 5), (1, "alloc", 1, 6), (2, "free", 7, 1),
                     (3, "free", 1, 5), (0, "alloc", 2, 1))
    with pytest.raises(TraceError) as caught:
        validate(trace, strict=False)
    assert caught.value.event == 3 and "allocated with size 6 at event 1" in str(caught.value)


def test_report_summary_and_repairs():
    report = ValidationReport(events=10, allocs=6, frees=4, leaks=2, leaked_bytes=300,
                              unmatched_frees_dropped=1, free_sizes_filled=3, strict=False)
    assert report.repairs() == {"unmatched_frees_dropped": 1, "free_sizes_filled": 3}
    line = report.summary()
    assert "\n" not in line
    assert "10 events" in line and "2 leaks holding 300 bytes" in line
    assert "1 unmatched frees dropped" in line and "3 free sizes filled" in line
    assert "no repairs" in ValidationReport().summary()


# ---------------------------------------------------------------------- against a reference
def reference(ops, ids, sizes, times, strict):
    """Obvious sequential validator: ``("error", index)`` or ``("ok", repaired columns)``."""
    live: dict[int, int] = {}
    keep, out_ids, out_sizes = [], list(ids), list(sizes)
    fresh = max(ids, default=0) + 1
    for i, (o, k, s) in enumerate(zip(ops, ids, sizes)):
        if s < 0 and not (s == SIZE_UNKNOWN and o == OP_FREE):
            return ("error", i)
        if i and times[i] < times[i - 1]:
            return ("error", i)
        if o == OP_ALLOC:
            if k in live:
                if strict:
                    return ("error", i)
                out_ids[live[k]] = fresh
                fresh += 1
            live[k] = i
            keep.append(i)
        else:
            if k not in live:
                if strict:
                    return ("error", i)
                continue
            j = live.pop(k)
            if s != SIZE_UNKNOWN and s != sizes[j]:
                return ("error", i)
            if not strict:
                out_sizes[i] = sizes[j]
            keep.append(i)
    return ("ok", [out_ids[i] for i in keep], [out_sizes[i] for i in keep], keep)


events_strategy = st.lists(
    st.tuples(st.sampled_from([OP_ALLOC, OP_FREE]), st.integers(0, 4),
              st.sampled_from([1, 2, 3, SIZE_UNKNOWN, -2]), st.integers(0, 3)),
    max_size=40)


@settings(max_examples=400, deadline=None)
@given(events_strategy, st.booleans())
def test_matches_reference_validator(events, strict):
    ops = [e[0] for e in events]
    ids = [e[1] for e in events]
    sizes = [e[2] for e in events]
    times = list(np.cumsum([e[3] if e[3] != 3 else -1 for e in events]))
    trace = Trace.from_columns(times, ops, ids, sizes, source="ref")
    expected = reference(ops, ids, sizes, times, strict)
    try:
        result, report = validate(trace, strict=strict)
    except TraceError as err:
        assert expected == ("error", err.event)
        return
    assert expected[0] == "ok"
    _, out_ids, out_sizes, keep = expected
    assert result.size.tolist() == out_sizes
    assert result.time_ns.tolist() == [times[i] for i in keep]
    # renamed ids: same positions renamed, to ids that are not used elsewhere
    for got, want, original in zip(result.id.tolist(), out_ids, [ids[i] for i in keep]):
        if want == original:
            assert got == original
        else:
            assert got not in ids
    assert len(set(result.id.tolist()) - set(ids)) == report.duplicate_allocs_renamed
    # bytes stay as recorded: valid now, and live bytes add up
    assert validate(result)[0] is result
    live = result.live_bytes()
    assert (live[-1] if len(live) else 0) == report.leaked_bytes


# ---------------------------------------------------------------------- speed
def big_trace(n: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    half = n // 2
    ids = np.arange(half)
    key = np.concatenate([rng.random(half), np.zeros(half)])
    key[half:] = key[:half] + rng.random(half) * 0.01
    order = np.argsort(key, kind="stable")
    sizes = rng.integers(1, 1 << 30, half)
    free_sizes = np.where(rng.random(half) < 0.5, sizes, SIZE_UNKNOWN)
    return Trace.from_columns(np.arange(n), np.repeat([OP_ALLOC, OP_FREE], half)[order],
                              np.concatenate([ids, ids])[order],
                              np.concatenate([sizes, free_sizes])[order])


def test_validates_a_million_events():
    # Speed is measured by benchmarks/formats.py, not asserted here.
    trace = big_trace(1_000_000)
    validate(trace)
    _, report = validate(trace, strict=False)
    assert report.free_sizes_filled > 0 and report.leaks == 0


# ---------------------------------------------------------------------- id matching in parts
# A long trace's ids are matched in parts (validate._PART_EVENTS): each part the events of a
# range of ids, so its sort finds what the whole sort finds. Held to the reference with parts
# of a few events each, and to the one whole sort on long traces with problems planted.
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([OP_ALLOC, OP_FREE]), st.integers(0, 40),
                          st.sampled_from([1, 2, 3, SIZE_UNKNOWN, -2]), st.integers(0, 3)),
                max_size=80), st.booleans())
def test_matches_reference_validator_in_parts(events, strict):
    from allocsim.traces import validate as module
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "_PART_EVENTS", 2)
        patch.setattr(module, "_MASK_BLOCK", 3)
        test_matches_reference_validator.hypothesis.inner_test(events, strict)


def _outcome(trace: Trace, strict: bool) -> tuple:
    try:
        result, report = validate(trace, strict=strict)
    except TraceError as err:
        return ("error", str(err))
    return ("ok", report, {name: getattr(result, name).tolist() for name in ("id", "size")})


@pytest.mark.parametrize("plant", ["none", "free-unknown", "double-alloc", "size-mismatch",
                                   "backwards", "leak"])
def test_parts_find_what_one_sort_finds(plant, monkeypatch):
    from allocsim.traces import validate as module
    trace = big_trace(60_000, seed=3)
    ops, ids, sizes, times = trace.op.copy(), trace.id.copy(), trace.size.copy(), trace.time_ns
    free_rows = np.flatnonzero(ops == OP_FREE)
    sized_frees = free_rows[sizes[free_rows] != SIZE_UNKNOWN]
    if plant == "free-unknown":
        ids[free_rows[20_000]] = 10**9
    elif plant == "double-alloc":
        ops[sized_frees[5_000]] = OP_ALLOC
    elif plant == "size-mismatch":
        sizes[sized_frees[7_000]] += 1
    elif plant == "backwards":
        times = times.copy()
        times[45_000] = times[44_000]
    elif plant == "leak":
        keep = np.ones(len(ops), dtype=bool)
        keep[free_rows[100:110]] = False
        ops, ids, sizes, times = ops[keep], ids[keep], sizes[keep], times[keep]
    planted = Trace.from_columns(times, ops, ids, sizes, source="big")
    parts: list[int] = []
    scan_part = module._scan_part
    monkeypatch.setattr(module, "_scan_part", lambda scan, order, *rest: (
        parts.append(len(order)), scan_part(scan, order, *rest)))
    for strict in (True, False):
        parts.clear()
        in_parts = _outcome(planted, strict)
        assert len(parts) > 3 and max(parts) < len(planted) // 2     # parts were used
        with monkeypatch.context() as whole:
            whole.setattr(module, "_MAX_PARTS", 1)
            assert in_parts == _outcome(planted, strict), (plant, strict)
        if plant == "none":
            assert in_parts[0] == "ok"
        elif plant != "leak" and (strict or plant in ("size-mismatch", "backwards")):
            assert in_parts[0] == "error", (plant, strict)
