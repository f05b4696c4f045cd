"""Runs that share their start: a run resumes from a saved state of an earlier one.

min-capacity replays one trace at ~30 capacities, and runs at nearby capacities are one run up
to the first decision the capacity changes. A run reads its capacity in two places only:

- the device, at each call: it grants ``used + bytes`` up to its capacity and refuses above.
  A run that so far had every call granted at ``used + bytes`` ≤ ``granted_most`` and refused
  at ≥ ``refused_least`` would have had each call answered alike at any capacity in
  ``[granted_most, refused_least - 1]`` (policy back-offs and PyTorch's free-cached-and-retry
  follow from these answers);
- the policy's own limit, where it has one derived from the capacity (BFC's memory_limit =
  fraction × capacity, read by Extend's ``available``, its region size ``min(curr, limit −
  pool)`` and DeallocateFreeRegions; PyTorch's allowed_memory_maximum, read by the fraction's
  cap and its garbage-collection threshold; CuPy's pool limit; the stream-ordered pool's
  release threshold, fraction × capacity with a fraction, read at each synchronisation and
  trim and by the preallocation's size): each such decision narrows
  the policy's :class:`~allocsim.policies.limit_window.LimitWindow`, the limits under which
  all of them go the same way.

Everything else a run does is a function of the trace and the policy's other constants. So
two runs whose constants are equal but for the limit (the same :func:`_shape`), at a point
where the second's capacity is inside the first's device window and its limit inside the
first's limit window, are the same run up to that point, in state as in every figure: the
second may start from the first's saved state there (the native core's ``snapshot`` and
``resume``) instead of from event 0, and it ends as a replay from event 0 would, byte for
byte. A window only shrinks as a run goes on, so the state worth resuming from is the latest
one whose windows hold the capacity.

The same holds between settings that differ only in the limit (tune's fractions on one card:
:meth:`SharedRuns.replay`, tune/search.py's local_evaluator). A policy whose constants differ with
the capacity beyond its limit shares nothing and restarts: JAX's preallocation
(``allow_growth=false``: the first region is the limit, taken at event 0), BFC's
``fragmentation_fraction`` (its split threshold follows the limit), best-fit's address range
(the device's next address follows the capacity). The TPU runtime reads the capacity itself
(its heap), so its runs never share.

States are saved every ``n / CHECKPOINTS`` events of each run (a resumed run's loss is at most
one spacing), only while no OOM has happened (a probe stops at its first); a run's state whose
windows are those of its previous one replaces it, and at most :data:`MAX_SAVED` are kept
(past that, those of the shape used longest ago go). With a ``grid`` (min-capacity's
resolution: its oracle asks each capacity on that grid once), a run saves only while its
windows hold one of the two grid capacities next to its own whose runs are of its shape: the
device window and the limit window are intervals, and the limit (as every other constant a
run takes from the capacity) never falls as the capacity rises, so windows that hold neither
neighbour hold no other capacity of the grid, and, as windows only shrink, neither do those
of any later state of that run. Which state a run resumes from never changes its result;
this spares the copies no run could resume from (BFC's family, whose limit window closes to
256 bytes at its first region that the limit sizes: every state a copy for nothing).
tests/test_shared_runs.py holds the shared search to the plain one, probe for probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from allocsim.policies import PolicySpec, parse_policy
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.device_buffers import buffers_on_device
from allocsim.sim.kernel.engine import replay
from allocsim.sim.kernel.native import CoreColumns, NativeRun, core_columns, result_of
from allocsim.sim.kernel.native import open_run as open_native_run
from allocsim.sim.kernel.results import RunResult
from allocsim.sim.questions.capacity.period import Period, find_period
from allocsim.sim.questions.run_repeats import (
    CoreMoment,
    core_checks,
    core_moment,
    core_repeats,
    repeated_state,
)
from allocsim.traces.model import Trace

CHECKPOINTS = 64                # states saved per run, evenly spaced
MAX_SAVED = 256                 # states kept in all
REPEAT_SHARE = 8                # replay(): a run looks for a repeat this far (1/8 of it)
REPEAT_MIN_EVENTS = 1 << 14     # ... on traces at least this long

# The constant that is the policy's limit, per family of the core: it may differ between runs
# that share (each decision against it is in the policy's limit window). Families absent
# from _SHARING never share.
_LIMIT_KEY = {"chunk": "memory_limit", "pytorch": "allowed_memory_maximum", "cupy": "limit",
              "cuda-async": "threshold"}
_SHARING = {"chunk", "pytorch", "on-demand", "buddy", "cupy", "cuda-async"}


@dataclass(frozen=True)
class _Saved:
    """A run's state at ``index`` and the capacities and limits that share it."""

    index: int
    granted_most: int
    refused_least: int          # -1: none refused
    limit_lo: int
    limit_hi: int
    state: Any                  # the core's Snapshot

    @property
    def windows(self) -> tuple[int, int, int, int]:
        return self.granted_most, self.refused_least, self.limit_lo, self.limit_hi

    def holds(self, capacity: int, limit: int) -> bool:
        """Whether a run at device capacity ``capacity`` (whole granules) under ``limit``
        decides as this run did up to here."""
        return _windows_hold(self.windows, capacity, limit)


def _windows_hold(windows: tuple[int, int, int, int], capacity: int, limit: int) -> bool:
    """Whether a run at device capacity ``capacity`` (whole granules) under ``limit`` lies in
    ``windows`` (granted_most, refused_least, limit_lo, limit_hi): it would have decided as
    the run they are of did."""
    granted_most, refused_least, limit_lo, limit_hi = windows
    return (granted_most <= capacity and (refused_least < 0 or capacity < refused_least)
            and limit_lo <= limit <= limit_hi)


def _shape(run: NativeRun) -> tuple[object, int] | None:
    """What two runs must share to share a start, and the run's limit; None if its family
    never shares."""
    family = run.config["family"]
    if family not in _SHARING:
        return None
    limit_key = _LIMIT_KEY.get(family)
    if family == "chunk" and run.config["growth"] != "bfc":
        limit_key = None            # best-fit has no limit
    config = {k: v for k, v in run.config.items() if k != limit_key}
    limit = int(run.config[limit_key]) if limit_key else 0
    if limit_key:
        # Whether there is a limit at all is a decision of its own (CuPy's 0 = none; the
        # stream-ordered pool's threshold of 0 keeps nothing and preallocates nothing).
        config["has limit"] = limit != 0
    device = {k: v for k, v in run.device.items() if k != "capacity"}
    return repr((sorted(config.items()), sorted(device.items()))), limit


class SharedRuns:
    """Native runs of one trace, each resumed from the latest saved state of an earlier run it
    shares (module docstring). ``runs`` counts the runs, ``resumed`` those that did not start
    at event 0, ``events_run`` the events replayed in all and ``events_resumed`` those the
    resumed runs did not replay. ``share=False``: every run from event 0, nothing saved."""

    def __init__(self, trace: Trace, *, timeline_points: int, share: bool = True,
                 repeats: bool = True, grid: int | None = None) -> None:
        self.trace = trace
        self.timeline_points = timeline_points
        self.share = share
        # The capacities runs are asked at, multiples of this, each once (min-capacity's
        # oracle): a run saves only while another of them could resume from it (module
        # docstring). None: runs at any capacity may come (tune's), every state is saved.
        self.grid = grid
        self.repeats = repeats              # replay() copies a repeating run's tail
        self.repeated_runs = 0              # ... and this many were
        self.repeat_stops = 0               # run(period=): runs that stopped at a repeat
        self._period_of: tuple[Trace, Period | None] | None = None
        self._ends: dict[object, list[tuple[_Saved, dict[str, Any]]]] = {}  # copied runs' ends
        self.runs = 0
        self.resumed = 0
        self.events_run = 0
        self.events_resumed = 0
        self._saved: dict[object, list[_Saved]] = {}
        self._count = 0
        self._columns: CoreColumns | None = None    # the trace's, checked once (native.py)

    def run(self, spec: PolicySpec, profile: DeviceProfile, *, stop_on_oom: bool,
            until: int | None = None, period: Period | None = None) -> dict[str, Any] | None:
        """The run of ``spec`` on ``profile`` to its end (or first OOM, with ``stop_on_oom``;
        or event ``until``, where given): the core's state, as a replay from event 0 leaves it;
        None where the core cannot take it. With the trace's ``period`` (a policy the core sees
        repeat itself: run_repeats.py's core_checks), the run stops once it repeats, its state
        then under ``repeated_from`` (the boundary; None where it did not): it completes as
        the run to the end would, with the same device and limit windows."""
        run = self._open(spec, profile, stop_on_oom=stop_on_oom)
        if run is None:
            return None
        self.runs += 1
        shape = _shape(run) if self.share else None
        saved = None
        if shape is not None:               # the shape used last goes last (_save evicts)
            saved = self._saved.pop(shape[0], [])
            self._saved[shape[0]] = saved
        start = 0
        if shape is not None and saved:
            own_capacity = int(run.device["capacity"])
            sharing = [s for s in saved if s.holds(own_capacity, shape[1])]
            if sharing:
                latest = max(sharing, key=lambda s: s.index)
                run.resume(latest.state)
                start = latest.index
                self.resumed += 1
                self.events_resumed += start
        spacing = max(1, run.n // CHECKPOINTS)
        end = run.n if until is None else min(run.n, until)
        done = start
        mark = (start // spacing + 1) * spacing
        own: _Saved | None = None       # this run's latest saved state
        # The grid capacities next to this run's and their limits, found at its first save
        # (None: no grid, or not found; every state is saved).
        neighbours: list[tuple[int, int]] | None = None
        looked = not self.grid or shape is None
        # Each boundary a period is checked from, then its end (boundaries lie a period or
        # more apart: in order).
        checks = [] if period is None else [
            (at, boundary) for boundary in period.boundaries()
            if boundary >= start and boundary + period.length <= end
            for at in (boundary, boundary + period.length)]
        then: CoreMoment | None = None
        repeated_from = None
        while done < end and not run.stopped and repeated_from is None:
            target = min(end, mark) if saved is not None else end
            if checks:
                target = min(target, checks[0][0])
            done = run.advance(target)
            if saved is not None and done == mark < run.n:
                if not looked:
                    looked = True
                    assert shape is not None
                    neighbours = self._neighbours(spec, profile, shape[0])
                windows = None if neighbours is None else run.windows()
                if windows is None or any(_windows_hold(windows, capacity, limit)
                                          for capacity, limit in neighbours or ()):
                    own = self._save(run, done, saved, own)
                else:
                    saved = None            # ... nor will any later state of this run
            if done == mark:
                mark += spacing
            if checks and done == checks[0][0]:
                at, boundary = checks.pop(0)
                if run.ooms:            # a repeat is a period without an OOM from a state without
                    checks = []
                elif at == boundary:
                    then = core_moment(run)
                elif period is not None and core_repeats(period, boundary, then,
                                                         core_moment(run)):
                    repeated_from = boundary
        self.events_run += done - start
        self.repeat_stops += repeated_from is not None
        state = run.state()
        state["repeated_from"] = repeated_from
        return state

    def replay(self, policy: str | PolicySpec, profile: DeviceProfile) -> RunResult:
        """``replay(trace, policy, profile, stop_on_oom=True)``, the same result, its run
        shared where the core takes it, or its tail copied where the run repeats itself
        (:meth:`repeated`)."""
        spec = parse_policy(policy)
        if len(self.trace.processes()) <= 1:
            state = self.repeated(spec, profile)
            if state is None:
                state = self.run(spec, profile, stop_on_oom=True)
            if state is not None:
                return result_of(self.trace, spec, profile, state,
                                 timeline_points=self.timeline_points)
        return replay(self.trace, spec, profile, stop_on_oom=True)

    def repeated(self, spec: PolicySpec, profile: DeviceProfile) -> dict[str, Any] | None:
        """The core's state at the end of the whole run of ``spec`` on ``profile`` (to its
        first OOM), its tail copied from a period where the trace repeats and the run, seen by
        the core alone, settles into repeating itself within 1/:data:`REPEAT_SHARE` of it
        (sim/questions/run_repeats.py); None where not (the caller runs it whole, having lost
        at most that share of a replay). Traces under :data:`REPEAT_MIN_EVENTS` events are
        left to the core whole: the period search costs more than their replay."""
        if (not self.repeats or len(self.trace) < REPEAT_MIN_EVENTS
                or not core_checks(spec.resolved().policy_class)):
            return None
        on_device = buffers_on_device(self.trace, profile)
        if self._period_of is None or self._period_of[0] is not on_device:
            self._period_of = (on_device, find_period(on_device))
        period = self._period_of[1]
        if period is None:
            return None
        run = self._open(spec, profile, stop_on_oom=True)
        if run is None:
            return None
        shape = _shape(run) if self.share else None
        if shape is not None:
            # An earlier copied run whose windows hold this one's capacity and limit decided
            # every event as this one would: its end is this one's.
            capacity = int(run.device["capacity"])
            for windows, end in self._ends.get(shape[0], ()):
                if windows.holds(capacity, shape[1]):
                    self.runs += 1
                    self.repeated_runs += 1
                    return dict(end)
        state = repeated_state(spec, period, run, budget=len(on_device) // REPEAT_SHARE)
        if state is None:
            return None
        self.runs += 1
        self.repeated_runs += 1
        if shape is not None:
            device, (lo, hi) = state["device"], state["limit_window"]
            windows = _Saved(run.n, device["granted_most"], device["refused_least"], lo, hi, None)
            self._ends.setdefault(shape[0], []).append((windows, dict(state)))
        return state

    def _open(self, spec: PolicySpec, profile: DeviceProfile, *,
              stop_on_oom: bool) -> NativeRun | None:
        """The run in the core, on the trace's columns as checked once for this device."""
        on_device = buffers_on_device(self.trace, profile)     # the same object each time
        if self._columns is None or self._columns.trace is not on_device:
            self._columns = core_columns(on_device)
        return open_native_run(self.trace, spec, profile, stop_on_oom=stop_on_oom,
                               timeline_points=self.timeline_points, columns=self._columns)

    def _neighbours(self, spec: PolicySpec, profile: DeviceProfile,
                    shape: object) -> list[tuple[int, int]] | None:
        """The device capacity and limit of the runs at the two capacities of the grid next
        to ``profile``'s that share this run's shape: those that could resume from a state of
        this run. A neighbour of another shape is left out, and with it every capacity beyond
        it: each constant the shape holds that follows the capacity (BFC's first region and
        split threshold, a preallocation's size, whether there is a limit at all) never falls
        as the capacity rises (tests/test_shared_runs.py checks it for every family that
        shares), so one that differs from this run's at the neighbour differs beyond it too.
        None where the core cannot take a neighbour's run: every state is saved."""
        assert self.grid
        below = (profile.capacity - 1) // self.grid * self.grid
        above = profile.capacity // self.grid * self.grid + self.grid
        found = []
        for capacity in (below, above):
            if capacity <= 0:
                continue
            other = self._open(spec, profile.device_with(capacity, profile.context_bytes),
                               stop_on_oom=True)
            other_shape = None if other is None else _shape(other)
            if other is None or other_shape is None:
                return None
            if other_shape[0] == shape:
                found.append((int(other.device["capacity"]), other_shape[1]))
        return found

    def _save(self, run: NativeRun, index: int, saved: list[_Saved],
              own: _Saved | None) -> _Saved | None:
        """Save ``run``'s state at ``index`` (none after an OOM: a probe stops at its first).
        A state whose windows are those of the run's previous one replaces it: every run that
        shares the earlier shares the later."""
        state = run.snapshot()
        if state.ooms:
            return own
        new = _Saved(index, state.granted_most, state.refused_least, state.limit_lo,
                     state.limit_hi, state)
        if own is not None and own.windows == new.windows:
            saved.remove(own)
        else:
            if self._count >= MAX_SAVED and not self._evict(saved):
                return own
            self._count += 1
        saved.append(new)
        return new

    def _evict(self, keep: list[_Saved]) -> bool:
        """Room for one more state: drop the states of the shape used longest ago (tune's
        settings are each run once; only settings that differ in their limit come back).
        False where only ``keep``'s own are left."""
        for shape, states in self._saved.items():
            if states is not keep and states:
                self._count -= len(states)
                self._saved[shape] = []
                return True
        return False


__all__ = ["CHECKPOINTS", "MAX_SAVED", "REPEAT_MIN_EVENTS", "REPEAT_SHARE", "SharedRuns"]
