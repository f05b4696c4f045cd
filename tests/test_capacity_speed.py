"""min-capacity's shortcuts (issue 17): the same answers as a replay per capacity, fewer replays.

Every policy, in several settings, on a periodic training trace (where runs repeat themselves
and skip to their end) and on random traces (where only the declared capacity use helps):
``min_capacity`` must equal the search with every capacity replayed — answer, ``monotone`` and
``exceptions``. tests/test_capacity_claims.py checks the claims behind the shortcuts directly.
"""

from __future__ import annotations

import functools

import pytest

from allocsim.policies import parse_policy
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.questions.capacity import minimum
from allocsim.sim.questions.capacity.oracle import CompletionOracle
from allocsim.traces.bundled import load_default_trace
from allocsim.traces.model import Trace
from allocsim.traces.synth import generate

GiB = 1 << 30
MiB = 1 << 20
DEVICE = DeviceProfile("test", 80 * GiB)

# Every policy; the settings that change how it depends on capacity (fractions, limits, GC,
# growth, expandable segments, split limits, sync modes) and the JAX presets.
SETTINGS = [
    "on-demand",
    "buddy", "buddy:release=true,arena=16MiB",
    "best-fit", "best-fit:trim=true",
    "bfc", "bfc:allow_growth=false", "bfc:fraction=0.6", "bfc:garbage_collection=true",
    "bfc:fragmentation_fraction=0.05", "bfc:memory_limit=64GiB",
    "preallocate", "preallocate:fraction=0.9", "preallocate:fraction=0.3",
    "pytorch", "pytorch:per_process_memory_fraction=0.8",
    "pytorch:per_process_memory_fraction=0.9,garbage_collection_threshold=0.5",
    "pytorch:garbage_collection_threshold=0.5", "pytorch:max_split_size_mb=20",
    "pytorch:expandable_segments=true", "pytorch:roundup_power2_divisions=4",
    "cupy", "cupy:fraction=0.9", "cupy:limit=64GiB",
    "cuda-async", "cuda-async:fraction=0.75,preallocate=true", "cuda-async:sync=none",
    "cuda-async:release_threshold=1GiB",
    "jax", "jax:preallocate=false", "jax:allocator=cuda_async",
]


@functools.cache
def traces() -> dict[str, Trace]:
    return {
        "training": generate("training", events=5000),
        "random": generate("random", events=2500, live=150, max_size=32 << 20, seed=3),
        "random-2-streams": generate("random", events=2500, live=100, max_size=64 << 20,
                                     streams=2, seed=4),
    }


def _plain(trace: Trace, policy: str, device: DeviceProfile, resolution: int):
    """The answer with every capacity replayed (no shortcut)."""
    return minimum._min_capacity(trace, policy, device, resolution, shortcuts=False)


def _asked(trace: Trace, policy: str, device: DeviceProfile, resolution: int, *,
           shortcuts: bool) -> tuple[minimum.CapacityAnswer, list[tuple[int, bool]]]:
    """The search's answer and every capacity it asked about, in order, with the answer."""
    asked: dict[int, bool] = {}
    answer = minimum._min_capacity(trace, policy, device, resolution, shortcuts=shortcuts,
                                   asked=asked)
    return answer, list(asked.items())


@pytest.mark.parametrize("trace_name", ["training", "random", "random-2-streams"])
@pytest.mark.parametrize("policy", SETTINGS)
def test_shortcuts_give_the_same_answer(policy: str, trace_name: str) -> None:
    # The same capacities asked about, in the same order, with the same answers: the search
    # takes the same path (a path chosen from what the shortcuts kept would differ, and
    # where the policy is not monotone end elsewhere).
    trace = traces()[trace_name]
    resolution = 4 * MiB if trace_name == "training" else MiB // 4
    fast, fast_asked = _asked(trace, policy, DEVICE, resolution, shortcuts=True)
    plain, plain_asked = _asked(trace, policy, DEVICE, resolution, shortcuts=False)
    assert fast_asked == plain_asked
    assert (fast.min_capacity, fast.monotone, fast.exceptions) == (
        plain.min_capacity, plain.monotone, plain.exceptions)
    assert fast.evaluations <= plain.evaluations


def test_the_first_guess_is_chosen_alike_with_shortcuts_and_without() -> None:
    # The stream-ordered pool without synchronisation is not monotone near its answer on this
    # trace. The search once chose its first guess (what the device handed out with no
    # limit) only where a kept replay showed it, which the search without shortcuts never
    # has: it guessed lower, bisected another interval and found 10 MiB less than the search
    # with them. The guess now reads the generous replay alone.
    trace = generate("training", events=40_000, seed=3)
    device = DeviceProfile("a100-like", 80 * GiB, context_bytes=512 * MiB)
    fast, fast_asked = _asked(trace, "cuda-async:sync=none", device, MiB, shortcuts=True)
    plain, plain_asked = _asked(trace, "cuda-async:sync=none", device, MiB, shortcuts=False)
    assert fast_asked == plain_asked
    assert (fast.min_capacity, fast.monotone, fast.exceptions) == (
        plain.min_capacity, plain.monotone, plain.exceptions)


@pytest.mark.parametrize("policy", ["on-demand", "buddy", "bfc", "pytorch", "preallocate"])
def test_shortcuts_give_the_same_answer_on_the_bundled_trace(policy: str) -> None:
    trace = load_default_trace()
    fast = minimum.min_capacity(trace, policy, DEVICE, resolution=4 << 20)
    plain = _plain(trace, policy, DEVICE, 4 << 20)
    assert (fast.min_capacity, fast.monotone, fast.exceptions) == (
        plain.min_capacity, plain.monotone, plain.exceptions)
    assert fast.evaluations <= plain.evaluations


def test_capacity_blind_policy_needs_few_replays() -> None:
    answer = minimum.min_capacity(load_default_trace(), "on-demand", DEVICE)
    assert answer.monotone and answer.evaluations <= 4


@pytest.mark.parametrize("policy", ["on-demand", "best-fit"])
def test_a_policy_a_refusal_fails_needs_only_the_generous_replay(policy: str) -> None:
    answer = minimum.min_capacity(traces()["random"], policy, DEVICE, resolution=MiB // 4)
    assert answer.evaluations == 1


@pytest.mark.parametrize("policy", ["bfc", "preallocate", "cupy", "pytorch",
                                    "pytorch:expandable_segments=true", "cuda-async:sync=none",
                                    "cuda-async:fraction=0.75,preallocate=true"])
def test_runs_of_a_repeating_trace_stop_once_they_repeat(policy: str) -> None:
    """On the training trace each replay (the generous one too) ends a few steps in."""
    trace = traces()["training"]
    oracle = CompletionOracle(trace, parse_policy(policy), DEVICE)
    assert oracle.probe.completed and oracle.skipped > len(trace) // 2


def test_probe_notices_capacity_reads() -> None:
    trace = load_default_trace()
    assert not CompletionOracle(trace, parse_policy("on-demand"), DEVICE).probe.capacity_read
    assert CompletionOracle(trace, parse_policy("preallocate"), DEVICE).probe.capacity_read


@pytest.mark.parametrize("policy", ["on-demand", "best-fit", "buddy", "pytorch",
                                    "pytorch:per_process_memory_fraction=0.8",
                                    "bfc:garbage_collection=true"])
def test_the_native_core_replays_the_probes_with_the_python_intervals(
        policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Off a repeating trace (no period to stop at) and off BFC's region watch, the oracle's
    # replays run in the native core: the same probe, the same intervals of capacities that
    # run alike (the core's device records what _RecordingDevice does), the same answers.
    from allocsim.sim.kernel import native
    from allocsim.sim.questions import shared_runs

    if native.core() is None:
        pytest.skip(f"the native core is not in use here: {native.implementation()}")
    trace = traces()["random"]
    device = DeviceProfile("test", 80 * GiB, context_bytes=64 * MiB)
    ran: list[int] = []
    opened = shared_runs.open_native_run     # the oracle's runs open there

    def counting(*args, **kwargs):
        run = opened(*args, **kwargs)
        ran.append(run is not None)
        return run

    monkeypatch.setattr(shared_runs, "open_native_run", counting)
    core = CompletionOracle(trace, parse_policy(policy), device)
    answers = [core.completes(c) for c in range(40 * MiB, 400 * MiB, 9 * MiB)]
    assert ran and all(ran)
    monkeypatch.setattr(shared_runs, "open_native_run", lambda *a, **k: None)
    python = CompletionOracle(trace, parse_policy(policy), device)
    assert [python.completes(c) for c in range(40 * MiB, 400 * MiB, 9 * MiB)] == answers
    assert core.probe == python.probe
    assert core._intervals == python._intervals and core.replays == python.replays


@pytest.mark.parametrize("policy", ["bfc", "pytorch", "cupy", "preallocate",
                                    "pytorch:expandable_segments=true", "cuda-async",
                                    "cuda-async:sync=none", "cuda-async:fraction=0.75",
                                    "jax:allocator=cuda_async"])
def test_probes_of_a_repeating_trace_whose_repeat_the_core_sees_run_in_the_core(
        policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the core sees a run repeat by itself (run_repeats.py's decision rows; the
    # stream-ordered pool's by place, so its periods may trim and map), no probe runs in
    # Python: each runs in the core and stops once it repeats, with the plain search's
    # answers.
    from allocsim.sim.kernel import native
    from allocsim.sim.questions.capacity import oracle as capacity_oracle

    if native.core() is None:
        pytest.skip(f"the native core is not in use here: {native.implementation()}")
    trace = traces()["training"]
    python_runs: list[int] = []
    replay_class = capacity_oracle.ProcessReplay

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        python_runs.append(1)
        return replay_class(*args, **kwargs)

    monkeypatch.setattr(capacity_oracle, "ProcessReplay", counted)
    oracle = CompletionOracle(trace, parse_policy(policy), DEVICE)
    assert oracle.probe.completed and oracle.skipped > len(trace) // 2
    fast = minimum.min_capacity(trace, policy, DEVICE, resolution=4 * MiB)
    assert not python_runs
    plain = _plain(trace, policy, DEVICE, 4 * MiB)
    assert (fast.min_capacity, fast.monotone, fast.exceptions) == (
        plain.min_capacity, plain.monotone, plain.exceptions)
