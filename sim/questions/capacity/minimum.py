"""The smallest device that runs a trace without OOM, per policy ("what GPU do I need?").

For each policy: find a capacity that fails and one that works (climbing from the lower bound —
peak live bytes: no allocator that keeps data in place can do with less — in doubling steps, up
to the peak reserved seen on a big device, doubled from there while it fails), then narrow the
interval between them to the stated resolution (:func:`_probe_point`: an eighth of the way up,
since a failing replay stops at its first OOM and costs a few percent of a passing one).
Allocators are not always monotone in capacity — preallocation takes a fraction of whatever the
device has, back-off depends on what is free — so the answer is then verified: capacities just
above it must pass, and a spread of capacities below it must fail. Any exception is reported
(``monotone: false``) with the smallest passing capacity found, which becomes the answer. Where
the policy is not monotone the answer depends on where the search looked: it is a capacity that
completes, never a promise that every larger one does (the exceptions say where that fails).

Speed (issue 17): the search asks "does it complete at c?" for ~30 capacities, and a passing
answer needs a whole replay. :class:`~allocsim.sim.questions.capacity.oracle.CompletionOracle`
answers each capacity once, and from replays already run wherever the policy's declared
capacity use (``capacity_use``, policies/base.py) shows the answer — the arguments are in that
module's docstring. The answers (``min_capacity``, ``monotone``, ``exceptions``) are exactly
those of a replay per capacity; only ``evaluations``, the replays actually run, is smaller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from allocsim.errors import UserInputError
from allocsim.policies import PolicySpec, format_size
from allocsim.policies.units import round_up
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.questions.capacity.oracle import PROBE_CAPACITY, CompletionOracle
from allocsim.sim.questions.compare import normalize_spec
from allocsim.sim.questions.offline import OFFLINE_NAME, offline_result
from allocsim.traces.model import Trace
from allocsim.traces.tpu_needed import has_needed_view, needed_view

MiB = 1 << 20
MIN_CAPACITY_KIND = "allocsim-min-capacity"   # the "kind" of min_capacity.json and --json
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
    # The device's own share (CUDA context and libraries, the TPU runtime's bytes), held on
    # every card before any allocator starts: part of min_capacity and so of the headroom.
    context_bytes: int = 0
    # Every capacity above the answer that the search saw fail (the exceptions, as numbers):
    # where the policy is not monotone the answer is a range, from min_capacity to one
    # resolution above the last of these (:attr:`completes_from`).
    failed_above: list[int] = field(default_factory=list)

    @property
    def completes_from(self) -> int | None:
        """The smallest capacity from which every capacity the search tried completed: the
        answer where the policy is monotone, higher where it fails above the answer."""
        if self.min_capacity is None:
            return None
        if not self.failed_above:
            return self.min_capacity
        return max(self.min_capacity, max(self.failed_above) + self.resolution)

    @property
    def headroom(self) -> int | None:
        """The smallest card over peak live: the context and what the allocator adds."""
        return None if self.min_capacity is None else self.min_capacity - self.lower_bound

    @property
    def allocator_headroom(self) -> int | None:
        """What the policy itself needs beyond peak live: the headroom less the context."""
        headroom = self.headroom
        return None if headroom is None else headroom - self.context_bytes

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
        data["allocator_headroom"] = self.allocator_headroom
        return data


def min_capacity(trace: Trace, policy: str | PolicySpec, device: DeviceProfile, *,
                 resolution: int = MiB) -> CapacityAnswer:
    """The smallest capacity (a multiple of ``resolution``) at which ``trace`` completes."""
    return _min_capacity(trace, policy, device, resolution, shortcuts=True)


def _min_capacity(trace: Trace, policy: str | PolicySpec, device: DeviceProfile,
                  resolution: int, *, shortcuts: bool, share: bool = True,
                  asked: dict[int, bool] | None = None) -> CapacityAnswer:
    """:func:`min_capacity`; with ``shortcuts=False`` every capacity asked about is replayed
    (the reference the tests hold the shortcuts to), with ``share=False`` every replay starts
    at event 0 (the reference for shared runs, sim/questions/shared_runs.py).
    ``asked``, where given, receives every capacity the search asked about and its answer."""
    if resolution <= 0:
        raise UserInputError(f"resolution must be a positive size, got {resolution}")
    normalized = normalize_spec(policy)
    peak_live, _ = trace.peak_live()
    lower = max(resolution, peak_live // resolution * resolution)
    # What a card holds before any allocator, as the device model takes it (sim/kernel/
    # device.py: rounded up to the granularity).
    context = round_up(device.context_bytes, device.granularity) if device.context_bytes else 0
    if isinstance(normalized, str):     # OFFLINE_NAME: the only name normalize_spec keeps
        # The plan does not depend on capacity: it fits exactly when its heap and the
        # device's own share do (the same card the online policies are asked to fit).
        roomy = device.device_with(PROBE_CAPACITY, device.context_bytes)
        heap = offline_result(trace, roomy).peak_reserved
        return CapacityAnswer(OFFLINE_NAME, round_up(max(heap, 1) + context, resolution),
                              peak_live, resolution, True, 1, context_bytes=context)
    spec = normalized
    if spec.name == "tpu" and has_needed_view(trace):
        # The runtime gives an idle executable's code and scratch up when a buffer needs the
        # room: what HBM must hold is the trace with them held through each call only.
        trace = needed_view(trace)
        peak_live, _ = trace.peak_live()
        lower = max(resolution, peak_live // resolution * resolution)

    oracle = CompletionOracle(trace, spec, device, shortcuts=shortcuts, share=share,
                              grid=resolution)
    probe = oracle.probe
    if asked is None:
        asked = {}                  # every capacity the search asked about, and the answer

    def works(capacity: int) -> bool:
        asked[capacity] = oracle.completes(capacity)
        return asked[capacity]

    if not probe.completed:
        return CapacityAnswer(str(spec), None, peak_live, resolution, True, oracle.replays,
                              context_bytes=context)
    # What the policy reserved with no limit is what most policies need at most; what the
    # device handed out (its own share too), where its declared capacity use shows the run
    # there is the generous one (known without a replay, with shortcuts). The choice reads
    # the probe alone, so the search with shortcuts and without asks the same capacities.
    guess = probe.peak_reserved
    if oracle.runs_as_the_probe(round_up(max(probe.peak_used, 1), resolution)):
        guess = probe.peak_used
    low, high = _bracket(works, lower, resolution, guess)
    if high is None:
        return CapacityAnswer(str(spec), None, peak_live, resolution, True, oracle.replays,
                              context_bytes=context)
    while high - low > resolution:
        point = _probe_point(low, high, resolution)
        if works(point):
            high = point
        else:
            low = point
    answer = high
    exceptions: list[str] = []
    for step in range(1, VERIFY_ABOVE + 1):
        capacity = answer + step * resolution
        if not works(capacity):
            shown, answer_shown = _distinct_sizes(capacity, answer, capacity - resolution)
            exceptions.append(f"fails at {shown}, above the answer {answer_shown}")
    below: list[int] = []
    if answer - resolution >= lower:
        spread = np.linspace(lower, answer - resolution, VERIFY_BELOW).astype(np.int64)
        below = np.unique(spread // resolution * resolution).tolist()
    bisected = answer
    for capacity in below:
        if capacity < answer and works(capacity):
            shown, bisected_shown = _distinct_sizes(capacity, bisected)
            exceptions.append(f"completes at {shown}, below the {bisected_shown} the bisection "
                              "found (taken as the answer)")
            answer = capacity
    return CapacityAnswer(str(spec), answer, peak_live, resolution, not exceptions,
                          oracle.replays, exceptions, context_bytes=context,
                          failed_above=sorted(c for c, completed in asked.items()
                                              if c > answer and not completed))


def _bracket(works: Callable[[int], bool], lower: int, resolution: int,
             generous_peak: int) -> tuple[int, int | None]:
    """A capacity known to fail and one known to work, the answer between them (None for the
    second: nothing up to :data:`PROBE_CAPACITY` works).

    A failing replay stops at its first OOM, which on a trace that reaches its peak early costs
    a few percent of a replay, while a passing one runs to the end: so the search climbs from
    the lower bound (which fails without a run: below peak live no allocator holds the data)
    in doubling steps of failures, and stops at ``generous_peak`` (what the policy took with
    no limit: most policies need no more). Fractions and preallocation reserve
    a share of whatever the device has, so their generous peak says nothing: the climb goes on
    past it, and from it doubles."""
    low = lower - resolution
    guess = max(lower, round_up(max(generous_peak, 1), resolution))
    step = 2 * resolution
    while low + step < guess:
        if works(low + step):
            return low, low + step
        low += step
        step *= 2
    high = guess
    while not works(high):
        low = max(low, high)
        high *= 2
        if high > PROBE_CAPACITY:
            return low, None
    return low, high


def _probe_point(low: int, high: int, resolution: int) -> int:
    """The next capacity to try between a failing ``low`` and a working ``high``: an eighth of
    the way up rather than half, on the resolution's grid. Failing replays stop at their first
    OOM and cost a few percent of a passing one, so the split that costs least asks mostly
    questions whose answer is "fails" (about 1.8 passing replays for every 2.3 of bisection's
    halving: an eighth minimises passes + ~5% per failure over the range's log)."""
    point = (low + (high - low) // 8) // resolution * resolution
    return point if point > low else low + resolution


def _distinct_sizes(a: int, b: int, *others: int) -> tuple[str, str]:
    """``a`` and ``b`` formatted with enough digits to tell them apart, and ``a`` from each of
    ``others`` (5,190,451,200 and 5,192,548,352 B are both "4.83GiB" at two decimals; the
    failures one resolution step apart above an answer must not read as one size)."""
    for precision in range(2, 7):
        shown = (format_size(a, precision), format_size(b, precision))
        sizes = {a, b, *others}
        if len({format_size(size, precision) for size in sizes}) == len(sizes):
            return shown
    return f"{a:,}B", f"{b:,}B"


def min_capacities(trace: Trace, policies: Sequence[str | PolicySpec], device: DeviceProfile, *,
                   resolution: int = MiB,
                   progress: Callable[[str], None] | None = None) -> list[CapacityAnswer]:
    answers = []
    for policy in policies:
        if progress:
            progress(str(policy))
        answers.append(min_capacity(trace, policy, device, resolution=resolution))
    return answers
