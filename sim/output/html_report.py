"""One self-contained HTML page of results: ``allocsim report RESULTS... -o report.html``.

The answer first: a summary per trace (sim/output/report_summary.py), then each trace's
details, each with an anchor to link to — what the numbers include (the context, memory live
before recording, the recording's own reserved, what is not modelled:
sim/output/report_context.py), the comparison table with the CLI's columns and names, the
interactive timeline (uPlot, bundled into the page: sim/output/interactive.py), the peak bars
and "explain the peak" (sim/output/report_peak.py), who holds memory at the peak
(sim/output/holders.py), the PNG figures when asked for (``--figures``: matplotlib is most of
the time a report costs, and the charts above show the same) — then min-capacity answers and
any section a caller adds (:class:`ReportSection`: ``tune`` adds its own). Works offline: the
library, the styles and any PNG figures are in the page. Every field from a results file is checked
(sim/output/report_input.py) and escaped. A few lines of script record on ``<html>`` that
the page ran (``data-report-ready``), its uncaught errors (``data-js-errors``) and, on
``<body>``, how many figures decoded, so a headless browser test can check it whole.
"""

from __future__ import annotations

import base64
import html
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from allocsim import __version__
from allocsim.policies.units import format_size
from allocsim.sim.output.display_text import shown
from allocsim.sim.output.figure_data import FRAGMENTATION_NAME
from allocsim.sim.output.figures import (
    FRAGMENTATION_TITLE,
    capacity_alt,
    capacity_fig,
    fragmentation_alt,
    fragmentation_fig,
    peaks_alt,
    peaks_fig,
    png_bytes,
    timeline_alt,
    timeline_fig,
)
from allocsim.sim.output.files import write_bytes
from allocsim.sim.output.holders import Holding, holders_section
from allocsim.sim.output.interactive import BucketBlocks, chart_block, page_assets, timeline_payload
from allocsim.sim.output.ownership import REPORT_MARK, guard
from allocsim.sim.output.report_context import RecordingFacts, context_box
from allocsim.sim.output.report_peak import explain_peak, peak_bars
from allocsim.sim.output.report_summary import policy_cell, summary_section, verdict_html
from allocsim.traces.bundled import DEFAULT_TRACE_NAME


@dataclass
class TraceDetails:
    """What a results file cannot hold, from the trace itself when the caller has it."""

    holdings: list[Holding]
    peak_live: int
    blocks: BucketBlocks | None = None
    recording: RecordingFacts | None = None


@dataclass
class ReportSection:
    """A section a caller adds after the details (``tune``'s results): ``body`` is HTML the
    caller built with every field escaped; ``anchor`` a name for links (letters, digits,
    ``-``)."""

    anchor: str
    title: str
    body: str


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1320px; color: #222;
       padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; margin: 1.2em 0 0.3em; }
nav { font-size: 0.9em; margin: 0.6em 0 1em; } nav a { margin-right: 1em; }
table { border-collapse: collapse; font-size: 0.88em; margin: 0.6em 0; }
th, td { padding: 0.25em 0.6em; border-bottom: 1px solid #eee; text-align: right;
         white-space: nowrap; }
th { background: #f6f6f6; white-space: normal; vertical-align: bottom; }
th:first-child, td:first-child { text-align: left; }
/* long policy specs and reasons wrap instead of pushing the last columns out of sight */
td:first-child { white-space: normal; overflow-wrap: break-word; max-width: 24em; }
td.wrap, th.wrap { white-space: normal; min-width: 14em; }
ul.context { font-size: 0.88em; color: #333; background: #f8f8fb; border-left: 4px solid #99a;
             padding: 0.4em 0.8em 0.4em 2em; margin: 0.5em 0; }
.pbars { font-size: 0.85em; margin: 0.6em 0; max-width: 900px; }
.pbar { display: grid; grid-template-columns: 16em 1fr 8em; column-gap: 0.6em;
        align-items: center; margin: 0.15em 0; }
.pname { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.ptrack { position: relative; height: 0.9em; background: #f3f3f3; }
.pfill { position: absolute; left: 0; top: 0; bottom: 0; }
.poff { background-image: repeating-linear-gradient(135deg, transparent 0 4px,
        rgba(255,255,255,0.7) 4px 7px); }
.plive { position: absolute; top: -0.2em; bottom: -0.2em; border-left: 2px solid #444; }
.pval { white-space: nowrap; }
.scroll { overflow-x: auto; }
tr.winner td { font-weight: 600; background: #eef7ee; }
td.fail { color: #b00; font-weight: 600; } .muted { color: #888; }
.verdict { background: #f6f6f6; padding: 0.5em 0.9em; border-left: 4px solid #4a4;
           margin: 0.4em 0; }
.paste { background: #fffbe6; padding: 0.4em 0.9em; border-left: 4px solid #d9a400; }
img { max-width: 100%; display: block; margin: 0.6em 0; }
.meta { color: #666; font-size: 0.85em; font-weight: normal; }
.legend { color: #555; font-size: 0.8em; margin-top: -0.3em; }
code { background: #f3f3f3; padding: 0 0.2em; }
a.anchor { color: #bbb; text-decoration: none; margin-left: 0.3em; font-size: 0.8em; }
.tl { border: 1px solid #e3e3e3; padding: 0.5em; margin: 0.8em 0; }
.tl-controls { font-size: 0.82em; margin-bottom: 0.3em; }
.tl-controls button { font-size: 0.95em; margin-right: 0.3em; }
.tl-hint { color: #777; margin-left: 0.6em; }
.tl-info { font-size: 0.82em; min-height: 3.2em; margin-top: 0.3em; }
.tl-info pre { margin: 0.2em 0; font-size: 0.9em; color: #444; overflow-x: auto; }
.kinds { font-size: 0.88em; }
.khead, details.kind > summary { display: grid; align-items: center; column-gap: 0.8em;
  grid-template-columns: minmax(12em, 2fr) 6em 4.5em 4.5em minmax(6em, 1fr) minmax(9em, 1.4fr); }
.khead { font-weight: 600; background: #f6f6f6; padding: 0.25em 0.5em 0.25em 1.4em; }
details.kind > summary { padding: 0.25em 0.5em; border-bottom: 1px solid #eee; cursor: pointer; }
details.kind > summary .kname::before { content: "▸ "; color: #888; }
details.kind[open] > summary .kname::before { content: "▾ "; }
.kname { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.num { text-align: right; white-space: nowrap; }
.kwhat { color: #666; white-space: nowrap; }
.hbar { display: block; height: 0.7em; background: #f0f0f0; }
.hbar span { display: block; height: 100%; background: #888; }
table.members { margin: 0.3em 0 0.6em 1.6em; }
td.tagcell { text-align: left; color: #555; }
details.frames summary { display: inline; cursor: pointer; color: #06c; margin-left: 0.5em; }
details.frames pre { text-align: left; white-space: pre; font-size: 0.9em; }
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
  // tables wider than their box (scrolling sideways hides their last columns)
  var wide = 0;
  document.querySelectorAll('.scroll').forEach(function (box) {
    if (box.scrollWidth > box.clientWidth + 1) { wide += 1; }
  });
  document.body.setAttribute('data-wide-tables', String(wide));
  // milliseconds from the start of navigation to the end of the load event's work
  document.documentElement.setAttribute('data-load-ms', String(Math.round(performance.now())));
});
"""

# What each column of the comparison table means (docs/formats.md, "The JSON schema").
COLUMN_LEGEND = (
    ("peak reserved", "most bytes held from the device at once (counted by the device)"),
    ("peak allocated", "peak live requested bytes (counted from the trace)"),
    ("util", "utilization = peak allocated / peak reserved"),
    ("frag", "1 − util = (peak reserved − peak allocated) / peak reserved: the same number "
             "under the same name as allocsim compare prints"),
    ("OOMs", "allocations that ran out of memory"),
    ("dev mallocs / dev frees", "calls to the device's malloc and free (cudaMalloc/cudaFree)"),
    ("alloc time", "modelled time spent in the allocator over the run"),
    ("slowdown", "(trace duration + alloc time) / trace duration; the winner must stay within "
                 "the budget"),
)

# Defined under the table as well, since the page shows it elsewhere and it is not frag.
FREE_AT_PEAK_NOTE = (
    f"<p class=legend><b>{html.escape(FRAGMENTATION_NAME)}</b> (in “explain the peak” and the "
    "fragmentation figure, not in the table): the free share of reserved memory at the moment "
    "of peak reserved, (reserved − in use) / reserved. It differs from <b>frag</b>, which "
    "sets two peaks that may fall at different moments against each other and counts "
    "rounding as used.</p>")

MEMORY_VIZ_URL = "https://pytorch.org/memory_viz"


def _img(figure: Any, alt: str) -> str:
    """An embedded PNG: ``figure`` a matplotlib figure, or the PNG's bytes when the caller
    rendered it already (``compare --out`` writes the same figures as files)."""
    data = figure if isinstance(figure, bytes) else png_bytes(figure)
    source = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="{source}">'


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "x"


def _column_legend() -> str:
    return ("<p class=legend>" + "; ".join(
        f"<b>{html.escape(name)}</b>: {html.escape(text)}" for name, text in COLUMN_LEGEND)
        + ".</p>" + FREE_AT_PEAK_NOTE)


def suggested_trace_argument(trace: dict[str, Any]) -> str:
    """How a suggested command names the trace: the path it was read from, folder and all (a
    bare file name does not run from where the user ran compare), with the home folder as
    ``~`` (a report is shared; a user name is not the reader's business); ``default`` for the
    bundled default trace, else ``TRACE``."""
    source = str(trace.get("source", ""))
    if trace.get("name") == Path(DEFAULT_TRACE_NAME).stem:
        return "default"
    if not source or source.startswith("synth:") or not Path(source).suffix:
        return "TRACE"
    path = Path(source)
    try:
        return str(Path("~") / path.relative_to(Path.home())) if path.is_absolute() else source
    except ValueError:      # not under the home folder
        return source


def _memory_viz_line(trace: dict[str, Any], policies: Sequence[str]) -> str:
    policy = policies[0] if policies else "P"
    command = (f"allocsim export-snapshot {shlex.quote(suggested_trace_argument(trace))} "
               f"--policy {shlex.quote(policy)} -o run.pickle")
    return ("<p class=meta>To see a policy's run block by block in PyTorch's memory viewer, "
            f"from the folder compare ran in: <code>{html.escape(command)}</code> (any policy "
            "of the table for "
            f"<code>--policy</code>), then drop <code>run.pickle</code> onto "
            f'<a href="{MEMORY_VIZ_URL}">{MEMORY_VIZ_URL}</a>.</p>')


def _table(data: dict[str, Any]) -> str:
    """The table ``allocsim compare`` prints, column for column and name for name."""
    rows = []
    for r in data["results"]:
        winner = ' class="winner"' if r["policy"] == data.get("winner") else ""
        done = "yes" if r["completed"] else "NO"
        held = r["peak_reserved"] > 0       # nothing reserved: no share to speak of
        share = r["peak_allocated"] / r["peak_reserved"] if held else 0.0
        utilization, frag = (f"{share:.1%}", f"{1 - share:.1%}") if held else ("-", "-")
        rows.append(
            f"<tr{winner}><td>{policy_cell(r['policy'])}</td>"
            f"<td{' class=fail' if not r['completed'] else ''}>{done}</td>"
            f"<td>{format_size(r['peak_reserved'])}</td><td>{format_size(r['peak_allocated'])}</td>"
            f"<td>{utilization}</td><td>{frag}</td>"
            f"<td>{int(r['ooms']):,}</td>"
            f"<td>{int(r['device_mallocs']):,}</td><td>{int(r['device_frees']):,}</td>"
            f"<td>{float(r['alloc_time_s']) * 1e3:.3g} ms</td>"
            f"<td>{float(r.get('slowdown', 1)):.3f}×</td></tr>")
    return ("<div class=scroll><table><tr><th>policy</th><th>done</th><th>peak reserved</th>"
            "<th>peak allocated</th><th>util</th>"
            "<th>frag</th><th>OOMs</th><th>dev mallocs</th>"
            "<th>dev frees</th><th>alloc time</th><th>slowdown</th></tr>" + "".join(rows)
            + "</table></div>")


def _heading(level: int, text: str, anchor: str) -> str:
    return (f"<h{level} id={anchor}>{html.escape(shown(text))}"
            f'<a class=anchor href="#{anchor}" title="link to this section">#</a></h{level}>')


def comparison_figures(data: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The three figures of a comparison, in the page's order: memory over time, peak
    reserved, free share of reserved memory."""
    trace, device, results = data["trace"], data["device"], data["results"]
    title = f"{shown(trace['name'])} on {device['name']}"
    return (timeline_fig(results, f"memory over time — {title}"),
            peaks_fig(results, f"peak reserved — {title}"), fragmentation_fig(results, title))


def _comparison_section(data: dict[str, Any], anchor: str,
                        details: TraceDetails | None = None,
                        pngs: Sequence[bytes] | None = None) -> str:
    """One trace's details: what the numbers include, the table, the charts, the peak
    explained, who holds it, and the PNG figures when ``pngs`` holds them."""
    trace, device = data["trace"], data["device"]
    results = data["results"]
    title = f"{shown(trace['name'])} on {device['name']}"
    names = (f"memory over time — {title}", f"{FRAGMENTATION_TITLE} — {title}",
             f"peak reserved — {title}")
    payload = timeline_payload(data, f"{anchor}-timeline",
                               details.blocks if details is not None else None)
    chart = ("" if payload is None else
             _heading(3, "Timeline (interactive)", f"{anchor}-timeline-h") + chart_block(payload))
    holders = ("" if details is None else
               holders_section(details.holdings, details.peak_live, f"{anchor}-holders"))
    figures = ("" if pngs is None else _heading(3, "Figures", f"{anchor}-figures") + "".join(
        _img(figure, alt) for figure, alt in zip(
            pngs, (timeline_alt(results, names[0]), peaks_alt(results, names[2]),
                   fragmentation_alt(results, names[1])))))
    return (
        _heading(2, trace["name"], anchor)
        + f"<p class=meta>{int(trace.get('events', 0)):,} events, "
        f"{int(trace.get('allocs', 0)):,} allocations, "
        f"peak live {format_size(trace['peak_live'])}; device {html.escape(device['name'])} "
        f"({format_size(device['capacity'])}); "
        f"source {html.escape(suggested_trace_argument(trace))}</p>"
        + context_box(data, details.recording if details is not None else None)
        + _table(data) + _column_legend()
        + f"<p class=verdict>{verdict_html(data)}</p>"
        + chart
        + _heading(3, "Explain the peak", f"{anchor}-peak") + peak_bars(data)
        + explain_peak(data, details.holdings if details is not None else None)
        + holders + figures
        + _memory_viz_line(trace, [r["policy"] for r in results if r["policy"] != "offline"]))


def _capacity_section(data: dict[str, Any], anchor: str, figures: bool) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(shown(a['policy']))}</td>"
        f"<td>{'never' if a['min_capacity'] is None else format_size(a['min_capacity'])}</td>"
        f"<td>{format_size(a['lower_bound'])}</td>"
        f"<td>{'-' if a.get('headroom') is None else format_size(a['headroom'])}</td>"
        f"<td>{'yes' if a.get('monotone', True) else 'no'}</td></tr>" for a in data["answers"])
    name = data["trace"]["name"]
    answers = list(data["answers"])
    return (_heading(2, f"minimum capacity — {name}", anchor)
            + "<div class=scroll><table><tr><th>policy</th><th>min capacity</th>"
            "<th>lower bound</th><th>headroom</th><th>monotone</th></tr>" + rows
            + "</table></div>"
            + (_img(capacity_fig(answers, name), capacity_alt(answers, name)) if figures else ""))


def render_report(documents: Sequence[dict[str, Any]], title: str = "allocsim report",
                  details: Sequence[TraceDetails | None] | None = None,
                  sections: Sequence[ReportSection] = (),
                  settings: Mapping[str, str] | None = None,
                  pngs: Sequence[Sequence[bytes] | None] | None = None,
                  figures: bool = False) -> str:
    """The page. ``details``, one per document when given, is what results.json cannot
    supply (who holds memory, the blocks behind the hover), from the trace where it is at
    hand. ``sections`` come after the details; ``settings`` maps a trace name to the line to
    paste shown in its summary (``tune`` fills both). ``pngs``, per document, its three
    figures (:func:`comparison_figures`) already rendered; else, with ``figures``, they are
    drawn here; else the page has its browser-drawn charts only."""
    extra = list(details or []) + [None] * len(documents)
    drawn: list[Sequence[bytes] | None] = list(pngs or []) + [None] * len(documents)
    if pngs is None and figures:
        drawn = [[png_bytes(fig) for fig in comparison_figures(d)] if "results" in d else None
                 for d in documents]
    anchors = [f"{'trace' if 'results' in d else 'capacity'}-{i + 1}-{slug(d['trace']['name'])}"
               for i, d in enumerate(documents)]
    bodies = [(_comparison_section(d, anchors[i], extra[i], drawn[i]) if "results" in d
               else _capacity_section(d, anchors[i], figures or pngs is not None))
              for i, d in enumerate(documents)]
    comparisons = [(d, anchors[i]) for i, d in enumerate(documents) if "results" in d]
    summary = summary_section(comparisons, documents, settings) if comparisons else ""
    added = "".join(_heading(2, s.title, slug(s.anchor)) + s.body for s in sections)
    links = ([("summary", "Summary")] if summary else []) + [
        (anchors[i], d["trace"]["name"] + ("" if "results" in d else " (capacity)"))
        for i, d in enumerate(documents)] + [(slug(s.anchor), s.title) for s in sections]
    nav = "<nav>" + "".join(f'<a href="#{a}">{html.escape(shown(t))}</a>'
                            for a, t in links) + "</nav>"
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    css, script = page_assets() if "class=tl " in "".join(bodies) else ("", "")
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            "<meta name=viewport content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><script>{_ERROR_FLAG_SCRIPT}</script>"
            f"<style>{css}{_STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>{REPORT_MARK} {html.escape(__version__)}"
            f", {stamp}</p>" + nav + summary + "".join(bodies) + added
            + (f"<script>{script}</script>" if script else "")
            + f"<script>{_CHECK_SCRIPT}</script></body></html>")


def write_report(documents: Sequence[dict[str, Any]], path: str | Path,
                 title: str = "allocsim report",
                 details: Sequence[TraceDetails | None] | None = None,
                 sections: Sequence[ReportSection] = (),
                 settings: Mapping[str, str] | None = None, *, figures: bool = False) -> Path:
    path = Path(path)
    claim = guard(path)     # replaces only an allocsim report, and only if nobody wrote it since
    page = render_report(documents, title, details, sections, settings, figures=figures)
    write_bytes(claim, page.encode("utf-8"))
    return path
