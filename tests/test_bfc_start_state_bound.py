"""The start-state search of a mid-run BFC profile is bounded by a count of candidates and says
when it gives up (issue 36.4: a 35 KB crafted profile kept ``fidelity`` searching past 60 s).

Work is counted, not timed: every candidate the search enumerates comes from the module's
``itertools`` (combinations, permutations, products), which the test counts."""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterator
from typing import Any

import pytest

from allocsim.sim.questions.fidelity import bfc_start as bfc_start_state
from allocsim.sim.questions.fidelity.bfc_start import (
    MAX_CANDIDATES,
    pool_bytes_from_records,
    start_states,
)

MiB = 1 << 20
FIRST = 2 * MiB                                     # Extend's first region with allow_growth
POOL = sum(FIRST << k for k in range(9))            # 2 + 4 + ... + 512 MiB: nine regions
FREE = 40 * MiB


def crafted_records(spans: int = 300) -> list[dict[str, Any]]:
    """Chunks at ``spans`` addresses spread over five times the biggest region, each gap
    narrower than it: no grouping into nine regions with fewer than five cuts holds them, and
    there are ~C(300, 4) of those to reject first. The fragmentation stat leaves a few pool
    sizes open, each tried."""
    step = 5 * (512 * MiB) // spans // 256 * 256
    largest = [17 * MiB + 768, 23 * MiB + 1792]
    return [{"event": k, "action": "alloc", "addr": 0x10_0000_0000 + k * step, "chunk": 256,
             "requested": 256, "in_use": POOL - FREE,
             "fragmentation": 1 - largest[k % 2] / FREE} for k in range(spans)]


class Counted(Exception):
    pass


def counting_itertools(limit: int) -> tuple[types.SimpleNamespace, list[int]]:
    """``itertools`` whose enumerations count what they hand out and stop the test past
    ``limit`` items in all."""
    drawn = [0]

    def counted(make: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
            for item in make(*args, **kwargs):
                drawn[0] += 1
                if drawn[0] > limit:
                    raise Counted(f"the search drew more than {limit:,} candidates")
                yield item
        return wrapper

    fake = types.SimpleNamespace(**{name: getattr(itertools, name) for name in dir(itertools)
                                    if not name.startswith("_")})
    for name in ("combinations", "permutations", "product"):
        setattr(fake, name, counted(getattr(itertools, name)))
    return fake, drawn


def test_a_crafted_profile_gives_up_after_a_bounded_count_of_candidates_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    refs = crafted_records()
    pools, why = pool_bytes_from_records(refs, FIRST, 4 << 30)
    assert why == "" and POOL in pools and len(pools) > 1   # the stat leaves several open
    fake, drawn = counting_itertools(limit=5 * MAX_CANDIDATES)
    monkeypatch.setattr(bfc_start_state, "itertools", fake)
    states, why = start_states(refs, {}, POOL - FREE, 4 << 30, FIRST)
    assert states == []
    assert why == (f"the start-state search gave up after {MAX_CANDIDATES:,} candidates "
                   "(groupings, region orders, bases, free gaps) with 0 arrangement(s) found: "
                   "the records leave too many open")
    assert drawn[0] == MAX_CANDIDATES


def test_the_budget_is_a_count_not_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same records give up after the same work, whatever the budget."""
    monkeypatch.setattr(bfc_start_state, "MAX_CANDIDATES", 1000)
    fake, drawn = counting_itertools(limit=10_000)
    monkeypatch.setattr(bfc_start_state, "itertools", fake)
    _, why = start_states(crafted_records(), {}, POOL - FREE, 4 << 30, FIRST)
    assert "gave up after 1,000 candidates" in why and drawn[0] == 1000


def test_the_fidelity_report_says_the_search_gave_up(monkeypatch, tmp_path) -> None:
    """A real (synthetic) mid-run recording, its search cut to a handful of candidates: the
    report names the cut, whether or not a state was found before it."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_bfc_fidelity import recording, write
    from test_bfc_start_state import RECORDED, WARM_UP

    from allocsim.sim.questions.fidelity.bfc import bfc_fidelity
    from allocsim.traces import formats

    events = recording(WARM_UP + RECORDED, limit=64 * MiB)[len(WARM_UP):]
    trace = formats.load(write(tmp_path, events, "warm"))
    for budget in (1, 5):      # gave up with none found, and with one found (it matches)
        monkeypatch.setattr(bfc_start_state, "MAX_CANDIDATES", budget)
        report = bfc_fidelity(trace)
        assert any(f"gave up after {budget:,} candidates" in note for note in report.notes), \
            report.text()
