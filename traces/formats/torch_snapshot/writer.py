"""Writing a PyTorch memory snapshot of a trace, or of a simulated run of one.

:func:`snapshot_of_run` builds the snapshot dict PyTorch's own viewer (pytorch.org/memory_viz,
``torch/utils/viz/MemoryViz.js``) opens, with a simulated policy's addresses and device calls
when it is given them (``allocsim.sim.output.export`` does), else a bump-pointer layout that
never reuses memory; :func:`write_snapshot` pickles that layout with protocol 4 and plain
types only (MemoryViz.js's ``unpickle`` reads protocols 2-4 and nothing else). Tags travel as
frames that re-import to the same tag (see ``allocsim.traces.formats.torch_snapshot.tags``).
"""

from __future__ import annotations

import bisect
import pickle
import re
from collections.abc import Iterable
from typing import Any, BinaryIO

import numpy as np

from allocsim.traces.formats.torch_snapshot.shape import (
    REFERENCE_ACTIONS,
    SEGMENT_ACTIONS,
    Segment,
    insert_segment,
    is_int,
    map_range,
    rounded_size,
    segment_type_of,
    unmap_range,
)
from allocsim.traces.formats.torch_snapshot.tags import TAG_FILENAME, frame_parts, tag_text
from allocsim.traces.model import OP_ALLOC, Trace, TraceError

__all__ = ["PICKLE_PROTOCOL", "snapshot_of_run", "write_snapshot"]

PICKLE_PROTOCOL = 4  # MemoryViz.js's unpickler reads protocols 2 to 4 only
_EXPORT_BASE = 1 << 32  # where the bump-pointer layout of an export starts


# A line number is ASCII digits that fit a frame's int64 (a tag "f.py:<5,000 digits>:g" is
# text, not a call site).
_CALL_SITE = re.compile(r"^(.*?):(-?[0-9]{1,18}):(.*)$")


def _frame_of(text: str) -> dict[str, Any]:
    """A frame dict from ``file:line:name``; anything else travels as a bare tag."""
    match = _CALL_SITE.match(text)
    if match:
        return {"filename": match[1], "line": int(match[2]), "name": match[3]}
    return {"filename": TAG_FILENAME, "line": 0, "name": text}


def _frames_of_tags(trace: Trace) -> list[list[dict[str, Any]]]:
    """Per tag code, the frames an exported alloc carries: the kept stack when the trace has
    one (it re-imports to the same tag), else one frame made from the tag."""
    stacks = trace.metadata.get("tag_stacks")
    stacks = stacks if isinstance(stacks, dict) else {}
    frames = []
    for tag in trace.tags:
        stack = stacks.get(tag)
        kept: list[dict[str, Any]] = []
        if isinstance(stack, list) and stack and all(isinstance(s, str) for s in stack):
            kept = [_frame_of(s) for s in stack]
        # A capped stack may have lost the frame the tag came from; then the tag alone.
        parts = [p for p in map(frame_parts, kept) if p is not None]
        if not kept or tag_text(parts) != tag:
            kept = [_frame_of(tag)]
        frames.append(kept)
    return frames


def _raw_streams(trace: Trace) -> dict[int, int]:
    """Small stream id -> raw handle, from ``stream_handles`` when the trace has them."""
    handles = trace.metadata.get("stream_handles")
    out: dict[int, int] = {}
    if isinstance(handles, dict):
        for small, raw in handles.items():
            try:
                out[int(small)] = int(raw)
            except (TypeError, ValueError):
                continue
    return out


def _time_us(ns: int) -> int | float:
    """Whole microseconds as an int (what PyTorch writes); otherwise a float, so that
    nanosecond times survive a round trip."""
    return ns // 1000 if ns % 1000 == 0 else ns / 1000


def _bump_addresses(trace: Trace) -> dict[int, int]:
    """Each alloc at a fresh address after the previous one (512-byte aligned, never reused)."""
    rows = np.flatnonzero(trace.op == OP_ALLOC).tolist()
    sizes = trace.size[rows].tolist() if rows else []
    out, cursor = {}, _EXPORT_BASE
    for row, size in zip(rows, sizes):
        out[row] = cursor
        cursor += rounded_size(max(size, 1))
    return out


class _Intervals:
    """The device ranges held as segments, for checking that every block lies in one."""

    def __init__(self) -> None:
        self.segs: list[Segment] = []
        self._starts: list[int] = []  # segment addresses, rebuilt only when segments change

    def contains(self, addr: int, size: int) -> bool:
        """O(log segments)."""
        at = bisect.bisect_right(self._starts, addr) - 1
        return at >= 0 and addr + size <= self.segs[at].address + self.segs[at].total_size

    def apply(self, action: str, addr: int, size: int, stream: int) -> bool:
        done = self._apply(action, addr, size, stream)
        self._starts = [s.address for s in self.segs]
        return done

    def _apply(self, action: str, addr: int, size: int, stream: int) -> bool:
        if action == "segment_alloc":
            insert_segment(self.segs, Segment(addr, size, stream,
                                                segment_type_of(size, False), False, 0))
            return True
        if action == "segment_map":
            map_range(self.segs, addr, size, stream)
            return True
        if action == "segment_free":
            at = next((k for k, s in enumerate(self.segs) if s.address == addr), None)
            if at is None:
                return False
            del self.segs[at]
            return True
        return unmap_range(self.segs, addr, size)  # segment_unmap


def _covering_segments(spans: Iterable[tuple[int, int, int]]) -> list[Segment]:
    """Segments covering every ``(addr, size, raw stream)`` span: touching spans merged."""
    segs: list[Segment] = []
    for addr, size, stream in sorted(spans):
        end = addr + max(size, 1)
        if segs and addr <= segs[-1].address + segs[-1].total_size:
            last = segs[-1]
            last.total_size = max(last.total_size, end - last.address)
        else:
            segs.append(Segment(addr, end - addr, stream, "large", False, 0))
    for seg in segs:
        seg.segment_type = segment_type_of(seg.total_size, False)
    return segs


def _check_segment_event(ev: Any, k: int, n: int) -> dict[str, Any]:
    where = f"segment_events[{k}]"
    if not isinstance(ev, dict) or ev.get("action") not in REFERENCE_ACTIONS:
        raise TraceError(f"{where}: expected a dict whose 'action' is one of "
                         + ", ".join(REFERENCE_ACTIONS))
    event = ev.get("event")
    if not is_int(event) or not 0 <= event <= n:
        raise TraceError(f"{where}: 'event' is {event!r}, expected an index 0..{n}")
    required = ("addr", "size") if ev["action"] in SEGMENT_ACTIONS else ()
    for key in ("addr", "size", "stream"):
        value = ev.get(key, None if key in required else 0)
        if key == "addr" and key not in required and value is None:
            continue  # an oom has no address
        if not is_int(value) or value < 0:
            raise TraceError(f"{where}: {key!r} is {value!r}, expected an integer >= 0")
    return ev


def snapshot_of_run(trace: Trace, addresses: dict[int, int] | None = None,
                    segment_events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A PyTorch snapshot dict of ``trace`` (one device), for PyTorch's memory viewer.

    ``addresses`` maps the index of each alloc event to the address a simulated policy gave
    it; without it, allocations are laid out one after another and never reuse memory.
    ``segment_events`` are the simulated device calls, each ``{"action": "segment_alloc" |
    "segment_free" | "segment_map" | "segment_unmap" (or "oom" / "snapshot"), "addr", "size",
    "stream" (small id), "event": index of the trace event it comes before, "time_ns"
    (optional)}`` — the shape of ``metadata["reference_events"]``. With them, the final
    ``segments`` are those still held at the end and every block must lie in a segment held
    when it is allocated (the viewer needs that); without them, one segment covers each
    run of touching allocations. Only plain dicts, lists, ints, floats and strs; a pure
    function of its inputs. The trace should be valid (every free matching an alloc).
    """
    n = len(trace)
    rows_alloc = np.flatnonzero(trace.op == OP_ALLOC).tolist()
    bump = addresses is None
    if addresses is None:
        if segment_events:
            raise TraceError("segment events need the addresses of the allocations they "
                             "hold: pass addresses too")
        addresses = _bump_addresses(trace)
    else:
        missing = next((r for r in rows_alloc if not is_int(addresses.get(r))), None)
        if missing is not None:
            raise TraceError("alloc has no address (addresses maps alloc event indices to "
                             "addresses)", event=missing)
    events = sorted((_check_segment_event(ev, k, n) for k, ev in
                     enumerate(segment_events or [])), key=lambda ev: ev["event"])
    raw_stream = _raw_streams(trace)
    times = trace.time_ns.tolist()
    ops, ids, sizes = trace.op.tolist(), trace.id.tolist(), trace.size.tolist()
    streams, tags = trace.stream.tolist(), trace.tag.tolist()
    tag_frames = _frames_of_tags(trace)
    held = _Intervals() if events else None

    entries: list[dict[str, Any]] = []
    live: dict[int, tuple[int, int, int, int]] = {}  # id -> (addr, size, raw stream, tag)
    k = 0
    for i in range(n + 1):
        while k < len(events) and events[k]["event"] <= i:
            entries.append(_device_entry(events[k], times, raw_stream, held))
            k += 1
        if i == n:
            break
        stream = raw_stream.get(streams[i], streams[i])
        if ops[i] == OP_ALLOC:
            addr, size = int(addresses[i]), sizes[i]
            if held is not None and not held.contains(addr, size):
                raise TraceError(f"address {addr:#x} (+{size} bytes) is in no segment held "
                                 "at that point", event=i)
            live[ids[i]] = (addr, size, stream, tags[i])
            frames = tag_frames[tags[i]] if 0 <= tags[i] < len(tag_frames) else []
            entries.append({"action": "alloc", "addr": addr, "size": size, "stream": stream,
                            "time_us": _time_us(times[i]), "frames": frames})
            continue
        buf = live.pop(ids[i], None)
        if buf is None:
            raise TraceError(f"free of unknown id {ids[i]}", event=i)
        for action in ("free_requested", "free_completed"):
            entries.append({"action": action, "addr": buf[0], "size": buf[1],
                            "stream": buf[2], "time_us": _time_us(times[i]), "frames": []})

    if held is not None:
        segs = held.segs
    else:
        # The bump layout spaces blocks by their rounded size: cover those spans, so that the
        # whole layout is one segment.
        span = rounded_size if bump else (lambda size: size)
        segs = _covering_segments((int(addresses[r]), span(max(sizes[r], 1)),
                                   raw_stream.get(streams[r], streams[r])) for r in rows_alloc)
    return {EXPORT_MARK: EXPORT_VERSION,      # first, so a writer can recognise its own file
            "segments": _final_segments(segs, live, tag_frames),
            "device_traces": [entries],
            "allocator_settings": {}}


# The first key of every snapshot this module writes: PyTorch's viewer and importer ignore it,
# and allocsim recognises a file it exported by it (allocsim.sim.output.ownership), so that it
# replaces its own exports but never a user's recorded snapshot.
EXPORT_MARK = "allocsim_export"
EXPORT_VERSION = 1


def _device_entry(ev: dict[str, Any], times: list[int], raw_stream: dict[int, int],
                  held: _Intervals | None) -> dict[str, Any]:
    """A trace entry for one simulated device call (or oom / snapshot marker)."""
    at = ev["event"]
    time_ns = ev.get("time_ns")
    if not is_int(time_ns):
        time_ns = times[at] if at < len(times) else (times[-1] if times else 0)
    stream = raw_stream.get(ev.get("stream", 0), ev.get("stream", 0))
    action, size = ev["action"], int(ev.get("size", 0))
    entry: dict[str, Any] = {"action": action}
    if action == "oom":
        entry["device_free"] = int(ev.get("device_free") or 0)
    else:
        entry["addr"] = int(ev.get("addr") or 0)
    entry.update({"size": size, "stream": stream, "time_us": _time_us(time_ns), "frames": []})
    if held is not None and action in SEGMENT_ACTIONS:
        if not held.apply(action, entry["addr"], size, stream):
            raise TraceError(f"{action} of {entry['addr']:#x} (+{size} bytes): no such "
                             f"segment is held before event {at}")
    return entry


def _final_segments(segs: list[Segment], live: dict[int, tuple[int, int, int, int]],
                    tag_frames: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Snapshot segments holding the blocks live at the end (gaps as inactive blocks)."""
    blocks = sorted((addr, size, tag) for addr, size, _, tag in live.values() if size > 0)
    starts = [b[0] for b in blocks]
    out = []
    for seg in segs:
        end = seg.address + seg.total_size
        lo, hi = bisect.bisect_left(starts, seg.address), bisect.bisect_left(starts, end)
        cursor, listed, active = seg.address, [], 0
        for addr, size, tag in blocks[lo:hi]:
            if addr < cursor or addr + size > end:
                raise TraceError(f"blocks overlap or leave their segment at {addr:#x}: the "
                                 "addresses cannot be drawn")
            if addr > cursor:
                listed.append({"address": cursor, "size": addr - cursor, "requested_size": 0,
                               "state": "inactive", "frames": []})
            frames = tag_frames[tag] if 0 <= tag < len(tag_frames) else []
            listed.append({"address": addr, "size": size, "requested_size": size,
                           "state": "active_allocated", "frames": frames})
            active += size
            cursor = addr + size
        if cursor < end:
            listed.append({"address": cursor, "size": end - cursor, "requested_size": 0,
                           "state": "inactive", "frames": []})
        out.append({"device": 0, "address": seg.address, "total_size": seg.total_size,
                    "allocated_size": active, "active_size": active, "requested_size": active,
                    "stream": seg.stream, "segment_type": seg.segment_type,
                    "segment_pool_id": [0, 0], "is_expandable": seg.is_expandable,
                    "frames": [], "blocks": listed})
    return out


def write_snapshot(trace: Trace, stream: BinaryIO) -> None:
    """Write ``trace`` as a snapshot pickle (bump-pointer addresses; see
    :func:`snapshot_of_run`), protocol 4 with plain types only, for PyTorch's viewer."""
    pickle.dump(snapshot_of_run(trace), stream, protocol=PICKLE_PROTOCOL)
