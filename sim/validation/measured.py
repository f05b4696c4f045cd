"""What a replay on real memory measured: the device-call log, caught corruptions, and the
per-event series every backend fills (:class:`Measured`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocsim.policies import format_size


@dataclass
class Corruption:
    """A placement the pattern check caught: which allocation, where, what was wrong."""

    event: int
    allocation: int          # the trace's buffer id
    address: int
    size: int
    kind: str                # overwritten | out of region | device misuse
    detail: str = ""

    def __str__(self) -> str:
        return (f"event {self.event}: buffer {self.allocation} ({format_size(self.size)} at "
                f"0x{self.address:x}): {self.kind}{': ' + self.detail if self.detail else ''}")


class CallLog:
    """Every device call of a measured replay: event, kind, bytes, success, wall time."""

    def __init__(self) -> None:
        self.event: list[int] = []
        self.kind: list[str] = []
        self.nbytes: list[int] = []
        self.ok: list[bool] = []
        self.wall_ns: list[int] = []

    def add(self, event: int, kind: str, nbytes: int, ok: bool, wall_ns: int) -> None:
        self.event.append(event)
        self.kind.append(kind)
        self.nbytes.append(nbytes)
        self.ok.append(ok)
        self.wall_ns.append(wall_ns)

    def __len__(self) -> int:
        return len(self.event)

    def head(self, count: int) -> CallLog:
        """The first ``count`` calls (those of the replay, not of the clean-up after it)."""
        log = CallLog()
        log.event, log.kind, log.nbytes = self.event[:count], self.kind[:count], self.nbytes[:count]
        log.ok, log.wall_ns = self.ok[:count], self.wall_ns[:count]
        return log

    def before(self, event: int) -> CallLog:
        """The calls made while replaying events before ``event`` (not the clean-up after)."""
        return self.head(sum(1 for e in self.event if e < event))

    @property
    def succeeded(self) -> int:
        return sum(self.ok)

    @property
    def failed(self) -> int:
        return len(self.ok) - sum(self.ok)

    @property
    def total_s(self) -> float:
        return sum(self.wall_ns) / 1e9

    def summary(self) -> dict[str, Any]:
        """Counts per kind and the distribution of wall time per successful call."""
        times = np.asarray([t for t, ok in zip(self.wall_ns, self.ok) if ok], dtype=np.float64)
        kinds: dict[str, int] = {}
        for kind, ok in zip(self.kind, self.ok):
            if ok:
                kinds[kind] = kinds.get(kind, 0) + 1
        return {
            "calls": self.succeeded, "failed": self.failed, "by_kind": kinds,
            "total_s": round(self.total_s, 9),
            "median_us": round(float(np.median(times)) / 1e3, 3) if len(times) else None,
            "p90_us": round(float(np.percentile(times, 90)) / 1e3, 3) if len(times) else None,
            "max_us": round(float(times.max()) / 1e3, 3) if len(times) else None,
        }


@dataclass
class Measured:
    """What one backend measured, per event and in total."""

    reserved: np.ndarray                     # bytes held from the device after each event
    used: np.ndarray | None = None           # bytes handed out (pool backends) after each event
    device_used: np.ndarray | None = None    # cudaMemGetInfo: device bytes in use (delta)
    first_oom_event: int | None = None
    ooms: int = 0
    calls: CallLog = field(default_factory=CallLog)
    calls_exact: bool = True                 # False: counted or timed indirectly (see notes)
    call_count: int | None = None            # successful calls, when known better than the log
    pattern_checked: bool = False
    blocks_checked: int = 0
    corruptions: list[Corruption] = field(default_factory=list)
    device_name: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    granularity: int | None = None           # the device's allocation quantum, as measured
    notes: list[str] = field(default_factory=list)


def inferred_calls(reserved: np.ndarray) -> CallLog:
    """A call log guessed from where reserved bytes moved (one call per move, untimed)."""
    log = CallLog()
    previous = 0
    for event in np.flatnonzero(np.diff(reserved, prepend=0)):
        value = int(reserved[event])
        log.add(int(event), "malloc" if value > previous else "free", abs(value - previous),
                True, 0)
        previous = value
    return log

