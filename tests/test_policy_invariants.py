"""Every policy, on random workloads: live blocks never overlap, lie inside memory held from the
device, reserved ≥ allocated, the policy's stats equal an independent recount, and after all
frees everything is coalesced."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from policy_checks import Referee, small_device

SPECS = ["on-demand", "preallocate", "best-fit", "bfc", "bfc:allow_growth=false",
         "bfc:garbage_collection=true,memory_limit=64MiB", "best-fit:trim=true",
         "bfc:fragmentation_fraction=0.01"]

sizes = st.one_of(st.integers(1, 4096), st.integers(4096, 1 << 20), st.integers(1 << 20, 24 << 20))
actions = st.lists(st.tuples(st.booleans(), sizes, st.integers(0, 10**6)), min_size=1, max_size=120)


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=60, deadline=None)
@given(actions=actions)
def test_invariants_hold_after_every_event(spec: str, actions) -> None:
    referee = Referee.of(spec, small_device(capacity=256 << 20))
    next_id = 0
    for is_alloc, size, pick in actions:
        if is_alloc or not referee.live:
            referee.malloc(next_id, size)
            next_id += 1
        else:
            referee.free(sorted(referee.live)[pick % len(referee.live)])
        referee.check()
    for ident in sorted(referee.live):
        referee.free(ident)
        referee.check()
    referee.check_fully_coalesced()


@pytest.mark.parametrize("spec", SPECS)
def test_out_of_memory_leaves_the_policy_consistent(spec: str) -> None:
    referee = Referee.of(spec, small_device(capacity=32 << 20))
    for ident in range(40):
        referee.malloc(ident, 3 << 20)
        referee.check()
    assert referee.ooms > 0
    assert referee.view.reserved <= 32 << 20
    for ident in sorted(referee.live):
        referee.free(ident)
    referee.check_fully_coalesced()
