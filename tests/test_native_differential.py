"""The native core gives the Python models' answers, as CPython holds ``_decimal`` to
``_pydecimal`` (docs/architecture.md, "Two implementations, one answer").

Whole runs on every bundled trace and generator, at a roomy, a tight and a too-small capacity
(growth's back-off, OOMs, BFC's failed Extend and garbage collection), through every native
setting: every RunResult field, every timeline bucket, the policy's stats and the address of
every malloc, in order. Runs that stop at their first OOM too, and where they stop wherever the
OOM falls in the timeline (with the capacities their device answered alike: min-capacity reads
them). Then hypothesis workloads, compared after every event (the device's reserved bytes and
calls, the largest request it granted and the smallest it refused, the policy's stats; for
the tpu policy, whose buffers move when it compacts, its compaction counters and every block
of HBM with each live buffer's offset, on TPU devices too). And the switch:
``ALLOCSIM_NATIVE=0`` runs the Python models through the same public call.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from dataclasses import replace

import native_cases as cases

from allocsim.policies import parse_policy
from allocsim.policies.base import native_twin_of
from allocsim.policies.cuda_async import CudaAsyncAllocator
from allocsim.policies.cupy_pool import CuPyPoolAllocator
from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.policies.registry import POLICIES
from allocsim.policies.tpu import TpuRuntimeAllocator
from allocsim.sim.kernel import native
from allocsim.sim.kernel.device import SimulatedDevice, resolve_device
from allocsim.sim.kernel.engine import TIMELINE_POINTS, ProcessReplay, replay
from allocsim.sim.kernel.results import RunResult
from allocsim.sim.questions.capacity.oracle import _NEVER as NEVER_REFUSED
from allocsim.sim.questions.capacity.oracle import _RecordingDevice
from allocsim.traces.model import Trace

TRACES = dict(cases.traces())


def assert_same(python: RunResult, core: RunResult, where: str) -> None:
    """Every field equal, the timeline's arrays element by element (and of the same dtype)."""
    for item in dataclasses.fields(RunResult):
        a, b = getattr(python, item.name), getattr(core, item.name)
        if item.name == "timeline":
            for column in ("event", "time_ns", "allocated", "reserved", "in_use"):
                x, y = getattr(a, column), getattr(b, column)
                assert x.dtype == y.dtype and np.array_equal(x, y), f"{where}: timeline.{column}"
        else:
            assert a == b, f"{where}: {item.name}: Python {a!r}, native {b!r}"
    assert python.to_json_dict(timeline=True) == core.to_json_dict(timeline=True), where


@pytest.mark.parametrize("label", sorted(TRACES))
def test_whole_runs_match_on_every_trace_capacity_and_setting(label: str) -> None:
    cases.need_core()
    trace = TRACES[label]
    for profile in cases.capacities(trace):
        for spec in cases.NATIVE_SPECS:
            where = f"{label} | {spec} | {profile.label}"
            python, python_addresses = cases.python_run(trace, spec, profile)
            core, core_addresses = cases.native_run(trace, spec, profile)
            assert_same(python, core, where)
            assert python_addresses == core_addresses, f"{where}: addresses"


def test_the_cases_reach_the_paths_they_are_for() -> None:
    # The tight capacities make OOMs, BFC backs off and garbage-collects somewhere: a case
    # list that stopped reaching them would hold the core to nothing there.
    cases.need_core()
    ooms = backoff = collected = 0
    for label in ("default-training", "training-seed0", "random-seed1", "regions-freed"):
        trace = TRACES[label]
        for profile in cases.capacities(trace):
            bfc, _ = cases.native_run(trace, "bfc:memory_limit=100GiB", profile)
            ooms += bfc.ooms
            backoff += bfc.failed_device_mallocs
            gc, _ = cases.native_run(trace, "bfc:garbage_collection=true", profile)
            collected += gc.device_frees
    assert ooms and backoff and collected


@pytest.mark.parametrize("spec", ["pytorch:expandable_segments=true", "cupy", "cupy:limit=64MiB",
                                  "cuda-async", "cuda-async:sync=none"])
def test_the_cases_reach_the_release_and_retry_paths_of_the_newer_policies(spec: str) -> None:
    # Each releases memory (expandable segments unmap pages, CuPy's free_all_blocks, the pool's
    # trim), retries refused device calls and runs out somewhere in the cases — the paths the
    # tight capacities are for.
    cases.need_core()
    ooms = refused = released = 0
    for label in ("default-training", "training-seed0", "random-seed1",
                  "random-streams3-seed0"):
        trace = TRACES[label]
        for profile in cases.capacities(trace):
            result, _ = cases.native_run(trace, spec, profile)
            ooms += result.ooms
            refused += result.failed_device_mallocs
            released += result.device_frees
    assert ooms and released and (refused or spec == "cupy:limit=64MiB"), (ooms, refused,
                                                                          released)


def test_the_core_runs_on_devices_with_a_share_of_their_own() -> None:
    # Every named profile at its own capacity holds a context (a100-80g: 512 MiB): the
    # core replays there (it declined them until its device took the share first).
    cases.need_core()
    trace = TRACES["default-training"]
    for name in ("a100-80g", "t4-16g"):
        profile = resolve_device(name)
        assert profile.context_bytes > 0
        for spec in ("bfc", "pytorch", "best-fit", "buddy", "on-demand"):
            assert native.is_native(parse_policy(spec), profile), (name, spec)
            assert native.native_replay(trace, parse_policy(spec), profile, stop_on_oom=False,
                                        progress=None, timeline_points=TIMELINE_POINTS,
                                        step=1 << 18) is not None, (name, spec)


def test_the_share_is_taken_before_the_policies_ask() -> None:
    # Hand-worked: on 16 MiB with 4 MiB of context, BFC without growth (limit 16 MiB, its
    # fraction of the whole capacity) asks for 16 MiB for 1 MiB and is refused; backs off to
    # round256(16 MiB x 0.9) = 15,099,648 and 13,589,760 (refused: over the 12 MiB left) and
    # gets 12,230,912 (12,231,168 reserved: the device's 512-byte granules). A device the
    # context fills refuses every call of every policy.
    cases.need_core()
    trace = Trace.from_events([(0, "alloc", 1, 1 << 20), (1, "free", 1, 1 << 20)], name="one")
    spec = "bfc:allow_growth=false"
    core, _ = cases.native_run(trace, spec, cases.gc_cycles_device())
    python, _ = cases.python_run(trace, spec, cases.gc_cycles_device())
    assert_same(python, core, spec)
    assert core.failed_device_mallocs == 3 and core.device_mallocs == 1
    assert core.peak_reserved == 12_231_168
    full = dataclasses.replace(cases.gc_cycles_device(), context_bytes=16 << 20)
    for spec in cases.NATIVE_SPECS:
        core, addresses = cases.native_run(trace, spec, full)
        assert core.device_mallocs == 0 and core.peak_reserved == 0, spec
        assert core.ooms == 1 and addresses == [-1], spec
        assert_same(cases.python_run(trace, spec, full)[0], core, f"{spec} on a full device")


def test_bfc_region_size_past_int64_does_not_spin() -> None:
    # gc-cycles doubles BFC's region size 80 times (bfc.py's Extend: Python's ints); the core
    # holds it at 2**62, where Extend reads it the same. Before, it wrapped to 0 and the
    # doubling loop spun forever (with the GIL released): a child process, with a timeout.
    cases.need_core()
    python = ProcessReplay(cases.gc_cycles(), parse_policy("bfc:garbage_collection=true"),
                           SimulatedDevice(cases.gc_cycles_device()))
    python.advance(python.n)
    assert python.policy.curr_region_allocation_bytes.bit_length() > 64   # the case reaches it
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import native_cases as cases\n"
        "core, addresses = cases.native_run(cases.gc_cycles(), "
        "'bfc:garbage_collection=true', cases.gc_cycles_device())\n"
        "print(core.ooms, core.device_mallocs, core.device_frees)\n")
    try:
        done = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent)],
                              capture_output=True, text=True, timeout=120, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail("the core spun in BFC's Extend (its region size wrapped)")
    expected = python.result("gc-cycles")
    assert done.stdout.split() == [str(expected.ooms), str(expected.device_mallocs),
                                   str(expected.device_frees)]
    assert expected.ooms == 80


@pytest.mark.parametrize("label", ["default-training", "kvcache-seed0", "random-seed0"])
def test_runs_that_stop_at_their_first_oom_match(label: str) -> None:
    cases.need_core()
    trace = TRACES[label]
    profiles = cases.capacities(trace)
    for tight in (profiles[2], profiles[-1]):        # below the peak; the context fills it
        for spec in cases.NATIVE_SPECS:
            python, python_addresses = cases.python_run(trace, spec, tight, stop_on_oom=True)
            core, core_addresses = cases.native_run(trace, spec, tight, stop_on_oom=True)
            assert_same(python, core, f"{label} | {spec} | {tight.name} | stop_on_oom")
            assert python_addresses == core_addresses


# -- where a run that stops at its first OOM stops ------------------------------------------
# The timeline's buckets and samples fall every few events once a trace is longer than
# TIMELINE_POINTS: 8193 events make buckets of 5 and a sample every 4, so an OOM at 4000-4009
# falls at each place in a bucket and between samples.
STOP_TRACE_EVENTS = 4 * TIMELINE_POINTS + 1
STOP_SPECS = ("pytorch", "pytorch:max_split_size_mb=128", "bfc", "best-fit", "buddy", "cupy",
              "cuda-async", "on-demand")


def stopping_at(oom_event: int) -> Trace:
    """4 KiB buffers, kept, up to ``oom_event``, a request of 1 TiB there (no card's), then
    ever larger buffers of 64 MiB and more, kept: each a device call that a run going on past
    its first OOM would be granted or refused."""
    rows: list[tuple] = []
    for event in range(STOP_TRACE_EVENTS):
        size = (4 << 10 if event < oom_event else 1 << 40 if event == oom_event
                else (64 << 20) + (event << 20))
        rows.append((event, "alloc", event, size, 0))
    return Trace.from_events(rows, name=f"oom at {oom_event}")


@pytest.mark.parametrize("spec", STOP_SPECS)
def test_a_run_stops_at_its_first_oom_wherever_it_falls_in_the_timeline(spec: str) -> None:
    # What min-capacity reads of a run that stops (sim/questions/capacity/oracle.py): where it
    # stopped, its OOMs and the capacities its device answered alike, the Python run's, the
    # core's run given all the events at once (its loop runs in stretches between samples
    # and bucket ends: an OOM that stops it ends the stretch, wherever it falls).
    cases.need_core()
    profile = resolve_device("a100-80g").device_with(1 << 30)
    for oom_event in range(4000, 4010):
        trace = stopping_at(oom_event)
        recording = _RecordingDevice(profile)
        python = ProcessReplay(trace, parse_policy(spec), recording, stop_on_oom=True)
        python.advance(python.n)
        core = native.open_run(trace, parse_policy(spec), profile, stop_on_oom=True,
                               timeline_points=TIMELINE_POINTS)
        assert core is not None
        core.advance(core.n)
        state = core.state()
        device = state["device"]
        refused = device["refused_least"]
        where = f"{spec}, OOM at event {oom_event}"
        assert python.stopped and state["stopped"], where
        assert (state["next_index"], state["ooms"]) == (oom_event + 1, 1), where
        assert (state["next_index"], state["ooms"]) == (python.next_index,
                                                        python.report.ooms), where
        assert device["granted_most"] == recording.lo, where
        assert (refused - 1 if refused >= 0 else NEVER_REFUSED) == recording.hi, where
        assert (device["reserved"], device["peak_reserved"]) == (
            python.view.reserved, python.view.peak_reserved), where
        assert (state["allocated"], state["peak_allocated"]) == (
            python.allocated, python.report.peak_allocated), where


def test_replay_takes_the_core_and_allocsim_native_0_the_python_models(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cases.need_core()
    trace = TRACES["default-training"]
    device = resolve_device("t4-16g", "1GiB")
    assert native.native_replay(trace, parse_policy("bfc"), device, stop_on_oom=False,
                                progress=None, timeline_points=TIMELINE_POINTS,
                                step=1 << 18) is not None
    core = replay(trace, "bfc", device)
    monkeypatch.setenv("ALLOCSIM_NATIVE", "0")
    assert native.core() is None and native.implementation().startswith("Python models")
    assert native.native_replay(trace, parse_policy("bfc"), device, stop_on_oom=False,
                                progress=None, timeline_points=TIMELINE_POINTS,
                                step=1 << 18) is None
    assert_same(replay(trace, "bfc", device), core, "ALLOCSIM_NATIVE=0")


def test_every_registered_policy_is_native_and_what_the_core_lacks_runs_in_python(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cases.need_core()
    for spec in cases.NATIVE_SPECS:
        assert native.is_native(parse_policy(spec)), spec
    for name, cls in POLICIES.items():     # every built-in policy has its twin
        assert native_twin_of(cls) is not None and native.is_native(parse_policy(name)), name
    # A class the core does not know (here a subclass, as a user's own policy would be) runs
    # in Python, whatever it derives from.
    trace = TRACES["default-training"]
    for base in (CuPyPoolAllocator, CudaAsyncAllocator, PyTorchCachingAllocator):
        subclass = type(f"Own{base.__name__}", (base,), {"name": f"own-{base.name}"})
        monkeypatch.setitem(POLICIES, subclass.name, subclass)
        spec = parse_policy(subclass.name)
        assert not native.is_native(spec), subclass.name
        assert native.native_replay(trace, spec, replace(resolve_device(None), context_bytes=0),
                                    stop_on_oom=False, progress=None,
                                    timeline_points=TIMELINE_POINTS, step=1 << 18) is None


def test_progress_is_reported_as_the_python_engine_reports_it() -> None:
    cases.need_core()
    trace = TRACES["default-training"]
    seen: list[tuple[int, int]] = []
    replay(trace, "bfc", resolve_device(None), progress=lambda done, total: seen.append(
        (done, total)))
    assert seen and seen[-1] == (len(trace), len(trace))


# -- random workloads, compared after every event ------------------------------------------
def workload(steps: list[tuple[bool, int, int]]) -> Trace:
    """A trace from (alloc?, size, which live buffer to free) steps."""
    rows: list[tuple] = []
    live: list[tuple[int, int, int]] = []
    for number, (is_alloc, size, pick) in enumerate(steps):
        if is_alloc or not live:
            rows.append((number, "alloc", number, size, pick % 3))     # three streams
            live.append((number, size, pick % 3))
        else:
            buffer, size, stream = live.pop(pick % len(live))
            rows.append((number, "free", buffer, size, stream))
    return Trace.from_events(rows, name="hypothesis")


STEPS = st.lists(st.tuples(st.booleans(),
                           st.one_of(st.integers(1, 4096), st.integers(4096, 1 << 20),
                                     st.integers(1 << 20, 48 << 20)),
                           st.integers(0, 10**6)), min_size=1, max_size=150)


CAPACITIES_MIB = st.sampled_from([16, 40, 96, 81920])


CONTEXTS_MIB = st.sampled_from([0, 0, 8, 64])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, spec=st.sampled_from(cases.NATIVE_SPECS), capacity_mib=CAPACITIES_MIB,
       context_mib=CONTEXTS_MIB)
def test_random_workloads_match_after_every_event(steps: list[tuple[bool, int, int]], spec: str,
                                                  capacity_mib: int, context_mib: int) -> None:
    compare_after_every_event(steps, spec, capacity_mib, context_mib)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, spec=st.sampled_from(cases.NEWER_SPECS), capacity_mib=CAPACITIES_MIB,
       context_mib=CONTEXTS_MIB)
def test_random_workloads_of_the_newer_native_policies_match_after_every_event(
        steps: list[tuple[bool, int, int]], spec: str, capacity_mib: int,
        context_mib: int) -> None:
    # Expandable segments, CuPy's pool and the stream-ordered pool have more state between
    # events (unmapped pages, per-stream arenas and owners) than one example in 120 reaches.
    compare_after_every_event(steps, spec, capacity_mib, context_mib)


def compare_after_every_event(steps: list[tuple[bool, int, int]], spec: str,
                              capacity_mib: int, context_mib: int | None,
                              device: str = "a100-80g") -> None:
    cases.need_core()
    trace = workload(steps)
    # The device's own share: none, some, or all of a small device (64 MiB fills 16 and 40);
    # None: the device's own (a TPU's: the runtime's bytes).
    # replace, not device_with: a share that fills the device is a case here, on purpose.
    card = resolve_device(device)
    profile = replace(card.device_with(capacity_mib << 20), context_bytes=card.context_bytes
                      if context_mib is None else context_mib << 20)
    # The device that notes the capacities answering alike, as min-capacity's Python runs do.
    recording = _RecordingDevice(profile)
    python = ProcessReplay(trace, parse_policy(spec), recording)
    core = native.open_run(trace, parse_policy(spec), profile, stop_on_oom=False,
                           timeline_points=TIMELINE_POINTS)
    assert core is not None
    for event in range(len(trace)):
        python.advance(event + 1)
        core.advance(event + 1)
        state = core.state()
        where = f"event {event} of {spec} at {capacity_mib} MiB, context {context_mib} MiB"
        assert state["device"]["reserved"] == python.view.reserved, where
        assert state["device"]["calls"] == python.view.calls, where
        assert state["device"]["cost_s"] == python.view.cost_s, where
        assert state["allocated"] == python.allocated, where
        assert state["ooms"] == python.report.ooms, where
        refused = state["device"]["refused_least"]
        assert state["device"]["granted_most"] == recording.lo, where
        assert (refused - 1 if refused >= 0 else NEVER_REFUSED) == recording.hi, where
        assert state["policy_stats"] == python.policy.stats().as_dict(), where
        if isinstance(python.policy, TpuRuntimeAllocator):
            cases.assert_same_tpu_state(python.policy, state, where)
    python_result = python.result(profile.label)
    core_result, _ = cases.native_run(trace, spec, profile)
    assert_same(python_result, core_result, f"{spec} at {capacity_mib} MiB")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, spec=st.sampled_from(cases.TPU_SPECS),
       capacity_mib=st.sampled_from([16, 40, 96, 160]),
       context_mib=st.sampled_from([None, None, None, 0, 8]))
def test_random_workloads_of_the_tpu_on_a_tpu_match_after_every_event(
        steps: list[tuple[bool, int, int]], spec: str, capacity_mib: int,
        context_mib: int | None) -> None:
    # On TPU profiles (512-byte granules, the runtime's bytes as the device's share) holes
    # that do not fit make compactions: the compaction counters and every block of HBM,
    # with each live handle's offset, alike after every event.
    compare_after_every_event(steps, spec, capacity_mib, context_mib, device="tpu-v5e")


@pytest.mark.parametrize("label", sorted(TRACES))
def test_tpu_runs_on_tpu_devices_match_compactions_and_blocks_included(label: str) -> None:
    cases.need_core()
    trace = TRACES[label]
    for profile in cases.tpu_capacities(trace):
        for spec in cases.TPU_SPECS:
            where = f"{label} | {spec} | {profile.label}"
            python, core, python_handles, core_handles = cases.tpu_runs(trace, spec, profile)
            assert_same(python, core, where)
            assert python_handles == core_handles, f"{where}: handles"


def test_the_tpu_cases_reach_compaction_and_oom() -> None:
    # A case list whose runs never compact (or never run short) would hold the core's
    # compaction to nothing: the bundled traces at the tight TPU capacities do both.
    cases.need_core()
    compactions = ooms = moved = 0
    for label in ("default-training", "random-seed0", "random-seed1", "kvcache-seed0"):
        trace = TRACES[label]
        for profile in cases.tpu_capacities(trace):
            run = native.open_run(trace, parse_policy("tpu"), profile, stop_on_oom=False,
                                  timeline_points=TIMELINE_POINTS)
            assert run is not None
            run.advance(run.n)
            state = run.state()
            compactions += state["policy_state"]["num_compactions"]
            moved += state["policy_state"]["compaction_moved_bytes"]
            ooms += state["ooms"]
    assert compactions and moved and ooms, (compactions, moved, ooms)


def test_what_allocsim_policies_says_is_native_is_native(capsys: pytest.CaptureFixture) -> None:
    cases.need_core()
    for name in native.native_settings():
        assert native.is_native(parse_policy(name)), name
    from allocsim.sim.cli import main
    assert main(["policies"]) == 0
    printed = capsys.readouterr().out
    assert "native core (native core in use here) replays:" in printed
    assert all(f"    {name:12s} " in printed for name in native.native_settings())
