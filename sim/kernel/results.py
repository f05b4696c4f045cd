"""What a run produces: :class:`RunResult` (headline metrics), :class:`Timeline` (over time) and
the :class:`CallLog` of device calls the reserved timeline is built from.

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

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

SCHEMA_VERSION = 1
_INT64_MIN = np.iinfo(np.int64).min


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
    # The trace's own time at ``event`` (no allocator time added): the same for every policy,
    # so the figures of one trace share it as their time axis.
    trace_time_ns: np.ndarray | None = None

    def to_json_dict(self) -> dict[str, list[int]]:
        names = ("event", "time_ns", "allocated", "reserved", "in_use")
        data = {name: getattr(self, name).tolist() for name in names}
        if self.trace_time_ns is not None:
            data["trace_time_ns"] = self.trace_time_ns.tolist()
        return data


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


# ---------------------------------------------------------------------- the device-call log
class _Packed(NamedTuple):
    """One packed chunk of a :class:`LogColumn`: the differences between successive values
    (int64, wrapping), held as ``codes`` of the narrowest integer type, or as indices into a
    ``table`` of the distinct differences (a policy that calls at every event repeats a few
    sizes and costs). ``base`` is the value before the chunk's first."""

    codes: np.ndarray
    table: np.ndarray | None
    base: int

    def values(self) -> np.ndarray:
        steps = self.codes.astype(np.int64) if self.table is None else self.table[self.codes]
        return np.cumsum(steps, dtype=np.int64) + np.int64(self.base)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + (0 if self.table is None else self.table.nbytes)


def _narrowest(lo: int, hi: int) -> type:
    for dtype in (np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return dtype
    return np.int64


def _pack(values: np.ndarray, base: int) -> _Packed:
    """``values`` (int64) after ``base``, packed losslessly (see :class:`_Packed`)."""
    steps = np.diff(values, prepend=np.int64(base))
    narrow = _narrowest(int(steps.min()), int(steps.max()))
    width = np.dtype(narrow).itemsize
    if width > 1:
        ordered = np.sort(steps)
        distinct = np.ones(len(ordered), dtype=bool)
        distinct[1:] = ordered[1:] != ordered[:-1]
        table = ordered[distinct]
        code_type = np.uint8 if len(table) <= 1 << 8 else np.uint16
        if len(table) <= 1 << 16 and (np.dtype(code_type).itemsize * len(steps)
                                      + table.nbytes < width * len(steps)):
            codes = np.searchsorted(table, steps).astype(code_type)
            return _Packed(codes, table, base)
    return _Packed(steps.astype(narrow), None, base)


class LogColumn:
    """One column of a :class:`CallLog`: appended to through :attr:`append` — a plain list's
    C ``append`` (≈21 ns against a typed array's ≈37: on-demand appends three values at every
    event, and this is 5% of its replay) — and packed a chunk at a time (:meth:`pack`), so the
    list never holds more than a chunk of events' calls. ``np.asarray(column)`` gives every
    value (int64, or float64 for the cost column); :meth:`chunks` gives them a chunk at a
    time."""

    def __init__(self, typecode: str) -> None:
        self._tail: list[Any] = []      # int ("q") or float ("d") values since the last pack
        self.append = self._tail.append
        self._float = typecode == "d"
        self._packed: list[_Packed] = []
        self._count = 0                 # values in the packed chunks
        self._last = 0                  # the last packed value (the float's bits for cost)

    def __len__(self) -> int:
        return self._count + len(self._tail)

    @property
    def nbytes(self) -> int:
        """Bytes the column holds: its packed chunks, and the tail's list with its objects."""
        return (sum(chunk.nbytes for chunk in self._packed) + sys.getsizeof(self._tail)
                + sum(map(sys.getsizeof, self._tail)))

    def _tail_bits(self) -> np.ndarray:
        tail = np.array(self._tail, dtype=np.float64 if self._float else np.int64)
        return tail.view(np.int64)

    def pack(self) -> None:
        """Move the values appended since the last pack into a packed chunk."""
        if not self._tail:
            return
        bits = self._tail_bits()
        chunk = _pack(bits, self._last)
        self._packed.append(chunk)
        self._count += len(bits)
        self._last = int(bits[-1])
        del self._tail[:]

    def chunks(self) -> Iterator[np.ndarray]:
        """The values, a packed chunk at a time, then those appended since (fresh arrays)."""
        for chunk in self._packed:
            yield self._typed(chunk.values())
        if self._tail:
            yield self._typed(self._tail_bits())

    def _typed(self, bits: np.ndarray) -> np.ndarray:
        return bits.view(np.float64) if self._float else bits

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        parts = list(self.chunks())
        values = (np.concatenate(parts) if parts
                  else np.zeros(0, dtype=np.float64 if self._float else np.int64))
        return values if dtype is None else values.astype(dtype, copy=False)


class CallLog:
    """The device calls of one process's replay: per event that made any, the event's index,
    the bytes the process held from the device after it and the cumulative modelled cost then
    (what the reserved timeline and the simulated clock are built from).

    The engine appends to the three columns (``events``, ``reserved``, ``cost``) in step, and
    calls :meth:`pack` between chunks of events; packed, a policy that calls at every event
    (on-demand, the stream-ordered pool releasing at every free) costs ~3 bytes a call instead
    of 24. Entries are in event order, at most one per event, and an event's entries never
    straddle a pack (the engine packs between events)."""

    PACK_AT = 1 << 12           # fewer entries than this since the last pack stay as they are

    def __init__(self) -> None:
        self.events = LogColumn("q")
        self.reserved = LogColumn("q")
        self.cost = LogColumn("d")

    def __len__(self) -> int:
        return len(self.events)

    @property
    def nbytes(self) -> int:
        return self.events.nbytes + self.reserved.nbytes + self.cost.nbytes

    def pack(self) -> None:
        """Pack the entries appended since the last pack, if there are enough of them."""
        if len(self.events._tail) >= self.PACK_AT:
            for column in (self.events, self.reserved, self.cost):
                column.pack()

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``(events, reserved, cost)`` a chunk at a time."""
        yield from zip(self.events.chunks(), self.reserved.chunks(), self.cost.chunks())

    def per_bucket(self, n: int, bucket: int) -> tuple[np.ndarray, np.ndarray]:
        """For events ``0..n-1`` in buckets of ``bucket`` events (the last may be short):
        the most bytes reserved after any event of each bucket, and the cumulative cost after
        its last event — after an event meaning as the last call at or before it left them
        (0 before the first call). One pass over the log a chunk at a time, never an array per
        event: the bucket's own calls give its maximum, and the call before the bucket counts
        too unless a call at the bucket's first event replaced it."""
        count = -(-n // bucket) if n > 0 else 0
        has = np.zeros(count, dtype=bool)           # a call in the bucket
        at_start = np.zeros(count, dtype=bool)      # a call at the bucket's first event
        top = np.zeros(count, dtype=np.int64)       # most reserved among the bucket's calls
        last = np.zeros(count, dtype=np.int64)      # reserved after its last call
        last_cost = np.zeros(count, dtype=np.float64)
        chunks = self.chunks()
        ahead = next(chunks, None)
        while ahead is not None:
            events, reserved, cost = ahead
            ahead = next(chunks, None)
            # An entry followed by another for the same event is never seen after an event.
            seen = np.ones(len(events), dtype=bool)
            seen[:-1] = events[1:] != events[:-1]
            if len(events) and ahead is not None and len(ahead[0]):
                seen[-1] = ahead[0][0] != events[-1]
            inside = events < n
            if not inside.all():
                events, reserved, cost, seen = (events[inside], reserved[inside], cost[inside],
                                                seen[inside])
            if not len(events):
                continue
            index = events // bucket
            firsts = np.flatnonzero(np.diff(index)) + 1
            starts = np.concatenate(([0], firsts))
            ends = np.concatenate((firsts, [len(events)])) - 1
            buckets = index[starts]
            most = np.maximum.reduceat(np.where(seen, reserved, _INT64_MIN), starts)
            top[buckets] = np.where(has[buckets], np.maximum(top[buckets], most), most)
            has[buckets] = True
            at_start[buckets] |= events[starts] == buckets * bucket
            last[buckets] = reserved[ends]
            last_cost[buckets] = cost[ends]
        positions = np.arange(count)
        upto = np.maximum.accumulate(np.where(has, positions, -1)) if count else positions
        before = np.concatenate(([-1], upto[:-1])) if count else positions
        carried = np.where(before >= 0, last[np.maximum(before, 0)], 0)
        reserved_max = np.where(has, np.where(at_start, top, np.maximum(top, carried)), carried)
        cost_at_end = np.where(upto >= 0, last_cost[np.maximum(upto, 0)], 0.0)
        return reserved_max.astype(np.int64, copy=False), cost_at_end
