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
import io
import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.errors import UserInputError
from allocsim.policies.units import format_size
from allocsim.sim.output.figures import pyplot

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
"""

_CHECK_SCRIPT = """
window.addEventListener('load', function () {
  var images = document.querySelectorAll('img');
  var loaded = 0;
  images.forEach(function (img) { if (img.complete && img.naturalWidth > 0) { loaded += 1; } });
  document.body.setAttribute('data-figures-loaded', String(loaded));
  document.body.setAttribute('data-figures-total', String(images.length));
});
"""


def _png(fig: Any) -> str:
    plt = pyplot()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _gib(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.float64) / (1 << 30)


def timeline_figure(results: Sequence[dict[str, Any]], title: str) -> str:
    plt = pyplot()
    shown = [r for r in results if r.get("timeline")]
    fig, axes = plt.subplots(max(1, len(shown)), 1, figsize=(10, 2.1 * max(1, len(shown)) + 0.5),
                             sharex=True, squeeze=False)
    for ax, result in zip(axes[:, 0], shown):
        tl = result["timeline"]
        seconds = np.asarray(tl["time_ns"], dtype=np.float64) / 1e9
        ax.fill_between(seconds, _gib(tl["allocated"]), step="post", alpha=0.35, label="allocated")
        ax.step(seconds, _gib(tl["reserved"]), where="post", color="black", lw=1.3,
                label="reserved")
        if result.get("first_oom_event") is not None:
            at = min(int(np.searchsorted(tl["event"], result["first_oom_event"])), len(seconds) - 1)
            ax.axvline(seconds[at], color="red", ls="--", lw=1, label="first OOM")
        ax.set_title(f"{result['policy']}: peak reserved {format_size(result['peak_reserved'])}",
                     fontsize=9, loc="left")
        ax.set_ylabel("GiB")
    axes[0, 0].legend(fontsize=7, loc="upper right", ncol=3)
    axes[-1, 0].set_xlabel("simulated time (s)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _png(fig)


def fragmentation_figure(results: Sequence[dict[str, Any]], title: str) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.2))
    for result in results:
        tl = result.get("timeline")
        if not tl:
            continue
        reserved = np.asarray(tl["reserved"], dtype=np.float64)
        in_use = np.asarray(tl["in_use"], dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(reserved > 0, (reserved - in_use) / reserved, 0.0)
        ax.step(np.asarray(tl["time_ns"]) / 1e9, share * 100, where="post", lw=1,
                label=result["policy"])
    ax.set_ylim(0, 100)
    ax.set_ylabel("free inside reserved (%)")
    ax.set_xlabel("simulated time (s)")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return _png(fig)


def peaks_figure(results: Sequence[dict[str, Any]], title: str) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(results) + 2), 3.3))
    x = np.arange(len(results))
    ax.bar(x - 0.2, _gib([r["peak_reserved"] for r in results]), 0.4, label="peak reserved")
    ax.bar(x + 0.2, _gib([r["peak_allocated"] for r in results]), 0.4, label="peak allocated")
    ax.set_xticks(x, [r["policy"] for r in results], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("GiB")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return _png(fig)


def capacity_figure(data: dict[str, Any]) -> str:
    plt = pyplot()
    answers = [a for a in data["answers"] if a.get("min_capacity")]
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(answers) + 2), 3.3))
    x = np.arange(len(answers))
    ax.bar(x, _gib([a["min_capacity"] for a in answers]), 0.6, label="minimum capacity")
    if answers:
        ax.axhline(answers[0]["lower_bound"] / (1 << 30), color="black", ls="--", lw=1,
                   label="peak live (lower bound)")
    ax.set_xticks(x, [a["policy"] for a in answers], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("GiB")
    ax.legend(fontsize=8)
    ax.set_title(f"smallest device that runs {data['trace']['name']}", fontsize=10)
    fig.tight_layout()
    return _png(fig)


def _comparison_section(data: dict[str, Any]) -> str:
    trace, device = data["trace"], data["device"]
    rows = []
    for r in data["results"]:
        winner = ' class="winner"' if r["policy"] == data.get("winner") else ""
        done = "yes" if r["completed"] else "NO"
        rows.append(
            f"<tr{winner}><td>{html.escape(r['policy'])}</td>"
            f"<td{' class=fail' if not r['completed'] else ''}>{done}</td>"
            f"<td>{format_size(r['peak_reserved'])}</td><td>{format_size(r['peak_allocated'])}</td>"
            f"<td>{r['utilization']:.1%}</td><td>{r['fragmentation']:.1%}</td><td>{r['ooms']}</td>"
            f"<td>{r['device_mallocs']:,}</td><td>{r['device_frees']:,}</td>"
            f"<td>{r['alloc_time_s'] * 1e3:.3g} ms</td><td>{r.get('slowdown', 1):.3f}×</td></tr>")
    title = f"{trace['name']} on {device['name']}"
    figures = [timeline_figure(data["results"], f"memory over time — {title}"),
               fragmentation_figure(data["results"], f"external fragmentation — {title}"),
               peaks_figure(data["results"], f"peak reserved vs allocated — {title}")]
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
        f"<p class=verdict>{verdict}</p>"
        + "".join(f'<img alt="figure" src="{src}">' for src in figures))


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
            f'<img alt="capacity" src="{capacity_figure(data)}">')


def load_results(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Result documents from files: compare results.json (object or array), min_capacity.json."""
    documents: list[dict[str, Any]] = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise UserInputError(f"{path}: cannot read results: {err}") from None
        for item in data if isinstance(data, list) else [data]:
            if not isinstance(item, dict) or not ("results" in item or "answers" in item):
                raise UserInputError(f"{path}: not an allocsim results file "
                                     "(no 'results' or 'answers')")
            documents.append(item)
    return documents


def render_report(documents: Sequence[dict[str, Any]], title: str = "allocsim report") -> str:
    sections = [(_comparison_section(d) if "results" in d else _capacity_section(d))
                for d in documents]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>{REPORT_MARK}, {stamp}</p>"
            + "".join(sections) + f"<script>{_CHECK_SCRIPT}</script></body></html>")


def write_report(documents: Sequence[dict[str, Any]], path: str | Path,
                 title: str = "allocsim report") -> Path:
    path = Path(path)
    _refuse_a_file_not_ours(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(documents, title), encoding="utf-8")
    return path


REPORT_MARK = "<p class=meta>made by allocsim"


def _refuse_a_file_not_ours(path: Path) -> None:
    """An existing file is replaced only when it is an allocsim report (its ``made by
    allocsim`` line): a user's page, notes or data are never overwritten."""
    if not path.exists():
        return
    if not path.is_file():
        raise UserInputError(f"{path}: exists and is not a file; refusing to write the report")
    with path.open("rb") as handle:
        head = handle.read(1 << 20)
    if REPORT_MARK.encode() not in head:
        raise UserInputError(f"{path}: exists and is not an allocsim report; refusing to "
                             "overwrite it (choose another -o)")
