"""``compare --out DIR``: one folder holding results.json, the HTML report and the figures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from allocsim.sim.output.figures import fragmentation_fig, peaks_fig, png_bytes, timeline_fig
from allocsim.sim.output.files import write_bytes, write_json
from allocsim.sim.output.html_report import holders_section, render_report
from allocsim.sim.output.ownership import guard
from allocsim.sim.questions.compare import Comparison
from allocsim.traces.model import OP_ALLOC, Trace

NO_TAG_LABEL = "(no tag)"


def holders_at_peak(trace: Trace, top: int = 10) -> list[tuple[str, int, int]]:
    """``(tag, live bytes, live blocks)`` at the trace's peak live bytes, largest first; past
    ``top`` tags the rest are summed as one row. Requested bytes, so the same under every
    policy: what PyTorch's memory_viz shows first."""
    peak, index = trace.peak_live()
    if index < 0 or peak <= 0:
        return []
    live: dict[int, tuple[int, int]] = {}
    ops = trace.op[: index + 1].tolist()
    ids = trace.id[: index + 1].tolist()
    sizes = trace.size[: index + 1].tolist()
    tags = trace.tag[: index + 1].tolist()
    for op, block, size, tag in zip(ops, ids, sizes, tags):
        if op == OP_ALLOC:
            live[block] = (int(size), int(tag))
        else:
            live.pop(block, None)
    by_tag: dict[str, list[int]] = {}
    for size, tag in live.values():
        name = trace.tag_name(tag) or NO_TAG_LABEL
        entry = by_tag.setdefault(name, [0, 0])
        entry[0] += size
        entry[1] += 1
    rows = sorted(((t, b, n) for t, (b, n) in by_tag.items()), key=lambda r: (-r[1], r[0]))
    if len(rows) > top:
        rest = rows[top - 1:]
        other = (f"{len(rest)} other tags", sum(r[1] for r in rest), sum(r[2] for r in rest))
        rows = [*rows[: top - 1], other]
    return rows


def write_comparisons(comparisons: Sequence[Comparison], out_dir: str | Path,
                      traces: Sequence[Trace] | None = None) -> list[Path]:
    """Into ``out_dir``: ``results.json`` (one object, or an array for several traces, as
    ``--json`` prints), ``report.html`` with every trace, and the three figures per trace
    (prefixed ``NN-NAME-`` when there are several). ``traces``, the replayed traces in the
    order of ``comparisons`` when the caller has them, add to the report who holds memory at
    the peak, by tag (results.json has no per-tag data). Returns the paths written."""
    out = Path(out_dir)
    json_path = out / "results.json"
    figures = [[out / f"{_prefix(index, c, len(comparisons))}{kind}.png" for kind in FIGURE_KINDS]
               for index, c in enumerate(comparisons)]
    for path in [json_path, out / "report.html", *(p for paths in figures for p in paths)]:
        guard(path)     # all refused before any is written: a folder is never half replaced
    documents = [c.to_json_dict(timeline=True) for c in comparisons]
    title = ("allocsim: " + documents[0]["trace"]["name"]) if len(documents) == 1 \
        else f"allocsim: {len(documents)} traces"
    holders = None
    if traces is not None and len(traces) == len(comparisons):
        holders = [holders_section(holders_at_peak(t), t.peak_live()[0])
                   if t.name == c.trace["name"] else "" for t, c in zip(traces, comparisons)]
    # Everything drawn before anything is written: a figure that fails to draw leaves the
    # folder as it was.
    page = render_report(documents, title, holders)
    pngs = []
    for comparison, paths in zip(comparisons, figures):
        title = f"trace {comparison.trace['name']}"
        drawn = (timeline_fig(comparison.results, title),
                 peaks_fig(comparison.results, title or "peak reserved vs peak allocated"),
                 fragmentation_fig(comparison.results, title))
        pngs += [(path, png_bytes(fig)) for path, fig in zip(paths, drawn)]
    write_json(documents[0] if len(documents) == 1 else documents, json_path)
    written = [json_path, write_bytes(page.encode("utf-8"), out / "report.html")]
    written += [write_bytes(data, path) for path, data in pngs]
    return written


FIGURE_KINDS = ("memory_timeline", "peaks", "fragmentation")


def _prefix(index: int, comparison: Comparison, count: int) -> str:
    """Figures of one trace have plain names; of several, ``NN-NAME-`` in front."""
    return "" if count == 1 else f"{index:02d}-{comparison.trace['name']}-"
