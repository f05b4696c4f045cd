"""The bridge to the native core (allocsim._native, built from native/): which runs it takes,
the constants it is handed, and the RunResult built from what it returns.

The Python models are the specification; the native core is their twin for speed, as CPython
holds ``_pydecimal`` and ``_decimal``. :func:`native_replay` is the one place the engine asks
(:func:`allocsim.sim.kernel.engine.replay`, at the start of a replay): it answers a
:class:`RunResult` when the core can replay the run, else None and the Python engine runs.
The core replays a run that needs no Python objects — one process, a policy whose class
declares a twin there (:class:`~allocsim.policies.base.NativeTwin`) with settings the core can
hold, the plain device and cost model — and the run's state comes back here: the engine's
counters, the timeline's buckets and samples, the device's counters and the policy's stats
(PolicyStats' fields). Runs that read a policy object (memory_stats, snapshots, export), keep
a device-call log (the validator), step in simpy (``share``) or watch a policy (min-capacity's
probes, explain-oom) build a ProcessReplay and run in Python.

Nothing the core decides is written twice here, and no policy is named here: every table and
constant it uses (the alignment and split slack, BFC's memory
limit, first region and back-off factor, best-fit's page, PyTorch's sizes and settings, CuPy's
unit and limit, the stream-ordered pool's threshold and chunk, the TPU runtime's granule and
compaction cost line) is what the Python policy built for the run's device hands over itself
(:meth:`~allocsim.policies.base.Policy.native_config`), and the device's granules, alignment
and costs are read off the Python device, so the two cannot drift. Every free index of the
core keeps the Python's order of free blocks, (size, tie), in one binned index with
size-class bins of its own (native/src/sorted_bins.hpp): a layout, not a rule.
``ALLOCSIM_NATIVE=0`` turns the core off; without the module (no C++ compiler at install
time) the Python models run, with the same answers (tests/test_native_differential.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from allocsim.policies import POLICIES, PolicySpec
from allocsim.policies.base import NATIVE_SIZE_LIMIT, native_twin_of
from allocsim.policies.registry import PRESETS
from allocsim.sim.kernel.device import (
    DEFAULT_PROFILE,
    PROFILES,
    RANGE_ALIGN,
    CostModel,
    DeviceProfile,
    GiB,
    SimulatedDevice,
)
from allocsim.sim.kernel.device_buffers import buffers_on_device
from allocsim.sim.kernel.results import RunResult, Timeline
from allocsim.sim.kernel.trace_scratch import with_trace_scratch
from allocsim.traces.model import Trace

_SIZE_LIMIT = NATIVE_SIZE_LIMIT  # the core's int64 arithmetic on sizes (rounding, doubling)
_ID_EMPTY = np.iinfo(np.int64).min  # the core's live map cannot hold this id


def core() -> ModuleType | None:
    """The native module, or None when it is off (``ALLOCSIM_NATIVE=0``) or not built."""
    if os.environ.get("ALLOCSIM_NATIVE", "1").strip() == "0":
        return None
    try:
        from allocsim import _native  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _native


def implementation() -> str:
    """Which implementation replays runs the core can take, in words (``allocsim --version``)."""
    if core() is not None:
        return "native core"
    if os.environ.get("ALLOCSIM_NATIVE", "1").strip() == "0":
        return "Python models (ALLOCSIM_NATIVE=0)"
    return "Python models (native core not built)"


def native_settings() -> dict[str, str]:
    """What the core has of each registered policy, in words (``allocsim policies``; each
    class's :class:`~allocsim.policies.base.NativeTwin` says), and of each preset: what the
    policy a setting stands for has."""
    settings = {name: twin.settings for name, cls in POLICIES.items()
                if (twin := native_twin_of(cls)) is not None}
    for name in PRESETS:
        settings[name] = "as the policy each setting stands for has (above)"
    return settings


def is_native(spec: PolicySpec, profile: DeviceProfile | None = None) -> bool:
    """Whether the core has this policy with these settings (on ``profile``, by default the
    default device): the policy built for it says (:meth:`Policy.native_config`)."""
    resolved = spec.resolved()
    if native_twin_of(resolved.policy_class) is None:
        return False
    device = SimulatedDevice(profile or PROFILES[DEFAULT_PROFILE])
    return resolved.build(device.view(0)).native_config() is not None


def device_config(profile: DeviceProfile, device: SimulatedDevice) -> dict[str, Any] | None:
    """The device's figures as the core takes them; None for a cost model of another type
    (a calibrated one with formulas of its own runs in Python)."""
    costs = profile.costs
    if type(costs) is not CostModel or type(device) is not SimulatedDevice:
        return None
    return {
        # The core's device starts with the context taken (SimulatedDevice starts its `used`
        # at it): the same refusals, and the same peak of the device's bytes.
        "capacity": device.capacity, "context": device.context,
        "granularity": profile.granularity,
        "map_granularity": profile.map_granularity, "range_align": RANGE_ALIGN, "gib": GiB,
        "next_address": device.next_address,
        "malloc_base_s": costs.malloc_base_s, "malloc_per_gib_s": costs.malloc_per_gib_s,
        "free_base_s": costs.free_base_s, "free_per_gib_s": costs.free_per_gib_s,
        "map_base_s": costs.map_base_s, "map_per_gib_s": costs.map_per_gib_s,
        "unmap_base_s": costs.unmap_base_s,
    }


@dataclass(frozen=True)
class CoreColumns:
    """A trace's columns as the core reads them — op, id, the sizes (a free's taken from its
    alloc), stream — or None where its int64 arithmetic does not hold them (sizes far below
    2**63, no id equal to its live map's empty marker; else the Python models run, with their
    unbounded ints). Worked out once by a caller that opens many runs of one trace
    (min-capacity's ~40, tune's ~70, sim/questions/shared_runs.py): the checks are three
    passes over every event, ~5% of a 1M-event replay's time each time a run is opened."""

    trace: Trace                                    # the trace (on the device) they are of
    columns: tuple[np.ndarray, ...] | None


def core_columns(trace: Trace) -> CoreColumns:
    """``trace``'s columns as the core reads them (:class:`CoreColumns`)."""
    sizes = trace.matched_sizes(packed=True)
    ids = trace.column("id")
    fits = not len(trace) or (int(sizes.max()) < _SIZE_LIMIT and int(ids.min()) != _ID_EMPTY)
    if not fits:
        return CoreColumns(trace, None)
    return CoreColumns(trace, (trace.column("op"), ids, sizes, trace.column("stream")))


class NativeRun:
    """One run in the core, made by :func:`open_run`: :meth:`advance` replays events up to an
    index, :meth:`state` reads the engine's, device's and policy's state back (what
    :func:`native_replay` builds the RunResult from; the differential tests compare it with
    the Python run's after every event)."""

    def __init__(self, replay: Any, n: int, config: dict[str, Any],
                 device: dict[str, Any]) -> None:
        self._replay = replay
        self.n = n
        self.config = config            # the policy's constants, as the core took them
        self.device = device            # the device's figures, as the core took them

    def advance(self, end: int) -> int:
        return int(self._replay.advance(end))

    @property
    def stopped(self) -> bool:
        return bool(self._replay.stopped())

    @property
    def next_index(self) -> int:
        return int(self._replay.next_index())

    @property
    def ooms(self) -> int:
        return int(self._replay.ooms())

    def state(self) -> dict[str, Any]:
        return dict(self._replay.state())

    def snapshot(self) -> Any:
        """The run's whole state now, for another run to :meth:`resume` from (min-capacity's
        shared runs, sim/questions/shared_runs.py); it holds where it stands
        (``next_index``, ``ooms``) and the capacities and limits under which every decision so
        far goes the same way (``granted_most``, ``refused_least``, ``limit_lo``,
        ``limit_hi``)."""
        return self._replay.snapshot()

    def windows(self) -> tuple[int, int, int, int]:
        """The windows a :meth:`snapshot` now would hold (``granted_most``,
        ``refused_least``, ``limit_lo``, ``limit_hi``), read without copying the state."""
        granted_most, refused_least, limit_lo, limit_hi = self._replay.windows()
        return int(granted_most), int(refused_least), int(limit_lo), int(limit_hi)

    def tape(self, end: int, *, restart: bool = False) -> int:
        """Advance to ``end`` one event at a time, recording what each did (the period that
        :meth:`repeat` copies; native/src/engine.hpp's Engine::tape): a tape started here
        with ``restart``, else the one that ends here extended."""
        return int(self._replay.tape(end, restart))

    def repeat(self, length: int) -> bool:
        """Copy the tape, one whole period of ``length`` events ending here with no device
        call and no OOM in it, to the run's end; False where the tape is not such a period.
        Sound only where the run from here repeats the run from the tape's start
        (sim/questions/run_repeats.py shows it)."""
        return bool(self._replay.repeat(length))

    def decision_state(self) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, int, int] | None:
        """The policy's decision rows (flat), the device's call count, the live buffers' ids
        and addresses (by place, a region rank and offset each, for the stream-ordered pool),
        the device's used and reserved bytes — what sim/questions/run_repeats.py compares at
        two period boundaries; None for a policy without rows."""
        got = self._replay.decision_state()
        return None if got is None else tuple(got)

    def resume(self, saved: Any) -> None:
        """This fresh run continues from ``saved`` (a state of a run of the same policy family
        and trace). Sound only where the two runs decide alike up to there: the caller's
        argument (shared_runs.py)."""
        self._replay.resume(saved)


def open_run(trace: Trace, spec: PolicySpec, profile: DeviceProfile, *, stop_on_oom: bool,
             timeline_points: int, events: int | None = None,
             record_addresses: bool = False,
             columns: CoreColumns | None = None) -> NativeRun | None:
    """The run in the core, ready to advance; None when the core cannot take it (see the
    module docstring). ``events`` replays only the first so many (the timeline's buckets are
    of those: a run that stopped early is replayed again so). ``columns``: the trace's as
    :func:`core_columns` worked them out before (for this trace on this device; else they
    are worked out here)."""
    module = core()
    if module is None:
        return None
    # A TPU step's scratch, where its trace carries one (trace_scratch.py).
    resolved = with_trace_scratch(spec.resolved(), trace)
    if native_twin_of(resolved.policy_class) is None:
        return None
    trace = buffers_on_device(trace, profile)   # a TPU holds u8[n] buffers
    device = SimulatedDevice(profile)
    # Built on the run's own (fresh) device: its constructor's device calls (best-fit's
    # address range) move the bump pointer exactly as the Python run's would.
    policy = resolved.build(device.view(0))
    config = policy.native_config()
    device_figures = device_config(profile, device)
    if config is None or device_figures is None:
        return None
    if columns is None or columns.trace is not trace:
        columns = core_columns(trace)
    if columns.columns is None:
        return None
    n = len(trace)
    events = n if events is None else events
    replay = module.replay(columns.columns, events, max(1, -(-events // timeline_points)),
                           max(1, n // timeline_points), stop_on_oom, record_addresses,
                           device_figures, config)
    return NativeRun(replay, events, config, device_figures)


def native_replay(trace: Trace, spec: PolicySpec, profile: DeviceProfile, *,
                  stop_on_oom: bool, progress: Callable[[int, int], None] | None,
                  timeline_points: int, step: int,
                  record_addresses: list[int] | None = None) -> RunResult | None:
    """The run replayed by the core, or None when the core cannot take it (see the module
    docstring). ``timeline_points`` and ``step`` are the engine's (buckets of the timeline,
    events between progress reports). With ``record_addresses`` (a list), every malloc's
    answer (its address, -1 for None) is appended to it, for the differential tests."""

    def run(events: int | None, report: Callable[[int, int], None] | None
            ) -> dict[str, Any] | None:
        native = open_run(trace, spec, profile, stop_on_oom=stop_on_oom,
                          timeline_points=timeline_points, events=events,
                          record_addresses=record_addresses is not None)
        if native is None:
            return None
        done = 0
        while done < native.n and not native.stopped:
            done = native.advance(min(native.n, done + step))
            if report is not None:
                report(done, len(trace))
        return native.state()

    state = run(None, progress)
    if state is None:
        return None
    return result_of(trace, spec, profile, state, timeline_points=timeline_points,
                     record_addresses=record_addresses)


def result_of(trace: Trace, spec: PolicySpec, profile: DeviceProfile, state: dict[str, Any], *,
              timeline_points: int, record_addresses: list[int] | None = None) -> RunResult:
    """The RunResult of a run of the core that ended in ``state`` (:meth:`NativeRun.state`,
    run to its end or to its first OOM with ``stop_on_oom``), as :func:`native_replay` gives
    it."""
    if state["stopped"] and state["next_index"] < len(trace):
        # A run that stopped at its first OOM: its timeline's buckets are of the events run
        # (RunReport._timeline), so those events are replayed again in such buckets.
        again = open_run(trace, spec, profile, stop_on_oom=True,
                         timeline_points=timeline_points, events=state["next_index"],
                         record_addresses=record_addresses is not None)
        assert again is not None
        again.advance(again.n)
        state = again.state()
        state["stopped"] = True
    if record_addresses is not None:
        record_addresses.extend(state["addresses"].tolist())
    return _result(trace, str(spec), profile.label, state)


def _result(trace: Trace, policy: str, device_name: str, state: dict[str, Any]) -> RunResult:
    """RunReport.result for the core's state."""
    oom = state["first_oom"]
    timeline = _timeline(trace, state)
    reserved = timeline.reserved.astype(np.float64)
    in_use = timeline.in_use.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(reserved > 0, (reserved - in_use) / reserved, 0.0)
    device = state["device"]
    return RunResult(
        policy=policy, trace=trace.name, device=device_name, process=0,
        events=len(trace), allocs=trace.n_allocs,
        completed=state["ooms"] == 0 and not state["stopped"],
        ooms=state["ooms"], first_oom_event=oom["event"] if oom else None,
        first_oom_size=oom["size"] if oom else None,
        first_oom_allocated=oom["allocated"] if oom else None,
        first_oom_reserved=oom["reserved"] if oom else None,
        first_oom_largest_free=oom["largest_free"] if oom else None,
        peak_allocated=state["peak_allocated"], peak_allocated_event=state["peak_allocated_event"],
        peak_reserved=device["peak_reserved"], peak_reserved_event=state["peak_reserved_event"],
        final_reserved=device["reserved"],
        internal_fragmentation=max(0, state["in_use_at_peak_allocated"] - state["peak_allocated"]),
        external_fragmentation=max(0, state["reserved_at_peak"]
                                   - state["in_use_at_peak_reserved"]),
        external_fragmentation_mean=float(share.mean()) if len(share) else 0.0,
        device_mallocs=device["mallocs"], device_frees=device["frees"],
        failed_device_mallocs=device["failed_mallocs"], alloc_time_s=device["cost_s"],
        trace_duration_s=trace.duration_ns / 1e9,
        policy_stats=dict(state["policy_stats"]), timeline=timeline,
        first_oom_others=None,
    )


def _timeline(trace: Trace, state: dict[str, Any]) -> Timeline:
    """RunReport._timeline from the core's buckets and samples."""
    n = state["next_index"]
    bucket = state["bucket"]
    last = np.minimum(np.arange(0, n, bucket, dtype=np.int64) + bucket, n) - 1
    cost = state["bucket_cost"]
    time_ns = trace.column("time_ns")
    t0 = int(time_ns[0]) if n else 0
    delay_ns = np.rint(cost * 1e9).astype(np.int64)
    trace_times = time_ns[last].astype(np.int64) - t0     # the core runs from start 0
    times = trace_times + delay_ns
    sample_events, sample_values = state["sample_events"], state["sample_values"]
    if len(sample_values):
        at = np.clip(np.searchsorted(sample_events, last, side="right") - 1, 0, None)
        in_use = sample_values[at]
    else:
        in_use = np.zeros(len(last), dtype=np.int64)
    return Timeline(event=last, time_ns=times, allocated=state["bucket_allocated"],
                    reserved=state["bucket_reserved"], in_use=in_use, trace_time_ns=trace_times)
