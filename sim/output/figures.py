"""Figures (matplotlib, Agg backend, PNG) of simulated runs, made to compare policies:

- ``memory_timeline.png``: the trace's live bytes and every policy's reserved bytes in one
  panel, then a panel per policy (live, in use, reserved), all on one time axis and one size
  scale (sim/output/figure_data.py says which);
- ``peaks.png``: peak reserved per policy on a linear scale, value printed, peak live marked;
- ``fragmentation.png``: per policy, the free share of reserved memory over the run, on the
  same time axis; each title gives the report's one fragmentation figure, free at peak;
- the smallest device each policy runs on (the report's capacity chart);
- the processes of a shared run, stacked against the device's capacity.

Each policy has one colour and one dash pattern everywhere (sim/output/colours.py). Every
figure of a trace is :data:`FIGURE_WIDTH_IN` wide, those on its time axis with their axes
between the same margins (so stacked in the report their time axes line up), and all in one
size unit (:func:`set_unit`); tick labels are plain numbers (no offsets, no exponents); legends
sit outside the plotting area; names are drawn as text, never as maths. :func:`png_bytes` is the
one place a figure is rendered.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.policies.units import format_size
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.engine import SharedRun
from allocsim.sim.kernel.results import RunResult
from allocsim.sim.output.colours import (
    CAPACITY_COLOUR,
    LIVE_COLOUR,
    OOM_COLOUR,
    policy_colours,
    policy_dashes,
)
from allocsim.sim.output.display_text import shown
from allocsim.sim.output.figure_data import (
    AXES_LEFT_IN,
    AXES_RIGHT_IN,
    FIGURE_WIDTH_IN,
    FRAGMENTATION_NAME,
    FRAGMENTATION_TITLE,
    MIN_LIVE_SHARE,
    Series,
    TraceScales,
    as_series,
    free_at_peak,
    free_share,
    oom_x,
    plain_number,
    set_unit,
    size_scale,
    size_unit,
    trace_scales,
)
from allocsim.sim.output.files import write_bytes
from allocsim.sim.output.ownership import figure_metadata, guard
from allocsim.sim.questions.share import ShareSpec


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported only when a figure is drawn (so that
    commands printing tables never pay for matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    # Names come from traces and users (a file called ``a$x$.csv``): never read them as
    # maths. allocsim's figures hold no maths, so mathtext is off for every text they draw.
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt
    return plt


# Policies a comparison's figure draws, in the comparison's order: one panel each, so 300
# policies made 300 panels and took most of a minute; the rest are in results.json and the
# tables, and the figure says how many it left out.
FIGURE_POLICIES = 16


def _at_most(series: list[Series]) -> tuple[list[Series], str]:
    """The first :data:`FIGURE_POLICIES` of ``series``, and a note when some are left out."""
    if len(series) <= FIGURE_POLICIES:
        return series, ""
    return series[:FIGURE_POLICIES], (f" (the first {FIGURE_POLICIES} of {len(series)} "
                                      "policies; all in results.json)")


def _new_figure(width: float, height: float) -> Any:
    return pyplot().figure(figsize=(width, height), layout="constrained")


def _time_axis_figure(height: float) -> Any:
    """A figure on the trace's time axis: no automatic layout, so that its axes sit between
    the same margins as every other such figure (constrained layout moved them by the width
    of each figure's legend and labels)."""
    return pyplot().figure(figsize=(FIGURE_WIDTH_IN, height))


def _fix_margins(fig: Any, top_in: float, bottom_in: float = 0.55) -> None:
    height = fig.get_size_inches()[1]
    fig.subplots_adjust(left=AXES_LEFT_IN / FIGURE_WIDTH_IN,
                        right=1 - AXES_RIGHT_IN / FIGURE_WIDTH_IN,
                        top=1 - top_in / height, bottom=bottom_in / height, hspace=0.6)


def _legend_at_right(fig: Any, handles: list[Any], labels: list[str], top_in: float) -> None:
    height = fig.get_size_inches()[1]
    fig.legend(handles, labels, loc="upper left", fontsize=7.5, frameon=False,
               bbox_to_anchor=(1 - (AXES_RIGHT_IN - 0.15) / FIGURE_WIDTH_IN,
                               1 - top_in / height))


def _dash(pattern: tuple[int, ...]) -> Any:
    return (0, pattern) if pattern else "-"


def _plain_ticks(axis: Any, bins: int = 6) -> None:
    """Plain-number tick labels (never "1.8×10⁰" or an offset) at round steps."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator
    axis.set_major_locator(MaxNLocator(nbins=bins, steps=[1, 2, 2.5, 5, 10]))
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: plain_number(value)))


def _shared_axes(fig: Any, rows: int, scales: TraceScales, y_top: float | None = None,
                 heights: Sequence[float] | None = None) -> Any:
    axes = fig.subplots(rows, 1, squeeze=False, sharex=True, sharey=True,
                        gridspec_kw={"height_ratios": heights} if heights else None)[:, 0]
    axes[0].set_xlim(0, scales.x_end)
    axes[0].set_ylim(0, scales.y_top if y_top is None else y_top)
    for ax in axes:
        _plain_ticks(ax.xaxis)
        _plain_ticks(ax.yaxis, 4)
        ax.tick_params(labelsize=7)
        ax.grid(axis="y", color="#e6e6e6", lw=0.6)
        ax.set_axisbelow(True)
    axes[-1].set_xlabel(scales.x_label, fontsize=8)
    return axes


def _clip(values: np.ndarray, scales: TraceScales) -> np.ndarray:
    """In axis units; what is above the scale drawn just under its top, so it shows."""
    return np.minimum(np.asarray(values, dtype=np.float64) / scales.y_scale,
                      scales.y_top * 0.985)


def _off_note(s: Series, scales: TraceScales) -> str:
    return " (above the scale: drawn at its top, ▲)" if s.policy in scales.off_scale else ""


def _reserved_line(ax: Any, s: Series, scales: TraceScales, colour: str, width: float,
                   dash: tuple[int, ...] = ()) -> None:
    assert s.reserved is not None
    off = s.policy in scales.off_scale
    ax.step(scales.x(s), _clip(s.reserved, scales), where="post", lw=width, color=colour,
            ls=_dash(dash))
    if off:
        ax.annotate(f"▲ {shown(s.policy)} {format_size(scales.off_scale[s.policy])}",
                    (scales.x_end, scales.y_top * 0.985), xytext=(-3, -3),
                    textcoords="offset points", ha="right", va="top", fontsize=7, color=colour)


def timeline_fig(runs: Sequence[Any], title: str = "") -> Any:
    """Live bytes and every policy's reserved bytes in one panel, then one panel per policy,
    all sharing the trace's time axis and one size scale."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    every = as_series(runs)
    series, left_out = _at_most([s for s in every if s.has_timeline])
    colours = policy_colours([s.policy for s in every])
    dashes = policy_dashes([s.policy for s in every])
    scales = trace_scales(series)
    fig = _time_axis_figure(1.45 * len(series) + 3.0)
    top_in = 0.75 if (title or left_out) else 0.35
    _fix_margins(fig, top_in)
    axes = _shared_axes(fig, len(series) + 1, scales, heights=[2.0] + [1.0] * len(series))
    overview = axes[0]
    if series:
        live = series[0]
        assert live.allocated is not None
        overview.fill_between(scales.x(live), _clip(live.allocated, scales), step="post",
                              color=LIVE_COLOUR, alpha=0.3, lw=0)
    for s in series:
        _reserved_line(overview, s, scales, colours[s.policy], 1.3, dashes[s.policy])
    overview.set_title("live bytes (grey) and each policy's reserved bytes", fontsize=9,
                       loc="left")
    overview.set_ylabel(scales.y_unit, fontsize=8)
    for ax, s in zip(axes[1:], series):
        assert s.allocated is not None and s.reserved is not None and s.in_use is not None
        x = scales.x(s)
        colour = colours[s.policy]
        ax.fill_between(x, _clip(s.allocated, scales), step="post", color=LIVE_COLOUR,
                        alpha=0.3, lw=0)
        ax.step(x, _clip(s.in_use, scales), where="post", lw=0.7, color=colour, ls=":")
        _reserved_line(ax, s, scales, colour, 1.4, dashes[s.policy])
        ax.set_ylabel(scales.y_unit, fontsize=8)
        oom = oom_x(s, scales)
        for target in (ax, overview):
            if oom is not None:
                target.axvline(oom, color=OOM_COLOUR, ls="--", lw=1)
        ax.set_title(f"{shown(s.policy)}: peak reserved {format_size(s.peak_reserved)}"
                     f"{_off_note(s, scales)}; {s.slowdown:.3f}× slowdown"
                     + ("" if s.completed else " — runs out of memory"), fontsize=8.5,
                     loc="left", color="black")
    handles = [Patch(color=LIVE_COLOUR, alpha=0.3, lw=0), Line2D([], [], color="#555", lw=1.4),
               Line2D([], [], color="#555", lw=0.7, ls=":")]
    labels = ["live (requested; every policy)", "reserved (policy colour)", "in use (rounded)"]
    if any(s.first_oom_event is not None for s in series):
        handles.append(Line2D([], [], color=OOM_COLOUR, ls="--", lw=1))
        labels.append("first OOM")
    handles += [Line2D([], [], color=colours[s.policy], lw=2, ls=_dash(dashes[s.policy]))
                for s in series]
    labels += [shown(s.policy, 36) for s in series]
    _legend_at_right(fig, handles, labels, top_in)
    if title or left_out:
        fig.suptitle(shown(title, 90) + left_out, fontsize=10, x=0.02, ha="left")
    return fig


def fragmentation_fig(runs: Sequence[Any], title: str = "") -> Any:
    """Per policy, one panel on the trace's time axis: the free share of reserved memory."""
    every = as_series(runs)
    series, left_out = _at_most([s for s in every if s.has_timeline])
    colours = policy_colours([s.policy for s in every])
    scales = trace_scales(series)
    fig = _time_axis_figure(1.3 * max(1, len(series)) + 1.5)
    top_in = 0.95
    _fix_margins(fig, top_in)
    axes = _shared_axes(fig, max(1, len(series)), scales, y_top=105)
    for ax, s in zip(axes, series):
        x = scales.x(s)
        share = free_share(s) * 100
        colour = colours[s.policy]
        ax.fill_between(x, share, step="post", alpha=0.25, color=colour, lw=0)
        ax.step(x, share, where="post", lw=1, color=colour)
        oom = oom_x(s, scales)
        if oom is not None:
            ax.axvline(oom, color=OOM_COLOUR, ls="--", lw=1)
        ax.set_yticks([0, 50, 100])
        ax.set_ylabel("free (%)", fontsize=8)
        ax.set_title(f"{shown(s.policy)}: {FRAGMENTATION_NAME} {free_at_peak(s):.1%}"
                     + ("" if s.completed else " — runs out of memory"), fontsize=8.5,
                     loc="left")
    # Two short lines that fit the figure's width (one long line was cut off at the right).
    fig.suptitle(f"{FRAGMENTATION_TITLE}{' — ' + shown(title, 70) if title else ''}{left_out}\n"
                 f"(reserved − in use) / reserved over the run; blank where under "
                 f"{MIN_LIVE_SHARE:.0%} of peak allocated is live",
                 fontsize=9.5, x=0.02, ha="left", va="top", y=1 - 0.1 / fig.get_size_inches()[1],
                 linespacing=1.5)
    return fig


def _bars(ax: Any, labels: Sequence[str], values: Sequence[float], colours: Sequence[str],
          texts: Sequence[str], unit: str, top: float | None = None) -> None:
    """Horizontal bars on a linear scale from 0, each with its value printed at its end; with
    ``top``, a bar past it is drawn to the edge, hatched, its value still printed."""
    y = np.arange(len(labels))
    top = max([*values, 1e-12]) if top is None else top
    clipped = [min(value, top) for value in values]
    bars = ax.barh(y, clipped, 0.6, color=colours)
    for row, (value, text, bar) in enumerate(zip(values, texts, bars)):
        if value > top:
            bar.set_hatch("///")
            bar.set_edgecolor("white")
            text = f"{text} ▶ (off the scale)"
        ax.text(min(value, top) + top * 0.01, row, text, va="center", ha="left", fontsize=7.5)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.3)
    _plain_ticks(ax.xaxis)
    ax.set_xlabel(unit, fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", color="#e6e6e6", lw=0.6)
    ax.set_axisbelow(True)


def peaks_fig(runs: Sequence[Any], title: str = "") -> Any:
    """Peak reserved per policy (bar, linear, value printed) with peak live marked, on the
    trace's one size scale (a pool far past it is drawn to the edge and named)."""
    every = as_series(runs)
    series, left_out = _at_most(list(every))
    colours = policy_colours([s.policy for s in every])
    fig = _new_figure(FIGURE_WIDTH_IN, 0.42 * len(series) + 1.3)
    ax = fig.subplots()
    top, _ = size_scale(series)
    unit, scale = set_unit(series)
    _bars(ax, [shown(s.policy, 40) for s in series], [s.peak_reserved / scale for s in series],
          [colours[s.policy] for s in series],
          [format_size(s.peak_reserved) + ("" if s.completed else " — OOM") for s in series],
          unit, top / scale)
    live = max([s.peak_allocated for s in series] + [0])
    ax.axvline(live / scale, color=CAPACITY_COLOUR, ls="--", lw=1,
               label=f"peak live {format_size(live)}")
    ax.legend(fontsize=7.5, loc="lower right", frameon=True)
    ax.set_title(shown(title or "peak reserved") + left_out, fontsize=9.5, loc="left")
    return fig


def capacity_fig(answers: Sequence[dict[str, Any]], trace_name: str) -> Any:
    """The smallest device each policy runs on (bar, linear, value printed), peak live marked;
    a policy that never fits is named as such."""
    colours = policy_colours([a["policy"] for a in answers])
    left_out = (f" (the first {FIGURE_POLICIES} of {len(answers)} policies; all in the JSON)"
                if len(answers) > FIGURE_POLICIES else "")
    answers = answers[:FIGURE_POLICIES]
    fig = _new_figure(FIGURE_WIDTH_IN, 0.42 * len(answers) + 1.3)
    ax = fig.subplots()
    fits = [a["min_capacity"] or 0 for a in answers]
    unit, scale = size_unit(max([*fits, 1]))
    _bars(ax, [shown(a["policy"], 40) for a in answers], [v / scale for v in fits],
          [colours[a["policy"]] for a in answers],
          [format_size(v) if v else "never fits" for v in fits], unit)
    if answers:
        bound = answers[0]["lower_bound"]
        ax.axvline(bound / scale, color=CAPACITY_COLOUR, ls="--", lw=1,
                   label=f"peak live {format_size(bound)} (the lower bound)")
        ax.legend(fontsize=7.5, loc="best", frameon=True)
    ax.set_title(f"smallest device that runs {shown(trace_name)}{left_out}", fontsize=9.5,
                 loc="left")
    return fig


# -- descriptions for the report's <img alt> -------------------------------------------------------
def timeline_alt(runs: Sequence[Any], title: str) -> str:
    series = as_series(runs)
    return (f"{shown(title)}: the trace's live bytes and each policy's reserved bytes over the "
            "trace's time, then one panel per policy, on one time axis and one size scale. "
            + "; ".join(
                f"{shown(s.policy)} peaks at {format_size(s.peak_reserved)} reserved, "
                f"{format_size(s.peak_allocated)} allocated"
                + ("" if s.completed else ", runs out of memory") for s in series) + ".")


def fragmentation_alt(runs: Sequence[Any], title: str) -> str:
    series = as_series(runs)
    return (f"{shown(title)}: one panel per policy, the {FRAGMENTATION_TITLE} over the run, in "
            f"percent. {FRAGMENTATION_NAME}: " + "; ".join(
                f"{shown(s.policy)} {free_at_peak(s):.1%}" for s in series) + ".")


def peaks_alt(runs: Sequence[Any], title: str) -> str:
    series = as_series(runs)
    return (f"{shown(title)}: bar chart on a linear scale of peak reserved per policy, with peak "
            "live marked. " + "; ".join(
                f"{shown(s.policy)} {format_size(s.peak_reserved)} reserved vs "
                f"{format_size(s.peak_allocated)} allocated" for s in series) + ".")


def capacity_alt(answers: Sequence[dict[str, Any]], trace_name: str) -> str:
    return ("Bar chart: the smallest device capacity on which each policy runs "
            f"{shown(trace_name)} without running out of memory, against peak live (the lower "
            "bound). " + "; ".join(
                f"{shown(a['policy'])} " + ("never fits" if a.get("min_capacity") is None
                                     else format_size(a["min_capacity"]))
                for a in answers) + ".")


# -- the PNG files ---------------------------------------------------------------------------------
def png_bytes(fig: Any, dpi: int = 110) -> bytes:
    """The figure as allocsim's own PNG (its ``Software`` chunk says so), and closed: the one
    place a figure is rendered, so that a figure that fails to draw fails before any file of
    its folder is written."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=dpi, metadata=figure_metadata())
    finally:
        pyplot().close(fig)
    return buffer.getvalue()


def save(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Save a figure as allocsim's own, atomically, never over a file it did not write."""
    claim = guard(path)
    write_bytes(claim, png_bytes(fig, dpi))
    return Path(path)


def plot_timelines(results: Sequence[RunResult], path: str | Path, title: str = "") -> Path:
    return save(timeline_fig(results, title), path)


def plot_peaks(results: Sequence[RunResult], path: str | Path, title: str = "") -> Path:
    return save(peaks_fig(results, title or "peak reserved"), path)


def plot_fragmentation(results: Sequence[RunResult], path: str | Path, title: str = "") -> Path:
    return save(fragmentation_fig(results, title), path)


def plot_share(run: SharedRun, specs: Sequence[ShareSpec], device: DeviceProfile,
               path: str | Path) -> Path:
    """Each process's reserved bytes over time, stacked, with the device's capacity."""
    fig = _new_figure(9, 3.8)
    ax = fig.subplots()
    ends = [int(r.timeline.time_ns[-1]) for r in run.results
            if r.timeline is not None and len(r.timeline.time_ns)]
    grid = np.linspace(0, max([*ends, 1]), 1000)
    stacked = np.zeros_like(grid)
    colours = policy_colours([r.policy for r in run.results])
    unit, scale = size_unit(device.capacity)
    for index, result in enumerate(run.results):
        tl = result.timeline
        if tl is None or not len(tl.time_ns):
            continue
        at = np.searchsorted(tl.time_ns, grid, side="right") - 1
        values = np.where((at >= 0) & (grid <= tl.time_ns[-1]), tl.reserved[np.maximum(at, 0)], 0)
        ax.fill_between(grid / 1e9, stacked / scale, (stacked + values) / scale, step="post",
                        alpha=0.45 + 0.4 * (index % 2), color=colours[result.policy],
                        label=f"p{index} {result.policy}" + ("" if result.completed else " (OOM)"))
        stacked = stacked + values
    ax.axhline(device.capacity / scale, color=OOM_COLOUR, ls="--", lw=1, label="capacity")
    _plain_ticks(ax.xaxis)
    _plain_ticks(ax.yaxis)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel(f"reserved ({unit})")
    ax.set_title(f"processes sharing {device.label}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return save(fig, path)
