"""Profiler ``.xplane.pb`` files (TensorFlow, JAX/XLA): a BFC allocator's requests as a trace.

What it reads
    ``tf.profiler.experimental.start(logdir)`` / ``stop()`` (TensorFlow) and
    ``jax.profiler.trace(logdir)`` (JAX) write ``logdir/plugins/profile/RUN/HOST.xplane.pb``,
    one serialized ``XSpace`` (decoded by :mod:`allocsim.traces.formats.xla.xplane_proto`, no
    TensorFlow needed). The BFC allocator (xla/tsl/framework/bfc_allocator.cc, ``AddTraceMe``)
    leaves one TraceMe instant event per call, ``MemoryAllocation`` or ``MemoryDeallocation``,
    with the stats ``allocator_name``, ``bytes_reserved``, ``bytes_allocated`` (bytes in use
    after the call), ``bytes_available`` (= memory_limit − bytes_reserved − bytes_allocated),
    ``fragmentation``, ``peak_bytes_in_use``, ``requested_bytes``, ``allocation_bytes`` (the
    chunk handed out or freed), ``addr`` (the chunk), and on allocations the op's annotation
    ``tf_op``, ``id`` (step), ``region_type``, ``data_type``, ``shape``. TensorFlow on CPU
    records them when its CPU allocator is BFC (``TF_CPU_ALLOCATOR_USE_BFC=true``); TF and JAX
    on GPU record them for the GPU allocators in the host plane (``/host:CPU``). Every plane
    is searched; the allocator is told apart by ``allocator_name`` only.

    The input is a file (by name ``*.xplane.pb``, or by content: its first plane is named
    ``/host:…``, ``/device:…`` or ``/task:…``), or a TensorBoard log folder
    (``plugins/profile/*/*.xplane.pb`` below it, or below its ``train/`` then ``validation/`` as
    Keras' ``TensorBoard(profile_batch=…)`` callback writes them; the newest run — run folders
    are named by time, ``YYYY_MM_DD_HH_MM_SS`` — unless the path names a run folder itself), or
    a run folder. A run with several host files is read from the first (by name) that holds
    memory records; the listing names the others.

What becomes the trace
    One allocator's calls (``allocator=NAME``; default the one with the most records), in the
    allocator's order: by time (line ``timestamp_ns`` + event ``offset_ps``). The records are
    made under the allocator's lock, so time order is call order except where two calls on
    different threads carry the same timestamp (TraceMe times are nanoseconds). Ties are broken
    by the allocator's own running total: among events with the same time, the one whose
    ``bytes_allocated`` continues the chain (previous ``bytes_allocated`` ± its
    ``allocation_bytes``) goes first; if none or several do, file order (plane, line,
    position in line). The number of tied groups is kept (``time_ties``).

    Allocations are allocs of ``requested_bytes`` tagged ``tf_op [shape]``; deallocations
    free the buffer live at ``addr``. A deallocation of an address not allocated in the
    recording (recording started mid-run) gets an alloc at the very start of the trace (the
    *prologue*, tag ``<allocated before recording>``, its size from the deallocation's own
    ``requested_bytes``).

Metadata
    ``format`` ("xplane"), ``allocator`` (the one read), ``allocators`` ({name: records}),
    ``listing`` (for ``allocsim info``), ``plane``, ``profile_file``, ``bfc_memory_limit``
    (bytes_available + bytes_reserved + bytes_allocated of the first record; constant over a
    run), ``prologue_events``, ``time_ties``, ``time_origin_ps``, and
    ``reference_events``: per record, in trace order, ``{"action": "alloc"|"free", "event":
    trace event index, "requested", "chunk" (allocation_bytes), "addr", "in_use"
    (bytes_allocated), "available", "reserved", "peak", "fragmentation"}`` — the allocator's
    own decisions, for ``allocsim fidelity``.
"""

from __future__ import annotations

import bisect
import math
import re
from pathlib import Path
from typing import Any

from allocsim.traces.formats.limits import read_input
from allocsim.traces.formats.registry import register_folder_format, register_format
from allocsim.traces.formats.xla.xplane_proto import Plane, WireError, read_xspace, varint
from allocsim.traces.model import NO_TAG, OP_ALLOC, OP_FREE, Trace, TraceError

__all__ = ["PROLOGUE_TAG", "detect_log_folder", "detect_xplane", "read_log_folder",
           "read_xplane", "xplane_records"]

EVENT_NAMES = ("MemoryAllocation", "MemoryDeallocation")
PROLOGUE_TAG = "<allocated before recording>"
SUFFIX = ".xplane.pb"
_NUMERIC = ("bytes_reserved", "bytes_allocated", "bytes_available", "peak_bytes_in_use",
            "requested_bytes", "allocation_bytes", "addr")
_RUN_NAME = re.compile(r"^\d{4}_\d{2}_\d{2}_\d{2}_\d{2}_\d{2}")


def _stats(plane: Plane, raw: list[tuple[int, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metadata_id, value in raw:
        if isinstance(value, tuple):   # ref_value: the name of a stat metadata
            value = plane.stat_names.get(value[1], "")
        out[plane.stat_names.get(metadata_id, str(metadata_id))] = value
    return out


def xplane_records(data: bytes, source: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Every BFC memory record of a serialized XSpace, in file order, as dicts of stats plus
    ``kind`` ("alloc"/"free"), ``time_ps``, ``order`` (file position) and ``plane``; and the
    names of the planes read."""
    try:
        planes = read_xspace(data, lambda name: name in EVENT_NAMES)
    except WireError as err:
        raise TraceError(f"not a readable XSpace protobuf (truncated or damaged): {err}",
                         source=source) from None
    records: list[dict[str, Any]] = []
    for plane in planes:
        for _line_id, _name, timestamp_ns, events in plane.lines:
            for event in events:
                stats = _stats(plane, plane.event_stats.get(event.metadata_id, []))
                stats.update(_stats(plane, event.stats))
                kind = "alloc" if plane.event_names[event.metadata_id] == EVENT_NAMES[0] \
                    else "free"
                stats.update(kind=kind, time_ps=timestamp_ns * 1000 + event.offset_ps,
                             order=len(records), plane=plane.name)
                records.append(stats)
    return records, [p.name for p in planes]


def _number(record: dict[str, Any], key: str, source: str) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(f"a {record['kind']} record lacks the numeric stat {key!r}",
                         source=source, event=record["order"])
    if isinstance(value, float) and not math.isfinite(value):
        raise TraceError(f"a {record['kind']} record's stat {key!r} is {value!r}, not a "
                         "number of bytes", source=source, event=record["order"])
    number = int(value)
    if key == "addr" and number < 0:
        number += 1 << 64       # an address is unsigned: a uint64 stat read as int64 wraps
    if not -(1 << 63) <= number < (1 << 63):
        raise TraceError(f"a {record['kind']} record's stat {key!r} is {number:,}, past what "
                         "a 64-bit count of bytes holds", source=source, event=record["order"])
    return number


def _allocator_order(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Time order, ties broken by the bytes_allocated chain (see the module docstring)."""
    ordered = sorted(records, key=lambda r: (r["time_ps"], r["order"]))
    out: list[dict[str, Any]] = []
    ties = 0
    in_use: int | None = None
    at = 0
    while at < len(ordered):
        stop = at + 1
        while stop < len(ordered) and ordered[stop]["time_ps"] == ordered[at]["time_ps"]:
            stop += 1
        group = ordered[at:stop]
        if len(group) > 1:
            ties += 1
        while group:
            pick = 0
            if in_use is not None and len(group) > 1:
                fits = [k for k, r in enumerate(group)
                        if r["in_use"] - r["signed"] == in_use]
                if len(fits) == 1:
                    pick = fits[0]
            record = group.pop(pick)
            out.append(record)
            in_use = record["in_use"]
        at = stop
    return out, ties


_FREE_SIZES = ("requested_bytes", "allocation_bytes")
_MAX_TIME_NS = (1 << 63) - 1   # a trace's time column is int64 nanoseconds
_SIZE_FROM_ALLOC = -1


def _free_sizes_from_allocs(ordered: list[dict[str, Any]], source: str) -> None:
    """Give each size-less free (the TPU runtime's) its buffer's sizes: those of the alloc
    live at its address, or for a buffer allocated before the recording the drop in the
    runtime's running total (``bytes_allocated`` before − after)."""
    live: dict[int, tuple[int, int]] = {}
    in_use: int | None = None
    for record in ordered:
        addr = record["addr"]
        if record["kind"] == "alloc":
            live[addr] = (record["requested_bytes"], record["allocation_bytes"])
        elif record["requested_bytes"] == _SIZE_FROM_ALLOC:
            found = live.pop(addr, None)
            if found is None:
                if in_use is None or in_use - record["bytes_allocated"] <= 0:
                    raise TraceError("a free record carries no size and frees a buffer "
                                     "allocated before the recording, with no running total "
                                     "before it to tell its size", source=source,
                                     event=record["order"])
                size = in_use - record["bytes_allocated"]
                found = (size, size)
            record["requested_bytes"], record["allocation_bytes"] = found
        else:
            live.pop(addr, None)
        in_use = record["bytes_allocated"]


def _follow_compactions(ordered: list[dict[str, Any]]) -> None:
    """The TPU runtime compacts when no hole fits: every live buffer slides to the top of HBM
    in address order (policies/tpu.py, ``compact``), and the runtime records no move. An
    allocation placed over a live buffer is the sign of one: the live buffers are moved as the
    rule moves them, so that each later free finds its buffer (``addr_key``: the address the
    buffer was allocated at; ``addr`` stays the one recorded). A request the runtime refuses
    after compacting (its OOM: the free total is short) records no allocation at all; the sign
    is then a free at an address no live buffer holds but the compacted layout does (seen on
    the chip: tests/data/tpu/steps/350m-eager)."""
    if not ordered or ordered[0]["kind"] != "alloc":
        return
    first = ordered[0]
    limit = first["bytes_available"] + first["bytes_reserved"] + first["bytes_allocated"]
    top = limit - (first["bytes_allocated"] - first["allocation_bytes"])
    live: dict[int, tuple[int, int]] = {}   # address now -> (size, address at allocation)
    starts: list[int] = []                  # the live addresses, sorted (overlap by bisection)
    changes = 0                             # allocs and frees found so far
    # The compacted layout last worked out, and ``changes`` then.
    tried: tuple[int, dict[int, tuple[int, int]]] | None = None
    for record in ordered:
        addr = record["addr"]
        if record["kind"] == "alloc":
            size = record["allocation_bytes"]
            at = bisect.bisect_left(starts, addr + size)   # live buffers starting below its end
            if at and starts[at - 1] + live[starts[at - 1]][0] > addr:
                live = _compacted(live, starts, top)
                starts = sorted(live)
            live[addr] = (size, addr)
            bisect.insort(starts, addr)
            changes += 1
        else:
            if addr not in live:
                # Frees of buffers from before the recording come in runs: the compacted
                # layout is worked out once per state of the live set, not once per free.
                if tried is None or tried[0] != changes:
                    tried = (changes, _compacted(live, starts, top))
                if addr in tried[1]:   # a compaction for a request that then failed
                    live, starts = tried[1], sorted(tried[1])
            found = live.pop(addr, None)
            if found is not None:
                changes += 1
                del starts[bisect.bisect_left(starts, addr)]
                record["addr_key"] = found[1]


def _compacted(live: dict[int, tuple[int, int]], starts: list[int],
               top: int) -> dict[int, tuple[int, int]]:
    """The live buffers after a compaction: slid to ``top`` in address order, none reordered
    (policies/tpu.py, ``compact``)."""
    moved: dict[int, tuple[int, int]] = {}
    below = top
    for start in reversed(starts):
        held, key = live[start]
        below -= held
        moved[below] = (held, key)
    return moved


def _tag(record: dict[str, Any]) -> str | None:
    op = record.get("tf_op")
    shape = record.get("shape")
    op = op if isinstance(op, str) and op else None
    shape = shape if isinstance(shape, str) and shape else None
    if op and shape:
        return f"{op} {shape}"
    return op or (f"<no op> {shape}" if shape else None)


def _float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def trace_from_records(records: list[dict[str, Any]], source: str, name: str,
                       allocator: str | None = None, **extra: Any) -> Trace:
    """The trace of one allocator's records (see the module docstring)."""
    counts: dict[str, int] = {}
    for record in records:
        key = str(record.get("allocator_name") or "")
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        raise TraceError("no BFC memory records (MemoryAllocation / MemoryDeallocation events) "
                         "in this profile; TensorFlow on CPU writes them only with "
                         "TF_CPU_ALLOCATOR_USE_BFC=true, and a profile must be started before "
                         "the allocations", source=source)
    listing = ", ".join(f"{k or '<unnamed>'} ({v:,} records)"
                        for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    if allocator is None:
        allocator = max(sorted(counts), key=lambda k: counts[k])
    elif str(allocator) not in counts:
        raise TraceError(f"no allocator {allocator!r} in this profile (it holds: {listing})",
                         source=source)
    allocator = str(allocator)
    mine = [r for r in records if str(r.get("allocator_name") or "") == allocator]
    sizes_from_allocs = 0
    for record in mine:
        if record["kind"] == "free" and not any(k in record for k in _FREE_SIZES):
            # The TPU runtime's frees carry no sizes: the freed buffer's alloc says them.
            record.update(dict.fromkeys(_FREE_SIZES, _SIZE_FROM_ALLOC))
            sizes_from_allocs += 1
        for key in _NUMERIC:
            if key == "bytes_reserved" and key not in record:
                record[key] = 0
            record[key] = _number(record, key, source)
        record["in_use"] = record["bytes_allocated"]
        record["signed"] = (record["allocation_bytes"] if record["kind"] == "alloc"
                            else -record["allocation_bytes"])
    if sizes_from_allocs:
        ordered, ties = _allocator_order(mine)
        _free_sizes_from_allocs(ordered, source)
        _follow_compactions(ordered)
        for record in mine:
            record["signed"] = (record["allocation_bytes"] if record["kind"] == "alloc"
                                else -record["allocation_bytes"])
    ordered, ties = _allocator_order(mine)
    origin = ordered[0]["time_ps"]

    tags: list[str] = []
    tag_ids: dict[str, int] = {}

    def intern(text: str | None) -> int:
        if text is None:
            return NO_TAG
        if text not in tag_ids:
            tag_ids[text] = len(tags)
            tags.append(text)
        return tag_ids[text]

    # Frees of addresses never allocated in the recording: their buffers predate it.
    prologue: list[dict[str, Any]] = []
    seen: set[int] = set()
    for record in ordered:
        key = record.get("addr_key", record["addr"])
        if record["kind"] == "alloc":
            seen.add(key)
        elif key not in seen:
            prologue.append(record)
            seen.add(key)   # an address is live once; later allocs reopen it
    times: list[int] = []
    ops: list[int] = []
    ids: list[int] = []
    sizes: list[int] = []
    tag_col: list[int] = []
    live: dict[int, tuple[int, int]] = {}
    next_id = 0
    for record in prologue:
        live[record["addr"]] = (next_id, record["requested_bytes"])
        times.append(0)
        ops.append(OP_ALLOC)
        ids.append(next_id)
        sizes.append(record["requested_bytes"])
        tag_col.append(intern(PROLOGUE_TAG))
        next_id += 1
    refs: list[dict[str, Any]] = []
    for record in ordered:
        time_ns = (record["time_ps"] - origin) // 1000
        if time_ns > _MAX_TIME_NS:   # timestamps at both ends of int64: no trace column holds it
            raise TraceError(f"a {record['kind']} record comes {time_ns:,} ns after the first, "
                             "past what 64-bit nanoseconds hold (line timestamp_ns + event "
                             "offset_ps)", source=source, event=record["order"])
        addr = record["addr"]
        key = record.get("addr_key", addr)
        if record["kind"] == "alloc":
            live[addr] = (next_id, record["requested_bytes"])
            buffer, size, tag = next_id, record["requested_bytes"], intern(_tag(record))
            next_id += 1
            op = OP_ALLOC
        else:
            found = live.pop(key, None)
            if found is None:   # freed twice with no alloc between: keep the record only
                buffer, size = next_id, record["requested_bytes"]
                next_id += 1
            else:
                buffer, size = found
            tag, op = NO_TAG, OP_FREE
        refs.append({"action": record["kind"], "event": len(times),
                     "requested": record["requested_bytes"],
                     "chunk": record["allocation_bytes"], "addr": addr,
                     "in_use": record["in_use"], "available": record["bytes_available"],
                     "reserved": record["bytes_reserved"], "peak": record["peak_bytes_in_use"],
                     "fragmentation": _float(record.get("fragmentation"))})
        times.append(time_ns)
        ops.append(op)
        ids.append(buffer)
        sizes.append(size)
        tag_col.append(tag)
    first = ordered[0]
    limit = first["bytes_available"] + first["bytes_reserved"] + first["bytes_allocated"]
    marked = [f"allocator {k or '<unnamed>'}: {v:,} records"
              + (" (replayed)" if k == allocator else "")
              for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    meta: dict[str, Any] = {
        "source": source, "name": name, "format": "xplane", "allocator": allocator,
        "allocators": dict(sorted(counts.items())), "plane": first["plane"],
        "bfc_memory_limit": limit, "prologue_events": len(prologue), "time_ties": ties,
        "time_origin_ps": origin, "reference_events": refs,
        # A TPU runtime's frees carry no sizes: that marks its profiles (the tpu model's).
        "memory_runtime": "tpu" if sizes_from_allocs else "bfc",
    }
    if sizes_from_allocs:   # the runtime records the bytes each array takes on the chip
        meta["sizes_on_device"] = "tpu: as the runtime recorded them"
    meta.update(extra)
    meta["listing"] = marked + list(meta.pop("listing_extra", []))
    return Trace.from_columns(times, ops, ids, sizes, tag=tag_col, tags=tags, **meta)


def read_xplane(data: bytes, source: str, name: str, allocator: str | None = None) -> Trace:
    """Reader of one ``.xplane.pb`` (registered as format ``xplane``)."""
    records, _planes = xplane_records(data, source)
    stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name
    return trace_from_records(records, source, stem, allocator)


def detect_xplane(path: str, head: bytes) -> bool:
    """An ``.xplane.pb`` file by name (its first byte XSpace field 1, planes), or any file
    whose first plane is named as the profiler names planes (``/host:CPU``, ``/device:GPU:0``,
    ``/task:...``) — a profile renamed to ``host.pb`` or saved without its suffix."""
    if path.lower().endswith(SUFFIX):
        return not head or head[0] == 0x0A
    return _first_plane_name(head).startswith(PLANE_NAME_PREFIXES)


PLANE_NAME_PREFIXES = ("/host:", "/device:", "/task:")


def _first_plane_name(head: bytes) -> str:
    """The name of the first XPlane in ``head`` (XSpace field 1 → XPlane field 2), or ''.
    XPlane's own fields come in field order as the profiler serialises them: ``id`` (1) may
    come first, then ``name`` (2)."""
    try:
        if not head or head[0] != 0x0A:
            return ""
        _, pos = varint(head, 1, len(head))             # the plane's length
        while pos < len(head):
            key, pos = varint(head, pos, len(head))
            if key == 0x08:                             # id
                _, pos = varint(head, pos, len(head))
            elif key == 0x12:                           # name
                size, pos = varint(head, pos, len(head))
                return head[pos:pos + min(size, 256)].decode("utf-8", "replace")
            else:
                return ""
    except WireError:
        return ""
    return ""


# -- folders ------------------------------------------------------------------------------
# Keras' TensorBoard callback (``TensorBoard(log_dir, profile_batch=...)``) writes the profile
# of training below ``LOG_DIR/train`` (and evaluation's below ``LOG_DIR/validation``).
KERAS_SUBFOLDERS = ("train", "validation")


def _run_folders(folder: Path) -> list[Path]:
    profile = folder / "plugins" / "profile"
    if profile.is_dir():
        return sorted((p for p in profile.iterdir() if p.is_dir()),
                      key=lambda p: (bool(_RUN_NAME.match(p.name)), p.name))
    for sub in KERAS_SUBFOLDERS:
        if (folder / sub / "plugins" / "profile").is_dir():
            return _run_folders(folder / sub)
    if (folder / "plugins").is_dir() or any(folder.glob("events.out.tfevents*")):
        return []
    return [folder]


def detect_log_folder(folder: Path) -> bool:
    """A TensorBoard log folder (``plugins/`` or ``events.out.tfevents*`` inside, or a Keras
    log folder with them under ``train/`` or ``validation/``), or a profile run folder
    holding ``*.xplane.pb``."""
    return ((folder / "plugins").is_dir() or any(folder.glob("events.out.tfevents*"))
            or any((folder / sub / "plugins").is_dir() for sub in KERAS_SUBFOLDERS)
            or any(folder.glob("*" + SUFFIX)))


def read_log_folder(folder: Path, source: str, name: str, allocator: str | None = None
                    ) -> Trace:
    """The newest run's profile of a log folder (see the module docstring)."""
    runs = [run for run in _run_folders(folder) if any(run.glob("*" + SUFFIX))]
    if not runs:
        raise TraceError("no profile in this log folder (expected plugins/profile/RUN/"
                         "HOST.xplane.pb, written by tf.profiler.experimental.start/stop or "
                         "jax.profiler.trace)", source=source)
    run = runs[-1]
    files = sorted(run.glob("*" + SUFFIX))
    extra = [f"run {run.name} (newest of {len(runs)})" if len(runs) > 1 else f"run {run.name}"]
    for path in files:
        records, _ = xplane_records(read_input(path), str(path))
        if records:
            others = [p.name for p in files if p != path]
            if others:
                extra.append("other host files (not read): " + ", ".join(others))
            return trace_from_records(records, source, name, allocator,
                                      profile_file=str(path), listing_extra=extra)
    raise TraceError(f"no BFC memory records (MemoryAllocation / MemoryDeallocation events) in "
                     f"the profile of run {run.name}; TensorFlow on CPU writes them only with "
                     "TF_CPU_ALLOCATOR_USE_BFC=true", source=source)


register_format("xplane", (SUFFIX,), read_xplane, detect=detect_xplane, recorded=True,
                options=("allocator",))
register_folder_format("tensorboard-profile", read_log_folder, detect_log_folder,
                       options=("allocator",))
