"""Does a trace complete at capacity c? — min-capacity's question, answered by a replay, or from
replays already run where the policy's declared capacity use says the answer follows.

Every answer is the one a replay at ``c`` would give (``stop_on_oom``: completed or not). The
policy declares how its decisions depend on the capacity (``capacity_use``, text read by
:class:`~allocsim.policies.base.CapacityUse`); the arguments, kind by kind. ``C`` is the
capacity the device actually has at ``c`` (whole granules, as :class:`SimulatedDevice` keeps
it); the device refuses a call exactly when ``used + bytes > C``.

- ``unknown`` (no declaration): the first, generous replay (:data:`PROBE_CAPACITY`) notes
  whether the policy ever read ``capacity``. If it did not, its decisions follow the device's
  answers only, and every call of that run had ``used + bytes`` at most the peak it used, so at
  any ``C`` from that peak to :data:`PROBE_CAPACITY` the run is the same. Else: a replay.
- ``limit``: a run at ``c`` is a function of the device's answers. Each replay records the
  largest ``used + bytes`` of a call the device granted (``lo``) and the smallest of a call it
  refused (``hi + 1``); at every ``C`` in ``[lo, hi]`` each call is answered alike, so by
  induction over the calls the run is the same and completes iff that one did. A capacity no
  replay covers gets its own replay, whose interval is kept.
- ``limit-fatal``: as ``limit``; and below the generous run's ``lo`` the first call that asks
  for more than ``C`` (every call before it asked for no more, so the run is the generous one
  until then) is refused, which fails its request: the trace does not complete.
- ``bfc-regions`` (BFC, preallocate): between two Extends, BFC's decisions are capacity-blind
  (best fit by (size, address), split when chunk ≥ min(2·request, request + 128 MiB), merges).
  An Extend at ``c`` is computed from the recorded pool, doubling size and request with ``c``'s
  memory_limit; up to the first Extend whose region differs from the replay's, the run is that
  replay. A region ``d`` bytes larger or smaller differs only in its last chunk (the newest
  region holds the highest addresses; regions never merge), so a watch
  (sim/questions/capacity/regions.py) records, for each region until the next Extend, the
  interval of ``d`` for which every best-fit choice and split stays the same (the last chunk,
  when free, neither chosen instead nor passed over; its split decision unchanged). Inside it
  the run is the replay's until that next Extend, where ``c`` fails if the request exceeds
  what its limit leaves (later Extends only shrink it); past the replay's end it completes iff
  the replay did. Otherwise: a replay.

Whatever the kind, a replay of a repeating trace stops as soon as it repeats itself
(sim/questions/capacity/period.py), for the policies whose decision state is known
(sim/questions/run_repeats.py: BFC, preallocate, CuPy, PyTorch, compared as they are, with
no device call within the period; the stream-ordered pool, whose decisions read addresses
only through their order, compared by place, so a period may map and unmap memory at fresh
addresses as long as the device has handed out the same memory at both ends); it completes,
as the whole replay would. The core sees each of these repeats by itself (its decision
rows), so such replays run there; the Python twin's run checks the same states where the
core is not built. tests/test_capacity_repeats.py holds each state to a trace whose events
repeat while its runs do not.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocsim.policies import PolicySpec
from allocsim.policies.base import (
    CAPACITY_BFC_REGIONS,
    CAPACITY_LIMIT,
    CAPACITY_LIMIT_FATAL,
    CAPACITY_UNKNOWN,
    capacity_use_of,
)
from allocsim.sim.kernel.device import DeviceProfile, ProcessDevice, SimulatedDevice
from allocsim.sim.kernel.device_buffers import buffers_on_device
from allocsim.sim.kernel.engine import TIMELINE_POINTS, ProcessReplay, replay
from allocsim.sim.questions.capacity.period import Period, find_period
from allocsim.sim.questions.capacity.regions import RegionWatch
from allocsim.sim.questions.run_repeats import core_checks, find_repeat, knows
from allocsim.sim.questions.shared_runs import SharedRuns
from allocsim.traces.model import Trace

PROBE_CAPACITY = 1 << 50          # "unlimited" for the first run (1 PiB)
_NEVER = 1 << 62                  # an interval's open end


class _WatchedView(ProcessDevice):
    """A process's device view that notes whether the policy ever read ``capacity``."""

    capacity_read = False

    @property
    def capacity(self) -> int:
        self.capacity_read = True
        return self._capacity

    @capacity.setter
    def capacity(self, value: int) -> None:
        self._capacity = value


class _RecordingDevice(SimulatedDevice):
    """The simulated device, noting the largest ``used + bytes`` it granted (``lo``) and the
    smallest it refused, minus one (``hi``): the capacities at which it answers alike."""

    def __init__(self, profile: DeviceProfile) -> None:
        super().__init__(profile)
        self.lo = 0
        self.hi = _NEVER

    def view(self, process: int = 0) -> ProcessDevice:
        if process not in self.views:
            self.views[process] = _WatchedView(self, process)
        return self.views[process]

    def _take(self, nbytes: int) -> bool:
        need = self.used + nbytes
        if need > self.capacity:
            if need - 1 < self.hi:
                self.hi = need - 1
            return False
        self.used = need
        if need > self.peak_used:
            self.peak_used = need
        if need > self.lo:
            self.lo = need
        return True


@dataclass(frozen=True)
class Probe:
    """What the generous replay showed."""

    completed: bool
    peak_reserved: int
    peak_used: int          # the most the device had handed out at once
    capacity_read: bool     # did the policy ever look at the device's capacity?


@dataclass(frozen=True)
class _Interval:
    """The replay at ``capacity`` ran the same at every device capacity in [lo, hi] (``limit``
    policies)."""

    capacity: int
    lo: int
    hi: int
    completed: bool


class CompletionOracle:
    """``completes(c)``: does ``trace`` run through ``spec`` without OOM on ``device`` with
    capacity ``c``? Each capacity is answered once; ``replays`` counts the replays run (the
    generous probe included). With ``shortcuts=False`` every capacity is replayed."""

    def __init__(self, trace: Trace, spec: PolicySpec, device: DeviceProfile, *,
                 shortcuts: bool = True, native: bool = True, share: bool = True,
                 grid: int | None = None) -> None:
        if len(trace.processes()) > 1:
            replay(trace, spec, device)     # raises replay's UserInputError for this trace
        self.trace = buffers_on_device(trace, device)   # a TPU holds u8[n] buffers
        self.spec = spec
        self.device = device
        self.shortcuts = shortcuts
        self.native = native            # replays in the core where it can (_native_replay)
        # ... each resumed from the latest saved state of an earlier run it shares
        # (sim/questions/shared_runs.py); share=False: each from event 0. ``grid``: the
        # search asks only multiples of it (min-capacity's resolution), so a run saves only
        # the states a run at another of them could resume from.
        self.shared = SharedRuns(self.trace, timeline_points=TIMELINE_POINTS, share=share,
                                 grid=grid)
        resolved = spec.resolved()
        self.kind = capacity_use_of(resolved.policy_class, dict(resolved.params))
        self._resolved = resolved
        self.replays = 0
        self.skipped = 0                    # events the periodic skip did not replay
        self._found_period: tuple[Period | None] | None = None
        self._known: dict[int, bool] = {}
        self._intervals: list[_Interval] = []
        self._watches: list[RegionWatch] = []
        self.probe = self._probe()

    def _card(self, capacity: int) -> DeviceProfile:
        """This device as a card of ``capacity`` bytes: a search over card sizes keeps the
        device's own share (DeviceProfile.device_with's rule)."""
        return self.device.device_with(capacity, self.device.context_bytes)

    def _effective(self, capacity: int) -> int:
        granularity = self.device.granularity
        return capacity // granularity * granularity

    def _probe(self) -> Probe:
        """The replay at :data:`PROBE_CAPACITY` (to the end, OOMs or not), watched."""
        native = self._native_replay(PROBE_CAPACITY, stop_on_oom=False)
        if native is not None:
            device = native[1]
            # The core's policy reads nothing of the device but its answers: what the
            # capacity decides, the Python policy built for the run read at its build.
            watched = _RecordingDevice(self._card(PROBE_CAPACITY)).view(0)
            self._resolved.build(watched)
            assert isinstance(watched, _WatchedView)
            return Probe(native[0], device["peak_reserved"], device["peak_used"],
                         watched.capacity_read)
        simulated = _RecordingDevice(self._card(PROBE_CAPACITY))
        run = ProcessReplay(self.trace, self.spec, simulated)
        watch = self._watch(run, simulated)
        completed = self._run(run)
        self.replays += 1
        view = simulated.view(0)
        assert isinstance(view, _WatchedView)
        self._keep(simulated, watch, completed)
        return Probe(completed, view.peak_reserved, simulated.peak_used, view.capacity_read)

    def _watch(self, run: ProcessReplay, simulated: SimulatedDevice) -> RegionWatch | None:
        if self.kind != CAPACITY_BFC_REGIONS or not self.shortcuts:
            return None
        return RegionWatch(run.policy, simulated)

    def _keep(self, simulated: _RecordingDevice, watch: RegionWatch | None,
              completed: bool) -> None:
        """Keep what a replay shows about other capacities."""
        if not self.shortcuts:
            return
        if self.kind in (CAPACITY_LIMIT, CAPACITY_LIMIT_FATAL):
            self._intervals.append(_Interval(simulated.profile.capacity, simulated.lo,
                                             simulated.hi, completed))
        if watch is not None:
            watch.completed = completed
            self._watches.append(watch)

    def completes(self, capacity: int) -> bool:
        if capacity not in self._known:
            known = self._shown(capacity) if self.shortcuts else None
            self._known[capacity] = self._replay(capacity) if known is None else known
        return self._known[capacity]

    def runs_as_the_probe(self, capacity: int) -> bool:
        """Whether the policy's declared capacity use alone shows that the run at ``capacity``
        is the generous run (module docstring: ``limit`` and ``limit-fatal`` at a device
        capacity from the most it handed out; ``unknown`` there too if the policy never read
        the capacity; ``bfc-regions``, which needs a watch, never). It reads only the probe,
        with shortcuts or without, so a search asks the same capacities either way
        (min-capacity's first guess: a search that chose its points from the replays it had
        kept would choose others without them, and where the policy is not monotone find
        another answer)."""
        probe = self.probe
        if capacity > PROBE_CAPACITY or self._effective(capacity) < probe.peak_used:
            return False
        if self.kind in (CAPACITY_LIMIT, CAPACITY_LIMIT_FATAL):
            return True
        return self.kind == CAPACITY_UNKNOWN and not probe.capacity_read

    def _shown(self, capacity: int) -> bool | None:
        """The answer at ``capacity`` if the replays run so far show it (module docstring)."""
        effective = self._effective(capacity)
        probe = self.probe
        if self.kind in (CAPACITY_LIMIT, CAPACITY_LIMIT_FATAL):
            for interval in self._intervals:
                if interval.lo <= effective <= interval.hi:
                    return interval.completed
            if (self.kind == CAPACITY_LIMIT_FATAL and probe.completed
                    and effective < self._intervals[0].lo):
                return False
            return None
        if self.kind == CAPACITY_BFC_REGIONS:
            policy = self._resolved.build(
                SimulatedDevice(self._card(capacity)).view(0))
            limit = policy.memory_limit                             # type: ignore[attr-defined]
            init_curr = policy.curr_region_allocation_bytes         # type: ignore[attr-defined]
            mif = policy.max_internal_fragmentation                 # type: ignore[attr-defined]
            for watch in self._watches:
                shown = watch.answer(effective, limit, init_curr, mif, self.device.granularity)
                if shown is not None:
                    return shown
            return None
        # ``unknown``: the generous run's answer where it is that run (one rule for both uses).
        return probe.completed if self.runs_as_the_probe(capacity) else None

    def _replay(self, capacity: int) -> bool:
        """The replay at ``capacity``, to its first OOM."""
        native = self._native_replay(capacity, stop_on_oom=True)
        if native is not None:
            return native[0]
        simulated = _RecordingDevice(self._card(capacity))
        run = ProcessReplay(self.trace, self.spec, simulated, stop_on_oom=True,
                            call_log=False)         # no timeline is read of a probe
        watch = self._watch(run, simulated)
        completed = self._run(run)
        self.replays += 1
        self._keep(simulated, watch, completed)
        return completed

    def _native_replay(self, capacity: int, *, stop_on_oom: bool
                       ) -> tuple[bool, dict[str, int]] | None:
        """The replay at ``capacity`` in the native core (sim/kernel/native.py), with its
        interval kept as :meth:`_keep` keeps a Python replay's: whether it completed and the
        core's device figures; on a repeating trace, for a policy whose repeat the core sees
        by itself (sim/questions/run_repeats.py's core_checks: every policy whose decision
        state is known), the run stops once it repeats and completes. None where the Python
        replay is needed: the reference search (no shortcuts), ``native=False``, or a run the
        core does not take. Either way the answer is the replay's
        (tests/test_native_differential.py holds the two to the same runs, device calls
        included). A BFC run in the core keeps no region watch: a Python replay costs ~20 of
        the core's, more than the watch saves unless it answers nearly every capacity (on the
        1M-event transformer trace it answered none of 31); without the core (or with
        ``native=False``) the watch runs, as before."""
        if not self.shortcuts or not self.native:
            return None
        period = None
        if core_checks(self._resolved.policy_class):
            period = self._period()         # the core sees the run repeat by itself
        profile = self._card(capacity)
        state = self.shared.run(self.spec, profile, stop_on_oom=stop_on_oom, period=period)
        if state is None:
            return None
        if state["repeated_from"] is not None:
            self.skipped += len(self.trace) - state["next_index"]
        device: dict[str, int] = state["device"]
        completed = state["ooms"] == 0 and not state["stopped"]
        self.replays += 1
        self._keep_native(profile, state, completed)
        return completed, device

    def _keep_native(self, profile: DeviceProfile, state: dict, completed: bool) -> None:
        """Keep what a replay in the core shows about other capacities, as :meth:`_keep` keeps
        a Python replay's: the interval of capacities that run alike."""
        if self.kind in (CAPACITY_LIMIT, CAPACITY_LIMIT_FATAL):
            # _RecordingDevice's lo and hi: the largest `used + bytes` granted, the smallest
            # refused minus one.
            device = state["device"]
            refused = device["refused_least"]
            self._intervals.append(_Interval(profile.capacity, device["granted_most"],
                                             refused - 1 if refused >= 0 else _NEVER,
                                             completed))

    def _run(self, run: ProcessReplay) -> bool:
        """Run ``run`` to its end (or its first OOM, with ``stop_on_oom``); whether it
        completed. Where the trace repeats and the policy's decision state is known
        (sim/questions/run_repeats.py), stop as soon as the run repeats itself
        (sim/questions/capacity/period.py): it completes, as a run to the end would."""
        period = self._period() if self.shortcuts and knows(type(run.policy)) else None
        if period is not None and find_repeat(run, period) is not None:
            self.skipped += run.n - run.next_index
            return True
        run.advance(run.n)
        return run.report.ooms == 0 and not run.stopped

    def _period(self) -> Period | None:
        if self._found_period is None:
            self._found_period = (find_period(self.trace),)
        return self._found_period[0]


__all__ = ["PROBE_CAPACITY", "CompletionOracle", "Probe"]
