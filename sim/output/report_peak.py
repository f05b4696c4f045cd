"""The report's "explain the peak": what the peak is made of, and what would shrink it.

For a comparison: the peak reserved of each policy as bars the browser draws (no PNG needed:
HTML widths in the figure set's one unit, peak live marked), then, for the winner (or the
best run), its peak split into what was handed out and what sat free in its cache, and one
line per lever that would lower it, each with the number it would come to:

- a policy that caches less (the lowest peak reserved that completes, the offline plan);
- fewer bytes live at the peak: the largest kinds of allocation at the peak
  (sim/output/holders.py) and what halving each would leave live at that moment — halving
  is what a half batch does to activations, or bf16 to float32 weights and optimizer state;
  the peak may then move to another moment, so the figure is where that moment goes, not a
  promise.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from allocsim.policies.units import format_size
from allocsim.sim.output.colours import policy_colours
from allocsim.sim.output.display_text import shown
from allocsim.sim.output.figure_data import (
    as_series,
    free_at_peak,
    plain_number,
    set_unit,
    size_scale,
)
from allocsim.sim.output.holders import Holding, group_by_kind

LEVERS_SHOWN = 3      # the largest kinds at the peak, each with what halving it would leave


def peak_bars(data: dict[str, Any]) -> str:
    """Peak reserved per policy as HTML bars on the trace's one size scale (value printed;
    peak live a marked line; a pool far past the scale drawn to the edge, hatched)."""
    series = as_series(data["results"])
    colours = policy_colours([s.policy for s in series])
    top, off = size_scale(series)
    unit, scale = set_unit(series)
    live = int(data["trace"]["peak_live"])
    rows = []
    for s in series:
        width = 100 * min(s.peak_reserved, top) / top
        past = s.policy in off
        rows.append(
            f"<div class=pbar><span class=pname>{html.escape(shown(s.policy, 40))}</span>"
            f"<span class=ptrack><span class=\"pfill{' poff' if past else ''}\" "
            f"style=\"width:{width:.2f}%;background-color:{colours[s.policy]}\"></span>"
            f"<span class=plive style=\"left:{100 * min(live, top) / top:.2f}%\"></span></span>"
            # past the scale: in its own unit (60.00GiB, not 61,440 MiB)
            "<span class=pval>" + (f"{format_size(s.peak_reserved)} ▶ off the scale" if past
                                   else _in(s.peak_reserved, scale, unit))
            + ("" if s.completed else " — OOM")
            + "</span></div>")
    return ("<div class=pbars><p class=meta>peak reserved per policy, in " + unit
            + f"; the dark line is peak live ({_in(live, scale, unit)}), the least any "
            "allocator could reserve</p>" + "".join(rows) + "</div>")


def _in(nbytes: int, scale: int, unit: str) -> str:
    return f"{plain_number(round(nbytes / scale, 2))} {unit}"


def _best(data: dict[str, Any]) -> dict[str, Any]:
    results = data["results"]
    winner = next((r for r in results if r["policy"] == data.get("winner")), None)
    if winner is not None:
        return winner
    done = [r for r in results if r["completed"]] or list(results)
    return min(done, key=lambda r: r["peak_reserved"])


def explain_peak(data: dict[str, Any], holdings: Sequence[Holding] | None) -> str:
    """The section's lines for one comparison (HTML, every field escaped)."""
    run = _best(data)
    s = as_series([run])[0]
    reserved, live = int(run["peak_reserved"]), int(data["trace"]["peak_live"])
    free = int(run.get("external_fragmentation", 0))
    context = int(data["device"].get("context_bytes") or 0)
    lines = [
        f"<b>{html.escape(shown(run['policy']))}</b> reserves <b>{format_size(reserved)}</b> "
        f"at its peak: {format_size(reserved - free)} handed out and {format_size(free)} "
        f"({free_at_peak(s):.1%}) free in its cache at that moment. The trace's own peak live "
        f"is {format_size(live)}, the floor for any allocator"
        + (f"; the device adds {format_size(context)} of context on top" if context else "")
        + "."]
    levers = []
    given = data.get("max_slowdown")
    budget = None if given is None else float(given)
    others = [r for r in data["results"] if r["completed"] and r["policy"] != run["policy"]]
    lower = min(others, key=lambda r: r["peak_reserved"], default=None)
    if lower is not None and lower["peak_reserved"] < reserved:
        slow = float(lower.get("slowdown", 1.0))
        over = budget is not None and slow > budget
        levers.append(f"Another allocator: <code>{html.escape(shown(lower['policy']))}</code> "
                      f"reserves {format_size(int(lower['peak_reserved']))} "
                      f"({format_size(reserved - int(lower['peak_reserved']))} less) at "
                      f"{slow:.3f}× slowdown"
                      + (f", past the {budget:g}× budget" if over else "")
                      + ("; the offline plan is a heuristic, not a setting"
                         if lower["policy"] == "offline" else "") + ".")
    if reserved > live:
        levers.append(f"No allocator needs less than peak live, {format_size(live)}: at most "
                      f"{format_size(reserved - live)} can come from the allocator; the rest "
                      "only from holding fewer bytes.")
    # A start-state buffer (``<live before recording, …>``) is no kind of tensor to halve.
    kinds = [g for g in group_by_kind(holdings or []) if not g.kind.startswith("<")]
    kinds = kinds[:LEVERS_SHOWN]
    if kinds:
        levers.append(
            "Fewer bytes at the peak — the largest kinds live then, and what is live at that "
            "moment with each halved (half the batch for what grows with it, bf16 for float32 "
            "weights and optimizer state, recomputing saved activations; the peak may then "
            "move elsewhere): " + "; ".join(
                f"<code>{html.escape(shown(g.kind, 60))}</code> {format_size(g.bytes)} "
                f"({g.bytes / max(live, 1):.0%}) → {format_size(live - g.bytes // 2)}"
                for g in kinds) + ".")
    elif holdings is None:
        levers.append("Who holds the peak needs the trace itself: "
                      "<code>allocsim compare TRACE -o DIR</code> shows it.")
    return ("<p>" + " ".join(lines) + "</p><p class=meta>What would shrink it:</p><ul>"
            + "".join(f"<li>{text}</li>" for text in levers) + "</ul>")
