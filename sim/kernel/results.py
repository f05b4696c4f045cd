"""What a run produces: :class:`RunResult` (headline metrics) and :class:`Timeline` (over time).

Metric names and definitions follow reference/anchors.md:

- ``peak_allocated``: peak live requested bytes (the engine's count from the trace) — the lower
  bound for any allocator that does not move data;
- ``peak_reserved``: most bytes the process held from the device (the device's count);
- ``utilization`` = peak_allocated / peak_reserved; ``fragmentation`` = 1 − utilization;
  ``waste`` = peak_reserved − peak_allocated; ``jw_fragmentation`` = waste / peak_allocated
  (Johnstone–Wilson measure #4, peak vs peak);
- ``internal_fragmentation``: bytes handed out beyond what was asked (rounding, unsplit slack)
  at the moment of peak allocated;
- ``external_fragmentation``: free bytes inside reserved memory at the moment of peak reserved,
  and ``external_fragmentation_mean`` its share of reserved averaged over the run's samples;
- device calls and ``alloc_time_s``, the modelled time of those calls; ``slowdown`` =
  (trace duration + alloc time) / trace duration.

The JSON form (:meth:`RunResult.to_json_dict`) is a stable schema for CI jobs: keys are only
ever added, never renamed, and it holds no wall-clock figures so the same input gives
byte-identical JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

SCHEMA_VERSION = 1


@dataclass
class Timeline:
    """Memory over a run, downsampled for plots (max per bucket keeps the peaks visible).

    ``event`` is the index of the last event of each bucket; ``time_ns`` simulated time then
    (trace time plus the allocator time spent so far).
    """

    event: np.ndarray
    time_ns: np.ndarray
    allocated: np.ndarray
    reserved: np.ndarray
    in_use: np.ndarray

    def to_json_dict(self) -> dict[str, list[int]]:
        return {name: getattr(self, name).tolist()
                for name in ("event", "time_ns", "allocated", "reserved", "in_use")}


@dataclass
class RunResult:
    """One trace (one process of it) replayed through one policy on one device."""

    policy: str
    trace: str
    device: str
    process: int
    events: int
    allocs: int
    completed: bool
    ooms: int
    first_oom_event: int | None
    first_oom_size: int | None
    first_oom_allocated: int | None
    first_oom_reserved: int | None
    first_oom_largest_free: int | None
    peak_allocated: int
    peak_allocated_event: int
    peak_reserved: int
    peak_reserved_event: int
    final_reserved: int
    internal_fragmentation: int
    external_fragmentation: int
    external_fragmentation_mean: float
    device_mallocs: int
    device_frees: int
    failed_device_mallocs: int
    alloc_time_s: float
    trace_duration_s: float
    policy_stats: dict[str, int] = field(default_factory=dict)
    timeline: Timeline | None = None
    first_oom_others: dict[int, int] | None = None   # other processes' reserved bytes then

    # -- derived metrics -------------------------------------------------------------
    @property
    def utilization(self) -> float:
        return self.peak_allocated / self.peak_reserved if self.peak_reserved else 1.0

    @property
    def fragmentation(self) -> float:
        return 1.0 - self.utilization

    @property
    def waste(self) -> int:
        return self.peak_reserved - self.peak_allocated

    @property
    def jw_fragmentation(self) -> float:
        return self.waste / self.peak_allocated if self.peak_allocated else 0.0

    @property
    def simulated_duration_s(self) -> float:
        return self.trace_duration_s + self.alloc_time_s

    @property
    def slowdown(self) -> float:
        if self.trace_duration_s <= 0:
            return 1.0
        return self.simulated_duration_s / self.trace_duration_s

    def to_json_dict(self, *, timeline: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "policy": self.policy,
            "process": self.process,
            "completed": self.completed,
            "peak_allocated": self.peak_allocated,
            "peak_reserved": self.peak_reserved,
            "utilization": round(self.utilization, 6),
            "fragmentation": round(self.fragmentation, 6),
            "waste": self.waste,
            "jw_fragmentation": round(self.jw_fragmentation, 6),
            "internal_fragmentation": self.internal_fragmentation,
            "external_fragmentation": self.external_fragmentation,
            "external_fragmentation_mean": round(self.external_fragmentation_mean, 6),
            "ooms": self.ooms,
            "first_oom_event": self.first_oom_event,
            "first_oom_size": self.first_oom_size,
            "first_oom_allocated": self.first_oom_allocated,
            "first_oom_reserved": self.first_oom_reserved,
            "first_oom_largest_free": self.first_oom_largest_free,
            "first_oom_others": (None if self.first_oom_others is None else
                                 {str(p): b for p, b in sorted(self.first_oom_others.items())}),
            "device_mallocs": self.device_mallocs,
            "device_frees": self.device_frees,
            "failed_device_mallocs": self.failed_device_mallocs,
            "alloc_time_s": round(self.alloc_time_s, 9),
            "trace_duration_s": round(self.trace_duration_s, 9),
            "slowdown": round(self.slowdown, 6),
            "peak_allocated_event": self.peak_allocated_event,
            "peak_reserved_event": self.peak_reserved_event,
            "final_reserved": self.final_reserved,
            "events": self.events,
            "allocs": self.allocs,
            "policy_stats": dict(self.policy_stats),
        }
        if timeline and self.timeline is not None:
            data["timeline"] = self.timeline.to_json_dict()
        return data
