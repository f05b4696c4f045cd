"""Every policy's ``capacity_use`` declaration held to real replays (issue 17).

min-capacity answers "does the trace complete at c?" without a replay where a policy's declared
capacity use says the answer follows from replays it ran (sim/questions/capacity/oracle.py), and
stops replays of a repeating trace once they repeat (sim/questions/capacity/period.py). Here,
for every declaring policy and setting, on random and repeating traces: every answer the
shortcuts give equals a replay's, the runs a ``limit`` interval claims the same make the same
device calls, and a deliberately wrong declaration is caught.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest

from allocsim.policies import POLICIES, PolicySpec, parse_policy
from allocsim.policies.base import (
    CAPACITY_BFC_REGIONS,
    CAPACITY_LIMIT,
    CAPACITY_LIMIT_FATAL,
    CAPACITY_UNKNOWN,
    CapacityUse,
    capacity_use_of,
)
from allocsim.policies.buddy import BuddyAllocator
from allocsim.policies.cupy_pool import CuPyPoolAllocator
from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.kernel.engine import ProcessReplay, replay
from allocsim.sim.questions.capacity.oracle import CompletionOracle
from allocsim.sim.questions.capacity.period import find_period
from allocsim.traces.model import Trace
from allocsim.traces.synth import generate

MiB = 1 << 20
DEVICE = DeviceProfile("test", 64 << 30)

# The settings whose declaration holds (kind other than unknown), each policy's defaults first.
DECLARING = [
    "on-demand", "best-fit", "best-fit:trim=true",
    "buddy", "buddy:release=true,arena=8MiB",
    "pytorch", "pytorch:max_split_size_mb=20", "pytorch:garbage_collection_threshold=0.5",
    "pytorch:roundup_power2_divisions=4",
    "cupy", "cupy:limit=24MiB",
    "cuda-async", "cuda-async:sync=none", "cuda-async:release_threshold=8MiB",
    "bfc", "bfc:allow_growth=false", "bfc:fraction=0.6", "bfc:memory_limit=40MiB",
    "preallocate", "preallocate:fraction=0.9", "preallocate:fraction=0.3",
]


def _steps(seed: int, steps: int = 12) -> Trace:
    """A repeating trace: a few resident buffers, then the same random step again and again
    (fresh ids every step, some buffers living into the next step)."""
    rng = random.Random(seed)
    events: list[tuple[int, str, int, int | None]] = []
    ident = 0
    for _ in range(rng.randint(1, 4)):
        events.append((len(events), "alloc", ident, rng.randint(1, 8) * MiB))
        ident += 1
    shape = [rng.choice([64 << 10, 1 * MiB, 3 * MiB, 5 * MiB, 9 * MiB]) for _ in range(12)]
    carried: list[int] = []
    for _ in range(steps):
        step = random.Random(seed)               # the same choices every step
        held = list(carried)
        for size in shape:
            events.append((len(events), "alloc", ident, size))
            held.append(ident)
            ident += 1
            if len(held) > 3 and step.random() < 0.5:
                events.append((len(events), "free", held.pop(step.randrange(len(held))), None))
        carried = [held.pop(step.randrange(len(held)))]
        for buffer in held:
            events.append((len(events), "free", buffer, None))
    return Trace.from_events(events, name=f"steps-{seed}")


@functools.cache
def traces() -> dict[str, Trace]:
    return {
        "random": generate("random", events=1500, live=80, max_size=8 << 20, seed=5),
        "random-2-streams": generate("random", events=1500, live=60, max_size=12 << 20,
                                     streams=2, seed=6),
        "steps": _steps(7),
    }


def _capacities(trace: Trace, seed: int) -> list[int]:
    """Capacities from the trace's live peak to four times it, at uneven steps."""
    peak = trace.peak_live()[0]
    rng = np.random.default_rng(seed)
    points = np.concatenate([np.linspace(peak, 1.25 * peak, 14),
                             rng.uniform(peak, 4 * peak, 10)])
    return sorted(set((points // 4096 * 4096).astype(np.int64).tolist()))


def _completes(trace: Trace, spec: PolicySpec, capacity: int) -> bool:
    return replay(trace, spec, DEVICE.device_with(capacity), stop_on_oom=True).completed


def _calls(trace: Trace, spec: PolicySpec, capacity: int) -> list[tuple[str, int, bool]]:
    """Every device call of the replay at ``capacity``: the run, as the device saw it."""
    run = ProcessReplay(trace, spec, SimulatedDevice(DEVICE.device_with(capacity)),
                        stop_on_oom=True)
    run.view.log = []
    run.advance(run.n)
    return [(call.kind, call.nbytes, call.ok) for call in run.view.log]


def _disagreements(trace: Trace, spec: PolicySpec, seed: int = 0) -> tuple[list[int], int]:
    """Capacities where the oracle's answer (a shortcut, or a replay that stopped once it
    repeated) is not a plain replay's, and how many answers came from a shortcut."""
    # The Python replays: BFC's region watch runs only there (the core's runs keep none).
    oracle = CompletionOracle(trace, spec, DEVICE, native=False)
    capacities = _capacities(trace, seed)
    random.Random(seed).shuffle(capacities)
    wrong, shown = [], 0
    for capacity in capacities:
        shown += oracle._shown(capacity) is not None
        if oracle.completes(capacity) != _completes(trace, spec, capacity):
            wrong.append(capacity)
    return wrong, shown


# What each built-in policy's rules say (a new policy declares its own, held by the replays
# below; it need not be added here).
DECLARED = {
    "on-demand": CAPACITY_LIMIT_FATAL, "best-fit": CAPACITY_LIMIT_FATAL,
    "buddy": CAPACITY_LIMIT, "pytorch": CAPACITY_LIMIT, "cupy": CAPACITY_LIMIT,
    "cuda-async": CAPACITY_LIMIT, "bfc": CAPACITY_BFC_REGIONS,
    "preallocate": CAPACITY_BFC_REGIONS, "tpu": CAPACITY_UNKNOWN,
}


def test_every_policy_declares_what_its_rules_say() -> None:
    undeclared = [name for name, cls in POLICIES.items() if "capacity_use" not in vars(cls)]
    assert not undeclared, f"no capacity_use in the class's own body: {undeclared}"
    assert {name: capacity_use_of(POLICIES[name], {}) for name in DECLARED} == DECLARED


@pytest.mark.parametrize("spec, kind", [
    ("pytorch:per_process_memory_fraction=0.8", CAPACITY_UNKNOWN),
    ("pytorch:expandable_segments=true", CAPACITY_UNKNOWN),
    ("pytorch:garbage_collection_threshold=0.5", CAPACITY_LIMIT),
    ("cupy:fraction=0.5", CAPACITY_UNKNOWN), ("cupy:limit=1GiB", CAPACITY_LIMIT),
    ("cuda-async:fraction=0.75", CAPACITY_UNKNOWN),
    ("cuda-async:release_threshold=1GiB", CAPACITY_LIMIT),
    ("bfc:garbage_collection=true", CAPACITY_UNKNOWN),
    ("bfc:fragmentation_fraction=0.1", CAPACITY_UNKNOWN),
    ("bfc:memory_limit=1GiB", CAPACITY_BFC_REGIONS),
    ("jax", CAPACITY_BFC_REGIONS), ("jax:allocator=platform", CAPACITY_LIMIT_FATAL),
])
def test_settings_that_change_how_capacity_is_used(spec: str, kind: str) -> None:
    resolved = parse_policy(spec).resolved()
    assert capacity_use_of(resolved.policy_class, dict(resolved.params)) == kind


def test_a_declaration_is_not_inherited_and_must_be_readable() -> None:
    class Quieter(BuddyAllocator):
        name = "quieter-buddy"

    assert capacity_use_of(Quieter, {}) == CAPACITY_UNKNOWN
    assert CapacityUse.parse("limit; unless a, b") == CapacityUse(CAPACITY_LIMIT, ("a", "b"))
    for text in ("limits", "limit; except a", "limit; unless"):
        with pytest.raises(ValueError):
            CapacityUse.parse(text)

    class Misspelt(BuddyAllocator):
        name = "misspelt-buddy"
        capacity_use = "limit; unless arenas"

    with pytest.raises(ValueError, match="arenas"):
        capacity_use_of(Misspelt, {})


@pytest.mark.parametrize("trace_name", ["random", "random-2-streams", "steps"])
@pytest.mark.parametrize("policy", DECLARING)
def test_every_shortcut_answer_is_a_replays_answer(policy: str, trace_name: str) -> None:
    spec = parse_policy(policy)
    wrong, shown = _disagreements(traces()[trace_name], spec)
    assert wrong == []
    assert shown > 0          # the claims were put to use, not only replays


@pytest.mark.parametrize("trace_name", ["random", "random-2-streams", "steps"])
@pytest.mark.parametrize("policy", [p for p in DECLARING
                                    if capacity_use_of(parse_policy(p).policy_class,
                                                       dict(parse_policy(p).params))
                                    in (CAPACITY_LIMIT, CAPACITY_LIMIT_FATAL)])
def test_a_limit_interval_holds_one_run(policy: str, trace_name: str) -> None:
    """At capacities inside an interval the device answers alike, the run is the same:
    the same device calls, in the same order, with the same answers."""
    trace, spec = traces()[trace_name], parse_policy(policy)
    oracle = CompletionOracle(trace, spec, DEVICE)
    for capacity in _capacities(trace, 1)[::3]:
        oracle.completes(capacity)
    rng = random.Random(2)
    for interval in oracle._intervals:
        recorded = _calls(trace, spec, interval.capacity)
        top = min(interval.hi, 8 * max(interval.lo, 1))
        for capacity in {interval.lo, top, rng.randint(interval.lo, top)}:
            assert _calls(trace, spec, capacity) == recorded, (interval, capacity)


def _lying(base: type, name: str) -> type:
    return type(f"Lying{base.__name__}", (base,), {"name": name, "capacity_use": "limit"})


def test_a_wrong_declaration_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy's set_limit(fraction=) and PyTorch's memory fraction cap the pool at a share of
    the capacity: declared ``limit`` anyway, the answers go wrong."""
    for base, name, setting in [(CuPyPoolAllocator, "lying-cupy", "fraction=0.5"),
                                (PyTorchCachingAllocator, "lying-pytorch",
                                 "per_process_memory_fraction=0.7")]:
        monkeypatch.setitem(POLICIES, name, _lying(base, name))
        wrong, _ = _disagreements(traces()["random"], parse_policy(f"{name}:{setting}"))
        assert wrong, name


def test_expandable_segments_are_rightly_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Expandable segments' best fit weighs a block by its size plus the unmapped space behind
    it — up to the end of a virtual range of 1.125 × capacity — so the capacity decides where
    a block goes even when no call is refused: declared ``limit``, a run at a capacity inside
    the interval of another makes other device calls. A 20 MiB request takes a 30 MiB block
    before the unmapped tail on a small device but a 600 MiB block on a big one."""
    monkeypatch.setitem(POLICIES, "lying-pytorch", _lying(PyTorchCachingAllocator,
                                                          "lying-pytorch"))
    events = [(0, "alloc", 1, 600 * MiB), (1, "alloc", 2, 2 * MiB), (2, "alloc", 3, 100 * MiB),
              (3, "alloc", 6, 30 * MiB), (4, "free", 1, None), (5, "free", 6, None),
              (6, "alloc", 4, 20 * MiB), (7, "alloc", 5, 590 * MiB)]
    trace = Trace.from_events(events)
    spec = parse_policy("lying-pytorch:expandable_segments=true")
    oracle = CompletionOracle(trace, spec, DEVICE)
    oracle.completes(800 * MiB)
    small = next(i for i in oracle._intervals if i.capacity == 800 * MiB)
    assert small.lo <= 1200 * MiB <= small.hi     # the claim: one run across the interval
    assert _calls(trace, spec, 1200 * MiB) != _calls(trace, spec, 800 * MiB)


def test_find_period() -> None:
    period = find_period(generate("training", events=5000))
    assert period is not None and period.length > 0
    assert find_period(traces()["random"]) is None
    steps = find_period(traces()["steps"])
    assert steps is not None and (len(traces()["steps"]) - steps.start) >= 4 * steps.length


@pytest.mark.parametrize("policy", [
    "bfc", "preallocate:fraction=0.5", "cupy", "bfc:garbage_collection=true", "cupy:fraction=0.8",
    "pytorch", "pytorch:expandable_segments=true", "pytorch:per_process_memory_fraction=0.5",
    "pytorch:per_process_memory_fraction=0.5,garbage_collection_threshold=0.5",
    "cuda-async", "cuda-async:fraction=0.75,preallocate=true", "cuda-async:fraction=0.3",
    "cuda-async:sync=none", "cuda-async:release_threshold=8MiB"])
def test_a_run_that_repeats_itself_ends_as_the_whole_replay(policy: str) -> None:
    """The generous replay, stopped once it repeats, reports what the whole replay does; so do
    the replays at smaller capacities (the stream-ordered pool's among them, where a period
    maps and unmaps memory at fresh addresses: its state is compared by place)."""
    spec = parse_policy(policy)
    for trace in (traces()["steps"], generate("training", events=5000)):
        oracle = CompletionOracle(trace, spec, DEVICE)
        whole = replay(trace, spec, DEVICE.device_with(1 << 50))
        assert oracle.skipped > 0
        assert (oracle.probe.completed, oracle.probe.peak_reserved) == (
            whole.completed, whole.peak_reserved)
        for capacity in _capacities(trace, 3):
            assert oracle.completes(capacity) == _completes(trace, spec, capacity), capacity


def test_the_core_replays_the_tpu_probes_and_the_capacity_it_reads_is_seen() -> None:
    # The tpu policy sizes its heap by the device's capacity: the oracle's probe, replayed in
    # the core, must see that read (the watched build), so no capacity is answered from the
    # probe's peak; every answer is a plain replay's.
    from allocsim.sim.kernel.native import core

    if core() is None:
        pytest.skip("the native core is not in use here")
    spec = parse_policy("tpu")
    trace = generate("random", seed=3, events=600, live=40)
    oracle = CompletionOracle(trace, spec, DEVICE)
    assert oracle.probe.capacity_read
    for capacity in _capacities(trace, 3):
        assert oracle.completes(capacity) == _completes(trace, spec, capacity), capacity
