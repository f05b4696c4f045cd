"""``compare --out DIR``: one folder holding results.json, the HTML report and the figures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from allocsim.sim.output.figures import plot_fragmentation, plot_peaks, plot_timelines
from allocsim.sim.output.files import write_json
from allocsim.sim.output.html_report import write_report
from allocsim.sim.questions.compare import Comparison


def write_comparisons(comparisons: Sequence[Comparison], out_dir: str | Path) -> list[Path]:
    """Into ``out_dir``: ``results.json`` (one object, or an array for several traces, as
    ``--json`` prints), ``report.html`` with every trace, and the three figures per trace
    (prefixed ``NN-NAME-`` when there are several). Returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    documents = [c.to_json_dict(timeline=True) for c in comparisons]
    json_path = out / "results.json"
    write_json(documents[0] if len(documents) == 1 else documents, json_path)
    title = ("allocsim: " + documents[0]["trace"]["name"]) if len(documents) == 1 \
        else f"allocsim: {len(documents)} traces"
    written = [json_path, write_report(documents, out / "report.html", title)]
    for index, comparison in enumerate(comparisons):
        name = comparison.trace["name"]
        prefix = "" if len(comparisons) == 1 else f"{index:02d}-{name}-"
        title = f"trace {name}"
        written += [
            plot_timelines(comparison.results, out / f"{prefix}memory_timeline.png", title),
            plot_peaks(comparison.results, out / f"{prefix}peaks.png", title),
            plot_fragmentation(comparison.results, out / f"{prefix}fragmentation.png", title),
        ]
    return written
