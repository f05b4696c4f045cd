"""The report's interactive timelines: uPlot charts in the page itself, working offline.

Why uPlot (1.6.32, MIT, vendored minified under sim/output/vendor/ with its licence): a
well-kept charting library made for exactly this — large time series, drag to zoom, a legend
that toggles series and shows the values under the cursor — at 51 KB minified (plus 2 KB of
CSS), the whole library inlined once per page. The alternatives weigh several times more for
the same chart: Chart.js ~200 KB with its zoom plugin, Plotly ~3.5 MB, ECharts ~1 MB; a page
of four traces stays under a few hundred KB with uPlot.

Per trace the chart shows the trace's live bytes and each policy's reserved bytes on the
trace's time axis and the same size scale as the static figures (sim/output/figure_data.py),
each policy in its colour and dash pattern (sim/output/colours.py).
The data are the results' timelines: at most ~2048 buckets of equal event count, each the
maximum of its bucket, so every peak is kept exact however long the trace
(sim/kernel/run_report.py). A policy whose run stopped early is put onto the same buckets by
maximum, which keeps its peaks too. Where the trace itself is at hand (``compare --out``),
each bucket also names its largest allocation — size, tag, stream and the tag's stack
frames — which the chart shows on hover.

Every value reaches the page as JSON inside ``<script type="application/json">`` with ``<``,
``>`` and ``&`` written as ``\\u`` escapes, so no field can close the element; the page's
script writes it into the DOM as text only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from allocsim.sim.output.colours import LIVE_COLOUR, policy_colours, policy_dashes
from allocsim.sim.output.figure_data import Series, as_series, trace_scales
from allocsim.sim.questions.offline import OFFLINE_NAME
from allocsim.traces.model import OP_ALLOC, Trace

UPLOT_VERSION = "1.6.32"
STEADY_SHARE = 0.5      # "steady state" starts where live bytes first reach half their peak


@dataclass
class BucketBlocks:
    """Per timeline bucket, its largest allocation: size, tag (an index into ``tags``) and
    stream; ``frames`` the kept stack of each tag that has one."""

    size: list[int]
    tag: list[int]
    stream: list[int]
    tags: list[str]
    frames: dict[int, list[str]]


def largest_allocs(trace: Trace, last_events: np.ndarray) -> BucketBlocks:
    """The largest allocation of each bucket ending at ``last_events`` (a timeline's
    ``event``); a bucket with none has size 0."""
    n = min(len(trace), int(last_events[-1]) + 1) if len(last_events) else 0
    sizes = np.where(np.asarray(trace.op[:n]) == OP_ALLOC, np.asarray(trace.size[:n]), -1)
    starts = np.concatenate(([0], np.asarray(last_events[:-1], dtype=np.int64) + 1))
    starts = np.minimum(starts, max(n - 1, 0))
    if n == 0:
        return BucketBlocks([], [], [], [], {})
    top = np.maximum.reduceat(sizes, starts)
    bucket = np.searchsorted(last_events, np.arange(n), side="left")
    hit = np.flatnonzero((sizes == top[np.minimum(bucket, len(top) - 1)]) & (sizes >= 0))
    first = np.full(len(starts), -1, dtype=np.int64)
    kept, at = np.unique(bucket[hit], return_index=True)
    first[kept] = hit[at]
    tags_column = np.asarray(trace.tag)
    streams_column = np.asarray(trace.stream)
    used: dict[int, int] = {}
    tag_names: list[str] = []
    out_tag, out_size, out_stream = [], [], []
    for event in first.tolist():
        if event < 0:
            out_size.append(0)
            out_tag.append(-1)
            out_stream.append(0)
            continue
        code = int(tags_column[event])
        if code not in used:
            used[code] = len(tag_names)
            tag_names.append(trace.tag_name(code) or "(no tag)")
        out_size.append(int(sizes[event]))
        out_tag.append(used[code])
        out_stream.append(int(streams_column[event]))
    stacks = trace.metadata.get("tag_stacks")
    stacks = stacks if isinstance(stacks, dict) else {}
    frames = {index: [str(f) for f in stacks[name][:12]] for index, name in enumerate(tag_names)
              if isinstance(stacks.get(name), list)}
    return BucketBlocks(out_size, out_tag, out_stream, tag_names, frames)


def _onto(x_union: np.ndarray, x: np.ndarray, values: np.ndarray) -> list[float | None]:
    """``values`` at points ``x`` put onto the buckets ending at ``x_union``: the maximum of
    the points of each bucket, the last value carried through a bucket with none, None past
    the series' end."""
    if len(x) == len(x_union) and np.array_equal(x, x_union):
        return [float(v) for v in values]
    index = np.minimum(np.searchsorted(x_union, x, side="left"), len(x_union) - 1)
    out = np.full(len(x_union), -np.inf)
    np.maximum.at(out, index, np.asarray(values, dtype=np.float64))
    last = float(values[0]) if len(values) else 0.0
    result: list[float | None] = []
    end = int(index.max()) if len(index) else -1
    for position, value in enumerate(out.tolist()):
        if position > end:
            result.append(None)
            continue
        last = value if value != -np.inf else last
        result.append(last)
    return result


def reference_series(series: Sequence[Series]) -> Series:
    """The run whose buckets the chart uses: a completed run of an online policy (their
    buckets are the engine's, the same for all of them), else the one that ran furthest."""
    drawn = [s for s in series if s.has_timeline]
    online = [s for s in drawn if s.completed and s.policy != OFFLINE_NAME]
    if online:
        return online[0]
    return max(drawn, key=lambda s: (int(s.event[-1]) if s.event is not None else 0,
                                     len(s.event) if s.event is not None else 0))


def timeline_payload(doc: dict[str, Any], anchor: str,
                     blocks: BucketBlocks | None = None) -> dict[str, Any] | None:
    """What the page's script needs to draw one trace's chart (None: no timelines)."""
    series = [s for s in as_series(doc["results"]) if s.has_timeline]
    if not series:
        return None
    scales = trace_scales(series)
    reference = reference_series(series)
    x_union = scales.x(reference)
    colours = policy_colours([r["policy"] for r in doc["results"]])
    dashes = policy_dashes([r["policy"] for r in doc["results"]])
    live = [max(values) if values else 0.0 for values in zip(*(
        [v if v is not None else 0.0 for v in _onto(x_union, scales.x(s), s.allocated)]
        for s in series if s.allocated is not None))]
    peak_live = max(live) if live else 0.0
    steady = next((float(x_union[i]) for i, v in enumerate(live) if v >= STEADY_SHARE * peak_live),
                  0.0)
    payload: dict[str, Any] = {
        "id": anchor, "x_label": scales.x_label,
        "x_unit": scales.x_label.split("(")[-1].rstrip(")") if scales.by_time else "",
        "x_end": scales.x_end, "y_unit": scales.y_unit, "y_scale": scales.y_scale,
        "y_top": scales.y_top * scales.y_scale,
        "y_all": max(float(np.max(s.reserved)) for s in series if s.reserved is not None),
        "steady_start": steady, "live_colour": LIVE_COLOUR,
        "x": [round(float(v), 6) for v in x_union], "live": live,
        "policies": [_policy(s, scales.x(s), x_union, colours[s.policy], dashes[s.policy],
                             s.policy in scales.off_scale) for s in series],
    }
    if blocks is not None and len(blocks.size) == len(x_union):
        payload["blocks"] = {"size": blocks.size, "tag": blocks.tag, "stream": blocks.stream,
                             "tags": blocks.tags,
                             "frames": {str(k): v for k, v in blocks.frames.items()}}
    return payload


def _policy(s: Series, x: np.ndarray, x_union: np.ndarray, colour: str,
            dash: tuple[int, ...], off_scale: bool) -> dict[str, Any]:
    assert s.reserved is not None
    return {"name": s.policy, "colour": colour, "dash": list(dash), "completed": s.completed,
            "peak_reserved": s.peak_reserved, "off_scale": off_scale,
            "reserved": _onto(x_union, x, s.reserved)}


def _script_json(data: Any) -> str:
    """JSON safe inside a <script> element: no ``<``, ``>`` or ``&`` left as such."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def chart_block(payload: dict[str, Any]) -> str:
    """The chart's place in the page: controls, the plot, the hover panel and its data."""
    anchor = payload["id"]
    return (f'<div class=tl id="{anchor}"><div class=tl-controls>'
            '<button type=button data-act=steady>steady state</button>'
            '<button type=button data-act=all>whole run</button>'
            '<button type=button data-act=in>zoom in</button>'
            '<button type=button data-act=out>zoom out</button>'
            '<button type=button data-act=left>◀ pan</button>'
            '<button type=button data-act=right>pan ▶</button>'
            '<label><input type=checkbox data-act=fit> fit every pool</label>'
            '<span class=tl-hint>drag to zoom, wheel to zoom at the cursor, double-click to '
            'reset; click a name in the legend to hide or show it</span></div>'
            '<div class=tl-plot></div><div class=tl-info aria-live=polite>hover the chart for '
            'the values at a point</div>'
            f'<script type="application/json" class=tl-data>{_script_json(payload)}</script>'
            '</div>')


def page_assets() -> tuple[str, str]:
    """``(css, script)`` every page with charts carries once: uPlot and the chart script."""
    vendor = resources.files("allocsim.sim.output") / "vendor"
    library = (vendor / "uPlot.iife.min.js").read_text(encoding="utf-8")
    # Its banner is a web address; the licence notice replaces it (nothing in the page points
    # at a network).
    library = library.split("\n", 1)[1] if library.startswith("/*!") else library
    banner = (f"/*! uPlot {UPLOT_VERSION} (c) 2022 Leon Sorokin, MIT licence (the licence text "
              "ships with allocsim: sim/output/vendor/uPlot.LICENSE) */\n")
    css = (vendor / "uPlot.min.css").read_text(encoding="utf-8")
    ours = (resources.files("allocsim.sim.output") / "report_charts.js").read_text(
        encoding="utf-8")
    return css, banner + library.replace("</script", "<\\/script") + "\n" + ours
