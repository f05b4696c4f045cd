"""The replay's memory per event (issue 17.4): packed trace columns, the packed device-call log
and the block-wise timeline change no result.

The references (tests/data/replay_memory.json, by tests/make_replay_memory_refs.py) were
recorded from the engine before the change; here they are replayed with the engine's chunk,
the log's pack threshold and the timeline's block made tiny, so every chunk, pack and block
boundary is crossed many times. The compact structures are held to plain reference models.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from allocsim.policies import parse_policy
from allocsim.sim.kernel import engine, results, run_report
from allocsim.sim.kernel.device import SimulatedDevice, resolve_device
from allocsim.sim.kernel.engine import ProcessReplay, replay
from allocsim.sim.kernel.results import CallLog, LogColumn
from allocsim.traces import formats, synth
from allocsim.traces.formats.native.npz import read_npz, write_npz
from allocsim.traces.model import COLUMN_DTYPES, NO_TAG, OP_ALLOC, Trace, pack_column

sys.path.insert(0, str(Path(__file__).parent))

import make_replay_memory_refs as refs

REFERENCES: dict[str, object] = json.loads(refs.REFS.read_text())
TRACES = dict(refs.traces())


@pytest.fixture
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Engine chunks of 97 events, the call log packed at every chunk with 5+ entries, and
    timeline blocks of one bucket: every boundary the memory work added, crossed often."""
    monkeypatch.setattr(engine, "CHUNK_EVENTS", 97)
    monkeypatch.setattr(results.CallLog, "PACK_AT", 5)
    monkeypatch.setattr(run_report, "TIMELINE_BLOCK_EVENTS", 1)


def test_the_references_cover_every_case() -> None:
    expected = {refs.key(label, policy, device, capacity)
                for label in TRACES for policy in refs.POLICIES
                for device, capacity in refs.DEVICES}
    expected |= {"shared|" + refs.key(label, policy, device, capacity)
                 for label in refs.SHARED_LABELS for policy in refs.SHARED_POLICIES
                 for device, capacity in refs.DEVICES}
    assert expected == set(REFERENCES)


@pytest.mark.parametrize("label", sorted(TRACES))
def test_results_are_those_recorded_before_the_memory_work(label: str, tiny_chunks: None) -> None:
    trace = TRACES[label]
    differ = []
    for policy in refs.POLICIES:
        for device, capacity in refs.DEVICES:
            name = refs.key(label, policy, device, capacity)
            if refs.case(trace, policy, device, capacity) != REFERENCES[name]:
                differ.append(name)
            if label in refs.SHARED_LABELS and policy in refs.SHARED_POLICIES:
                if refs.shared_case(trace, policy, device, capacity) != REFERENCES["shared|"
                                                                                   + name]:
                    differ.append("shared|" + name)
    assert not differ


def test_results_do_not_depend_on_the_chunk_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = synth.generate("random", seed=5, events=5000, live=150)
    profile = resolve_device("t4-16g", "128MiB")
    expected = [replay(trace, p, profile).to_json_dict(timeline=True)
                for p in ("on-demand", "cuda-async", "bfc")]
    for chunk, pack_at, block in ((1, 1, 1), (1000, 1, 512), (4096, 3000, 7)):
        monkeypatch.setattr(engine, "CHUNK_EVENTS", chunk)
        monkeypatch.setattr(results.CallLog, "PACK_AT", pack_at)
        monkeypatch.setattr(run_report, "TIMELINE_BLOCK_EVENTS", block)
        got = [replay(trace, p, profile).to_json_dict(timeline=True)
               for p in ("on-demand", "cuda-async", "bfc")]
        assert got == expected, (chunk, pack_at, block)


def test_a_run_converts_its_events_to_lists_in_chunks_that_double() -> None:
    """A run that stops early (a min-capacity probe of a repeating trace stops once it
    repeats) converts few events: the first chunk of Python lists is FIRST_CHUNK_EVENTS, each
    next one twice the last, up to CHUNK_EVENTS."""
    trace = synth.generate("random", seed=5, events=200_000, live=150)
    run = ProcessReplay(trace, parse_policy("bfc"), SimulatedDevice(resolve_device("t4-16g")))
    loaded = []
    while run.next_index < len(trace):
        run.advance(run.next_index + 1)
        if not loaded or run._base != loaded[-1][0]:
            loaded.append((run._base, len(run._lists[0])))
    sizes = [size for _, size in loaded]
    first = engine.FIRST_CHUNK_EVENTS
    assert sizes[:6] == [first, 2 * first, 4 * first, 8 * first, 16 * first, 32 * first]
    assert max(sizes) == engine.CHUNK_EVENTS == 32 * first
    assert sum(sizes) == len(trace)


# ---------------------------------------------------------------------- packed trace columns
def test_pack_column_holds_a_column_in_the_least_memory() -> None:
    assert pack_column(np.full(5, 7, np.int64), np.int64) == 7
    assert pack_column(np.array([-1, 100], np.int64), np.int32).dtype == np.int8
    assert pack_column(np.array([-1, 40_000], np.int64), np.int64).dtype == np.int32
    assert pack_column(np.array([0, 300], np.int64), np.int32).dtype == np.int16
    assert pack_column(np.array([0, 1 << 40], np.int64), np.int64).dtype == np.int64
    assert pack_column(np.array([0, 1], np.int8), np.int8).dtype == np.int8     # op: as is
    assert pack_column(np.zeros(0, np.int64), np.int64).dtype == np.int64       # empty
    extreme = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max])
    assert np.array_equal(pack_column(extreme, np.int64), extreme)


def _columns(n: int = 1000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = np.arange(n, dtype=np.int64) // 2
    return {"time_ns": np.arange(n, dtype=np.int64) * 3_000_000_000,
            "op": (np.arange(n) % 2).astype(np.int8), "id": ids,
            "size": np.repeat(rng.integers(1, 1 << 20, n // 2), 2),
            "stream": np.zeros(n, np.int32), "process": np.full(n, 3, np.int32),
            "tag": (ids % 50).astype(np.int32)}


def test_a_packed_trace_reads_as_the_plain_one_and_unpacks_only_when_read() -> None:
    plain = Trace(**_columns(), tags=[f"t{i}" for i in range(50)])
    packed = Trace.from_owned_columns(_columns(), 1000, tags=list(plain.tags))
    assert packed.nbytes == 1000 * (8 + 1 + 2 + 4 + 1) < plain.nbytes == 1000 * 37
    assert packed.equals(plain) and plain.equals(packed)
    assert (packed.processes(), packed.streams(), packed.n_allocs, packed.duration_ns) == (
        plain.processes(), plain.streams(), plain.n_allocs, plain.duration_ns)
    assert packed.peak_live() == plain.peak_live()
    assert np.array_equal(packed.live_bytes(), plain.live_bytes())
    # column() reads without unpacking, read-only.
    before = packed.nbytes
    view = packed.column("tag")
    with pytest.raises(ValueError):
        view[0] = 1
    assert packed.nbytes == before and packed.column("stream").strides == (0,)
    # An attribute read unpacks that column for good: its dtype, writable, the same array.
    for name, dtype in COLUMN_DTYPES.items():
        column = getattr(packed, name)
        assert column.dtype == dtype and column.flags.writeable
        assert getattr(packed, name) is column
        assert np.array_equal(column, getattr(plain, name))
    assert packed.nbytes == plain.nbytes


def test_writers_of_a_packed_column_keep_working(tmp_path: Path) -> None:
    trace = synth.generate("training", seed=0, steps=2, layers=2)
    assert isinstance(trace._held["stream"], int)       # the generator left it defaulted
    trace.stream[3] = 2                                 # as importers and tests write them
    trace.tag[:] = NO_TAG
    assert trace.streams() == [0, 2] and int(trace.column("stream")[3]) == 2
    assert set(trace.column("tag").tolist()) == {NO_TAG}
    path = tmp_path / "t.npz"
    formats.save(trace, path)
    loaded = formats.load(path)
    assert loaded.equals(trace, metadata=False)
    loaded.time_ns = loaded.time_ns * 2                 # a whole column replaced
    assert loaded.duration_ns == 2 * trace.duration_ns and len(loaded) == len(trace)


def test_a_packed_trace_writes_the_same_file_bytes(tmp_path: Path) -> None:
    plain = Trace(**_columns(), tags=[f"t{i}" for i in range(50)], metadata={"name": "x"})
    packed = Trace.from_owned_columns(_columns(), 1000, tags=list(plain.tags),
                                      metadata={"name": "x"})
    files, arrays = [], []
    for trace in (plain, packed):
        stream = io.BytesIO()
        write_npz(trace, stream)
        files.append(stream.getvalue())
        with np.load(io.BytesIO(files[-1])) as npz:
            arrays.append({key: (npz[key].dtype, npz[key].tobytes()) for key in npz.files})
    assert arrays[0] == arrays[1]       # the same arrays, at the file's dtypes
    again = read_npz(files[1], "f.npz", "f")
    assert again.equals(plain, metadata=False) and again.nbytes < plain.nbytes


def test_packed_traces_select_copy_and_pickle() -> None:
    packed = Trace.from_owned_columns(_columns(), 1000, tags=[f"t{i}" for i in range(50)])
    plain = Trace(**_columns(), tags=list(packed.tags))
    mask = plain.id % 3 == 0
    assert packed.select(mask).equals(plain.select(mask))
    assert packed.select(np.arange(10)).equals(plain.select(np.arange(10)))
    assert packed.for_process(3).equals(plain.for_process(3), metadata=False)
    again = pickle.loads(pickle.dumps(packed))
    assert again.equals(plain) and again.nbytes == packed.nbytes
    other = copy.copy(packed)
    other.size[0] = 5                   # unpacks the copy's column only
    assert int(packed.column("size")[0]) == int(plain.size[0]) != 5


def test_matched_sizes_packed_are_the_int64_ones() -> None:
    trace = TRACES["random-unknown-free-sizes"]
    packed = Trace.from_owned_columns({name: trace.column(name).copy()
                                       for name in COLUMN_DTYPES}, len(trace))
    full = trace.matched_sizes()
    assert full.dtype == np.int64
    narrow = packed.matched_sizes(packed=True)
    assert narrow.dtype != np.int64 and np.array_equal(narrow, full)
    assert np.array_equal(packed.matched_sizes(), full)
    sizes = np.where(trace.op == OP_ALLOC, full, -full)
    assert packed.peak_live() == (int(np.cumsum(sizes).max()), int(np.argmax(np.cumsum(sizes))))


@pytest.fixture(scope="module")
def training() -> Trace:
    return synth.generate("training", seed=0, events=200_000)


def test_loading_and_replaying_leave_the_columns_packed(tmp_path: Path, training: Trace) -> None:
    trace = training
    path = tmp_path / "t.npz"
    formats.save(trace, path)
    loaded = formats.load(path)
    held = loaded.nbytes / len(loaded)
    assert held <= 18                   # time 8, op 1, id ≤ 4, size 4, tag 1; stream/process 0
    for policy in ("on-demand", "bfc", "cuda-async"):
        result = replay(loaded, policy, resolve_device("a100-80g"))
        assert result.to_json_dict(timeline=True) == replay(
            trace, policy, resolve_device("a100-80g")).to_json_dict(timeline=True)
    assert loaded.nbytes / len(loaded) == held          # the replay unpacked nothing


# ---------------------------------------------------------------------- the device-call log
def _filled(values: list[float] | list[int], typecode: str, packs: list[int]) -> LogColumn:
    column = LogColumn(typecode)
    for index, value in enumerate(values):
        if index in packs:
            column.pack()
        column.append(value)
    return column


@pytest.mark.parametrize("seed", range(6))
def test_a_log_column_gives_back_every_value_exactly(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    big = np.iinfo(np.int64)
    kinds = [rng.integers(0, 4, n),                                  # narrow steps
             rng.choice([512, 1 << 20, -(1 << 20), 7 << 30], n),     # few distinct: a table
             rng.integers(big.min, big.max, n, dtype=np.int64),       # wrapping steps
             np.cumsum(rng.integers(0, 1 << 40, n))]                  # wide, all distinct
    packs = sorted(set(rng.integers(0, n, 5).tolist()))
    for values in kinds:
        column = _filled(values.tolist(), "q", packs)
        assert len(column) == n
        assert np.array_equal(np.asarray(column), values)
        assert np.asarray(column, dtype=np.float64).dtype == np.float64
    costs = np.cumsum(rng.choice([14e-6, 50e-6 + 1e-7, 3e-3], n))
    costs[::7] *= -1.5                                               # any float, bit for bit
    column = _filled(costs.tolist(), "d", packs)
    assert np.asarray(column).tobytes() == costs.tobytes()
    special = [float("nan"), float("inf"), -0.0, 5e-324, 1.0]
    assert np.asarray(_filled(special, "d", [2])).tobytes() == np.array(special).tobytes()


def test_a_log_of_one_call_per_event_packs_to_a_few_bytes_a_call(training: Trace) -> None:
    trace = training
    run = ProcessReplay(trace, parse_policy("on-demand"), SimulatedDevice(
        resolve_device("a100-80g")), call_log=True)
    run.advance(run.n)
    log = run.report.call_log
    assert len(log) > 0.9 * len(trace)
    assert log.nbytes / len(log) < 5            # 24 unpacked
    assert np.asarray(run.report.call_events).dtype == np.int64


def _per_bucket_reference(events: np.ndarray, reserved: np.ndarray, cost: np.ndarray, n: int,
                          bucket: int) -> tuple[np.ndarray, np.ndarray]:
    """The engine's timeline before the change: the last call at or before every event."""
    starts = np.arange(0, n, bucket)
    last = np.minimum(starts + bucket, n) - 1
    position = np.searchsorted(events, np.arange(n), side="right") - 1
    after = np.where(position >= 0, reserved[np.maximum(position, 0)] if len(reserved)
                     else 0, 0)
    at_end = np.searchsorted(events, last, side="right") - 1
    costs = np.where(at_end >= 0, cost[np.maximum(at_end, 0)] if len(cost) else 0.0, 0.0)
    most = (np.maximum.reduceat(after, starts) if n else np.zeros(0, np.int64))
    return most, costs


@pytest.mark.parametrize("seed", range(12))
def test_per_bucket_is_the_per_event_reduction(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    calls = int(rng.integers(0, n + 1)) if n else 0
    # In event order, sometimes two entries for one event, sometimes past n.
    events = np.sort(rng.integers(0, n + 3, calls)) if calls else np.zeros(0, np.int64)
    reserved = rng.integers(0, 1 << 34, calls)
    cost = np.cumsum(rng.random(calls))
    log = CallLog()
    log.PACK_AT = 1
    cut = set(rng.integers(0, max(1, calls), 4).tolist())
    for index in range(calls):
        if index in cut:
            log.pack()                      # even between two entries of one event
        log.events.append(int(events[index]))
        log.reserved.append(int(reserved[index]))
        log.cost.append(float(cost[index]))
    for bucket in (1, 2, 7, max(1, n)):
        keep = events < n
        want = _per_bucket_reference(events[keep], reserved[keep], cost[keep], n, bucket)
        got = log.per_bucket(n, bucket)
        assert np.array_equal(got[0], want[0]) and got[0].dtype == np.int64
        assert got[1].tobytes() == want[1].astype(np.float64).tobytes()


# ------------------------------------------------- the timeline's buckets, kept as the run goes
def _both_ways(trace: Trace, policy: str, capacity: str, *, stop_on_call: bool = False,
               points: int | None = None) -> ProcessReplay:
    """A replay to the end that keeps the full log too; with ``stop_on_call`` advanced as the
    shared engine does (stopping after every event that made a device call)."""
    run = ProcessReplay(trace, parse_policy(policy), SimulatedDevice(
        resolve_device("t4-16g", capacity)), call_log=True)
    while run.next_index < run.n:
        run.advance(run.n, stop_on_call=stop_on_call)
    return run


@pytest.mark.parametrize("policy", (*refs.POLICIES, "pytorch:expandable_segments=true"))
@pytest.mark.parametrize("events", [1, 2, 2047, 2048, 2049, 6001])
def test_the_buckets_kept_as_the_run_goes_are_the_full_logs_reduction(
        policy: str, events: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Few timeline points, so buckets hold several events and their first event's call matters.
    monkeypatch.setattr(engine, "TIMELINE_POINTS", 64)
    trace = synth.generate("random", seed=events, events=events, live=40).select(
        np.arange(events))
    for capacity, stop_on_call in (("256MiB", False), ("48MiB", True)):    # OOMs at 48 MiB
        run = _both_ways(trace, policy, capacity, stop_on_call=stop_on_call)
        kept = run.report.buckets.arrays()
        want = run.report.call_log.per_bucket(run.n, run.report.buckets.bucket)
        assert len(kept[0]) == -(-run.n // run.report.buckets.bucket)
        assert np.array_equal(kept[0], want[0]) and kept[0].dtype == np.int64
        assert kept[1].tobytes() == want[1].tobytes()


def test_a_bucket_counts_the_bytes_before_it_unless_its_first_event_replaced_them() -> None:
    buckets = run_report.BucketSummary(n=9, bucket=3)
    buckets.close(-1, 0, 0.0)               # events 0-2: no call, nothing reserved
    buckets.first_call = 3
    buckets.close(100, 100, 1.0)            # 3-5: a call at 3 reserved 100
    buckets.first_call = 7
    buckets.close(40, 40, 2.0)              # 6-8: a call at 7 fell to 40; 100 held after 6
    assert buckets.arrays()[0].tolist() == [0, 100, 100]
    buckets = run_report.BucketSummary(n=6, bucket=3)
    buckets.first_call = 0
    buckets.close(100, 100, 1.0)
    buckets.first_call = 3
    buckets.close(40, 40, 2.0)              # the call at 3, its first event, fell to 40
    assert buckets.arrays()[0].tolist() == [100, 40]
    assert buckets.arrays()[1].tolist() == [1.0, 2.0]


def test_a_run_stopped_early_needs_the_call_log_for_its_timeline() -> None:
    trace = synth.generate("random", seed=1, events=3000, live=40)
    profile = resolve_device("a100-80g")
    run = ProcessReplay(trace, parse_policy("on-demand"), SimulatedDevice(profile))
    run.advance(1000)
    with pytest.raises(RuntimeError, match="call_log=True"):
        run.result(profile.label)
    logged = ProcessReplay(trace, parse_policy("on-demand"), SimulatedDevice(profile),
                           call_log=True)
    logged.advance(1000)
    want = logged.report.call_log.per_bucket(1000, 1)
    timeline = logged.result(profile.label).timeline
    assert np.array_equal(timeline.reserved, want[0])
    assert not run.report.keeps_call_log and ProcessReplay(
        trace, parse_policy("on-demand"), SimulatedDevice(profile), stop_on_oom=True
    ).report.keeps_call_log
