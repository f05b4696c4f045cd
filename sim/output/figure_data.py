"""What every figure and the interactive timelines draw from, and the scales they share.

:class:`Series` is one policy's run as a drawing needs it, from a :class:`RunResult` (the PNG
files of ``compare --out``) or a results.json entry (the HTML report). :func:`trace_scales`
gives the scales every panel of one trace shares:

- one time axis: the trace's own time (``trace_time_ns``, the same for every policy: the
  allocator's modelled time is the slowdown column, not a stretch of the axis), or the event
  index for results written before it was kept;
- one size axis for live bytes and every policy's reserved bytes, in the figure set's one
  unit (:func:`set_unit`), the same for the timeline, the peak bars and the interactive
  chart, so they never mix MiB and GiB. A policy whose peak reserved is far past the others'
  and the live bytes (a pool of the whole device against megabytes live) is drawn clipped at
  the top, lines and bars alike, and named with its value, rather than flattening every other
  line to the floor; its true peak is written beside it and in the table.

The one fragmentation figure the report shows, in its table and its panels alike, is the free
share of reserved memory at peak reserved (:func:`free_at_peak`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocsim.sim.kernel.results import RunResult

_SIZE_UNITS = (("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40))

FRAGMENTATION_NAME = "free at peak"
FRAGMENTATION_TITLE = "free share of reserved memory"
FRAGMENTATION_QUANTITY = "free share of reserved memory, (reserved − in use) / reserved"

# A policy whose peak reserved is past this many times the scale's reference (peak live, or
# the lowest peak reserved when that is higher) is drawn clipped at the top.
OFF_SCALE_RATIO = 4.0


def size_unit(max_bytes: float) -> tuple[str, int]:
    """The largest binary unit in which ``max_bytes`` is at least 1: ``(name, bytes)``."""
    name, scale = _SIZE_UNITS[0]
    for unit, size in _SIZE_UNITS:
        if max_bytes >= size:
            name, scale = unit, size
    return name, scale


def size_scale(series: Sequence[Series]) -> tuple[float, dict[str, int]]:
    """The top of every size axis of a trace, in bytes, and the policies drawn clipped at it
    (policy -> its peak reserved): live bytes and each peak reserved, except a peak past
    :data:`OFF_SCALE_RATIO` times the reference (peak live, or the lowest peak reserved when
    that is higher), which would flatten every other line and bar to the floor."""
    live = max([1.0, *(float(s.peak_allocated) for s in series), *(
        float(np.max(s.allocated)) for s in series
        if s.allocated is not None and len(s.allocated))])
    peaks = {s.policy: max(float(s.peak_reserved), float(np.max(s.reserved))
                           if s.reserved is not None and len(s.reserved) else 0.0)
             for s in series}
    reference = max(live, min(peaks.values(), default=live))
    within = [p for p in peaks.values() if p <= OFF_SCALE_RATIO * reference]
    top = max([live, *within]) * 1.08
    return top, {policy: int(peak) for policy, peak in peaks.items() if peak > top}


def set_unit(series: Sequence[Series]) -> tuple[str, int]:
    """The one size unit of every figure of a trace (timeline, peak bars, interactive chart):
    the binary unit of their shared scale's top (:func:`size_scale`); a value past the scale
    is written out in full beside its clipped line or bar."""
    return size_unit(size_scale(series)[0])


# Every figure of a comparison is this wide (inches), and those on the trace's time axis keep
# their axes between the same margins, so their time axes line up when stacked in the report.
FIGURE_WIDTH_IN = 10.0
AXES_LEFT_IN = 0.8
AXES_RIGHT_IN = 2.7         # the legend's column at the right


def time_unit(max_ns: float) -> tuple[str, float]:
    """s, ms, µs or ns for a time axis that ends at ``max_ns``: ``(name, nanoseconds)``."""
    for unit, size in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if max_ns >= size:
            return unit, size
    return "ns", 1.0


def plain_number(value: float) -> str:
    """A tick label: up to 4 significant digits, never an exponent or an offset."""
    if value == 0:
        return "0"
    text = f"{value:.4g}"
    if "e" in text:
        text = f"{value:,.0f}" if abs(value) >= 1 else f"{value:.6f}".rstrip("0")
    return text


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
    trace_time_ns: np.ndarray | None = None

    @classmethod
    def from_result(cls, r: RunResult) -> Series:
        tl = r.timeline
        series = cls(r.policy, r.completed, r.peak_reserved, r.peak_allocated,
                     r.external_fragmentation, r.slowdown, r.first_oom_event)
        if tl is not None and len(tl.event):
            series.event, series.time_ns = np.asarray(tl.event), np.asarray(tl.time_ns)
            series.allocated, series.reserved = np.asarray(tl.allocated), np.asarray(tl.reserved)
            series.in_use = np.asarray(tl.in_use)
            if tl.trace_time_ns is not None:
                series.trace_time_ns = np.asarray(tl.trace_time_ns)
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
            if tl.get("trace_time_ns") is not None:
                series.trace_time_ns = np.asarray(tl["trace_time_ns"], dtype=np.float64)
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


def free_at_peak(s: Series) -> float:
    """The report's one fragmentation figure: free bytes inside reserved memory at the moment
    of peak reserved, as a share of it (``external_fragmentation / peak_reserved``)."""
    return s.external_fragmentation / s.peak_reserved if s.peak_reserved else 0.0


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


@dataclass
class TraceScales:
    """The axes every panel of one trace shares."""

    x_label: str
    x_scale: float                       # ns (or events) per axis unit
    x_end: float                         # in axis units
    by_time: bool                        # False: the event index
    y_unit: str
    y_scale: int                         # bytes per axis unit
    y_top: float                         # in axis units
    off_scale: dict[str, int] = field(default_factory=dict)   # policy -> peak reserved, clipped

    def x(self, s: Series) -> np.ndarray:
        """The series' points on the shared time axis."""
        raw = s.trace_time_ns if self.by_time else s.event
        assert raw is not None
        return np.asarray(raw, dtype=np.float64) / self.x_scale


def trace_scales(series: Sequence[Series]) -> TraceScales:
    drawn = [s for s in series if s.has_timeline]
    by_time = bool(drawn) and all(s.trace_time_ns is not None for s in drawn)
    if by_time:
        end = max(float(np.max(s.trace_time_ns)) for s in drawn)  # type: ignore[arg-type]
        unit, scale = time_unit(end)
        x_label, x_scale = f"trace time ({unit})", scale
    else:
        end = max([float(np.max(s.event)) for s in drawn if s.event is not None] + [1.0])
        x_label, x_scale = "event (the trace's order)", 1.0
    top, off = size_scale(drawn)
    y_unit, y_scale = size_unit(top)
    return TraceScales(x_label, x_scale, max(end / x_scale, 1e-9), by_time, y_unit, y_scale,
                       top / y_scale, off)


def oom_x(s: Series, scales: TraceScales) -> float | None:
    """Where on the shared time axis the run's first OOM falls (None: it completed)."""
    if s.first_oom_event is None or s.event is None or not len(s.event):
        return None
    x = scales.x(s)
    return float(x[min(int(np.searchsorted(s.event, s.first_oom_event)), len(x) - 1)])
