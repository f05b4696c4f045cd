"""traces/tpu_needed.py: a TPU program's trace with idle executables' code and scratch given up,
by hand-worked cases (the rule was read on the chip: tests/test_tpu_programs.py)."""

from __future__ import annotations

from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace
from allocsim.traces.tpu_needed import has_needed_view, needed_view

A, F = OP_ALLOC, OP_FREE


def _program() -> Trace:
    # state (id 0, 1000 B) placed; call 1 of "step": its code (id 1, 300 B) loaded, output
    # (id 2, 100 B); between calls a batch (id 3, 500 B) placed; call 2: output (id 4, 100 B).
    ops = [A, A, A, A, A, F, F, F, F]
    ids = [0, 1, 2, 3, 4, 2, 3, 4, 0]
    sizes = [1000, 300, 100, 500, 100, 100, 500, 100, 1000]
    facts = {"executables": [{"name": "step", "code_bytes": 300, "code_buffer": 1,
                              "scratch_bytes": 64}],
             "calls": [[0, 1, 3], [0, 4, 5]], "scratch_bytes": 64}
    return Trace.from_columns(list(range(9)), ops, ids, sizes, xla_tpu=facts)


def test_code_and_scratch_are_held_through_each_call_only() -> None:
    trace = _program()
    view = needed_view(trace)
    rows = list(zip(view.op.tolist(), view.id.tolist(), view.size.tolist()))
    assert rows == [(A, 0, 1000),
                    (A, 5, 300), (A, 6, 64), (A, 2, 100), (F, 5, 300), (F, 6, 64),  # call 1
                    (A, 3, 500),                                   # between: no code held
                    (A, 7, 300), (A, 8, 64), (A, 4, 100), (F, 7, 300), (F, 8, 64),  # call 2
                    (F, 2, 100), (F, 3, 500), (F, 4, 100), (F, 0, 1000)]
    # With room the runtime holds the code from call 1 on: 1000 + 300 + 100 + 500 + 100.
    assert trace.peak_live()[0] == 2000
    # What it cannot give up: the batch placed between calls needs no code beside it; call 2
    # needs 1000 + 100 + 500 + 300 + 64 + 100.
    assert view.peak_live()[0] == 2064
    assert view.metadata["xla_tpu"]["scratch_bytes"] == 0       # scratch is in the events
    assert view.metadata["xla_tpu"]["view"] == "needed"


def test_a_trace_that_does_not_say_where_its_calls_are_has_no_view() -> None:
    plain = Trace.from_columns([0, 1], [A, F], [0, 0], [512, 512])
    assert not has_needed_view(plain)
    assert needed_view(plain) is plain
    assert has_needed_view(_program())
    assert not has_needed_view(needed_view(_program()))      # a view is not viewed again
