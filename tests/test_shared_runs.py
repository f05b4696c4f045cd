"""Shared runs (issue 39, part 2): a run resumed from a saved state of an earlier run is the
run from event 0, byte for byte.

sim/questions/shared_runs.py resumes a probe at capacity C from the latest saved state
whose windows hold C: the device's (every call so far answered alike at C) and the policy's
limit window (policies/limit_window.py, native/src/limit_window.hpp: every decision against a
limit derived from the capacity gone alike). Held here: for every policy and the settings that
change how it reads the capacity, on the bundled trace, a repeating training trace, random
traces and a trace whose peak comes last, the shared search asks the same capacities, gets the
same answers (the checks above the answer included) and every probe ends in the same state as
the search whose probes all start at event 0; that the windows are tight enough to be useful
(resumes happen and skip most of the events where the trace's peak comes late); that the
Python models and the native core keep the same limit window, rule for rule; and that tune,
whose fractions on one card share runs the same way, answers as with a replay per setting.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import pytest

from allocsim.policies import PolicySpec, parse_policy
from allocsim.policies.limit_window import NO_LOWER, NO_UPPER
from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.kernel.engine import ProcessReplay
from allocsim.sim.kernel.native import core
from allocsim.sim.kernel.native import open_run as open_native_run
from allocsim.sim.questions.capacity import minimum as capacity
from allocsim.sim.questions.shared_runs import SharedRuns
from allocsim.sim.questions.tune.recommend import tune
from allocsim.sim.questions.tune.search import local_evaluator
from allocsim.traces.bundled import load_default_trace
from allocsim.traces.model import Trace
from allocsim.traces.synth import generate

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10
DEVICE = DeviceProfile("test", 80 * GiB)

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built")

SETTINGS = [
    "on-demand", "buddy", "best-fit",
    "bfc", "bfc:allow_growth=false", "bfc:fraction=0.6", "bfc:garbage_collection=true",
    "bfc:fraction=0.7,garbage_collection=true", "bfc:fragmentation_fraction=0.05",
    "preallocate", "preallocate:fraction=0.3",
    "pytorch", "pytorch:per_process_memory_fraction=0.8",
    "pytorch:per_process_memory_fraction=0.9,garbage_collection_threshold=0.5",
    "pytorch:expandable_segments=true", "pytorch:max_split_size_mb=20",
    "cupy", "cupy:fraction=0.9", "cupy:limit=64GiB",
    "cuda-async", "cuda-async:fraction=0.75,preallocate=true", "cuda-async:sync=none",
    "jax", "jax:preallocate=false", "jax:allocator=cuda_async", "tpu",
]


def late_peak(steps: int = 600) -> Trace:
    """Steps of scratch buffers over a slowly growing set of kept ones, the biggest buffers at
    the very end: no capacity near the answer decides anything before the last events."""
    events: list[tuple[int, str, int, int | None]] = []
    next_id = 0
    for step in range(steps):
        scratch = next_id
        events.append((len(events), "alloc", scratch, (64 + step % 7) * KiB))
        if step % 5 == 0:
            events.append((len(events), "alloc", next_id + 1, 256 * KiB))   # kept
        events.append((len(events), "free", scratch, None))
        next_id += 2
    for k in range(6):      # big buffers freed and asked again bigger: a tight card's cache
        big = next_id + k    # is released (and a BFC region backs off) before the last ones
        events.append((len(events), "alloc", big, (20 + 6 * k) * MiB + 4 * KiB))
        if k % 2 == 0:
            events.append((len(events), "free", big, None))
    return Trace.from_events(events, name="late-peak")


@functools.cache
def traces() -> dict[str, tuple[Trace, int]]:
    """Each trace with the resolution it is searched at."""
    return {
        "bundled": (load_default_trace(), 4 * MiB),
        "training": (generate("training", events=5000), 4 * MiB),
        "random": (generate("random", events=2500, live=150, max_size=32 << 20, seed=3),
                   MiB // 4),
        "random-2-streams": (generate("random", events=2500, live=100, max_size=64 << 20,
                                      streams=2, seed=4), MiB // 4),
        "late-peak": (late_peak(), MiB // 4),
    }


def _search(trace: Trace, policy: str, resolution: int, share: bool,
            monkeypatch: pytest.MonkeyPatch) -> tuple[dict, dict[int, bool], list]:
    """The search's answer, every capacity it asked about with its answer, and every native
    probe's capacity and final state, in order."""
    probes: list[tuple[int, dict[str, Any]]] = []
    run = SharedRuns.run

    def noted(self: SharedRuns, spec: PolicySpec, profile: DeviceProfile, *,
              stop_on_oom: bool, **given: Any) -> dict[str, Any] | None:
        state = run(self, spec, profile, stop_on_oom=stop_on_oom, **given)
        probes.append((profile.capacity, state))
        return state

    with monkeypatch.context() as patch:
        patch.setattr(SharedRuns, "run", noted)
        asked: dict[int, bool] = {}
        answer = capacity._min_capacity(trace, policy, DEVICE, resolution, shortcuts=True,
                                        share=share, asked=asked)
    return answer.to_json_dict(), asked, probes


def _comparable(state: dict[str, Any] | None) -> object:
    """A probe's state with its arrays as bytes (their dtype too), to compare byte for byte."""
    if state is None:
        return None
    if isinstance(state, dict):
        return {key: _comparable(value) for key, value in state.items()}
    if isinstance(state, np.ndarray):
        return (state.dtype.str, state.tobytes())
    if isinstance(state, tuple | list):
        return [_comparable(value) for value in state]
    return state


@pytest.mark.parametrize("trace_name", ["bundled", "training", "random", "random-2-streams",
                                        "late-peak"])
@pytest.mark.parametrize("policy", SETTINGS)
def test_the_shared_search_is_the_plain_search_probe_for_probe(
        policy: str, trace_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    trace, resolution = traces()[trace_name]
    shared = _search(trace, policy, resolution, True, monkeypatch)
    plain = _search(trace, policy, resolution, False, monkeypatch)
    assert shared[0] == plain[0]            # answer, checks, exceptions, evaluations
    assert shared[1] == plain[1]            # every capacity asked, in order, and its answer
    assert list(shared[1]) == list(plain[1])
    assert [c for c, _ in shared[2]] == [c for c, _ in plain[2]]
    for (at, state), (_, expected) in zip(shared[2], plain[2], strict=True):
        if state is not None and expected is not None and (
                state["repeated_from"] is not None or expected["repeated_from"] is not None):
            # A run that repeats itself stops at the first boundary it is seen to repeat
            # from, which a resumed run may have started past: it stops later, with the same
            # outcome and the same windows (no device call after the first repeat, and the
            # same decisions against the limit) — what the search keeps of it.
            assert _outcome(state) == _outcome(expected), f"the probe at {at:,} B"
            continue
        assert _comparable(state) == _comparable(expected), f"the probe at {at:,} B"


def _outcome(state: dict[str, Any]) -> tuple[Any, ...]:
    device = state["device"]
    return (state["ooms"], state["stopped"], device["granted_most"], device["refused_least"],
            device["peak_reserved"], device["peak_used"], tuple(state["limit_window"]))


@pytest.mark.parametrize("policy", ["bfc", "bfc:fraction=0.6", "pytorch",
                                    "pytorch:per_process_memory_fraction=0.8", "cupy",
                                    "cupy:fraction=0.9", "cuda-async", "cuda-async:fraction=0.75",
                                    "cuda-async:fraction=0.75,sync=none"])
def test_probes_near_a_late_peak_resume_from_saved_states(policy: str) -> None:
    """Where nothing near the answer is decided before the trace's last events, every probe
    after the first resumes, and the search's few to forty probes replay the events of less
    than one and a half replays."""
    trace, resolution = traces()["late-peak"]
    made: list[SharedRuns] = []
    init = SharedRuns.__init__

    def kept(self: SharedRuns, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SharedRuns, "__init__", kept)
        answer = capacity._min_capacity(trace, policy, DEVICE, resolution, shortcuts=True)
    runs = answer.evaluations
    assert runs >= 3
    shared = made[0]
    assert shared.resumed >= runs - 2
    assert shared.events_run < 1.5 * len(trace)


def _resumes(trace: Trace, policy: str, resolution: int, grid: bool
             ) -> tuple[list[tuple[int, int]], int]:
    """Each run of the search (its capacity and the event it resumed at) and the states its
    runs saved; ``grid=False``: the runs save as though any capacity might come."""
    runs: list[tuple[int, int]] = []
    saves: list[int] = []
    run, save, init = SharedRuns.run, SharedRuns._save, SharedRuns.__init__

    def noted(self: SharedRuns, spec: PolicySpec, profile: DeviceProfile, **given: Any) -> Any:
        before = self.events_resumed
        state = run(self, spec, profile, **given)
        runs.append((profile.capacity, self.events_resumed - before))
        return state

    def counted(self: SharedRuns, *args: Any) -> Any:
        saves.append(1)
        return save(self, *args)

    def made(self: SharedRuns, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if not grid:
            self.grid = None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SharedRuns, "run", noted)
        patch.setattr(SharedRuns, "_save", counted)
        patch.setattr(SharedRuns, "__init__", made)
        capacity._min_capacity(trace, policy, DEVICE, resolution, shortcuts=True)
    return runs, len(saves)


@pytest.mark.parametrize("trace_name", ["random", "late-peak", "training"])
@pytest.mark.parametrize("policy", [
    "bfc", "bfc:allow_growth=false", "bfc:fragmentation_fraction=0.05", "preallocate",
    "pytorch", "pytorch:per_process_memory_fraction=0.8", "pytorch:expandable_segments=true",
    "cupy:fraction=0.9", "cuda-async:fraction=0.75,preallocate=true", "jax"])
def test_a_search_saves_only_states_another_of_its_capacities_could_resume_from(
        policy: str, trace_name: str) -> None:
    """min-capacity asks each capacity of its resolution's grid once, so a run stops saving
    once its windows hold neither grid capacity next to its own: every run of the search
    still resumes where it resumed when every state was saved."""
    trace, resolution = traces()[trace_name]
    on_grid, saved = _resumes(trace, policy, resolution, grid=True)
    every, saved_before = _resumes(trace, policy, resolution, grid=False)
    assert on_grid == every
    assert saved <= saved_before


@pytest.mark.parametrize("policy", ["bfc:fraction=0.6", "pytorch:per_process_memory_fraction=0.8",
                                    "cupy:fraction=0.9", "cuda-async:fraction=0.75", "best-fit"])
def test_a_run_s_windows_read_without_a_copy_are_those_its_snapshot_holds(policy: str) -> None:
    trace, _ = traces()["late-peak"]
    run = open_native_run(trace, parse_policy(policy), DEVICE.device_with(160 * MiB),
                          stop_on_oom=True, timeline_points=100)
    assert run is not None
    seen = set()
    for end in np.linspace(0, len(trace), 9).astype(int)[1:].tolist():
        run.advance(end)
        state = run.snapshot()
        windows = (state.granted_most, state.refused_least, state.limit_lo, state.limit_hi)
        assert run.windows() == windows, f"after {end}"
        seen.add(windows)
    assert len(seen) > 1                    # the windows moved as the run went on


def test_a_run_whose_first_region_follows_the_capacity_saves_nothing() -> None:
    """A preallocating BFC takes a region of its limit at the first malloc: a run at any other
    capacity differs in a constant and never resumes from its states, so none is saved (every
    one was, before the search knew its grid)."""
    trace, resolution = traces()["late-peak"]
    runs, saved = _resumes(trace, "preallocate", resolution, grid=True)
    _, saved_before = _resumes(trace, "preallocate", resolution, grid=False)
    assert all(start == 0 for _, start in runs)
    assert saved == 0 < saved_before


@pytest.mark.parametrize("policy", [name for name in SETTINGS if name != "tpu"])
def test_what_a_run_takes_from_the_capacity_never_falls_as_the_capacity_rises(
        policy: str) -> None:
    """The grid rule's premise (shared_runs.py, ``_neighbours``): each constant of a run that
    follows the capacity — the limit, a first region, a split threshold, whether there is a
    limit, the device's own share where the card is smaller than it — is a number that never
    falls as the capacity rises, so windows that hold neither grid neighbour of a run hold no
    capacity beyond them."""
    trace, _ = traces()["random"]
    device = DEVICE.device_with(None, 3 * GiB // 2)     # a share larger than the small cards
    cards = [card * MiB for card in (256, 1024, 1536, 1537, 4096, 4097, 65536, 65537)]
    runs = [open_native_run(trace, parse_policy(policy), device.device_with(card, 3 * GiB // 2),
                            stop_on_oom=True, timeline_points=100) for card in cards]
    assert all(run is not None for run in runs)
    for part in ("config", "device"):
        values = [getattr(run, part) for run in runs if run is not None]
        for key in values[0]:
            seen = [value[key] for value in values]
            if key == "capacity" or len({repr(value) for value in seen}) == 1:
                continue
            assert all(isinstance(value, int | float) for value in seen), (part, key, seen)
            assert seen == sorted(seen), (part, key, seen)


def _windows_alike(policy: str, capacity_bytes: int, trace: Trace) -> None:
    profile = DEVICE.device_with(capacity_bytes)
    python = ProcessReplay(trace, parse_policy(policy), SimulatedDevice(profile),
                           call_log=False)
    native = open_native_run(trace, parse_policy(policy), profile, stop_on_oom=False,
                             timeline_points=100)
    assert native is not None
    holder = python.policy
    window = getattr(holder, "limit_window", None) or holder.release.limit_window
    for end in np.linspace(0, len(trace), 9).astype(int)[1:].tolist():
        python.advance(end)
        native.advance(end)
        assert window.as_tuple() == tuple(native.state()["limit_window"]), f"after {end}"


@pytest.mark.parametrize("policy", ["bfc:fraction=0.6", "bfc:fraction=0.7,garbage_collection=true",
                                    "pytorch:per_process_memory_fraction=0.8",
                                    "pytorch:per_process_memory_fraction=0.9,"
                                    "garbage_collection_threshold=0.5", "cupy:fraction=0.9",
                                    "cuda-async:fraction=0.75", "cuda-async:fraction=0.5,sync=none",
                                    "cuda-async:fraction=0.75,preallocate=true",
                                    "jax:allocator=cuda_async"])
@pytest.mark.parametrize("trace_name", ["random", "random-2-streams", "late-peak"])
def test_the_python_models_and_the_core_keep_the_same_limit_window(policy: str,
                                                                   trace_name: str) -> None:
    """The twins' limit windows, noted by the same rules, agree through a run that meets its
    limit (cards from a little over the trace's peak live bytes to twice it)."""
    trace, _ = traces()[trace_name]
    peak = trace.peak_live()[0]
    for over in (1.05, 1.2, 1.4, 1.7, 2.0):
        _windows_alike(policy, int(peak * over), trace)


def _decisions(policy: str, profile: DeviceProfile, trace: Trace) -> list[object]:
    """The core's whole decision state (rows, device calls, live buffers' places) at eight
    points of a run: two runs that decided alike have the same."""
    run = open_native_run(trace, parse_policy(policy), profile, stop_on_oom=False,
                          timeline_points=100)
    assert run is not None
    seen = []
    for end in np.linspace(0, len(trace), 9).astype(int)[1:].tolist():
        run.advance(end)
        seen.append(_comparable(list(run.decision_state())))
    return seen


@pytest.mark.parametrize("setting", ["fraction=0.75", "fraction=0.5,sync=none",
                                     "fraction=0.75,preallocate=true"])
@pytest.mark.parametrize("trace_name", ["random", "random-2-streams", "late-peak"])
def test_a_pool_run_under_a_threshold_at_its_window_s_edge_decides_alike(
        setting: str, trace_name: str) -> None:
    """The window is no wider than the decisions allow: a run of the stream-ordered pool
    whose release threshold is set to either end of the window its fraction's run noted
    (the threshold most likely to decide otherwise) makes that run's every decision, on cards
    from a little over the trace's peak live bytes to twice it."""
    trace, _ = traces()[trace_name]
    peak = trace.peak_live()[0]
    edges_tried = 0
    for over in (1.05, 1.2, 1.4, 1.7, 2.0):
        profile = DEVICE.device_with(int(peak * over))
        run = open_native_run(trace, parse_policy(f"cuda-async:{setting}"), profile,
                              stop_on_oom=False, timeline_points=100)
        assert run is not None
        run.advance(len(trace))
        lo, hi = run.state()["limit_window"]
        threshold = int(run.config["threshold"])
        assert lo <= threshold <= hi
        rest = ",".join(part for part in setting.split(",") if not part.startswith("fraction"))
        expected = _decisions(f"cuda-async:{setting}", profile, trace)
        for edge in {lo, hi} - {threshold, NO_LOWER, NO_UPPER}:
            if edge < 1:                # 0 is no threshold: a decision of its own
                continue
            edges_tried += 1
            given = f"cuda-async:release_threshold={edge}" + (f",{rest}" if rest else "")
            assert _decisions(given, profile, trace) == expected, (over, edge)
    assert edges_tried         # the trace reached the threshold somewhere


def test_a_limit_decision_narrows_the_window_where_it_is_made() -> None:
    """BFC under a limit too small for a request: Extend's refusal bounds the window above,
    each region it makes bounds it below."""
    trace, _ = traces()["late-peak"]
    policy = parse_policy("bfc:memory_limit=40MiB")
    run = ProcessReplay(trace, policy, SimulatedDevice(DEVICE), call_log=False)
    run.advance(run.n)
    lo, hi = run.policy.limit_window.as_tuple()         # type: ignore[attr-defined]
    assert run.report.ooms and lo <= 40 * MiB <= hi and hi < 1 << 40


def test_the_pools_release_threshold_is_noted_where_a_trim_reads_it() -> None:
    """The stream-ordered pool with three 2 MiB chunks mapped under a 5 MiB threshold: a free
    that leaves one wholly free is a synchronisation over the threshold (6 MiB > t), and the
    trim keeps that chunk (6 − 2 < t): every threshold in (4, 6) MiB decides alike, and 4 MiB
    would have released it, 6 MiB not trimmed at all."""
    device = SimulatedDevice(DEVICE.device_with(64 * MiB))
    policy = parse_policy("cuda-async:release_threshold=5MiB").build(device.view(0))
    a, _, _ = (policy.malloc(2 * MiB) for _ in range(3))
    assert policy.limit_window.as_tuple() == (NO_LOWER, NO_UPPER)   # no sync yet
    policy.free(a)
    assert policy.mapped == 6 * MiB                                  # kept
    assert policy.limit_window.as_tuple() == (4 * MiB + 1, 6 * MiB - 1)


def test_a_pool_sync_at_or_under_its_threshold_notes_that_it_kept_everything() -> None:
    """Under an 8 MiB threshold the same free keeps the 6 MiB mapped without a trim: every
    threshold from 6 MiB up decides alike; a free that leaves no chunk wholly free reads no
    threshold at all."""
    device = SimulatedDevice(DEVICE.device_with(64 * MiB))
    policy = parse_policy("cuda-async:release_threshold=8MiB").build(device.view(0))
    a, b, _, _ = policy.malloc(2 * MiB), policy.malloc(MiB), policy.malloc(MiB), \
        policy.malloc(2 * MiB)                  # b and the next share the second chunk
    policy.free(b)
    assert policy.mapped == 6 * MiB
    assert policy.limit_window.as_tuple() == (NO_LOWER, NO_UPPER)
    policy.free(a)
    assert policy.mapped == 6 * MiB
    assert policy.limit_window.as_tuple() == (6 * MiB, NO_UPPER)


def test_a_pool_threshold_under_what_is_mapped_narrows_the_window_from_above() -> None:
    """Under a 3 MiB threshold the same free releases the chunk (6 − 2 ≥ 3) and, 4 MiB left
    and still over 3, looks on for another: every threshold under 4 MiB decides alike (at
    4 MiB the trim would have stopped there)."""
    device = SimulatedDevice(DEVICE.device_with(64 * MiB))
    policy = parse_policy("cuda-async:release_threshold=3MiB").build(device.view(0))
    a, _, _ = (policy.malloc(2 * MiB) for _ in range(3))
    policy.free(a)
    assert policy.mapped == 4 * MiB
    assert policy.limit_window.as_tuple() == (NO_LOWER, 4 * MiB - 1)


def _pytorch_gc(capacity: int) -> Any:
    """PyTorch's allocator with its whole card allowed (a fraction of 1.0) and garbage
    collection at half of it."""
    device = SimulatedDevice(DEVICE.device_with(capacity))
    return parse_policy("pytorch:per_process_memory_fraction=1.0,"
                        "garbage_collection_threshold=0.5").build(device.view(0))


def test_pytorch_garbage_collection_notes_its_threshold_as_a_decision_on_the_maximum() -> None:
    """100 MiB allowed, collection over 50 MiB. a (12 MiB) and b (40 MiB) are made while the
    pool is under the threshold; a freed, c (20 MiB) misses with 52 MiB held: over 50 (a
    maximum of 104 MiB would not have collected), collection releases a, and 40 MiB held is
    enough (under a maximum of 80 MiB it would not have been). Every maximum in
    [80, 104) MiB decides alike."""
    policy = _pytorch_gc(100 * MiB)
    a = policy.malloc(12 * MiB)
    window = policy.release.limit_window
    assert window.as_tuple() == (12 * MiB, NO_UPPER)     # 0 held (no collection), 12 fits
    policy.malloc(40 * MiB)
    assert window.as_tuple() == (52 * MiB, NO_UPPER)     # 12 held under 24/2; 52 fits
    policy.free(a)
    policy.malloc(20 * MiB)
    assert policy.memory_stats()["num_device_free"] == 1                 # a went
    assert window.as_tuple() == (80 * MiB, 104 * MiB - 1)


def test_pytorch_garbage_collection_under_its_threshold_narrows_the_window_from_below() -> None:
    """With 200 MiB allowed the same miss finds 52 MiB held under the threshold (100 MiB) and
    collects nothing: every maximum from 104 MiB up decides alike."""
    policy = _pytorch_gc(200 * MiB)
    a = policy.malloc(12 * MiB)
    policy.malloc(40 * MiB)
    policy.free(a)
    policy.malloc(20 * MiB)
    assert policy.memory_stats()["num_device_free"] == 0
    assert policy.release.limit_window.as_tuple() == (104 * MiB, NO_UPPER)


@pytest.mark.parametrize("share", [0.5, 0.3, 0.6, 0.7, 0.123456789, 0.999])
def test_the_least_maximum_reaching_a_held_size_is_exact(share: float) -> None:
    """For every held size, the least allowed_memory_maximum whose threshold, computed as
    PyTorch computes it (the float product, truncated), reaches it: the one below does not."""
    policy = parse_policy(f"pytorch:per_process_memory_fraction=1.0,"
                          f"garbage_collection_threshold={share}").build(
        SimulatedDevice(DEVICE).view(0))
    release = policy.release

    def threshold(maximum: int) -> int:
        return int(share * maximum)

    helds = [*range(1, 2000), *(MiB * k + d for k in (1, 3, 1000, 70_000) for d in (-1, 0, 1))]
    for held in helds:
        least = release._least_maximum_reaching(held)
        assert threshold(least) >= held > threshold(least - 1), held
    assert release._least_maximum_reaching(0) == 0


@pytest.mark.parametrize("setting", [
    "per_process_memory_fraction=0.9,garbage_collection_threshold=0.5",
    "per_process_memory_fraction=0.6,garbage_collection_threshold=0.3",
    "per_process_memory_fraction=0.8,garbage_collection_threshold=0.7,max_split_size_mb=20"])
@pytest.mark.parametrize("trace_name", ["random", "random-2-streams", "late-peak"])
def test_a_pytorch_run_under_a_maximum_at_its_window_s_edge_decides_alike(
        setting: str, trace_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window is no wider than the decisions allow: a run of PyTorch's allocator with
    garbage collection whose allowed_memory_maximum is set to either end of the window its
    fraction's run noted makes that run's every decision, on cards from a little over the
    trace's peak live bytes to twice it."""
    trace, _ = traces()[trace_name]
    peak = trace.peak_live()[0]
    numbers = PyTorchCachingAllocator.native_numbers
    edges_tried = 0
    for over in (1.05, 1.2, 1.4, 1.7, 2.0):
        profile = DEVICE.device_with(int(peak * over))
        policy = f"pytorch:{setting}"
        run = open_native_run(trace, parse_policy(policy), profile, stop_on_oom=False,
                              timeline_points=100)
        assert run is not None
        run.advance(len(trace))
        lo, hi = run.state()["limit_window"]
        maximum = int(run.config["allowed_memory_maximum"])
        assert lo <= maximum <= hi
        expected = _decisions(policy, profile, trace)
        for edge in {lo, hi} - {maximum, NO_LOWER, NO_UPPER}:
            edges_tried += 1
            with monkeypatch.context() as patch:
                patch.setattr(PyTorchCachingAllocator, "native_numbers",
                              lambda self, edge=edge: {**numbers(self),
                                                       "allowed_memory_maximum": edge})
                at_edge = open_native_run(trace, parse_policy(policy), profile,
                                          stop_on_oom=False, timeline_points=100)
                assert at_edge is not None and at_edge.config["allowed_memory_maximum"] == edge
                assert _decisions(policy, profile, trace) == expected, (over, edge)
    assert edges_tried         # the trace reached the limit somewhere


# ====================================================================== tune's shared runs
@pytest.mark.parametrize("framework_name", ["pytorch", "jax", "tensorflow", "cupy"])
@pytest.mark.parametrize("trace_name", ["late-peak", "random"])
def test_tune_with_shared_runs_is_tune_with_a_replay_per_setting(
        framework_name: str, trace_name: str) -> None:
    """Every setting's result, the answer and the search's counts are those of replays from
    event 0, on a card a little over the trace's peak live bytes (where fractions matter)."""
    trace, _ = traces()[trace_name]
    device = DEVICE.device_with(int(trace.peak_live()[0] * 1.15))
    shared = tune(trace, framework_name, device, max_slowdown=None)
    plain = tune(trace, framework_name, device, max_slowdown=None,
                 evaluate=local_evaluator(trace, share=False))
    assert json.dumps(shared.to_json_dict(), sort_keys=True) == json.dumps(
        plain.to_json_dict(), sort_keys=True)


def test_tunes_fractions_on_one_card_resume_from_each_other() -> None:
    """PyTorch's fractions on one card differ only in the limit: where the trace's peak comes
    last, the fraction stage's replays resume from each other's saved states."""
    trace, _ = traces()["late-peak"]
    device = DEVICE.device_with(int(trace.peak_live()[0] * 1.15))
    made: list[SharedRuns] = []
    init = SharedRuns.__init__

    def kept(self: SharedRuns, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SharedRuns, "__init__", kept)
        tune(trace, "pytorch", device, max_slowdown=None)
    shared = made[0]
    assert shared.resumed >= 20
    assert shared.events_resumed > shared.resumed * len(trace) * 0.9   # each skips nearly all


def test_the_runs_of_one_trace_check_its_columns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a run checks the trace's columns (three passes over every event): the runs of a
    search share one check, and a second trace gets its own."""
    from allocsim.sim.questions import shared_runs

    checked: list[int] = []
    check = shared_runs.core_columns

    def counted(trace: Trace) -> Any:
        checked.append(len(trace))
        return check(trace)

    monkeypatch.setattr(shared_runs, "core_columns", counted)
    trace, _ = traces()["training"]
    runs = SharedRuns(trace, timeline_points=100)
    for card in (GiB // 4, GiB // 2, GiB, 2 * GiB):
        runs.run(parse_policy("pytorch"), DEVICE.device_with(card, 0), stop_on_oom=True)
    assert checked == [len(trace)]
    other, _ = traces()["random"]
    SharedRuns(other, timeline_points=100).run(parse_policy("pytorch"), DEVICE,
                                              stop_on_oom=True)
    assert checked == [len(trace), len(other)]


def test_a_run_given_another_trace_s_columns_reads_its_own() -> None:
    """The checked columns travel with the trace they are of: handed another trace's, open_run
    checks its own trace's, and the run is that trace's run."""
    from allocsim.sim.kernel.native import core_columns

    trace, _ = traces()["random"]
    other, _ = traces()["training"]
    spec = parse_policy("bfc")
    given = open_native_run(trace, spec, DEVICE, stop_on_oom=False, timeline_points=100,
                            columns=core_columns(other))
    plain = open_native_run(trace, spec, DEVICE, stop_on_oom=False, timeline_points=100)
    assert given is not None and plain is not None
    given.advance(given.n)
    plain.advance(plain.n)
    assert given.n == len(trace)
    assert _comparable(given.state()) == _comparable(plain.state())
