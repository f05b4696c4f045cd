"""One self-contained HTML page of results: ``allocsim report RESULTS... -o report.html``.

No network: figures are PNGs embedded as data URIs, styles inline. For each compared trace the
page shows the comparison table, the verdict, the memory timeline per policy (allocated vs
reserved, OOM marked), fragmentation over time and peak reserved vs allocated; min-capacity
results (``min_capacity.json``) add a capacity chart. A few lines of script count the figures
that decoded and record it on ``<body data-figures-loaded=N>`` so a headless browser test can
check the page rendered whole.
"""

from __future__ import annotations

import base64
import html
import shlex
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from allocsim import __version__
from allocsim.policies.units import format_size
from allocsim.sim.output.figures import (
    FRAGMENTATION_TITLE,
    fragmentation_alt,
    fragmentation_fig,
    peaks_alt,
    peaks_fig,
    png_bytes,
    policy_colors,
    pyplot,
    size_unit,
    timeline_alt,
    timeline_fig,
)
from allocsim.sim.output.files import write_bytes
from allocsim.sim.output.ownership import REPORT_MARK, guard
from allocsim.traces.bundled import DEFAULT_TRACE_NAME

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.9em; margin: 1em 0; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #eee; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr.winner td { font-weight: 600; background: #eef7ee; }
td.fail { color: #b00; font-weight: 600; }
.verdict { background: #f6f6f6; padding: 0.6em 1em; border-left: 4px solid #4a4; }
img { max-width: 100%; display: block; margin: 0.5em 0; }
.meta { color: #666; font-size: 0.85em; }
.legend { color: #555; font-size: 0.8em; margin-top: -0.6em; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""

# First in <head>: any uncaught error later counts on <html data-js-errors=N> (what a
# headless browser test reads back from the DOM).
_ERROR_FLAG_SCRIPT = """
document.documentElement.setAttribute('data-js-errors', '0');
window.addEventListener('error', function () {
  var root = document.documentElement;
  root.setAttribute('data-js-errors', String(Number(root.getAttribute('data-js-errors')) + 1));
});
"""

_CHECK_SCRIPT = """
document.documentElement.setAttribute('data-report-ready', '1');
window.addEventListener('load', function () {
  var images = document.querySelectorAll('img');
  var loaded = 0;
  images.forEach(function (img) { if (img.complete && img.naturalWidth > 0) { loaded += 1; } });
  document.body.setAttribute('data-figures-loaded', String(loaded));
  document.body.setAttribute('data-figures-total', String(images.length));
});
"""


def _png(fig: Any) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(fig, dpi=100)).decode("ascii")


def timeline_figure(results: Sequence[dict[str, Any]], title: str) -> str:
    return _png(timeline_fig(results, title))


def fragmentation_figure(results: Sequence[dict[str, Any]], title: str) -> str:
    return _png(fragmentation_fig(results, title))


def peaks_figure(results: Sequence[dict[str, Any]], title: str) -> str:
    return _png(peaks_fig(results, title))


def capacity_figure(data: dict[str, Any]) -> str:
    answers = [a for a in data["answers"] if a.get("min_capacity")]
    colors = policy_colors([a["policy"] for a in answers])
    fig = pyplot().figure(figsize=(max(6, 1.2 * len(answers) + 3.5), 3.3), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(answers))
    top = max([a["min_capacity"] for a in answers] + [1])
    unit, scale = size_unit(top)
    ax.bar(x, [a["min_capacity"] / scale for a in answers], 0.6,
           color=[colors[a["policy"]] for a in answers], label="minimum capacity")
    if answers:
        ax.axhline(answers[0]["lower_bound"] / scale, color="black", ls="--", lw=1,
                   label="peak live (lower bound)")
    ax.set_xticks(x, [a["policy"] for a in answers], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(unit)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(f"smallest device that runs {data['trace']['name']}", fontsize=10)
    return _png(fig)


def capacity_alt(data: dict[str, Any]) -> str:
    answers = data["answers"]
    return (f"Bar chart: the smallest device capacity on which each policy runs "
            f"{data['trace']['name']} without running out of memory, against peak live (the lower "
            "bound). " + "; ".join(
                f"{a['policy']} " + ("never fits" if a.get("min_capacity") is None
                                     else format_size(a["min_capacity"]))
                for a in answers) + ".")


# What each column of the comparison table means (README, "The JSON schema").
COLUMN_LEGEND = (
    ("peak reserved", "most bytes held from the device at once (counted by the device)"),
    ("peak allocated", "peak live requested bytes (counted from the trace)"),
    ("util", "utilization = peak allocated / peak reserved"),
    ("frag", "fragmentation = 1 − utilization"),
    ("OOMs", "allocations that ran out of memory"),
    ("dev mallocs / dev frees", "calls to the device's malloc and free (cudaMalloc/cudaFree)"),
    ("alloc time", "modelled time spent in the allocator over the run"),
    ("slowdown", "(trace duration + alloc time) / trace duration; the winner must stay within "
                 "the budget"),
)

MEMORY_VIZ_URL = "https://pytorch.org/memory_viz"


def _column_legend() -> str:
    return ("<p class=legend>" + "; ".join(
        f"<b>{html.escape(name)}</b>: {html.escape(text)}" for name, text in COLUMN_LEGEND)
        + ".</p>")


def _memory_viz_line(trace: dict[str, Any], policies: Sequence[str]) -> str:
    source = str(trace.get("source", ""))
    shown = source if source and Path(source).suffix else (
        "default" if trace.get("name") == Path(DEFAULT_TRACE_NAME).stem else "TRACE")
    policy = policies[0] if policies else "P"
    command = (f"allocsim export-snapshot {shlex.quote(shown)} --policy {shlex.quote(policy)} "
               "-o run.pickle")
    return ("<p class=meta>To see a policy's run block by block in PyTorch's memory viewer: "
            f"<code>{html.escape(command)}</code> (any policy of the table for "
            f"<code>--policy</code>), then drop <code>run.pickle</code> onto "
            f'<a href="{MEMORY_VIZ_URL}">{MEMORY_VIZ_URL}</a>.</p>')


def _comparison_section(data: dict[str, Any], holders: str = "") -> str:
    trace, device = data["trace"], data["device"]
    rows = []
    for r in data["results"]:
        winner = ' class="winner"' if r["policy"] == data.get("winner") else ""
        done = "yes" if r["completed"] else "NO"
        rows.append(
            f"<tr{winner}><td>{html.escape(r['policy'])}</td>"
            f"<td{' class=fail' if not r['completed'] else ''}>{done}</td>"
            f"<td>{format_size(r['peak_reserved'])}</td><td>{format_size(r['peak_allocated'])}</td>"
            f"<td>{r['utilization']:.1%}</td><td>{r['fragmentation']:.1%}</td><td>{int(r['ooms']):,}</td>"
            f"<td>{int(r['device_mallocs']):,}</td><td>{int(r['device_frees']):,}</td>"
            f"<td>{r['alloc_time_s'] * 1e3:.3g} ms</td><td>{r.get('slowdown', 1):.3f}×</td></tr>")
    title = f"{trace['name']} on {device['name']}"
    results = data["results"]
    names = (f"memory over time — {title}", f"{FRAGMENTATION_TITLE} — {title}",
             f"peak reserved vs allocated — {title}")
    figures = [(timeline_figure(results, names[0]), timeline_alt(results, names[0])),
               (fragmentation_figure(results, title), fragmentation_alt(results, names[1])),
               (peaks_figure(results, names[2]), peaks_alt(results, names[2]))]
    verdict = (f"<b>winner: {html.escape(data['winner'])}</b> — " if data.get("winner")
               else "<b>no winner</b> — ") + html.escape(data.get("reason", ""))
    return (
        f"<h2>{html.escape(trace['name'])}</h2>"
        f"<p class=meta>{trace['events']:,} events, {trace['allocs']:,} allocations, "
        f"peak live {format_size(trace['peak_live'])}; device {html.escape(device['name'])} "
        f"({format_size(device['capacity'])}); "
        f"source {html.escape(str(trace.get('source', '')))}</p>"
        "<table><tr><th>policy</th><th>done</th><th>peak reserved</th><th>peak allocated</th>"
        "<th>util</th><th>frag</th><th>OOMs</th><th>dev mallocs</th><th>dev frees</th>"
        "<th>alloc time</th><th>slowdown</th></tr>" + "".join(rows) + "</table>"
        + _column_legend()
        + f"<p class=verdict>{verdict}</p>"
        + _memory_viz_line(trace, [r["policy"] for r in results if r["policy"] != "offline"])
        + holders
        + "".join(f'<img alt="{html.escape(alt)}" src="{src}">' for src, alt in figures))


def holders_section(holders: Sequence[tuple[str, int, int]], peak_live: int) -> str:
    """Who holds memory at the trace's peak live bytes, by tag (call site / op): rows of
    ``(tag, live bytes, live blocks)``, largest first. Empty rows give an empty string."""
    if not holders:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(tag)}</td><td>{format_size(size)}</td>"
        f"<td>{size / peak_live if peak_live else 0:.1%}</td><td>{count:,}</td></tr>"
        for tag, size, count in holders)
    return ("<p class=meta>Who holds memory at the trace's peak live "
            f"({format_size(peak_live)}; the same requests under every policy), by tag:</p>"
            "<table><tr><th>tag</th><th>live bytes</th><th>share</th><th>blocks</th></tr>"
            + rows + "</table>")


def _capacity_section(data: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(a['policy'])}</td>"
        f"<td>{'never' if a['min_capacity'] is None else format_size(a['min_capacity'])}</td>"
        f"<td>{format_size(a['lower_bound'])}</td>"
        f"<td>{'-' if a['headroom'] is None else format_size(a['headroom'])}</td>"
        f"<td>{'yes' if a['monotone'] else 'no'}</td></tr>" for a in data["answers"])
    return (f"<h2>minimum capacity — {html.escape(data['trace']['name'])}</h2>"
            "<table><tr><th>policy</th><th>min capacity</th><th>lower bound</th>"
            "<th>headroom</th><th>monotone</th></tr>" + rows + "</table>"
            f'<img alt="{html.escape(capacity_alt(data))}" src="{capacity_figure(data)}">')


def render_report(documents: Sequence[dict[str, Any]], title: str = "allocsim report",
                  holders: Sequence[str] | None = None) -> str:
    """The page. ``holders``, one per document when given, is HTML (:func:`holders_section`)
    that results.json cannot supply: it is computed from the trace where the trace is at hand."""
    extra = list(holders or []) + [""] * len(documents)
    sections = [(_comparison_section(d, extra[i]) if "results" in d else _capacity_section(d))
                for i, d in enumerate(documents)]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f"<title>{html.escape(title)}</title><script>{_ERROR_FLAG_SCRIPT}</script>"
            f"<style>{_STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>{REPORT_MARK} {html.escape(__version__)}"
            f", {stamp}</p>"
            + "".join(sections) + f"<script>{_CHECK_SCRIPT}</script></body></html>")


def write_report(documents: Sequence[dict[str, Any]], path: str | Path,
                 title: str = "allocsim report", holders: Sequence[str] | None = None) -> Path:
    path = Path(path)
    guard(path)     # replaces only an allocsim report
    return write_bytes(render_report(documents, title, holders).encode("utf-8"), path)


