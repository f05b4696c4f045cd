"""``compare --out DIR``: one folder holding results.json and the HTML report, and the PNG
figures when asked for (``--figures``).

Why the PNGs are on request: matplotlib took three quarters of ``compare -o``'s time (6.4 s
against 1.2 s for ``compare`` on the bundled traces), for figures the page already shows as
charts drawn by the browser (the interactive timeline, the peak bars: sim/output/interactive.py,
sim/output/html_report.py). Without them ``compare -o`` costs the replays and the page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from allocsim.sim.output.display_text import shown
from allocsim.sim.output.figure_data import as_series
from allocsim.sim.output.figures import png_bytes
from allocsim.sim.output.files import safe_stem, write_bytes, write_json
from allocsim.sim.output.holders import live_at_peak
from allocsim.sim.output.html_report import (
    ReportSection,
    TraceDetails,
    comparison_figures,
    render_report,
)
from allocsim.sim.output.interactive import largest_allocs, reference_series
from allocsim.sim.output.ownership import guard
from allocsim.sim.output.report_context import RecordingFacts
from allocsim.sim.questions.compare import Comparison
from allocsim.traces.model import Trace


def trace_details(trace: Trace, comparison: Comparison) -> TraceDetails:
    """What the report shows of the trace itself: who holds memory at its peak and, per
    timeline bucket, the largest allocation (for the chart's hover)."""
    peak = trace.peak_live()[0]
    series = [s for s in as_series(comparison.results) if s.has_timeline]
    blocks = None
    if series:
        reference = reference_series(series)
        assert reference.event is not None
        blocks = largest_allocs(trace, np.asarray(reference.event))
    recorded = trace.metadata.get("total_reserved_max")
    recording = RecordingFacts(
        int(recorded) if isinstance(recorded, int) and recorded > 0 else None,
        [str(line) for line in trace.metadata.get("not_modelled") or []])
    return TraceDetails(live_at_peak(trace), peak, blocks, recording)


def write_comparisons(comparisons: Sequence[Comparison], out_dir: str | Path,
                      traces: Sequence[Trace] | None = None,
                      sections: Sequence[ReportSection] = (),
                      settings: Mapping[str, str] | None = None, *, figures: bool = False,
                      progress: Callable[[str], None] | None = None) -> list[Path]:
    """Into ``out_dir``: ``results.json`` (one object, or an array for several traces, as
    ``--json`` prints), ``report.html`` with every trace and, with ``figures``, the three PNG
    figures per trace (prefixed ``NN-NAME-`` when there are several), also shown in the page.
    ``progress`` is told each slow step (what is being drawn or read). ``traces``, the
    replayed traces in the order of ``comparisons`` when the caller has them, add to the
    report who holds memory at the peak and the blocks behind the timeline's hover
    (results.json has no per-block data).
    ``sections`` and ``settings`` go to the report as :func:`render_report` takes them.
    Returns the paths written."""
    out = Path(out_dir)
    json_path = out / "results.json"
    step = progress or (lambda _text: None)
    figure_paths = [[out / f"{_prefix(index, c, len(comparisons))}{kind}.png"
                     for kind in FIGURE_KINDS] for index, c in enumerate(comparisons)] \
        if figures else []
    # all refused before any is written: a folder is never half replaced; each claimed as
    # checked, so that a file written there while the figures are drawn is not replaced
    json_claim = guard(json_path, "results")
    claims = {path: guard(path) for path in [out / "report.html",
                                             *(p for paths in figure_paths for p in paths)]}
    documents = [c.to_json_dict(timeline=True) for c in comparisons]
    title = ("allocsim: " + shown(documents[0]["trace"]["name"])) if len(documents) == 1 \
        else f"allocsim: {len(documents)} traces"
    details = None
    if traces is not None and len(traces) == len(comparisons):
        step("finding who holds memory at each peak")
        details = [trace_details(t, c) if t.name == c.trace["name"] else None
                   for t, c in zip(traces, comparisons)]
    # Everything drawn before anything is written: a figure that fails to draw leaves the
    # folder as it was. Each figure is rendered once, for its file and the page alike.
    drawn: list[list[bytes]] = []
    for index, doc in enumerate(documents if figures else []):
        drawn.append([])
        for kind, fig in zip(FIGURE_KINDS, comparison_figures(doc)):
            step(f"drawing {kind}.png (trace {index + 1}/{len(documents)})")
            drawn[-1].append(png_bytes(fig))
    step("writing the report")
    page = render_report(documents, title, details, sections, settings,
                         pngs=drawn if figures else None)
    pngs = [(path, data) for paths, datas in zip(figure_paths, drawn)
            for path, data in zip(paths, datas)]
    write_json(documents[0] if len(documents) == 1 else documents, json_claim, kind="results")
    write_bytes(claims[out / "report.html"], page.encode("utf-8"))
    for path, data in pngs:
        write_bytes(claims[path], data)
    return [json_path, out / "report.html", *(path for path, _ in pngs)]


FIGURE_KINDS = ("memory_timeline", "peaks", "fragmentation")


def _prefix(index: int, comparison: Comparison, count: int) -> str:
    """Figures of one trace have plain names; of several, ``NN-NAME-`` in front (the name
    made safe: a trace named ``/../../x`` writes nothing outside the folder)."""
    return "" if count == 1 else f"{index:02d}-{safe_stem(str(comparison.trace['name']))}-"
