"""The summary of a sweep's results: the winning policy per trace × device × capacity.

:func:`best_policies` applies the winner rule of :mod:`allocsim.sim.questions.compare` to the
records of a results file; :func:`best_policies_text` prints them as a table.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allocsim.policies import format_size
from allocsim.sim.output.tables import format_table
from allocsim.sim.questions.compare import DEFAULT_MAX_SLOWDOWN
from allocsim.sim.questions.offline import OFFLINE_NAME
from allocsim.sim.sweeps.store import latest_records

__all__ = ["BestRow", "best_policies", "best_policies_text"]


@dataclass
class BestRow:
    """The winner of one (trace, device, capacity) group of a sweep."""

    trace: str
    device: str
    capacity: int | None
    winner: str | None
    peak_reserved: int | None
    alloc_time_s: float | None
    slowdown: float | None
    runner_up: str | None
    policies: int           # policies with a result in the group
    errors: int             # cells of the group that failed
    reason: str = ""


def _rank(result: Mapping[str, Any], policy: str) -> tuple[bool, int, float, str]:
    # allocsim.sim.questions.compare.rank_key on a result dict: completed first, then the
    # lowest peak reserved, then the lowest modelled allocator time, then the spec's name.
    return (not result["completed"], result["peak_reserved"], result["alloc_time_s"], policy)


def best_policies(records: Iterable[Mapping[str, Any]], *,
                  max_slowdown: float | None = DEFAULT_MAX_SLOWDOWN) -> list[BestRow]:
    """The best policy per trace × device × capacity, by the winner rule of
    :mod:`allocsim.sim.questions.compare`: among results that complete without OOM and stay
    within the slowdown budget (None: no budget), the lowest peak reserved, then the lowest
    allocator time; ``offline`` is a plan, never the winner. Takes raw records (duplicates
    resolved by :func:`~allocsim.sim.sweeps.store.latest_records`)."""
    budget = math.inf if max_slowdown is None else max_slowdown
    groups: dict[tuple[str, str, int | None], list[dict[str, Any]]] = {}
    for record in latest_records(records).values():
        group = (record["trace"], record["device"], record.get("capacity"))
        groups.setdefault(group, []).append(record)
    rows = []
    for (trace, device, capacity), members in groups.items():
        ok = [r for r in members if r.get("status") == "ok" and r.get("result")]
        errors = len(members) - len(ok)
        candidates = sorted(((r["result"], r["policy"]) for r in ok
                             if r["policy"] != OFFLINE_NAME
                             and r["result"]["completed"] and r["result"]["slowdown"] <= budget),
                            key=lambda pair: _rank(*pair))
        if candidates:
            best, policy = candidates[0]
            reason = "lowest peak reserved among policies completing within the budget"
            rows.append(BestRow(trace, device, capacity, policy, best["peak_reserved"],
                                best["alloc_time_s"], best["slowdown"],
                                candidates[1][1] if len(candidates) > 1 else None,
                                len(ok), errors, reason))
        else:
            completed = [r for r in ok if r["result"]["completed"]]
            reason = ("no policy completes within the slowdown budget" if completed else
                      "no policy completes without running out of memory" if ok else
                      "every cell failed")
            rows.append(BestRow(trace, device, capacity, None, None, None, None, None,
                                len(ok), errors, reason))
    rows.sort(key=lambda r: (r.trace, r.device, -1 if r.capacity is None else r.capacity))
    return rows


def best_policies_text(rows: Sequence[BestRow]) -> str:
    """A plain table of :func:`best_policies` rows."""
    table = []
    for row in rows:
        table.append([
            row.trace, row.device, "default" if row.capacity is None else format_size(row.capacity),
            row.winner or f"none ({row.reason})",
            "-" if row.peak_reserved is None else format_size(row.peak_reserved),
            "-" if row.alloc_time_s is None else f"{row.alloc_time_s * 1e3:.3g} ms",
            "-" if row.slowdown is None else f"{row.slowdown:.3f}x",
            row.runner_up or "-", str(row.policies), str(row.errors)])
    return format_table(table, ["trace", "device", "capacity", "best policy", "peak reserved",
                                "alloc time", "slowdown", "runner-up", "policies", "errors"],
                        left=(0, 1, 3, 7))
