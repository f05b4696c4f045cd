"""Confounds separated: one change at a time, over a population of trace pairs.

``[[contrasts]]`` names pairs of traces that differ in one thing (jit alone, donation alone,
remat alone, or both), each ``[base, variant]``; the table gives per pair the peak live and
each sized policy's minimum capacity, base → variant, as a change, and under the pairs the
min / median / max of each change and in how many pairs it has the sign of the median — a
sentence about the change is a finding only where that count is all pairs::

    [[contrasts]]
    label = "donation alone (not donated → donated)"
    pairs = [["1.3b nodonate remat", "1.3b donate remat"], ...]

Computed from the run's own comparisons and minimum capacities (nothing is replayed again).
"""

from __future__ import annotations

from statistics import median
from typing import Any

from allocsim.policies import format_size
from allocsim.sim.output.tables import format_table
from allocsim.traces.model import Trace


def contrast(entry: dict[str, Any], traces: dict[str, Trace],
             capacities: list[dict[str, Any]]) -> dict[str, Any]:
    sized = list(dict.fromkeys(c["policy"] for c in capacities))
    capacity = {(c["trace"], c["policy"]): c["min_capacity"] for c in capacities}
    pairs = []
    for base, variant in entry["pairs"]:
        if base not in traces or variant not in traces:
            continue            # an optional trace that was skipped (said under "skipped")
        pairs.append({"base": base, "variant": variant,
                      "peak_live": [int(traces[base].peak_live()[0]),
                                    int(traces[variant].peak_live()[0])],
                      "min_capacity": {p: [capacity.get((base, p)), capacity.get((variant, p))]
                                       for p in sized}})
    return {"label": entry["label"], "policies": sized, "pairs": pairs}


def _change(pair: list[int | None]) -> float | None:
    base, variant = pair
    if base is None or variant is None or base == 0:
        return None
    return variant / base - 1


def _size(value: int | None) -> str:
    return "never" if value is None else format_size(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def spread(changes: list[float | None]) -> list[str]:
    """min, median, max of the changes and in how many pairs the change has the median's
    direction (a finding holds only where that is every pair)."""
    known = [c for c in changes if c is not None]
    if not known:
        return ["-", "-", "-", "-"]
    middle = median(known)
    direction = "up" if middle > 0 else "down" if middle < 0 else "flat"
    same = sum((c > 0) == (middle > 0) and (c < 0) == (middle < 0) for c in known)
    return [_pct(min(known)), _pct(middle), _pct(max(known)),
            f"{direction} in {same} of {len(changes)}"]


def quantities(c: dict[str, Any]) -> list[tuple[str, Any]]:
    """(quantity name, how to read its [base, variant] from a pair) for the table's rows."""
    return [("peak live", lambda p: p["peak_live"]),
            *((f"min capacity {q}", lambda p, q=q: p["min_capacity"][q])
              for q in c["policies"])]


def render(c: dict[str, Any]) -> list[str]:
    rows = []
    for p in c["pairs"]:
        for name, get in quantities(c):
            base, variant = get(p)
            rows.append([f"{p['base']} → {p['variant']}", name, _size(base), _size(variant),
                         _pct(_change([base, variant]))])
    summary = [[name, *spread([_change(get(p)) for p in c["pairs"]])]
               for name, get in quantities(c)]
    return [f"**{c['label']}** (change = variant / base − 1)", "", "```",
            format_table(rows, ["base → variant", "quantity", "base", "variant", "change"],
                         left=(0, 1)), "```", "",
            f"Over the {len(c['pairs'])} pairs:", "", "```",
            format_table(summary, ["quantity", "min", "median", "max", "direction"],
                         left=(0, 4)), "```", ""]


def spread_of(entry: dict[str, Any], capacities: list[dict[str, Any]]) -> dict[str, Any]:
    """``[[spreads]]``: per sized policy, its headroom (min capacity over peak live − 1) on
    each of ``traces`` (label, traces = [...])."""
    wanted = [t for t in entry["traces"] if any(c["trace"] == t for c in capacities)]
    sized = list(dict.fromkeys(c["policy"] for c in capacities))
    ratio = {(c["trace"], c["policy"]): c["headroom_ratio"] for c in capacities}
    return {"label": entry["label"], "traces": wanted,
            "headroom": {p: [ratio.get((t, p)) for t in wanted] for p in sized}}


def render_spread(s: dict[str, Any]) -> list[str]:
    rows = []
    for policy, values in s["headroom"].items():
        known = [v for v in values if v is not None]
        fits = f"{len(known)} of {len(values)}"
        if not known:
            rows.append([policy, "-", "-", "-", fits, "-"])
            continue
        worst = s["traces"][values.index(max(known))]
        rows.append([policy, f"+{min(known):.1%}", f"+{median(known):.1%}",
                     f"+{max(known):.1%}", fits, worst])
    return [f"**{s['label']}**: headroom (min capacity over peak live) over "
            f"{len(s['traces'])} traces", "", "```",
            format_table(rows, ["policy", "min", "median", "max", "sized", "max at"],
                         left=(0, 5)), "```", ""]
