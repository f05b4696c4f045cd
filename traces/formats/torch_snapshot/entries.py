"""A PyTorch memory snapshot's trace entries, replayed into the columns of a Trace.

What it does, in order
    1. *Device.* :func:`choose_device` picks the device to read (by default the one that did
       the most: segments plus allocator entries, ``snapshot`` markers not counted; ties: the
       lowest index).
    2. *Entries.* :func:`parse_entries` checks each entry into an
       :class:`~allocsim.traces.formats.torch_snapshot.shape.Entry`; :func:`times_ns` turns
       ``time_us`` into nanoseconds from the first entry (synthetic times 1 µs apart in files
       without it; times that go backwards are clamped and counted); :class:`StreamIds` gives
       raw ``cudaStream_t`` handles small ids in order of first appearance.
    3. *Replay.* :func:`replay` walks the entries forwards from the start state
       (``allocsim.traces.formats.torch_snapshot.start_state``): the blocks live at the start become
       allocs at the very start (the *prologue*, tag :data:`PROLOGUE_TAG`); ``alloc`` becomes
       an alloc of its requested ``size`` under a fresh id (addresses are reused); the buffer
       is freed at ``free_completed`` (only then can the allocator reuse the block), and a
       block whose free was requested but not completed stays live; ``segment_*``, ``oom`` and
       ``snapshot`` entries are kept as reference events, in file order, each with the index
       of the trace event it comes before.
"""

from __future__ import annotations

import collections
import math
from typing import Any

from allocsim.traces.formats.torch_snapshot.shape import (
    BLOCK_ACTIONS,
    INT64_MAX,
    KNOWN_ACTIONS,
    REFERENCE_ACTIONS,
    SEGMENT_ACTIONS,
    Block,
    Entry,
    Snapshot,
    int_field,
    is_int,
)
from allocsim.traces.formats.torch_snapshot.tags import Tagger
from allocsim.traces.model import OP_ALLOC, OP_FREE, TraceError

__all__ = [
    "PROLOGUE_TAG",
    "UNKNOWN_ACTIONS",
    "Columns",
    "StreamIds",
    "choose_device",
    "device_activity",
    "device_counts",
    "device_segments",
    "parse_entries",
    "replay",
    "times_ns",
]

PROLOGUE_TAG = "<allocated before recording>"
# Key of the ``problems`` counter (``metadata["inconsistencies"]``) for trace entries whose
# action this reader does not know: how many were dropped (read_snapshot also records them in
# ``metadata["entry_anomalies"]``, the repair record validate() reads).
UNKNOWN_ACTIONS = "unknown_actions_dropped"


def device_counts(snap: Snapshot) -> dict[int, int]:
    """Trace entries per device (every device that has entries or segments)."""
    counts = {i: len(t) for i, t in enumerate(snap.device_traces)}
    for seg in snap.segments:
        if seg.device is not None:
            counts.setdefault(seg.device, 0)
    return dict(sorted(counts.items()))


def device_segments(snap: Snapshot) -> dict[int, int]:
    """Segments of the final state per device (every device of :func:`device_counts`)."""
    segments = dict.fromkeys(device_counts(snap), 0)
    for seg in snap.segments:
        if seg.device is not None:
            segments[seg.device] += 1
    return segments


def device_activity(snap: Snapshot) -> dict[int, int]:
    """What a device did, for choosing the default one: its segments in the final state plus
    its trace entries that are allocator actions. ``snapshot`` markers are not counted — the
    recorder writes one per ``_dump_snapshot`` call on whichever device is current, so a file
    whose memory is all on device 1 can hold markers only on device 0."""
    activity = device_segments(snap)
    for device, raw in enumerate(snap.device_traces):
        activity[device] += sum(1 for e in raw
                                if not (isinstance(e, dict) and e.get("action") == "snapshot"))
    return activity


def choose_device(snap: Snapshot, device_index: Any, source: str) -> int:
    """The device to read: ``device_index`` if given, else the one that did the most
    (:func:`device_activity`; ties: the lowest index)."""
    counts = device_counts(snap)
    with_events = [d for d, n in counts.items() if n]
    listing = ", ".join(f"{d} ({counts[d]} entries)" for d in with_events) or "none"
    if device_index is None:
        activity = {d: n for d, n in device_activity(snap).items() if n}
        if activity:
            chosen = max(activity, key=lambda d: (activity[d], -d))
            if chosen < 0:
                raise TraceError(f"segment device {chosen} is not a device index", source=source)
            return chosen
        return 0
    if not is_int(device_index):
        try:
            device_index = int(str(device_index), 10)
        except ValueError:
            raise TraceError(f"device_index {device_index!r} is not an integer",
                             source=source) from None
    if device_index in with_events or device_segments(snap).get(device_index):
        return device_index
    if not with_events and (snap.legacy or not counts or device_index in counts):
        return device_index  # a state-only file: read that device's segments
    raise TraceError(f"device {device_index} has no trace entries and no segments (devices "
                     f"with entries: {listing})", source=source)



def parse_entries(raw: list[Any], device: int, source: str) -> list[Entry]:
    entries = []
    for i, e in enumerate(raw):
        where = f"device {device} entry {i}"
        if not isinstance(e, dict):
            raise TraceError(f"{where} is a {type(e).__name__}, expected a dict",
                             source=source)
        action = e.get("action")
        if not isinstance(action, str):
            raise TraceError(f"{where}: 'action' should be a string", source=source)
        where = f"{where} ({action})"
        addr: int | None = None
        device_free: int | None = None
        size = 0
        stream = 0
        if action in BLOCK_ACTIONS or action in SEGMENT_ACTIONS:
            addr = int_field(e, "addr", where, source)
            size = int_field(e, "size", where, source, minimum=0)
            stream = int_field(e, "stream", where, source, default=0)
        elif action in ("oom", "snapshot"):
            size = int_field(e, "size", where, source, default=0, minimum=0)
            stream = int_field(e, "stream", where, source, default=0)
            if action == "oom":
                device_free = int_field(e, "device_free", where, source, default=0)
            elif is_int(e.get("addr")):
                addr = e["addr"]
        entries.append(Entry(action, addr, size, stream, e.get("frames"), device_free))
    return entries


def times_ns(raw: list[Any], device: int, source: str) -> tuple[list[int], dict[str, Any]]:
    """Nanoseconds from the first entry, non-decreasing, and the metadata saying how."""
    stamps = [e.get("time_us") if isinstance(e, dict) else None for e in raw]
    if not stamps or any(s is None for s in stamps):
        # Files from before time_us (2023) have no clock at all: keep the order, 1 µs apart.
        return [1000 * i for i in range(len(stamps))], {"synthetic_times": bool(stamps)}
    clock: list[int | float] = []
    for i, s in enumerate(stamps):
        # Finite: an infinite stamp leaves no interval to measure (inf - inf is NaN).
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
            raise TraceError(f"device {device} entry {i}: 'time_us' is {s!r}, expected a "
                             "finite number", source=source)
        clock.append(s)
    origin = clock[0]
    times: list[int] = []
    clamped = 0
    worst = 0
    previous = 0
    for s in clock:
        t = round((s - origin) * 1000)
        if t < previous:
            # Clocks of different threads can disagree by a little; never let time run back.
            clamped += 1
            worst = max(worst, previous - t)
            t = previous
        times.append(t)
        previous = t
    if times and times[-1] > INT64_MAX:
        raise TraceError(f"device {device}: the trace spans {times[-1]} ns, more than 64 bits "
                         "hold", source=source)
    meta: dict[str, Any] = {"synthetic_times": False, "time_origin_us": origin,
                            "times_clamped": clamped}
    if clamped:
        meta["times_clamped_max_ns"] = worst
    return times, meta


class StreamIds:
    """Raw ``cudaStream_t`` handles -> 0, 1, 2, ... in order of first appearance."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}

    def __call__(self, raw: int) -> int:
        small = self.ids.get(raw)
        if small is None:
            small = self.ids[raw] = len(self.ids)
        return small

    def handles(self) -> dict[str, int]:
        return {str(small): raw for raw, small in self.ids.items()}


class Columns:
    """The Trace's columns as Python lists while they grow."""

    def __init__(self) -> None:
        self.time: list[int] = []
        self.op: list[int] = []
        self.id: list[int] = []
        self.size: list[int] = []
        self.stream: list[int] = []
        self.tag: list[int] = []

    def add(self, time: int, op: int, key: int, size: int, stream: int, tag: int) -> None:
        self.time.append(time)
        self.op.append(op)
        self.id.append(key)
        self.size.append(size)
        self.stream.append(stream)
        self.tag.append(tag)

    def __len__(self) -> int:
        return len(self.op)


def _reference_event(e: Entry, time_ns: int, event: int, stream: int) -> dict[str, Any]:
    ref: dict[str, Any] = {"action": e.action, "addr": e.addr, "size": e.size,
                           "stream": stream, "time_ns": time_ns, "event": event}
    if e.action == "oom":
        ref["device_free"] = e.device_free
    return ref


def replay(entries: list[Entry], times: list[int], start: dict[int, Block],
           streams: StreamIds, tagger: Tagger, problems: collections.Counter[str]
           ) -> tuple[Columns, list[dict[str, Any]], int, int]:
    """Columns, reference events, prologue length and frees pending at the end."""
    cols = Columns()
    live: dict[int, tuple[int, int, int, int]] = {}  # addr -> (id, size, stream, tag)
    next_id = 0
    t0 = times[0] if times else 0
    if start:
        prologue_tag = tagger.intern(PROLOGUE_TAG)
        for addr in sorted(start):
            b = start[addr]
            live[addr] = (next_id, b.requested, streams(b.stream), prologue_tag)
            cols.add(t0, OP_ALLOC, next_id, b.requested, streams(b.stream), prologue_tag)
            next_id += 1
    prologue = len(cols)
    # Blocks whose free was requested before recording and not yet completed are pending too.
    pending: set[int] = {addr for addr, b in start.items() if b.pending}
    refs: list[dict[str, Any]] = []
    for e, t in zip(entries, times):
        action, at = e.action, e.addr
        if action not in KNOWN_ACTIONS:
            # Dropped, and counted: validate() reports it as a repair (an error if strict).
            problems[UNKNOWN_ACTIONS] += 1
        elif action in REFERENCE_ACTIONS:
            refs.append(_reference_event(e, t, len(cols), streams(e.stream)))
        elif at is None:
            continue  # an annotation (block actions have an address)
        elif action == "alloc":
            if at in live:
                # Two live blocks at one address cannot happen; keep the old one as a leak.
                problems["allocs_of_live_addresses"] += 1
            pending.discard(at)
            buf = (next_id, e.size, streams(e.stream), tagger(e.frames))
            live[at] = buf
            cols.add(t, OP_ALLOC, *buf)
            next_id += 1
        elif action == "free_requested":
            if at in live:
                pending.add(at)
        elif action == "free_completed":
            freed = live.pop(at, None)
            pending.discard(at)
            if freed is None:
                problems["unmatched_frees_dropped"] += 1
                continue
            if e.size != freed[1]:
                problems["free_size_mismatches"] += 1
            cols.add(t, OP_FREE, *freed)
    return cols, refs, prologue, len(pending)
