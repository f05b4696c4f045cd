"""Why did it run out of memory — a real shortage or fragmentation? (``allocsim explain-oom``)

What it is for
    The question users ask most after a CUDA OOM. :func:`explain_oom` replays a trace until
    its first failing request and reports, at that request (after the allocator's own release
    path ran): live bytes (requested bytes of the buffers alive), reserved bytes (held from
    the device), cached-but-free bytes (reserved − in use), the largest free block and the
    device's free bytes. Then the verdict:

    - **real shortage** when live + request > capacity: no allocator that keeps data in
      place could have served it (only using less memory helps);
    - **limit** when it fits the card but not the share the policy may hold (JAX's 75% pool,
      BFC's ``fraction``/``memory_limit``, PyTorch's ``per_process_memory_fraction``): live +
      request > that limit, so only a larger share (or less memory) helps;
    - **fragmentation** otherwise: there were enough bytes within the limit, but not in one
      free block or device range (external), or they were lost to rounding and unsplit
      remainders (internal; in use > live). Bytes of the card outside the policy's limit are
      never counted as free: the policy cannot reach them.

    And the answer that makes it actionable: the same trace replayed at the same capacity
    under the offline plan (:mod:`allocsim.sim.questions.offline`, the best any allocator
    could do knowing the future), ``pytorch:expandable_segments=true``,
    ``pytorch:max_split_size_mb=N`` for a few N, ``pytorch:roundup_power2_divisions=4`` —
    and, when the failing policy is not ``pytorch``, ``pytorch`` itself, ``bfc`` and
    ``best-fit`` — which complete, and with how much to spare (capacity − peak reserved).

Two inputs
    - A PyTorch snapshot with an ``oom`` entry (:mod:`allocsim.traces.formats.torch_snapshot`):
      the failing request is the recorded one (it is not in the trace: PyTorch records no
      alloc for it), the capacity is what the process held then plus the recorded
      ``device_free`` and the policy is ``pytorch`` as recorded
      (:mod:`allocsim.sim.questions.fidelity.oom`). The state at the request
      is the seeded model's (fidelity's replay, from the state recording started in); the
      what-if replays run the trace up to and including that request from an empty device
      (what followed it in the recording depended on the OOM), the recorded settings among
      them, so every row is measured the same way.
    - Any trace + policy + device: the first request the policy fails is the one explained;
      the what-if replays run the whole trace.

Reading "spare": capacity − peak reserved of a run that completed; the offline plan's is
capacity − its heap (one region holding every buffer at a planned offset).

The command, ``allocsim explain-oom``: :mod:`allocsim.sim.cli.explain`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from allocsim.errors import UserInputError
from allocsim.policies import PolicySpec, format_size, parse_policy
from allocsim.policies.bfc import BFCAllocator
from allocsim.policies.pytorch.caching import (
    PyTorchCachingAllocator,
    get_allocation_size,
)
from allocsim.policies.settings import PyTorchSettings
from allocsim.printable import printable
from allocsim.sim.kernel.device import (
    DEFAULT_PROFILE,
    DeviceProfile,
    SimulatedDevice,
    resolve_device,
)
from allocsim.sim.kernel.engine import ProcessReplay, replay
from allocsim.sim.questions.fidelity.oom import (
    RecordedOOM,
    model_at_recorded_oom,
    recorded_oom,
)
from allocsim.sim.questions.fidelity.recording import FidelityError, check_snapshot_trace
from allocsim.sim.questions.offline import offline_result
from allocsim.traces.model import NO_TAG, OP_ALLOC, Trace

__all__ = [
    "LIMIT",
    "MAX_SPLIT_SIZES_MB",
    "Alternative",
    "NoOOMError",
    "OOMExplanation",
    "allocator_limit",
    "explain_oom",
    "variant_specs",
]

MAX_SPLIT_SIZES_MB = (128, 512)
SHOWN_NAME = 120                # characters of a name the text shows (display_text.MAX_SHOWN)
OFFLINE_MAX_BUFFERS = 200_000   # the offline planner is O(buffers × overlapping buffers)
REAL_SHORTAGE = "real shortage"
LIMIT = "limit"
FRAGMENTATION = "fragmentation"


class NoOOMError(UserInputError):
    """The trace does not run out of memory under that policy at that capacity."""


@dataclass
class Alternative:
    """One what-if replay at the same capacity."""

    policy: str
    completed: bool
    peak_reserved: int | None       # of a completed run
    spare: int | None               # capacity − peak reserved, when completed
    first_oom_event: int | None
    note: str = ""

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class OOMExplanation:
    """The state at the first failing request, the verdict, and what would have completed."""

    trace: str
    policy: str
    device: str
    capacity: int
    capacity_source: str
    event: int                      # the failing request's index (snapshots: the trace
                                    # event the recorded oom comes before)
    request: int                    # bytes asked for
    stream: int
    live: int                       # requested bytes of the live buffers
    reserved: int                   # held from the device (after the release path)
    in_use: int                     # the allocator's blocks handed out (rounding included)
    cached_free: int                # reserved − in use
    largest_free_block: int         # inside the reserved memory
    device_free: int                # capacity − reserved
    verdict: str
    reason: str
    alternatives: list[Alternative]
    peak_live: int = 0              # of the whole replayed trace
    segment_needed: int | None = None   # pytorch: the new segment a miss asks the device for
    allocator_limit: int | None = None  # what the policy may hold, when below the capacity
    recorded: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def completing(self) -> list[Alternative]:
        return [a for a in self.alternatives if a.completed]

    def to_json_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "alternatives"}
        data["alternatives"] = [a.to_json_dict() for a in self.alternatives]
        data["schema"] = 1
        return data

    def text(self) -> str:
        """One screen."""
        f = format_size
        lines = [f"OOM in {_shown(self.trace)} under {_shown(self.policy)} on "
                 f"{_shown(self.device)} (capacity {f(self.capacity)}: "
                 f"{_shown(self.capacity_source)})",
                 f"  failing request     {f(self.request)} on stream {self.stream}, "
                 f"event {self.event:,}",
                 f"  live                {f(self.live):>10s}  requested bytes of the buffers "
                 "alive",
                 f"  reserved            {f(self.reserved):>10s}  held from the device",
                 f"  cached but free     {f(self.cached_free):>10s}  reserved − in use "
                 f"({f(self.in_use)})",
                 f"  largest free block  {f(self.largest_free_block):>10s}",
                 f"  device free         {f(self.device_free):>10s}  capacity − reserved"]
        if self.allocator_limit is not None:
            lines.append(f"  policy's limit      {f(self.allocator_limit):>10s}  what it may hold "
                         f"({f(self.capacity - self.allocator_limit)} of the card out of reach)")
        if self.recorded:
            lines.append(f"  recorded            reserved {f(self.recorded['reserved'])}, "
                         f"device_free {f(self.recorded['device_free'])}")
        if self.segment_needed is not None:
            lines.append(f"  new segment needed  {f(self.segment_needed):>10s}  what a cache miss "
                         "asks the device for")
        lines.append(f"verdict: {self.verdict.upper()} — {self.reason}")
        lines.append(f"at {f(self.capacity)}, would it have completed?")
        names = [_shown(a.policy) for a in self.alternatives]
        width = max([len(name) for name in names] + [6])
        lines.append(f"  {'policy':{width}s}  done  peak reserved       spare")
        for a, name in zip(self.alternatives, names):
            peak = f(a.peak_reserved) if a.peak_reserved is not None else "-"
            spare = f(a.spare) if a.spare is not None else (
                f"OOM@{a.first_oom_event:,}" if a.first_oom_event is not None else "-")
            done = "yes" if a.completed else "no"
            note = f"  ({printable(a.note)})" if a.note else ""
            lines.append(f"  {name:{width}s}  {done:4s}  {peak:>13s}  {spare:>10s}{note}")
        online = [a for a in self.completing if a.policy != "offline"]
        best = max(online, key=lambda a: a.spare or 0, default=None)
        if best is not None:
            lines.append(f"most to spare: {_shown(best.policy)} ({f(best.spare or 0)})")
        elif self.completing:
            lines.append("only the offline plan (a plan, not a runnable allocator) completes")
        else:
            lines.append("none of them completes at this capacity")
        for note in self.notes:
            lines.append(f"note: {printable(note)}")
        return "\n".join(lines)


def _shown(name: object) -> str:
    """A name (the trace's, a policy's, the device's) as the explanation shows it: escaped and
    bounded as every display shows a name (sim/output/display_text.py; issue 56.13)."""
    return printable(name, SHOWN_NAME)


# ============================================================================ the verdict
def verdict(capacity: int, live: int, request: int, in_use: int, reserved: int,
            largest_free: int, segment_needed: int | None = None,
            limit: int | None = None) -> tuple[str, str]:
    """``(verdict, one-sentence reason)``; see the module docstring. ``limit``: the bytes the
    policy may hold when less than ``capacity`` (:func:`allocator_limit`)."""
    f = format_size
    need = live + request
    if need > capacity:
        return REAL_SHORTAGE, (f"live {f(live)} + request {f(request)} = {f(need)} > capacity "
                               f"{f(capacity)}: no allocator that keeps data in place could "
                               "serve it")
    reachable = capacity if limit is None else min(limit, capacity)
    if need > reachable:
        return LIMIT, (f"live {f(live)} + request {f(request)} = {f(need)} fits in the capacity "
                       f"{f(capacity)} but not in the {f(reachable)} this policy may hold: a "
                       "larger share of the card would serve it")
    free_total = reachable - in_use
    outside = (f" (the {f(capacity - reachable)} outside the policy's limit not counted)"
               if reachable < capacity else "")
    if free_total >= request:
        return FRAGMENTATION, (
            f"live + request = {f(need)} fits in {f(reachable)} and {f(free_total)} was free "
            f"(cached {f(reserved - in_use)} + device {f(reachable - reserved)}){outside}, but "
            f"the largest free block was {f(largest_free)} and the device had "
            f"{f(reachable - reserved)} left"
            + (f" (a new segment needs {f(segment_needed)})" if segment_needed else "")
            + ": not contiguous or not reusable (external fragmentation)")
    return FRAGMENTATION, (
        f"live + request = {f(need)} fits in {f(reachable)}, but the blocks handed out hold "
        f"{f(in_use - live)} more than was requested (rounding, unsplit remainders), leaving "
        f"only {f(free_total)} free{outside} (internal fragmentation)")


def allocator_limit(policy: object, capacity: int) -> int | None:
    """The bytes ``policy`` may hold from the device when its own rule caps them below
    ``capacity``, else None: BFC's ``memory_limit`` (JAX's preallocated pool is one region of
    it, TensorFlow's per_process_gpu_memory_fraction sets it — bfc_allocator.cc's Extend fails
    past it), PyTorch's ``allowed_memory_maximum`` under a memory fraction
    (CUDACachingAllocator.cpp's alloc_block refuses past it)."""
    limit: int | None = None
    if isinstance(policy, BFCAllocator):
        limit = policy.memory_limit
    elif isinstance(policy, PyTorchCachingAllocator) and policy.set_fraction:
        limit = policy.allowed_memory_maximum
    return limit if limit is not None and limit < capacity else None


# ============================================================================ the what-ifs
def variant_specs(failing: PolicySpec, max_split_sizes_mb: Sequence[int] = MAX_SPLIT_SIZES_MB
                  ) -> list[PolicySpec]:
    """The what-if policies (besides the offline plan) for a failing policy: the pytorch
    variants built on the failing policy's pytorch parameters (plain pytorch otherwise), and
    pytorch, bfc and best-fit when the failing policy is not pytorch. The failing policy
    itself first."""
    base = PyTorchSettings(**dict(failing.params) if failing.name == "pytorch" else {})
    variants = ([replace(base, expandable_segments=True)]
                + [replace(base, max_split_size_mb=n) for n in max_split_sizes_mb]
                + [replace(base, roundup_power2_divisions="4")])
    texts = [variant.spec() for variant in variants]
    if failing.name != "pytorch":
        texts = ["pytorch", *texts, "bfc", "best-fit"]
    specs = [failing]
    for text in texts:
        spec = parse_policy(text)
        if spec not in specs:
            specs.append(spec)
    return specs


def _alternatives(trace: Trace, specs: Sequence[PolicySpec], profile: DeviceProfile,
                  notes: list[str], first_label: str | None = None) -> list[Alternative]:
    rows: list[Alternative] = []
    capacity = profile.capacity
    for k, spec in enumerate(specs):
        result = replay(trace, spec, profile, stop_on_oom=True)
        label = first_label if k == 0 and first_label else str(spec)
        rows.append(Alternative(
            policy=label, completed=result.completed,
            peak_reserved=result.peak_reserved if result.completed else None,
            spare=capacity - result.peak_reserved if result.completed else None,
            first_oom_event=result.first_oom_event))
    buffers = trace.n_allocs
    if buffers > OFFLINE_MAX_BUFFERS:
        notes.append(f"offline plan skipped: {buffers:,} buffers (the planner is quadratic "
                     f"beyond {OFFLINE_MAX_BUFFERS:,})")
    else:
        plan = offline_result(trace, profile)
        heap = plan.policy_stats.get("heap_size", 0)
        rows.insert(1, Alternative(
            policy="offline", completed=plan.completed,
            peak_reserved=plan.peak_reserved if plan.completed else None,
            spare=capacity - plan.peak_reserved if plan.completed else None,
            first_oom_event=plan.first_oom_event,
            note=f"heap {format_size(heap)}, lower bound {format_size(plan.peak_allocated)}"))
    return rows


# ============================================================================ entry points
def explain_oom(trace: Trace, policy_spec: str | PolicySpec | None = None,
                device_profile: DeviceProfile | None = None, *,
                max_split_sizes_mb: Sequence[int] = MAX_SPLIT_SIZES_MB) -> OOMExplanation:
    """Explain the first failing request (see the module docstring). A snapshot with a
    recorded oom and neither ``policy_spec`` nor ``device_profile`` given explains the
    recorded one; otherwise the trace is replayed under ``policy_spec`` (default
    ``pytorch``) on ``device_profile`` (default the default profile). Raises
    :class:`NoOOMError` when nothing fails."""
    if policy_spec is None and device_profile is None and _is_snapshot(trace):
        oom = recorded_oom(trace)
        if oom is not None:
            return _explain_recorded(trace, oom, max_split_sizes_mb)
    spec = parse_policy(policy_spec or "pytorch")
    profile = device_profile or resolve_device(DEFAULT_PROFILE)
    return _explain_replayed(trace, spec, profile, max_split_sizes_mb)


def _is_snapshot(trace: Trace) -> bool:
    try:
        check_snapshot_trace(trace)
    except FidelityError:
        return False
    return True


def _explain_replayed(trace: Trace, spec: PolicySpec, profile: DeviceProfile,
                      max_split_sizes_mb: Sequence[int]) -> OOMExplanation:
    if len(trace.processes()) > 1:
        raise UserInputError(f"{_shown(trace.name)}: explain-oom takes one process; this trace has "
                         f"{len(trace.processes())} (select one first)")
    run = ProcessReplay(trace, spec, SimulatedDevice(profile), stop_on_oom=True,
                        call_log=False)             # the OOM's state is read, no timeline
    run.advance(len(trace))
    if run.report.first_oom is None:
        raise NoOOMError(f"{_shown(trace.name)} does not run out of memory under {spec} on "
                         f"{_shown(profile.label)} ({format_size(profile.capacity)}); give a "
                         "smaller --capacity")
    oom = run.report.first_oom
    event, request, live, reserved, largest = (oom.event, oom.size, oom.allocated,
                                                oom.reserved, oom.largest_free)
    in_use = run.policy.bytes_in_use
    capacity = profile.capacity
    needed = _segment_needed(run.policy, request)
    limit = allocator_limit(run.policy, capacity)
    kind, reason = verdict(capacity, live, request, in_use, reserved, largest, needed, limit)
    notes: list[str] = []
    if _is_snapshot(trace):
        notes.append("a snapshot replayed from an empty device under the given policy (its "
                     "prologue allocates what was live when recording started)")
    peak_live = _peak_live_note(trace, capacity, kind, notes)
    alternatives = _alternatives(trace, variant_specs(spec, max_split_sizes_mb), profile, notes)
    return OOMExplanation(
        trace=trace.name, policy=str(spec), device=profile.label, capacity=capacity,
        capacity_source=f"device {profile.label}",
        event=event, request=request, stream=int(trace.stream[event]), live=live,
        reserved=reserved, in_use=in_use, cached_free=reserved - in_use,
        largest_free_block=largest, device_free=capacity - reserved, verdict=kind,
        reason=reason, alternatives=alternatives, peak_live=peak_live, segment_needed=needed,
        allocator_limit=limit, notes=notes)


def _segment_needed(policy: object, request: int) -> int | None:
    """For the pytorch model: the segment a cache miss of ``request`` asks for (the whole
    segment even with expandable segments, whose pages come in 2/20 MiB)."""
    if not isinstance(policy, PyTorchCachingAllocator):
        return None
    return get_allocation_size(policy.rounded_size(request))


def _peak_live_note(trace: Trace, capacity: int, kind: str, notes: list[str]) -> int:
    peak, at = trace.peak_live()
    if kind == FRAGMENTATION and peak > capacity:
        notes.append(f"the trace's peak live bytes, {format_size(peak)} after event {at:,}, "
                     f"exceed the capacity: past this failure it runs short in any case")
    return peak


def _explain_recorded(trace: Trace, oom: RecordedOOM, max_split_sizes_mb: Sequence[int]
                      ) -> OOMExplanation:
    policy, view, notes, stream = model_at_recorded_oom(trace, oom)
    notes = list(oom.settings.notes) + notes
    address = policy.malloc(oom.request, stream)
    if address is not None:
        policy.free(address)
        notes.append("the model serves this request at this capacity: its state differs from "
                     "the recording's before here (see allocsim fidelity)")
    reserved = view.reserved
    in_use = policy.bytes_in_use
    largest = policy.stats().largest_free_block
    live = int(trace.live_bytes()[oom.event - 1]) if oom.event > 0 else 0
    capacity = oom.capacity
    needed = _segment_needed(policy, oom.request)
    limit = allocator_limit(policy, capacity)
    kind, reason = verdict(capacity, live, oom.request, in_use, reserved, largest, needed, limit)
    profile = DeviceProfile("recorded", capacity, granularity=512)
    upto = _until_request(trace, oom.event, oom.request, oom.stream)
    peak_live = _peak_live_note(upto, capacity, kind, notes)
    notes.append(f"what-if replays: the {oom.event:,} events before the failing request and "
                 "the request itself, from an empty device")
    alternatives = _alternatives(upto, variant_specs(oom.settings.spec, max_split_sizes_mb),
                                 profile, notes, first_label=f"{oom.settings.spec} (as recorded)")
    return OOMExplanation(
        trace=trace.name, policy=str(oom.settings.spec), device="recorded", capacity=capacity,
        capacity_source=oom.capacity_source, event=oom.event, request=oom.request,
        stream=oom.stream, live=live, reserved=reserved, in_use=in_use,
        cached_free=reserved - in_use, largest_free_block=largest,
        device_free=capacity - reserved, verdict=kind, reason=reason,
        alternatives=alternatives, peak_live=peak_live, segment_needed=needed,
        allocator_limit=limit,
        recorded={"reserved": oom.recorded_reserved, "device_free": oom.device_free,
                  "entry": oom.index, "time_ns": oom.time_ns},
        notes=notes)


def _until_request(trace: Trace, event: int, request: int, stream: int) -> Trace:
    """The first ``event`` events of ``trace`` and an alloc of ``request`` bytes after them."""
    last_time = int(trace.time_ns[event - 1]) if event > 0 else 0
    new_id = int(trace.id.max()) + 1 if len(trace) else 0
    return Trace(
        time_ns=np.append(trace.time_ns[:event], last_time),
        op=np.append(trace.op[:event], OP_ALLOC), id=np.append(trace.id[:event], new_id),
        size=np.append(trace.size[:event], request),
        stream=np.append(trace.stream[:event], stream),
        process=np.append(trace.process[:event], 0), tag=np.append(trace.tag[:event], NO_TAG),
        tags=list(trace.tags),
        metadata={**{k: v for k, v in trace.metadata.items()
                     if k in ("name", "source", "format")},
                  "name": f"{trace.name}[..oom]"})
