"""A run that repeats itself has its tail copied, not run, and ends as the replay of every event.

sim/questions/run_repeats.py: where the trace repeats and the Python twin's run is seen to
repeat (its decision state equal a period apart, no device call between), the core runs only
through the first repeated period, recording what each event did, and copies that period to
the end (native/src/engine.hpp, Engine::tape and Engine::repeat); the policy's statistics at
the end are read a whole number of periods earlier, counts grown by a period's each period.
Held here: the core's whole state at the end (figures, samples, buckets, skipped events, the
device's, the policy's statistics, the limit window) equals the run of every event, for every
policy with an absolute decision state and the settings that change it, on traces whose last
period is whole and cut short; the copy is taken where it should be and not elsewhere; a copied
run's end answers a later run whose windows hold it; and the core refuses a tape that is not a
whole period ending where the run stands, or a copy that could not be a repeat.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from allocsim.policies import parse_policy
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.kernel.engine import TIMELINE_POINTS, ProcessReplay, replay
from allocsim.sim.kernel.native import core
from allocsim.sim.kernel.native import open_run as open_native_run
from allocsim.sim.questions import shared_runs
from allocsim.sim.questions.run_repeats import (
    DECISION_STATE,
    ORDER_ONLY_STATE,
    PYTHON_ROWS,
    core_moment,
    moment,
)
from allocsim.sim.questions.shared_runs import SharedRuns
from allocsim.traces.model import Trace
from allocsim.traces.synth import generate

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10
DEVICE = DeviceProfile("test", 80 * GiB)

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built")

COPIED = ["bfc", "bfc:garbage_collection=true", "bfc:allow_growth=false", "preallocate",
          "jax", "jax:preallocate=false", "cupy", "cupy:limit=64GiB", "pytorch",
          "pytorch:expandable_segments=true", "pytorch:max_split_size_mb=20",
          "pytorch:roundup_power2_divisions=4", "pytorch:per_process_memory_fraction=0.9",
          "pytorch:per_process_memory_fraction=0.9,garbage_collection_threshold=0.5",
          # the stream-ordered pool where its threshold keeps its memory: no call in a period
          "cuda-async:sync=none", "cuda-async:fraction=0.75", "jax:allocator=cuda_async"]
# No decision state known (buddy, on-demand, best-fit), or a run that repeats with a device
# call every period: the stream-ordered pool's default threshold of 0 releases each region
# freed whole, and the copy keeps the device still.
NEVER_COPIED = ["cuda-async", "buddy", "on-demand", "best-fit"]


@pytest.fixture(autouse=True)
def short_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy is tried on traces of any length here, its Python run given a quarter of it
    (the defaults leave traces under 65,536 events to the core whole)."""
    monkeypatch.setattr(shared_runs, "REPEAT_MIN_EVENTS", 0)
    monkeypatch.setattr(shared_runs, "REPEAT_SHARE", 4)


def steps(count: int, *, tail: int = 0) -> Trace:
    """A step of four events, repeated: a 64 KiB and a 30 MiB buffer taken, then freed; then
    ``tail`` events of one more step (a period cut short at the end)."""
    events: list[tuple[int, str, int, int | None]] = []
    for step in range(count + 1):
        a, b = 2 * step, 2 * step + 1
        for kind, buffer, size in (("alloc", a, 64 * KiB), ("alloc", b, 30 * MiB),
                                   ("free", a, None), ("free", b, None)):
            if step == count and len(events) >= 4 * count + tail:
                break
            events.append((len(events), kind, buffer, size))
    return Trace.from_events(events, name=f"steps-{count}-{tail}")


def two_streams_with_strays(count: int) -> Trace:
    """A step on stream 0 and one on stream 1, each taking and freeing two buffers, and a
    free of a buffer never taken (skipped, as the engine skips it: its size is given, as
    every free's is here, so none is taken from a matching alloc)."""
    events: list[tuple[int, str, int, int | None, int]] = []
    for step in range(count):
        stream, base = step % 2, 3 * step
        for kind, buffer, size in (("alloc", base, 96 * KiB), ("alloc", base + 1, 12 * MiB),
                                   ("free", base, 96 * KiB), ("free", 10**9 + step, 4096),
                                   ("free", base + 1, 12 * MiB)):
            events.append((len(events), kind, buffer, size, stream))
    return Trace.from_events(events, name="two-streams-with-strays")


TRACES = {
    "two streams, stray frees": lambda: two_streams_with_strays(4001),
    "training": lambda: generate("training", events=30_011),
    "training-longer": lambda: generate("training", events=41_357, seed=2),
    "steps, the last whole": lambda: steps(3000),
    "steps, the last cut short": lambda: steps(3000, tail=2),
}


def whole_state(trace: Trace, spec: str, device: DeviceProfile) -> dict[str, Any]:
    runs = SharedRuns(trace, timeline_points=TIMELINE_POINTS, share=False, repeats=False)
    state = runs.run(parse_policy(spec), device, stop_on_oom=True)
    assert state is not None and state.pop("repeated_from") is None
    return state


def assert_same_state(copied: dict[str, Any], whole: dict[str, Any]) -> None:
    assert copied.keys() == whole.keys()
    for key, value in whole.items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(copied[key], value), key
        else:
            assert copied[key] == value, key


@pytest.mark.parametrize("kind", TRACES)
@pytest.mark.parametrize("spec", COPIED)
def test_a_copied_run_ends_as_the_run_of_every_event(kind: str, spec: str) -> None:
    trace = TRACES[kind]()
    runs = SharedRuns(trace, timeline_points=TIMELINE_POINTS)
    copied = runs.repeated(parse_policy(spec), DEVICE)
    assert copied is not None, "the run repeats within a quarter of the trace"
    assert runs.repeated_runs == 1
    assert_same_state(copied, whole_state(trace, spec, DEVICE))


@pytest.mark.parametrize("spec", COPIED + NEVER_COPIED)
def test_replay_gives_the_whole_replays_result_whether_copied_or_not(spec: str) -> None:
    trace = TRACES["training"]()
    runs = SharedRuns(trace, timeline_points=TIMELINE_POINTS)
    result = runs.replay(spec, DEVICE)
    assert runs.repeated_runs == (spec in COPIED)
    expected = replay(trace, spec, DEVICE, stop_on_oom=True)
    assert result.to_json_dict(timeline=True) == expected.to_json_dict(timeline=True)


def leaking_steps(count: int = 2000) -> Trace:
    """Each step leaks a 4 KiB buffer beside a 64 KiB scratch one: the events repeat every
    three, the runs never do (the pool grows)."""
    events: list[tuple[int, str, int, int | None]] = []
    for step in range(count):
        events += [(len(events), "alloc", 2 * step, 64 * KiB),
                   (len(events) + 1, "alloc", 2 * step + 1, 4 * KiB),
                   (len(events) + 2, "free", 2 * step, None)]
    return Trace.from_events(events, name="leaking-steps")


@pytest.mark.parametrize("spec", ["bfc", "cupy", "pytorch"])
def test_a_run_that_does_not_repeat_is_run_whole(spec: str) -> None:
    trace = leaking_steps()
    runs = SharedRuns(trace, timeline_points=TIMELINE_POINTS)
    assert runs.repeated(parse_policy(spec), DEVICE) is None
    small = DeviceProfile("small", 6 * MiB)       # and where the leaks end in an OOM
    assert runs.replay(spec, small).to_json_dict(timeline=True) == replay(
        trace, spec, small, stop_on_oom=True).to_json_dict(timeline=True)
    assert runs.repeated_runs == 0


def test_a_run_that_repeats_with_device_calls_is_seen_to_repeat_and_run_whole() -> None:
    """The stream-ordered pool with its default threshold unmaps and maps a region every
    step: its run repeats by place (a probe stops there) but is not copied."""
    trace = TRACES["training"]()
    runs = SharedRuns(trace, timeline_points=TIMELINE_POINTS)
    spec = parse_policy("cuda-async")
    assert runs.repeated(spec, DEVICE) is None
    period = shared_runs.find_period(trace)
    assert period is not None
    probe = runs.run(spec, DEVICE, stop_on_oom=True, period=period)
    assert probe is not None and probe["repeated_from"] is not None
    whole = whole_state(trace, "cuda-async", DEVICE)
    assert probe["device"]["calls"] < whole["device"]["calls"], "calls in every period"


def test_every_policy_whose_state_is_known_is_checked_by_the_core() -> None:
    """min-capacity's probes of a repeating trace run in the core for every policy whose
    decision state is known (sim/questions/capacity/oracle.py keeps no Python hand-over)."""
    assert set(PYTHON_ROWS) == set(DECISION_STATE) | set(ORDER_ONLY_STATE)


def test_a_copied_runs_end_answers_a_later_run_whose_windows_hold_it() -> None:
    trace = TRACES["training"]()
    runs = SharedRuns(trace, timeline_points=TIMELINE_POINTS)
    first = runs.replay("pytorch:per_process_memory_fraction=0.9", DEVICE)
    second = runs.replay("pytorch:per_process_memory_fraction=0.95", DEVICE)
    assert runs.repeated_runs == 2 and len(runs._ends) == 1
    assert len(next(iter(runs._ends.values()))) == 1, "the second was the first's end"
    for spec, result in (("pytorch:per_process_memory_fraction=0.9", first),
                         ("pytorch:per_process_memory_fraction=0.95", second)):
        assert result.to_json_dict(timeline=True) == replay(
            trace, spec, DEVICE, stop_on_oom=True).to_json_dict(timeline=True)


ROW_SPECS = ["bfc", "bfc:garbage_collection=true", "preallocate", "cupy", "pytorch",
             "pytorch:expandable_segments=true", "pytorch:max_split_size_mb=20",
             "pytorch:per_process_memory_fraction=0.5,garbage_collection_threshold=0.5"]
# The stream-ordered pool's rows are by place, its whole state (regions included).
PLACE_SPECS = ["cuda-async", "cuda-async:sync=none", "cuda-async:fraction=0.3",
               "jax:allocator=cuda_async", "cuda-async:fraction=0.3,sync=none,preallocate=true"]
ROW_TRACES = {
    "training": lambda: generate("training", events=1500),
    "transformer": lambda: generate("transformer", events=1500),
    "random, two streams": lambda: generate("random", events=1500, streams=2, live=120,
                                            max_size=48 << 20, seed=7),
}
ROOMY, TIGHT = DeviceProfile("roomy", 80 * GiB), DeviceProfile("tight", 3 * GiB)


def python_run(trace: Trace, spec: str, device: DeviceProfile) -> ProcessReplay:
    return ProcessReplay(trace, parse_policy(spec), SimulatedDevice(device), stop_on_oom=True,
                         call_log=False)


@pytest.mark.parametrize("device", [ROOMY, TIGHT], ids=["roomy", "tight"])
@pytest.mark.parametrize("kind", ROW_TRACES)
@pytest.mark.parametrize("spec", ROW_SPECS + PLACE_SPECS)
def test_the_cores_decision_rows_are_its_python_twins_after_every_event(
        spec: str, kind: str, device: DeviceProfile) -> None:
    """native/src's decision_rows and place_rows against run_repeats.py's chunk_rows,
    pytorch_rows, cupy_rows and cuda_async_rows: the same rows (garbage collection's ages,
    unmapped blocks, a second stream's pools, arenas and owners included), the same device
    side (calls; by place, the memory handed out) and the same live buffers at the same
    addresses or places (the Python twin's moment)."""
    trace = ROW_TRACES[kind]()
    python = python_run(trace, spec, device)
    run = opened(trace, spec, device)
    rows_of = PYTHON_ROWS[type(python.policy)]
    for event in range(1, len(trace) + 1):
        python.advance(event)
        run.advance(event)
        if python.stopped:
            break
        in_core = core_moment(run)
        assert in_core is not None
        assert np.array_equal(in_core.rows, rows_of(python.policy)), event
        _, device_side, live = moment(python)
        assert in_core.device == device_side and in_core.live == live, event
        assert in_core.calls == python.view.calls, event


def frozen(value: Any) -> Any:
    """A hashable form of a decision state in which equal states are equal (dicts and sets
    by their sorted items; lists and tuples in their order, which may decide)."""
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, frozen(v)) for k, v in value.items())))
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted(value)))
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


@pytest.mark.parametrize("device", [ROOMY, TIGHT], ids=["roomy", "tight"])
@pytest.mark.parametrize("kind", ROW_TRACES)
@pytest.mark.parametrize("spec", ROW_SPECS)
def test_between_device_calls_the_rows_change_exactly_when_the_decision_state_does(
        spec: str, kind: str, device: DeviceProfile) -> None:
    """The rows leave out what only a device call changes (regions, segments, the pool,
    limits, the order of the pools): so between two events with no call between them, the
    Python twin's whole decision state (DECISION_STATE's, what min-capacity's Python runs
    compare) is the same exactly when its rows are."""
    trace = ROW_TRACES[kind]()
    python = python_run(trace, spec, device)
    state_of = DECISION_STATE[type(python.policy)]
    rows_of = PYTHON_ROWS[type(python.policy)]
    stretch: dict[str, dict[Any, Any]] = {"state": {}, "rows": {}}
    calls = -1
    for event in range(1, len(trace) + 1):
        python.advance(event)
        if python.stopped:
            break
        if python.view.calls != calls:
            calls, stretch = python.view.calls, {"state": {}, "rows": {}}
        state, rows = frozen(state_of(python.policy)), rows_of(python.policy).tobytes()
        assert stretch["state"].setdefault(state, rows) == rows, event
        assert stretch["rows"].setdefault(rows, state) == state, event


@pytest.mark.parametrize("device", [ROOMY, TIGHT], ids=["roomy", "tight"])
@pytest.mark.parametrize("kind", ROW_TRACES)
@pytest.mark.parametrize("spec", PLACE_SPECS)
def test_rows_by_place_change_exactly_when_the_order_only_state_does(
        spec: str, kind: str, device: DeviceProfile) -> None:
    """The stream-ordered pool's rows hold its whole order-only state (ORDER_ONLY_STATE's,
    what its Python runs compare: chunks, regions, owners, streams, the indexes' order, the
    pending preallocation), device calls or not: over the whole run the state is the same
    exactly when its rows are."""
    trace = ROW_TRACES[kind]()
    python = python_run(trace, spec, device)
    places_of = ORDER_ONLY_STATE[type(python.policy)]
    rows_of = PYTHON_ROWS[type(python.policy)]
    seen: dict[str, dict[Any, Any]] = {"state": {}, "rows": {}}
    for event in range(1, len(trace) + 1):
        python.advance(event)
        if python.stopped:
            break
        state, rows = frozen(places_of(python.policy)[0]), rows_of(python.policy).tobytes()
        assert seen["state"].setdefault(state, rows) == rows, event
        assert seen["rows"].setdefault(rows, state) == state, event


def opened(trace: Trace, spec: str, device: DeviceProfile = DEVICE) -> Any:
    run = open_native_run(trace, parse_policy(spec), device, stop_on_oom=True,
                          timeline_points=TIMELINE_POINTS)
    assert run is not None
    return run


def test_the_core_copies_only_a_whole_period_ending_where_the_run_stands() -> None:
    trace = steps(100)
    run = opened(trace, "pytorch")
    run.advance(40)
    run.tape(48)
    assert not run.repeat(4), "the tape is 8 events long, not one period of 4"
    assert not run.repeat(8 + 1)
    run.advance(52)                             # past the tape's end without taping
    assert not run.repeat(4)
    run.tape(56)
    assert run.repeat(4)
    assert run.state()["next_index"] == len(trace)
    with pytest.raises(RuntimeError, match="not a state to save"):
        run.snapshot()


def test_the_core_refuses_to_copy_a_run_that_keeps_every_mallocs_answer() -> None:
    trace = steps(100)
    run = open_native_run(trace, parse_policy("pytorch"), DEVICE, stop_on_oom=True,
                          timeline_points=TIMELINE_POINTS, record_addresses=True)
    assert run is not None
    run.advance(40)
    run.tape(44)
    assert not run.repeat(4)


def test_the_core_refuses_a_period_with_a_device_call() -> None:
    trace = steps(100)
    run = opened(trace, "pytorch")
    run.tape(4)                                 # the first step reserves the segments
    assert run.state()["device"]["calls"] > 0
    assert not run.repeat(4)


def test_a_period_that_leaks_is_no_repeat_and_its_copy_fails_loudly() -> None:
    trace = leaking_steps()
    run = opened(trace, "pytorch")
    run.advance(3000)
    run.tape(3003)                              # a step that leaks 4 KiB
    with pytest.raises(RuntimeError, match="does not leave the allocated bytes"):
        run.repeat(3)
