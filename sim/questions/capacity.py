"""The smallest device that runs a trace without OOM, per policy ("what GPU do I need?").

For each policy: find a capacity that works (doubling up from the peak reserved seen on a big
device), bisect between the lower bound (peak live bytes: no allocator that keeps data in place
can do with less) and it, to the stated resolution. Allocators are not always monotone in
capacity — preallocation takes a fraction of whatever the device has, back-off depends on what
is free — so the answer is then verified: capacities just above it must pass, and a spread of
capacities below it must fail. Any exception is reported (``monotone: false``) with the smallest
passing capacity found, which becomes the answer.

Speed (issue 17): the search asks "does it complete at c?" for ~30 capacities, and a passing
answer needs a whole replay. Two shortcuts give exactly the answers a replay per question
would (same ``min_capacity``, ``monotone`` and ``exceptions``; only ``evaluations``, the
replays actually run, is smaller):

- A replay is deterministic, so each capacity is replayed at most once (a memo).
- The first, generous replay (:data:`PROBE_CAPACITY`) runs on a device that notes whether the
  policy ever read ``capacity``. If it never did, the policy sees the capacity only through
  the device's answers to its calls, and a replay at ``c`` makes the same decisions as the
  generous one for as long as the device answers the same. The device refuses a call exactly
  when ``used + bytes > capacity``; every call the generous run made had ``used + bytes`` at
  most its peak ``P`` (or above ``PROBE_CAPACITY``, refused at both). So for
  ``P <= c <= PROBE_CAPACITY`` every answer — hence the whole run — is the same, and the
  trace completes at ``c`` iff it completed generously: no replay needed. Below ``P`` the run
  may diverge at its first refused call (a policy may free its cache and retry) and is
  replayed; a policy that reads the capacity (fractions, limits, virtual ranges sized by it)
  gets no shortcut at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from allocsim.errors import UserInputError
from allocsim.policies import PolicySpec, format_size, parse_policy
from allocsim.policies.units import round_up
from allocsim.sim.kernel.device import DeviceProfile, ProcessDevice, SimulatedDevice
from allocsim.sim.kernel.engine import ProcessReplay, replay
from allocsim.sim.questions.compare import normalize_spec
from allocsim.sim.questions.offline import OFFLINE_NAME, offline_result
from allocsim.traces.model import Trace

MiB = 1 << 20
PROBE_CAPACITY = 1 << 50          # "unlimited" for the first run (1 PiB)
VERIFY_ABOVE = 8                  # resolution steps checked above the answer
VERIFY_BELOW = 16                 # capacities checked below it, spread down to the lower bound


@dataclass
class CapacityAnswer:
    """The minimum capacity for one policy, with how sure we are of it."""

    policy: str
    min_capacity: int | None       # None: does not complete even on PROBE_CAPACITY
    lower_bound: int               # peak live bytes of the trace
    resolution: int
    monotone: bool
    evaluations: int
    exceptions: list[str] = field(default_factory=list)

    @property
    def headroom(self) -> int | None:
        return None if self.min_capacity is None else self.min_capacity - self.lower_bound

    @property
    def headroom_ratio(self) -> float | None:
        if self.min_capacity is None or not self.lower_bound:
            return None
        return self.min_capacity / self.lower_bound - 1

    def to_json_dict(self) -> dict:
        data = asdict(self)
        data["headroom"] = self.headroom
        ratio = self.headroom_ratio
        data["headroom_ratio"] = None if ratio is None else round(ratio, 6)
        return data


def _completes(trace: Trace, spec: PolicySpec, device: DeviceProfile, capacity: int) -> bool:
    return replay(trace, spec, device.with_capacity(capacity), stop_on_oom=True).completed


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


class _WatchedDevice(SimulatedDevice):
    def view(self, process: int = 0) -> ProcessDevice:
        if process not in self.views:
            self.views[process] = _WatchedView(self, process)
        return self.views[process]


@dataclass(frozen=True)
class _Probe:
    completed: bool
    peak_reserved: int
    peak_used: int          # the most the device had handed out at once
    capacity_read: bool     # did the policy ever look at the device's capacity?


def _generous_probe(trace: Trace, spec: PolicySpec, device: DeviceProfile) -> _Probe:
    """The replay at :data:`PROBE_CAPACITY`, watching whether the policy reads the capacity."""
    if len(trace.processes()) > 1:
        replay(trace, spec, device)     # raises replay's UserInputError for this trace
    simulated = _WatchedDevice(device.with_capacity(PROBE_CAPACITY))
    run = ProcessReplay(trace, parse_policy(spec), simulated)
    run.advance(run.n)
    view = simulated.view(0)
    assert isinstance(view, _WatchedView)
    result = run.result(simulated.profile.name)
    return _Probe(result.completed, result.peak_reserved, simulated.peak_used,
                  view.capacity_read)


def min_capacity(trace: Trace, policy: str | PolicySpec, device: DeviceProfile, *,
                 resolution: int = MiB) -> CapacityAnswer:
    """The smallest capacity (a multiple of ``resolution``) at which ``trace`` completes."""
    if resolution <= 0:
        raise UserInputError(f"resolution must be a positive size, got {resolution}")
    normalized = normalize_spec(policy)
    peak_live, _ = trace.peak_live()
    evaluations = 0
    lower = max(resolution, peak_live // resolution * resolution)
    if isinstance(normalized, str):     # OFFLINE_NAME: the only name normalize_spec keeps
        # The plan does not depend on capacity: it fits exactly when its heap does.
        heap = offline_result(trace, device.with_capacity(PROBE_CAPACITY)).peak_reserved
        return CapacityAnswer(OFFLINE_NAME, round_up(max(heap, 1), resolution), peak_live,
                              resolution, True, 1)
    spec = normalized

    # A capacity that works: what the policy reserved with (practically) no limit, doubled
    # until it works — preallocation and fractions make the needed size a multiple of it.
    probe = _generous_probe(trace, spec, device)
    evaluations += 1
    known: dict[int, bool] = {}

    def works(capacity: int) -> bool:
        """Whether the trace completes at ``capacity``: replayed once, or known without a
        replay where the module docstring's argument says it runs as the generous probe."""
        nonlocal evaluations
        if capacity not in known:
            if not probe.capacity_read and probe.peak_used <= capacity <= PROBE_CAPACITY:
                known[capacity] = probe.completed
            else:
                evaluations += 1
                known[capacity] = _completes(trace, spec, device, capacity)
        return known[capacity]

    if not probe.completed:
        return CapacityAnswer(str(spec), None, peak_live, resolution, True, evaluations)
    high = max(lower, round_up(max(probe.peak_reserved, 1), resolution))
    while not works(high):
        high *= 2
        if high > PROBE_CAPACITY:
            return CapacityAnswer(str(spec), None, peak_live, resolution, True, evaluations)
    low = lower - resolution            # < peak live: fails without a run (no data moves)
    while high - low > resolution:
        middle = (low + high) // 2 // resolution * resolution
        if middle <= low:
            middle = low + resolution
        if works(middle):
            high = middle
        else:
            low = middle
    answer = high
    exceptions: list[str] = []
    for step in range(1, VERIFY_ABOVE + 1):
        capacity = answer + step * resolution
        if not works(capacity):
            exceptions.append(f"fails at {format_size(capacity)} above the answer")
    below: list[int] = []
    if answer - resolution >= lower:
        spread = np.linspace(lower, answer - resolution, VERIFY_BELOW).astype(np.int64)
        below = np.unique(spread // resolution * resolution).tolist()
    for capacity in below:
        if capacity < answer and works(capacity):
            exceptions.append(f"completes at {format_size(capacity)} below the answer")
            answer = capacity
    return CapacityAnswer(str(spec), answer, peak_live, resolution, not exceptions, evaluations,
                          exceptions)


def min_capacities(trace: Trace, policies: Sequence[str | PolicySpec], device: DeviceProfile, *,
                   resolution: int = MiB,
                   progress: Callable[[str], None] | None = None) -> list[CapacityAnswer]:
    answers = []
    for policy in policies:
        if progress:
            progress(str(policy))
        answers.append(min_capacity(trace, policy, device, resolution=resolution))
    return answers
