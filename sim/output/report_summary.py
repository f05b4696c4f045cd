"""The report's first section: the answer, per trace, before any figure.

One line per policy — does it complete, its peak reserved, the smallest card it runs on (from a
min_capacity.json of the same trace, when given) and its modelled slowdown — then the winner
and why, and, where a tuner filled it (``settings``), the setting to paste. Each trace's name
links to its details further down.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from allocsim.policies.units import format_size
from allocsim.sim.output.display_text import shown


def policy_cell(policy: str) -> str:
    """A policy's name for a table cell, escaped, that wraps after its commas (a tuned
    setting is a long spec; wrapping mid-word read as two settings)."""
    return html.escape(shown(policy)).replace(",", ",<wbr>")


def capacity_by_policy(documents: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per trace name, per policy, its min-capacity answer (the last document wins)."""
    found: dict[str, dict[str, Any]] = {}
    for doc in documents:
        if "answers" in doc:
            found.setdefault(doc["trace"]["name"], {}).update(
                {a["policy"]: a for a in doc["answers"]})
    return found


def _card(answer: dict[str, Any] | None) -> str:
    if answer is None:
        return "<td class=muted>—</td>"
    if answer.get("min_capacity") is None:
        return "<td class=fail>never fits</td>"
    return f"<td>{format_size(answer['min_capacity'])}</td>"


def verdict_html(doc: dict[str, Any]) -> str:
    winner = doc.get("winner")
    head = (f"<b>winner: {html.escape(winner)}</b>" if winner else "<b>no winner</b>")
    return f"{head} — {html.escape(doc.get('reason', ''))}"


def setting_html(setting: str | None) -> str:
    """The hook ``tune`` fills: a line to paste into the job's settings."""
    if not setting:
        return ""
    return (f"<p class=paste>setting to paste: <code>{html.escape(setting)}</code></p>")


def trace_summary(doc: dict[str, Any], anchor: str, cards: Mapping[str, Any],
                  setting: str | None) -> str:
    rows = []
    for r in doc["results"]:
        winner = " class=winner" if r["policy"] == doc.get("winner") else ""
        done = "yes" if r["completed"] else f"NO ({int(r['ooms']):,} OOMs)"
        rows.append(
            f"<tr{winner}><td>{policy_cell(r['policy'])}</td>"
            f"<td{'' if r['completed'] else ' class=fail'}>{done}</td>"
            f"<td>{format_size(r['peak_reserved'])}</td>{_card(cards.get(r['policy']))}"
            f"<td>{float(r.get('slowdown', 1.0)):.3f}×</td></tr>")
    trace, device = doc["trace"], doc["device"]
    return (
        f"<div class=tsum><h3><a href=\"#{anchor}\">{html.escape(shown(trace['name']))}</a> "
        f"<span class=meta>on {html.escape(device['name'])} "
        f"({format_size(device['capacity'])}), peak live "
        f"{format_size(trace['peak_live'])}</span></h3>"
        f"<p class=verdict>{verdict_html(doc)}</p>{setting_html(setting)}"
        "<div class=scroll><table class=summary><tr><th>policy</th><th>completes</th>"
        "<th>peak reserved</th><th>minimum card</th><th>modelled slowdown</th></tr>"
        + "".join(rows) + "</table></div></div>")


def summary_section(entries: Sequence[tuple[dict[str, Any], str]],
                    documents: Sequence[dict[str, Any]],
                    settings: Mapping[str, str] | None = None) -> str:
    """``entries``: each comparison document with its details' anchor."""
    cards = capacity_by_policy(documents)
    settings = settings or {}
    body = "".join(trace_summary(doc, anchor, cards.get(doc["trace"]["name"], {}),
                                 settings.get(doc["trace"]["name"]))
                   for doc, anchor in entries)
    missing = [doc["trace"]["name"] for doc, _ in entries if doc["trace"]["name"] not in cards]
    note = ("<p class=meta>minimum card: the smallest device each policy runs the trace on; "
            "shown when the report is also given that trace's <code>min_capacity.json</code> "
            "(<code>allocsim min-capacity TRACE -o DIR</code>).</p>" if missing else "")
    only_capacity = [doc for doc in documents if "answers" in doc
                     and doc["trace"]["name"] not in {d["trace"]["name"] for d, _ in entries}]
    extra = "".join(
        f"<p>smallest device for <b>{html.escape(shown(doc['trace']['name']))}</b>: " + "; ".join(
            f"{html.escape(a['policy'])} "
            + ("never fits" if a.get("min_capacity") is None else format_size(a["min_capacity"]))
            for a in doc["answers"]) + "</p>" for doc in only_capacity)
    return ("<section id=summary><h2>Summary</h2>" + body + extra + note
            + "<p class=meta>The winner completes without running out of memory, within the "
            "slowdown budget, with the lowest peak reserved (the README's winner rule). Details "
            "of each trace follow.</p></section>")
