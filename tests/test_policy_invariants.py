"""Every policy, on random workloads: live blocks never overlap, lie inside memory held from the
device, reserved ≥ allocated, the policy's stats equal an independent recount, and after all
frees everything is coalesced."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from policy_checks import Referee, exhaust, play, small_device, workload_actions

SPECS = ["on-demand", "preallocate", "best-fit", "bfc", "bfc:allow_growth=false",
         "bfc:garbage_collection=true,memory_limit=64MiB", "best-fit:trim=true",
         "bfc:fragmentation_fraction=0.01"]

actions = workload_actions()


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=60, deadline=None)
@given(actions=actions)
def test_invariants_hold_after_every_event(spec: str, actions) -> None:
    referee = Referee.of(spec, small_device(capacity=256 << 20))
    play(referee, actions)


# Every registered model, in the configurations their own test files exercise.
OOM_SPECS = [*SPECS,
    "pytorch", "pytorch:expandable_segments=true", "pytorch:max_split_size_mb=20",
    "pytorch:roundup_power2_divisions=[1:4;>:8]",
    "pytorch:garbage_collection_threshold=0.5,per_process_memory_fraction=0.5",
    "pytorch:max_split_size_mb=20,expandable_segments=true",
    "cupy", "cupy:limit=64MiB", "cupy:fraction=0.25",
    "cuda-async", "cuda-async:fraction=0.25", "cuda-async:release_threshold=1GiB",
    "cuda-async:sync=none", "cuda-async:fraction=0.5,preallocate=true",
    "buddy", "buddy:release=true", "buddy:arena=1MiB,min_block=4KiB"]


@pytest.mark.parametrize("spec", OOM_SPECS)
def test_out_of_memory_leaves_the_policy_consistent(spec: str) -> None:
    referee = Referee.of(spec, small_device(capacity=32 << 20))
    exhaust(referee)
