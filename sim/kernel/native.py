"""The bridge to the native core (allocsim._native, built from native/): which runs it takes,
the constants it is handed, and the RunResult built from what it returns.

The Python models are the specification; the native core is their twin for speed, as CPython
holds ``_pydecimal`` and ``_decimal``. :func:`native_replay` is the one place the engine asks
(:func:`allocsim.sim.kernel.engine.replay`, at the start of a replay): it answers a
:class:`RunResult` when the core can replay the run, else None and the Python engine runs.
The core replays a run that needs no Python objects — one process, a policy and setting it has
(:data:`NATIVE_POLICIES`), the plain device and cost model — and the run's state comes back
here: the engine's counters, the timeline's buckets and samples, the device's counters and
the policy's stats (PolicyStats' fields). Runs that read a policy object (memory_stats,
snapshots, export), keep a device-call log (the validator), step in simpy (``share``) or watch
a policy (min-capacity's probes, explain-oom) build a ProcessReplay and run in Python.

Nothing the core decides is written twice here: every table and constant it uses (the bins of
each bit length of BFC, preallocate and best-fit, the alignment and split slack, BFC's memory
limit, first region and back-off factor, best-fit's page and heap base, PyTorch's sizes,
settings and expandable range sizes, CuPy's unit and limit, the stream-ordered pool's
threshold, chunk, alignment and sync mode, the TPU runtime's granule, own bytes and compaction
cost line, the device's granules, alignment and costs) is read off the Python device and the
Python policy built for the run's device, so the two cannot drift. The other free indexes
(PyTorch's pools, CuPy's arenas, the stream-ordered pool's, the TPU's) keep the Python's order
of free blocks, (size, tie), in size-class bins of their own (native/src/sorted_bins.hpp): a
layout, not a rule.
``ALLOCSIM_NATIVE=0`` turns the core off; without the module (no C++ compiler at install
time) the Python models run, with the same answers (tests/test_native_differential.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from allocsim.policies import PolicySpec
from allocsim.policies.best_fit import BestFitAllocator
from allocsim.policies.bfc import (
    BACKPEDAL_FACTOR,
    MIN_ALLOCATION,
    BFCAllocator,
    PreallocateAllocator,
)
from allocsim.policies.buddy import BuddyAllocator
from allocsim.policies.chunks import BIN
from allocsim.policies.cuda_async import CudaAsyncAllocator
from allocsim.policies.cupy_pool import ALLOCATION_UNIT_SIZE, CuPyPoolAllocator
from allocsim.policies.on_demand import OnDemandAllocator
from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.policies.pytorch.settings import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    NO_LIMIT,
)
from allocsim.policies.tpu import COMPACTION_BASE_S, COMPACTION_PER_GB_S, TpuRuntimeAllocator
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
from allocsim.traces.model import Trace

# The policy classes the core replays, by the family of its code that does (native/src/);
# which settings of each it has, :func:`policy_config` says.
NATIVE_POLICIES: dict[type, str] = {
    BFCAllocator: "chunk",
    PreallocateAllocator: "chunk",
    BestFitAllocator: "chunk",
    PyTorchCachingAllocator: "pytorch",
    OnDemandAllocator: "on-demand",
    BuddyAllocator: "buddy",
    CuPyPoolAllocator: "cupy",
    CudaAsyncAllocator: "cuda-async",
    TpuRuntimeAllocator: "tpu",
}
# What the core has of each policy, in words (``allocsim policies``; docs/architecture.md,
# "Native core").
NATIVE_SETTINGS = {
    "preallocate": "every setting",
    "best-fit": "every setting",
    "bfc": "every setting",
    "on-demand": "every setting",
    "buddy": "every setting",
    "jax": "every setting (allocator=bfc, platform or cuda_async)",
    "pytorch": "every setting (expandable_segments included)",
    "cupy": "every setting",
    "cuda-async": "every setting",
    "tpu": "every setting",
}
_SIZE_LIMIT = 1 << 60           # the core's int64 arithmetic on sizes (rounding, doubling)
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


def is_native(spec: PolicySpec, profile: DeviceProfile | None = None) -> bool:
    """Whether the core has this policy with these settings (on ``profile``, by default the
    default device): the constants of the Python policy built for it say."""
    resolved = spec.resolved()
    if resolved.policy_class not in NATIVE_POLICIES:
        return False
    device = SimulatedDevice(profile or PROFILES[DEFAULT_PROFILE])
    return policy_config(resolved.build(device.view(0))) is not None


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


def policy_config(policy: Any) -> dict[str, Any] | None:
    """The constants of a freshly built Python policy as the core takes them; None when the
    core does not have its class."""
    family = NATIVE_POLICIES.get(type(policy))
    if family is None:
        return None
    if isinstance(policy, PyTorchCachingAllocator):
        return _pytorch_config(policy)
    if isinstance(policy, OnDemandAllocator):
        return {"family": family}
    if isinstance(policy, CuPyPoolAllocator):
        return {"family": family, "unit": ALLOCATION_UNIT_SIZE, "limit": policy.get_limit()}
    if isinstance(policy, CudaAsyncAllocator):
        return {"family": family, "threshold": policy.threshold, "chunk": policy.chunk,
                "alignment": policy.alignment, "sync_on_free": bool(policy.sync_on_free),
                "preallocate": bool(policy.preallocate_pending)}
    if isinstance(policy, TpuRuntimeAllocator):
        if not (0 <= policy.runtime_bytes < _SIZE_LIMIT and policy.granule < _SIZE_LIMIT):
            return None       # the core's int64 heap size and rounding
        return {"family": family, "granule": policy.granule,
                "runtime_bytes": policy.runtime_bytes, "compaction_base_s": COMPACTION_BASE_S,
                "compaction_per_gb_s": COMPACTION_PER_GB_S}
    if isinstance(policy, BuddyAllocator):
        return {"family": family, "min_block": policy.min_block, "arena": policy.arena,
                "release": bool(policy.release)}
    config: dict[str, Any] = {"family": family, "bin_of_bits": list(BIN),
                              "alignment": policy.alignment, "max_slack": policy.max_slack}
    if isinstance(policy, BFCAllocator):
        if not 0 <= policy.memory_limit < _SIZE_LIMIT:
            return None       # the core's int64 Extend (its region size held below 2**62)
        config.update(growth="bfc", memory_limit=policy.memory_limit,
                      first_region=policy.curr_region_allocation_bytes,
                      min_allocation=MIN_ALLOCATION,
                      garbage_collection=bool(policy.garbage_collection),
                      backpedal_factor=BACKPEDAL_FACTOR)
    else:
        config.update(growth="best-fit", page=policy.page, heap_base=policy.heap_base,
                      trim=bool(policy.trim))
    return config


def _pytorch_config(policy: PyTorchCachingAllocator) -> dict[str, Any]:
    """PyTorch's constants and settings for the core (it has every setting)."""
    segments = policy.expandable_segments
    ranges = ({"range_small": segments.range_size(K_SMALL_BUFFER),
               "range_large": segments.range_size(K_LARGE_BUFFER)} if segments is not None else {})
    return {"family": "pytorch", "min_block_size": K_MIN_BLOCK_SIZE, "small_size": K_SMALL_SIZE,
            "small_buffer": K_SMALL_BUFFER, "large_buffer": K_LARGE_BUFFER,
            "min_large_alloc": K_MIN_LARGE_ALLOC, "round_large": K_ROUND_LARGE,
            "set_fraction": bool(policy.set_fraction),
            "allowed_memory_maximum": policy.allowed_memory_maximum,
            "divisions": list(policy.divisions) if any(d > 1 for d in policy.divisions) else [],
            "max_split_size": policy.max_split_size, "no_limit": NO_LIMIT,
            "max_non_split_rounding": policy.max_non_split_rounding,
            "gc_on": bool(policy.set_fraction and policy.gc_threshold > 0.0),
            "gc_threshold": float(policy.gc_threshold), "expandable": bool(policy.expandable),
            **ranges}


def _columns_fit(trace: Trace, sizes: np.ndarray) -> bool:
    """Whether the core's int64 arithmetic holds the trace (sizes far below 2**63, no id equal
    to its live map's empty marker); else the Python models, with their unbounded ints."""
    if not len(trace):
        return True
    ids = trace.column("id")
    return int(sizes.max()) < _SIZE_LIMIT and int(ids.min()) != _ID_EMPTY


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

    def state(self) -> dict[str, Any]:
        return dict(self._replay.state())

    def snapshot(self) -> Any:
        """The run's whole state now, for another run to :meth:`resume` from (min-capacity's
        shared runs, sim/questions/shared_runs.py); it holds where it stands
        (``next_index``, ``ooms``) and the capacities and limits under which every decision so
        far goes the same way (``granted_most``, ``refused_least``, ``limit_lo``,
        ``limit_hi``)."""
        return self._replay.snapshot()

    def resume(self, saved: Any) -> None:
        """This fresh run continues from ``saved`` (a state of a run of the same policy family
        and trace). Sound only where the two runs decide alike up to there: the caller's
        argument (shared_runs.py)."""
        self._replay.resume(saved)


def open_run(trace: Trace, spec: PolicySpec, profile: DeviceProfile, *, stop_on_oom: bool,
             timeline_points: int, events: int | None = None,
             record_addresses: bool = False) -> NativeRun | None:
    """The run in the core, ready to advance; None when the core cannot take it (see the
    module docstring). ``events`` replays only the first so many (the timeline's buckets are
    of those: a run that stopped early is replayed again so)."""
    module = core()
    if module is None:
        return None
    resolved = spec.resolved()
    if resolved.policy_class not in NATIVE_POLICIES:
        return None
    trace = buffers_on_device(trace, profile)   # a TPU holds u8[n] buffers
    device = SimulatedDevice(profile)
    # Built on the run's own (fresh) device: its constructor's device calls (best-fit's
    # address range) move the bump pointer exactly as the Python run's would.
    policy = resolved.build(device.view(0))
    config = policy_config(policy)
    device_figures = device_config(profile, device)
    sizes = trace.matched_sizes(packed=True)
    if config is None or device_figures is None or not _columns_fit(trace, sizes):
        return None
    columns = (trace.column("op"), trace.column("id"), sizes, trace.column("stream"))
    n = len(trace)
    events = n if events is None else events
    replay = module.replay(columns, events, max(1, -(-events // timeline_points)),
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
        # (ProcessReplay._timeline), so those events are replayed again in such buckets.
        again = open_run(trace, spec, profile, stop_on_oom=True,
                         timeline_points=timeline_points, events=state["next_index"],
                         record_addresses=record_addresses is not None)
        assert again is not None
        again.advance(again.n)
        state = again.state()
        state["stopped"] = True
    if record_addresses is not None:
        record_addresses.extend(state["addresses"].tolist())
    return _result(trace, str(spec), profile.name, state)


def _result(trace: Trace, policy: str, device_name: str, state: dict[str, Any]) -> RunResult:
    """ProcessReplay.result for the core's state."""
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
    """ProcessReplay._timeline from the core's buckets and samples."""
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
