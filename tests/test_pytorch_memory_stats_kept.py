"""Which of the PyTorch model's statistics are kept (issue 17): everything unless the caller says
memory_stats() will not be read (keep_memory_stats(False), as the replay engine does); then the
counters only that report reads are left off the hot path, and every read of one fails loudly
while everything else (stats(), segments(), seed(), check(), the results) stays exact."""

from __future__ import annotations

import random

import pytest

from allocsim.policies import parse_policy
from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.policies.pytorch.stats import MEMORY_STATS_ONLY
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.kernel.engine import ProcessReplay, replay
from allocsim.traces import synth
from allocsim.traces.model import OP_ALLOC

MiB = 1 << 20
PROFILE = DeviceProfile("t", 1 << 30, granularity=512)


def fresh(**params) -> tuple[PyTorchCachingAllocator, object]:
    view = SimulatedDevice(PROFILE).view(0)
    return PyTorchCachingAllocator(view, **params), view


def workload(policy: PyTorchCachingAllocator, seed: int = 0, steps: int = 400) -> None:
    """Random mallocs and frees on two streams, splits and merges in both pools."""
    rng = random.Random(seed)
    live: list[int] = []
    for _ in range(steps):
        if live and rng.random() < 0.45:
            policy.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice((rng.randint(1, 4096), rng.randint(4096, MiB),
                               rng.randint(MiB, 24 * MiB)))
            address = policy.malloc(size, rng.randint(0, 1))
            if address is not None:
                live.append(address)


def test_everything_is_kept_by_default_and_the_general_path_runs() -> None:
    policy, _ = fresh()
    assert policy.memory_stats_kept and "malloc" not in vars(policy)
    workload(policy)
    policy.check()
    assert policy.memory_stats()["inactive_split.all.peak"] > 0


def test_not_kept_the_report_and_its_counters_refuse_to_be_read() -> None:
    policy, _ = fresh()
    policy.keep_memory_stats(False)
    assert not policy.memory_stats_kept and "malloc" not in vars(policy)
    workload(policy)
    policy.check()
    with pytest.raises(RuntimeError, match=r"memory_stats\(\) was not kept"):
        policy.memory_stats()
    for name in MEMORY_STATS_ONLY:
        with pytest.raises(AttributeError, match=name):
            getattr(policy.counters, name)


def test_not_kept_what_stays_is_exact() -> None:
    kept, _ = fresh()
    lean, _ = fresh()
    lean.keep_memory_stats(False)
    for policy in (kept, lean):
        workload(policy, seed=3)
    assert lean.stats() == kept.stats()
    assert lean.stats().bytes_requested == sum(lean.pools.requested.values())
    assert lean.segments() == kept.segments()
    assert list(lean.blocks()) == list(kept.blocks())


def test_the_choice_is_made_before_the_first_malloc_or_seed() -> None:
    policy, _ = fresh()
    policy.malloc(1000)
    with pytest.raises(ValueError, match="before the first malloc"):
        policy.keep_memory_stats(False)
    policy.keep_memory_stats(True)                  # what it already does: nothing to refuse
    lean, _ = fresh()
    lean.keep_memory_stats(False)
    lean.malloc(1000)
    with pytest.raises(ValueError, match="before the first malloc"):
        lean.keep_memory_stats(True)                # the peaks missed cannot be recounted
    seeded, _ = fresh()
    seeded.seed([{"address": 1 << 40, "total_size": 2 * MiB, "segment_type": "small"}])
    with pytest.raises(ValueError, match="seed"):
        seeded.keep_memory_stats(False)


def test_asking_again_before_any_malloc_restores_the_general_path() -> None:
    policy, _ = fresh()
    policy.keep_memory_stats(False)
    policy.keep_memory_stats(True)
    assert policy.memory_stats_kept and "malloc" not in vars(policy)
    workload(policy)
    reference, _ = fresh()
    workload(reference)
    assert policy.memory_stats() == reference.memory_stats()


@pytest.mark.parametrize("params", [
    {"max_split_size_mb": 64}, {"roundup_power2_divisions": 4},
    {"garbage_collection_threshold": 0.6, "per_process_memory_fraction": 0.5}])
def test_settings_off_the_default_hot_path_keep_everything_anyway(params) -> None:
    policy, _ = fresh(**params)
    policy.keep_memory_stats(False)                 # a permission, not an order
    assert policy.memory_stats_kept and "malloc" not in vars(policy)
    workload(policy)
    policy.check()
    assert policy.memory_stats()["allocation.all.peak"] > 0


def test_expandable_segments_leave_the_reports_counters_out_too() -> None:
    """Expandable segments with the other settings at their defaults leave memory_stats()'s
    own counters out when it will not be read (the same malloc and free, which skip them; held
    to the kept run by tests/test_fast_path_equivalence.py), and refuse memory_stats() then."""
    policy, _ = fresh(expandable_segments=True)
    policy.keep_memory_stats(False)
    assert not policy.memory_stats_kept and "malloc" not in vars(policy)
    workload(policy)
    policy.check()
    with pytest.raises(RuntimeError, match="not kept"):
        policy.memory_stats()


def test_seed_works_with_the_counters_not_kept() -> None:
    base = 1 << 40
    segments = [{"address": base, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
                 "blocks": [{"address": base, "size": 4 * MiB, "state": "active_allocated",
                             "requested_size": 4 * MiB - 100},
                            {"address": base + 4 * MiB, "size": 16 * MiB, "state": "inactive"}]}]
    kept, _ = fresh()
    lean, _ = fresh()
    lean.keep_memory_stats(False)
    assert kept.seed(segments).keys() == lean.seed(segments).keys()
    assert not lean.memory_stats_kept and "malloc" not in vars(lean)
    lean.check()
    for name in MEMORY_STATS_ONLY:
        assert not hasattr(lean.counters, name) and hasattr(kept.counters, name)
    for policy in (kept, lean):
        workload(policy, seed=5)
    assert lean.segments() == kept.segments() and lean.stats() == kept.stats()


def test_check_catches_a_counter_held_while_not_kept() -> None:
    policy, _ = fresh()
    policy.keep_memory_stats(False)
    workload(policy)
    policy.counters.inactive_split = 0              # a stale value someone could read
    with pytest.raises(AssertionError, match="not kept"):
        policy.check()


def test_the_replay_engine_says_the_report_is_not_read_unless_asked() -> None:
    trace = synth.generate("training", seed=1, steps=2, layers=3)
    run = ProcessReplay(trace, parse_policy("pytorch"), SimulatedDevice(PROFILE))
    run.advance(run.n)
    assert not run.policy.memory_stats_kept
    with pytest.raises(RuntimeError, match="memory_stats=True"):
        run.policy.memory_stats()
    asked = ProcessReplay(trace, parse_policy("pytorch"), SimulatedDevice(PROFILE),
                          memory_stats=True)
    asked.advance(asked.n)
    # The same events driven through a directly built allocator (everything kept, the general
    # path): every figure of memory_stats(), peaks and totals included, is the same.
    direct, _ = fresh()
    live: dict[int, int] = {}
    sizes = trace.matched_sizes().tolist()
    for op, ident, size, stream in zip(trace.op.tolist(), trace.id.tolist(), sizes,
                                       trace.stream.tolist()):
        if op == OP_ALLOC:
            address = direct.malloc(size, stream) if size > 0 else None
            if address is not None:
                live[ident] = address
        elif ident in live:
            direct.free(live.pop(ident))
    assert asked.policy.memory_stats() == direct.memory_stats()
    assert run.result("t").to_json_dict() == asked.result("t").to_json_dict()
    assert replay(trace, "pytorch", PROFILE).to_json_dict() == run.result("t").to_json_dict()
