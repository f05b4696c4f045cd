"""Figures (matplotlib, Agg backend, PNG) of simulated runs:

- ``memory_timeline.png``: per policy, allocated vs reserved (and bytes in use) over the run,
  OOMs marked;
- ``peaks.png``: peak reserved next to peak allocated, per policy (log scale);
- ``fragmentation.png``: free share of reserved memory over the run, per policy;
- the processes of a shared run, stacked against the device's capacity.

The same drawing serves the PNG files of ``compare --out`` (from :class:`RunResult`) and the
HTML report (from the JSON documents): :class:`Series` is what both give it. Choices that hold
for every figure:

- each policy has one colour everywhere (:func:`policy_colors`: a fixed mapping by name, then a
  fallback cycle);
- each panel has its own time axis, from 0 to the end of that run. Simulated time is trace time
  plus the allocator time spent so far, so a slow policy (on-demand, often several times slower)
  runs longer; a shared axis squeezed every other run into a corner, and normalising time would
  hide the very cost that the slowdown column measures. The panel titles give each run's
  duration and slowdown;
- sizes are in the binary unit (B/KiB/MiB/GiB/TiB) that the data of each axis calls for;
- legends sit outside the plotting area.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.policies.units import format_size
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.engine import SharedRun
from allocsim.sim.kernel.results import RunResult
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


# -- colours and units -------------------------------------------------------------------------
POLICY_COLORS: dict[str, str] = {
    "on-demand": "#1f77b4", "preallocate": "#ff7f0e", "best-fit": "#2ca02c", "bfc": "#d62728",
    "pytorch": "#9467bd", "offline": "#8c564b", "buddy": "#e377c2", "cupy": "#bcbd22",
    "first-fit": "#17becf", "cuda-async": "#7f7f7f",
    # JAX's settings (the experiments' own names), each its own colour in every figure
    "jax": "#393b79", "jax:preallocate=false": "#e6550d", "jax:allocator=platform": "#31a354",
    "jax:allocator=cuda_async": "#637939", "jax:fraction=0.9": "#6b6ecf",
    "jax:fraction=0.45": "#9c9ede", "pytorch:expandable_segments=true": "#843c39",
}
FALLBACK_COLORS: tuple[str, ...] = (
    "#7f7f7f", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d",
    "#31a354", "#756bb1")


def policy_colors(policies: Sequence[str]) -> dict[str, str]:
    """One colour per policy: the fixed one for a known name, else the next unused colour of the
    fallback cycle in the order given (the same list gives the same colours in every figure)."""
    colors = {p: POLICY_COLORS[p] for p in policies if p in POLICY_COLORS}
    spare = [c for c in FALLBACK_COLORS if c not in colors.values()] or list(FALLBACK_COLORS)
    index = 0
    for policy in policies:
        if policy not in colors:
            colors[policy] = spare[index % len(spare)]
            index += 1
    return colors


_SIZE_UNITS = (("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40))


def size_unit(max_bytes: float) -> tuple[str, int]:
    """The largest binary unit in which ``max_bytes`` is at least 1: ``(name, bytes)``."""
    name, scale = _SIZE_UNITS[0]
    for unit, size in _SIZE_UNITS:
        if max_bytes >= size:
            name, scale = unit, size
    return name, scale


def time_unit(max_ns: float) -> tuple[str, float]:
    """s, ms, µs or ns for a time axis that ends at ``max_ns``: ``(name, nanoseconds)``."""
    for unit, size in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if max_ns >= size:
            return unit, size
    return "ns", 1.0


def _power_label(value: float) -> str:
    unit, scale = size_unit(value)
    number = value / scale
    return f"{number:.0f}{unit}" if number == int(number) else f"{number:.3g}{unit}"


# -- what every figure draws from ----------------------------------------------------------------
@dataclass
class Series:
    """One policy's run as the figures need it (from a RunResult or a results.json entry)."""

    policy: str
    completed: bool
    peak_reserved: int
    peak_allocated: int
    external_fragmentation: int
    slowdown: float
    first_oom_event: int | None
    event: np.ndarray | None = None
    time_ns: np.ndarray | None = None
    allocated: np.ndarray | None = None
    reserved: np.ndarray | None = None
    in_use: np.ndarray | None = None

    @classmethod
    def from_result(cls, r: RunResult) -> Series:
        tl = r.timeline
        series = cls(r.policy, r.completed, r.peak_reserved, r.peak_allocated,
                     r.external_fragmentation, r.slowdown, r.first_oom_event)
        if tl is not None and len(tl.event):
            series.event, series.time_ns = np.asarray(tl.event), np.asarray(tl.time_ns)
            series.allocated, series.reserved = np.asarray(tl.allocated), np.asarray(tl.reserved)
            series.in_use = np.asarray(tl.in_use)
        return series

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Series:
        series = cls(d["policy"], d["completed"], d["peak_reserved"], d["peak_allocated"],
                     d.get("external_fragmentation", 0), d.get("slowdown", 1.0),
                     d.get("first_oom_event"))
        tl = d.get("timeline")
        if tl and tl.get("event"):
            series.event = np.asarray(tl["event"], dtype=np.int64)
            series.time_ns = np.asarray(tl["time_ns"], dtype=np.float64)
            series.allocated = np.asarray(tl["allocated"], dtype=np.float64)
            series.reserved = np.asarray(tl["reserved"], dtype=np.float64)
            series.in_use = np.asarray(tl.get("in_use", tl["allocated"]), dtype=np.float64)
        return series

    @property
    def has_timeline(self) -> bool:
        return self.time_ns is not None and len(self.time_ns) > 0

    @property
    def duration_ns(self) -> float:
        return float(self.time_ns[-1]) if self.time_ns is not None and len(self.time_ns) else 0.0


def as_series(runs: Sequence[RunResult | Series | Mapping[str, Any]]) -> list[Series]:
    return [r if isinstance(r, Series) else Series.from_result(r) if isinstance(r, RunResult)
            else Series.from_json(r) for r in runs]


def _time_axis(ax: Any, s: Series) -> np.ndarray:
    assert s.time_ns is not None
    unit, scale = time_unit(s.duration_ns)
    ax.set_xlim(0, max(s.duration_ns / scale, 1e-12))
    ax.set_xlabel(f"simulated time ({unit})", fontsize=8)
    return np.asarray(s.time_ns, dtype=np.float64) / scale


def _oom_at(s: Series, x: np.ndarray) -> float | None:
    if s.first_oom_event is None or s.event is None:
        return None
    return float(x[min(int(np.searchsorted(s.event, s.first_oom_event)), len(x) - 1)])


def _duration(s: Series) -> str:
    unit, scale = time_unit(s.duration_ns)
    return f"{s.duration_ns / scale:.3g} {unit}, {s.slowdown:.2f}× slowdown"


def _new_figure(width: float, height: float) -> Any:
    return pyplot().figure(figsize=(width, height), layout="constrained")


def timeline_fig(runs: Sequence[Any], title: str = "") -> Any:
    """Per policy, one panel: allocated (filled), in use and reserved over the run's own time."""
    series = [s for s in as_series(runs) if s.has_timeline]
    colors = policy_colors([s.policy for s in as_series(runs)])
    fig = _new_figure(10, 2.0 * max(1, len(series)) + 0.9)
    axes = fig.subplots(max(1, len(series)), 1, squeeze=False)[:, 0]
    any_oom = False
    for ax, s in zip(axes, series):
        assert s.allocated is not None and s.reserved is not None and s.in_use is not None
        x = _time_axis(ax, s)
        unit, scale = size_unit(max(float(np.max(s.reserved)), float(np.max(s.allocated)), 1.0))
        color = colors[s.policy]
        ax.fill_between(x, s.allocated / scale, step="post", alpha=0.35, color=color, lw=0)
        ax.step(x, s.in_use / scale, where="post", lw=0.7, color=color)
        ax.step(x, s.reserved / scale, where="post", lw=1.4, color="black")
        oom = _oom_at(s, x)
        if oom is not None:
            any_oom = True
            ax.axvline(oom, color="red", ls="--", lw=1)
        ax.set_ylim(bottom=0)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_title(f"{s.policy}: peak reserved {format_size(s.peak_reserved)}, peak allocated "
                     f"{format_size(s.peak_allocated)}; {_duration(s)}"
                     + ("" if s.completed else " — OOM"), fontsize=9, loc="left",
                     color=color)
    if series:
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
        handles = [Patch(color="#777777", alpha=0.35, lw=0),
                   Line2D([], [], color="#777777", lw=0.7), Line2D([], [], color="black", lw=1.4)]
        labels = ["allocated (requested, policy colour)", "in use (rounded)", "reserved"]
        if any_oom:
            handles.append(Line2D([], [], color="red", ls="--", lw=1))
            labels.append("first OOM")
        fig.legend(handles, labels, loc="outside lower center", ncol=len(handles), fontsize=8,
                   frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


FRAGMENTATION_TITLE = "free share of reserved memory"
FRAGMENTATION_QUANTITY = "free share of reserved memory, (reserved − in use) / reserved"


# Points where less than this share of the run's peak allocated bytes is live are not drawn:
# before the first allocation and after the last frees (a few bytes left live against a cache
# of megabytes) the ratio says only "the cache is idle" and showed as a spike to 100%.
MIN_LIVE_SHARE = 0.01


def free_share(s: Series) -> np.ndarray:
    """Per timeline point, the share of reserved bytes not handed out; NaN where (almost)
    nothing is live (under :data:`MIN_LIVE_SHARE` of peak allocated) or nothing is reserved."""
    assert s.reserved is not None and s.in_use is not None and s.allocated is not None
    reserved = np.asarray(s.reserved, dtype=np.float64)
    in_use = np.asarray(s.in_use, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = (reserved - in_use) / reserved
    live = np.asarray(s.allocated, dtype=np.float64)
    floor = max(1.0, MIN_LIVE_SHARE * max(s.peak_allocated, 0))
    return np.where((reserved > 0) & (live >= floor), share, np.nan)


def _at_peak(s: Series) -> float:
    return s.external_fragmentation / s.peak_reserved if s.peak_reserved else 0.0


def fragmentation_fig(runs: Sequence[Any], title: str = "") -> Any:
    """Per policy, one panel (no line hides another): the free share of reserved memory."""
    series = [s for s in as_series(runs) if s.has_timeline]
    colors = policy_colors([s.policy for s in as_series(runs)])
    fig = _new_figure(10, 1.45 * max(1, len(series)) + 0.8)
    axes = fig.subplots(max(1, len(series)), 1, squeeze=False)[:, 0]
    for ax, s in zip(axes, series):
        x = _time_axis(ax, s)
        share = free_share(s) * 100
        color = colors[s.policy]
        ax.fill_between(x, share, step="post", alpha=0.2, color=color, lw=0)
        ax.step(x, share, where="post", lw=1, color=color)
        oom = _oom_at(s, x)
        if oom is not None:
            ax.axvline(oom, color="red", ls="--", lw=1)
        ax.set_ylim(0, 105)
        ax.set_yticks([0, 50, 100])
        ax.set_ylabel("free (%)", fontsize=8)
        ax.tick_params(labelsize=7)
        at_peak = _at_peak(s)
        finite = share[np.isfinite(share)]
        mean = f", mean {np.mean(finite):.0f}%" if len(finite) else ""
        ax.set_title(f"{s.policy}: {at_peak:.0%} free at peak reserved{mean}"
                     + ("" if s.completed else " — OOM"), fontsize=9, loc="left", color=color)
    fig.suptitle(f"{FRAGMENTATION_TITLE}{' — ' + title if title else ''}\n(reserved − in use) / "
                 f"reserved, in %; blank where under {MIN_LIVE_SHARE:.0%} of peak allocated is "
                 "live", fontsize=10)
    return fig


def _log_size_axis(ax: Any, low: float, high: float) -> None:
    """A log axis from below ``low`` to above ``high`` with at most ~7 power-of-two ticks
    labelled in B/KiB/MiB/GiB."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    lo = math.floor(math.log2(max(low, 1.0))) - 1
    hi = math.ceil(math.log2(max(high, 2.0))) + 1
    step = max(1, math.ceil((hi - lo) / 7))
    ticks = [2.0 ** e for e in range(lo, hi + 1, step)]
    ax.set_yscale("log", base=2)
    ax.set_ylim(2.0 ** lo, 2.0 ** hi)
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _power_label(v)))


def peaks_fig(runs: Sequence[Any], title: str = "") -> Any:
    """Peak reserved (bar, the policy's colour) and peak allocated (black mark), log scale, so
    that one policy reserving the whole device (preallocate) does not flatten the others."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    series = as_series(runs)
    colors = policy_colors([s.policy for s in series])
    fig = _new_figure(max(6.0, 1.1 * len(series) + 2.5), 3.8)
    ax = fig.subplots()
    x = np.arange(len(series))
    reserved = [max(s.peak_reserved, 1) for s in series]
    allocated = [max(s.peak_allocated, 1) for s in series]
    ax.bar(x, reserved, 0.6, color=[colors[s.policy] for s in series])
    ax.hlines(allocated, x - 0.3, x + 0.3, color="black", lw=2)
    values = [v for v in reserved + allocated if v > 1] or [1]
    _log_size_axis(ax, min(values), max(values))
    for i, s in enumerate(series):
        ax.annotate(format_size(s.peak_reserved) + ("" if s.completed else "\nOOM"),
                    (i, reserved[i]), xytext=(0, 2), textcoords="offset points", ha="center",
                    va="bottom", fontsize=7, color="red" if not s.completed else "black")
    ax.set_xticks(x, [s.policy for s in series], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("bytes (log scale)", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    fig.legend([Patch(color="#999999"), Line2D([], [], color="black", lw=2)],
               ["peak reserved (bar,\npolicy colour)", "peak allocated"],
               loc="outside right upper", fontsize=8, frameon=False)
    ax.set_title(title or "peak reserved vs peak allocated", fontsize=10)
    return fig


# -- descriptions for the report's <img alt> -------------------------------------------------------
def timeline_alt(runs: Sequence[Any], title: str) -> str:
    series = as_series(runs)
    return (f"{title}: one panel per policy, allocated and reserved memory against each run's "
            "own simulated time. " + "; ".join(
                f"{s.policy} peaks at {format_size(s.peak_reserved)} reserved, "
                f"{format_size(s.peak_allocated)} allocated"
                + ("" if s.completed else ", runs out of memory") for s in series) + ".")


def fragmentation_alt(runs: Sequence[Any], title: str) -> str:
    series = as_series(runs)
    return (f"{title}: one panel per policy, the {FRAGMENTATION_QUANTITY} over the run, in "
            "percent. At peak reserved: " + "; ".join(
                f"{s.policy} {_at_peak(s):.0%}" for s in series) + ".")


def peaks_alt(runs: Sequence[Any], title: str) -> str:
    series = as_series(runs)
    return (f"{title}: bar chart on a log scale of peak reserved per policy, with peak allocated "
            "marked. " + "; ".join(
                f"{s.policy} {format_size(s.peak_reserved)} reserved vs "
                f"{format_size(s.peak_allocated)} allocated" for s in series) + ".")


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
    guard(path)
    return write_bytes(png_bytes(fig, dpi), path)


def plot_timelines(results: Sequence[RunResult], path: str | Path, title: str = "") -> Path:
    return save(timeline_fig(results, title), path)


def plot_peaks(results: Sequence[RunResult], path: str | Path, title: str = "") -> Path:
    return save(peaks_fig(results, title or "peak reserved vs peak allocated"), path)


def plot_fragmentation(results: Sequence[RunResult], path: str | Path, title: str = "") -> Path:
    return save(fragmentation_fig(results, title), path)


def plot_share(run: SharedRun, specs: Sequence[ShareSpec], device: DeviceProfile,
               path: str | Path) -> Path:
    """Each process's reserved bytes over time, stacked, with the device's capacity."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ends = [int(r.timeline.time_ns[-1]) for r in run.results
            if r.timeline is not None and len(r.timeline.time_ns)]
    grid = np.linspace(0, max([*ends, 1]), 1000)
    stacked = np.zeros_like(grid)
    for index, result in enumerate(run.results):
        tl = result.timeline
        if tl is None or not len(tl.time_ns):
            continue
        at = np.searchsorted(tl.time_ns, grid, side="right") - 1
        values = np.where((at >= 0) & (grid <= tl.time_ns[-1]), tl.reserved[np.maximum(at, 0)], 0)
        ax.fill_between(grid / 1e9, stacked / (1 << 30), (stacked + values) / (1 << 30),
                        step="post", alpha=0.6, label=f"p{index} {result.policy}"
                        + ("" if result.completed else " (OOM)"))
        stacked = stacked + values
    ax.axhline(device.capacity / (1 << 30), color="red", ls="--", lw=1, label="capacity")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("reserved (GiB)")
    ax.set_title(f"processes sharing {device.name}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return save(fig, path)
