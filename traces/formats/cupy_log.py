"""Importer for CuPy memory-hook logs (JSON lines), from our recorder or CuPy's DebugPrintHook.

Follows CuPy's cupy/cuda/memory_hook.pyx (the hook callbacks) and cupy/cuda/memory.pyx (the
pool that calls them). CuPy calls a memory hook's keyword callbacks
``malloc_postprocess(device_id, size, mem_size, mem_ptr, pmem_id)`` for every request to the
pool, ``free_postprocess(device_id, mem_size, mem_ptr, pmem_id)`` when a buffer goes back to
the pool and ``alloc_postprocess(device_id, mem_size, mem_ptr)`` on a pool miss (cudaMalloc).
CuPy gives no time and no stream. Two line formats are read (blank lines ignored; lines that
do not start with ``{`` - other program output mixed into a captured stdout - are skipped and
counted in ``metadata["skipped_lines"]``):

(a) **allocsim's recorder** (:mod:`allocsim.traces.record.cupy_hook`), one JSON object per line::

        {"allocsim-cupy-log": 1, "metadata": {"recorder": "...", "cupy": "13.3.0"}}
        {"t": 900, "hook": "alloc", "device": 0, "mem_size": 512, "ptr": 150496608256,
         "stream": 0}
        {"t": 1200, "hook": "malloc", "device": 0, "size": 24, "mem_size": 512,
         "ptr": 150496608256, "pmem_id": 139882163933816, "stream": 0,
         "tag": "train.py:12:step"}
        {"t": 5300, "hook": "free", "device": 0, "mem_size": 512, "ptr": 150496608256,
         "pmem_id": 139882163933816, "stream": 0}

    (each object on one line; wrapped here).

    ``t``: nanoseconds since the recorder started (``time.perf_counter_ns()``); ``hook``:
    ``malloc`` | ``free`` | ``alloc`` (pool miss); ``device``: CUDA device id; ``size``:
    requested bytes (malloc only); ``mem_size``: bytes rounded up by the pool (to 512);
    ``ptr``: device address; ``pmem_id``: Python id of CuPy's PooledMemory object;
    ``stream``: raw ``cudaStream_t`` of the current stream (``cupy.cuda.get_current_stream()
    .ptr``, 0 = legacy default stream); ``tag`` (optional): the Python call site
    ``file:line:function``. The first line, optional, carries trace metadata.

(b) **CuPy's DebugPrintHook** output::

        {"hook":"alloc","device_id":0,"mem_size":512,"mem_ptr":150496608256}
        {"hook":"malloc","device_id":0,"size":24,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278"}
        {"hook":"free","device_id":0,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278"}

    No time: events are given synthetic times 1 µs apart and ``metadata["synthetic_times"]``
    is True. ``pmem_id`` may be an int or a hex string.

Mapping to a :class:`~allocsim.traces.model.Trace`: only ``malloc`` and ``free`` hooks are buffer
events (a ``malloc`` of ``size``, the *requested* bytes; its free gets that size). Buffers are
identified by ``(device, ptr)`` (``pmem_id`` where a line has no pointer), with a fresh trace
id per malloc; a free of a buffer malloc'ed before recording is opened by a prologue alloc at
time 0 of its ``mem_size`` (see :mod:`allocsim.traces.formats.torch_profiler`). A malloc of 0 bytes
holds no memory and gets no free hook, so it is skipped
(``metadata["zero_size_mallocs_skipped"]``). Times count from the device's first line.

What the pool itself did goes to ``metadata["reference_events"]``, shaped like the snapshot
importer's: ``{"action", ["addr",] "size", "stream", "time_ns", "event"}``, ``event`` being the
trace event it comes before. An ``alloc`` hook is ``"segment_alloc"`` (``addr`` = its pointer,
``size`` = ``mem_size``), served to the malloc that follows it, or ``"segment_alloc_failed"``
when its pointer is 0 (cudaMalloc failed; CuPy then releases its cache and retries). A malloc
that failed (pointer 0, ``size`` > 0) is ``"oom"`` (``metadata["failed_mallocs"]`` counts them).

Streams become small ids in order of first use; ``metadata["stream_handles"]`` maps them back
(``{"0": raw handle, ...}``) when the log has streams. Option ``device_index`` (``N`` or
``"cuda:N"``) picks a device; by default the one with the most buffer events
(``metadata["devices"]`` counts them per ``"cuda:N"``). Errors name the file, the hook record
(0-based) and the line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from allocsim.ascii_numbers import MAX_DIGITS
from allocsim.traces.formats.native import file_metadata
from allocsim.traces.formats.registry import register_format
from allocsim.traces.formats.torch_profiler import (
    AddressMatcher,
    build_trace,
    intern_tags,
    parse_device_index,
)
from allocsim.traces.model import NO_TAG, OP_ALLOC, OP_FREE, Trace, TraceError, int64_problem

__all__ = [
    "FORMAT_NAME",
    "HEADER_KEY",
    "HOOK_ALLOC",
    "HOOK_FREE",
    "HOOK_MALLOC",
    "HOOK_NAMES",
    "HookEvents",
    "detect_cupy_log",
    "hook_events_to_trace",
    "read_cupy_log",
    "write_hook_log",
]

FORMAT_NAME = "cupy-log"
HEADER_KEY = "allocsim-cupy-log"
HOOK_MALLOC, HOOK_FREE, HOOK_ALLOC = 0, 1, 2
HOOK_NAMES = ("malloc", "free", "alloc")
_HOOK_CODES = {name: code for code, name in enumerate(HOOK_NAMES)}
SYNTHETIC_STEP_NS = 1000
# CuPy's pool rounds each request up to a multiple of this (cupy/cuda/memory.pyx, _round_size
# with ALLOCATION_UNIT_SIZE = 512); a request whose rounding passes int64 cannot be logged.
ROUND_BYTES = 512
_MAX_REQUEST = (1 << 63) - ROUND_BYTES
# The most memory a device allocsim models holds (sim/kernel/device_profile.py's
# MAX_PROFILE_CAPACITY, 1 EiB; traces/ cannot import it): a malloc the pool answered, or a
# buffer it freed, of more than that is no record of a real pool (a hand edit, a corrupt log).
MAX_HELD_BYTES = 1 << 60
_DETECT = re.compile(rb'^\s*\{.*"hook"\s*:\s*"(?:malloc|free|alloc)"', re.MULTILINE)
_NONE = -1  # a field the line did not have


@dataclass
class HookEvents:
    """Hook calls as parallel columns (what the recorder keeps and the log lines hold).

    ``t`` is None when the source had no times; ``size`` / ``pmem_id`` / ``stream`` hold -1
    where a line did not say; ``tag`` indexes ``tags`` (NO_TAG: none). ``line`` (optional)
    gives each record's line number for error messages.
    """

    hook: Sequence[int]
    device: Sequence[int]
    size: Sequence[int]
    mem_size: Sequence[int]
    ptr: Sequence[int]
    pmem_id: Sequence[int]
    stream: Sequence[int]
    tag: Sequence[int]
    tags: list[str] = field(default_factory=list)
    t: Sequence[int] | None = None
    line: Sequence[int] | None = None

    def __len__(self) -> int:
        return len(self.hook)


# ====================================================================== to a trace
def hook_events_to_trace(events: HookEvents, *, source: str, name: str,
                         device_index: object = None,
                         metadata: dict[str, Any] | None = None) -> Trace:
    """The trace of one device's malloc/free hooks (see the module docstring)."""
    meta = file_metadata(metadata or {}, source, name)
    meta.setdefault("format", FORMAT_NAME)
    hooks = list(events.hook)
    devices = list(events.device)
    counts: dict[str, int] = {}
    for hook, device in zip(hooks, devices):
        if hook != HOOK_ALLOC:
            counts[f"cuda:{device}"] = counts.get(f"cuda:{device}", 0) + 1
    chosen = _choose_device(counts, parse_device_index(device_index, source), source)
    meta.update(device=f"cuda:{chosen}", devices=dict(sorted(counts.items())),
                synthetic_times=events.t is None)
    return _Builder(events, chosen, source, meta).build()


def _choose_device(counts: dict[str, int], wanted: str | None, source: str) -> int:
    if wanted is None or wanted == "cuda":
        if not counts:
            return 0  # an empty log: an empty trace of device 0
        return int(max(sorted(counts), key=lambda k: counts[k]).split(":")[1])
    if wanted in counts:
        return int(wanted.split(":")[1])
    have = ", ".join(f"{k} ({v} events)" for k, v in sorted(counts.items())) or "none"
    raise TraceError(f"no malloc/free hooks for device {wanted!r} (the log has: {have})",
                     source=source)


class _Builder:
    """Walks the hook records of one device, matching frees to mallocs."""

    def __init__(self, events: HookEvents, device: int, source: str, meta: dict[str, Any]):
        self.events, self.device, self.source, self.meta = events, device, source, meta
        self.times = list(events.t) if events.t is not None else None
        self.matcher = AddressMatcher()
        self.streams: dict[int, int] = {}  # raw handle -> small id
        self.saw_stream = False
        self.buffer_stream: dict[int, int] = {}  # trace id -> stream of its malloc
        self.buffer_mem_size: dict[int, int] = {}  # trace id -> mem_size of its malloc
        self.size_mismatches = 0
        self.first_size_mismatch: tuple[int, int, int] = (0, 0, 0)
        self.cols: dict[str, list[int]] = {k: [] for k in
                                           ("time_ns", "op", "id", "size", "stream", "tag")}
        self.reference: list[dict[str, Any]] = []
        self.skipped_zero = 0

    def fail(self, record: int, problem: str) -> TraceError:
        lines = self.events.line
        if lines is not None:
            problem = f"line {lines[record]}: {problem}"
        return TraceError(problem, source=self.source, event=record)

    def stream_id(self, i: int) -> int:
        handle = int(self.events.stream[i])
        self.saw_stream = self.saw_stream or handle >= 0
        # A line without a stream (DebugPrintHook) counts as the default stream.
        return self.streams.setdefault(max(handle, 0), len(self.streams))

    def time(self, i: int, event: int) -> int:
        """Record ``i``'s time (made relative in finish), or the synthetic time of ``event``."""
        return self.times[i] if self.times is not None else event * SYNTHETIC_STEP_NS

    def build(self) -> Trace:
        ev = self.events
        for i, (hook, device) in enumerate(zip(ev.hook, ev.device)):
            if device != self.device:
                continue
            event = len(self.cols["op"])
            if hook == HOOK_ALLOC:
                if ev.ptr[i] != 0:
                    self.check_held(i, "mem_size", int(ev.mem_size[i]))
                # mem_ptr 0: cudaMalloc failed (CuPy then frees its cache and retries).
                action = "segment_alloc_failed" if ev.ptr[i] == 0 else "segment_alloc"
                self.refer(i, event, action, int(ev.mem_size[i]), addr=max(int(ev.ptr[i]), 0))
            elif hook == HOOK_MALLOC:
                self.malloc(i, event)
            else:
                self.free(i, event)
        return self.finish()

    def refer(self, i: int, event: int, action: str, size: int, **extra: int) -> None:
        """A reference event, shaped like the snapshot importer's (``event``: the trace
        event it comes before; prologue added in finish)."""
        self.reference.append({"action": action, **extra, "size": size,
                               "stream": self.stream_id(i), "time_ns": self.time(i, event),
                               "event": event})

    def key(self, i: int) -> Hashable:
        ptr = self.events.ptr[i]
        return ("ptr", ptr) if ptr != _NONE else ("pmem", self.events.pmem_id[i])

    def malloc(self, i: int, event: int) -> None:
        ev = self.events
        size, ptr = int(ev.size[i]), int(ev.ptr[i])
        if size < 0:
            raise self.fail(i, "malloc hook without 'size'")
        if size > _MAX_REQUEST:
            # MemoryPool.malloc rounds every request up to 512 bytes (_round_size in
            # cupy/cuda/memory.pyx): this one's rounding passes what a pool can hold.
            raise self.fail(i, f"size {size} rounds up to CuPy's {ROUND_BYTES}-byte unit past "
                               "64 bits: no pool hands that out")
        if int(ev.mem_size[i]) < size:
            raise self.fail(i, f"mem_size {int(ev.mem_size[i])} is smaller than the size {size} "
                               "requested (the pool rounds up, never down)")
        if ptr != 0:    # answered (a failed request of any size is an OOM the log recorded)
            self.check_held(i, "size", size)
            self.check_held(i, "mem_size", int(ev.mem_size[i]))
        if ptr == 0:
            if size == 0:
                self.skipped_zero += 1  # Memory(0): no device memory, and no free hook
            else:
                self.refer(i, event, "oom", size)
            return
        stream = self.stream_id(i)
        buffer_id = self.matcher.alloc(self.key(i), size, i)
        self.buffer_stream[buffer_id] = stream
        self.buffer_mem_size[buffer_id] = int(ev.mem_size[i])
        self.add(self.time(i, event), OP_ALLOC, buffer_id, size, stream, ev.tag[i])

    def check_held(self, i: int, key: str, nbytes: int) -> None:
        """Refuse record ``i`` when its ``key`` says the pool handed out ``nbytes``, more than
        any device holds (:data:`MAX_HELD_BYTES`)."""
        if nbytes > MAX_HELD_BYTES:
            raise self.fail(i, f"{key} {nbytes:,} is more than any device holds (at most "
                               f"{MAX_HELD_BYTES:,} bytes, 1 EiB): no pool hands that out")

    def free(self, i: int, event: int) -> None:
        ev = self.events
        self.check_held(i, "mem_size", int(ev.mem_size[i]))
        stream = self.stream_id(i)
        buffer_id, size, alloc_event = self.matcher.free(self.key(i), int(ev.mem_size[i]),
                                                         stream=stream, event=i)
        malloced = self.buffer_mem_size.pop(buffer_id, None)
        if alloc_event >= 0 and malloced is not None and malloced != ev.mem_size[i]:
            # CuPy frees a PooledMemory of the size it handed out: a log that says otherwise
            # is not one pool's record (two logs merged, a hand edit).
            if self.size_mismatches == 0:
                self.first_size_mismatch = (event, int(ev.mem_size[i]), malloced)
            self.size_mismatches += 1
        # The trace's stream column is the stream a buffer was allocated on.
        self.add(self.time(i, event), OP_FREE, buffer_id, size,
                 self.buffer_stream.pop(buffer_id, stream), ev.tag[i])

    def add(self, time_ns: int, op: int, buffer_id: int, size: int, stream: int,
            tag: int) -> None:
        for name, value in (("time_ns", time_ns), ("op", op), ("id", buffer_id),
                            ("size", size), ("stream", stream), ("tag", tag)):
            self.cols[name].append(value)

    def first_time(self) -> int:
        """Time origin: the first record of the device (a pool miss may precede any malloc)."""
        if self.times is None:
            return 0
        return next((int(t) for t, d in zip(self.times, self.events.device)
                     if d == self.device), 0)

    def finish(self) -> Trace:
        cols, meta = self.cols, self.meta
        t0 = self.first_time()
        times = np.asarray(cols["time_ns"], dtype=np.int64) - t0
        n_pro = len(self.matcher.prologue)
        for ref in self.reference:
            ref["event"] += n_pro
            ref["time_ns"] -= t0
        if self.reference:
            meta["reference_events"] = self.reference
        meta["failed_mallocs"] = sum(r["action"] == "oom" for r in self.reference)
        if self.skipped_zero:
            meta["zero_size_mallocs_skipped"] = self.skipped_zero
        if self.size_mismatches:
            event, freed, malloced = self.first_size_mismatch
            meta["size_anomalies"] = {"frees_of_another_size": {
                "count": self.size_mismatches, "first_event": event + len(self.matcher.prologue),
                "problem": f"free of mem_size {freed} for a buffer malloc'ed with mem_size "
                           f"{malloced}"}}
        if self.saw_stream:
            meta["stream_handles"] = {str(k): h for h, k in self.streams.items()}
        tag, tags = _used_tags(np.asarray(cols["tag"], dtype=np.int32), self.events.tags)
        return build_trace(self.matcher, time_ns=times, op=cols["op"], ids=cols["id"],
                           size=cols["size"], stream=cols["stream"],
                           process=np.zeros(len(times), dtype=np.int32), tag=tag, tags=tags,
                           metadata=meta, unknown_frees_are_anomalies=True)


def _used_tags(codes: np.ndarray, table: list[str]) -> tuple[np.ndarray, list[str]]:
    """Re-index ``codes`` to a table of only the tags used (in first-use order)."""
    values = [table[c] if c != NO_TAG else None for c in codes.tolist()]
    return intern_tags(values)


# ====================================================================== the log file
def write_hook_log(events: HookEvents, stream: BinaryIO,
                   metadata: dict[str, Any] | None = None) -> None:
    """Write ``events`` as format (a) lines (recorder output), after a metadata line."""
    header = {HEADER_KEY: 1, "metadata": metadata or {}}
    lines = [json.dumps(header, ensure_ascii=True)]
    t = list(events.t) if events.t is not None else None
    for i, hook in enumerate(events.hook):
        record: dict[str, Any] = {}
        if t is not None:
            record["t"] = t[i]
        record["hook"] = HOOK_NAMES[hook]
        record["device"] = events.device[i]
        if hook == HOOK_MALLOC:
            record["size"] = events.size[i]
        record["mem_size"] = events.mem_size[i]
        record["ptr"] = events.ptr[i]
        if hook != HOOK_ALLOC:
            record["pmem_id"] = events.pmem_id[i]
        if events.stream[i] >= 0:
            record["stream"] = events.stream[i]
        if events.tag[i] != NO_TAG:
            record["tag"] = events.tags[events.tag[i]]
        lines.append(json.dumps(record, ensure_ascii=True, separators=(",", ":")))
    stream.write(("\n".join(lines) + "\n").encode("utf-8"))


def detect_cupy_log(path: str, head: bytes) -> bool:
    """Text with a JSON line naming a CuPy hook (or our log's header line)."""
    if b"\x00" in head:
        return False
    return bool(_DETECT.search(head)) or f'{{"{HEADER_KEY}"'.encode() in head[:200]


def read_cupy_log(data: bytes, source: str, name: str, *,
                  device_index: object = None) -> Trace:
    """Read a CuPy hook log, format (a) or (b) (see the module docstring)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TraceError(f"not UTF-8 text (bad byte at offset {err.start})",
                         source=source) from None
    events, metadata, skipped = _parse_lines(text.split("\n"), source)
    if skipped:
        metadata["skipped_lines"] = skipped
    return hook_events_to_trace(events, source=source, name=name, device_index=device_index,
                                metadata=metadata)


def _parse_lines(lines: list[str], source: str) -> tuple[HookEvents, dict[str, Any], int]:
    cols: dict[str, list[int]] = {k: [] for k in ("hook", "device", "size", "mem_size", "ptr",
                                                   "pmem_id", "stream", "line")}
    times: list[int | None] = []
    tag_values: list[str | None] = []
    metadata: dict[str, Any] = {}
    skipped = 0
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("{"):
            skipped += 1
            continue
        record_no = len(cols["hook"])

        def fail(problem: str, number: int = number, record_no: int = record_no) -> TraceError:
            return TraceError(f"line {number}: {problem}", source=source, event=record_no)

        try:
            record = json.loads(line)
        except ValueError as err:
            raise fail(f"bad JSON: {err}") from None
        except RecursionError:
            raise fail("JSON nested too deeply to read") from None
        if not isinstance(record, dict):
            raise fail("expected a JSON object")
        if HEADER_KEY in record and record_no == 0 and not metadata:
            metadata = record.get("metadata") or {}
            if not isinstance(metadata, dict):
                raise fail("the header's metadata must be a JSON object")
            continue
        _parse_record(record, fail, cols, times, tag_values)
        cols["line"].append(number)
    if any(t is None for t in times) and not all(t is None for t in times):
        record_no = next(i for i, t in enumerate(times) if (t is None) != (times[0] is None))
        raise TraceError(f"line {cols['line'][record_no]}: some lines have a time 't' and "
                         "some do not", source=source, event=record_no)
    # Either every line has a time or none has (checked above).
    clock = None if not times or times[0] is None else [t for t in times if t is not None]
    tag, tags = intern_tags(tag_values)
    events = HookEvents(hook=cols["hook"], device=cols["device"], size=cols["size"],
                        mem_size=cols["mem_size"], ptr=cols["ptr"], pmem_id=cols["pmem_id"],
                        stream=cols["stream"], tag=tag.tolist(), tags=tags,
                        t=clock,
                        line=cols["line"])
    return events, metadata, skipped


def _parse_record(record: dict[str, Any], fail: Callable[[str], TraceError],
                  cols: dict[str, list[int]],
                  times: list[int | None], tag_values: list[str | None]) -> None:
    name = record.get("hook")
    hook = _HOOK_CODES.get(name) if isinstance(name, str) else None
    if hook is None:
        raise fail(f"hook {record.get('hook')!r} is not malloc, free or alloc")

    def number(*keys: str, required: bool = True) -> int:
        for key in keys:
            if key in record:
                return _integer(record[key], key, fail)
        if required:
            raise fail(f"{HOOK_NAMES[hook]} hook without {keys[0]!r}")
        return _NONE

    cols["hook"].append(hook)
    device = number("device", "device_id", required=False)
    cols["device"].append(0 if device == _NONE else device)
    size = number("size", required=hook == HOOK_MALLOC)
    cols["size"].append(size)
    # A malloc line without mem_size (hand-written logs) counts its request as rounded size.
    mem_size = number("mem_size", required=hook != HOOK_MALLOC)
    cols["mem_size"].append(size if mem_size == _NONE else mem_size)
    ptr = number("ptr", "mem_ptr", required=False)
    pmem = number("pmem_id", required=False)
    if ptr == _NONE and pmem == _NONE and hook != HOOK_ALLOC:
        raise fail(f"{HOOK_NAMES[hook]} hook without 'ptr' or 'pmem_id' (a log printed "
                   "before the pool answered cannot match frees to mallocs)")
    cols["ptr"].append(ptr)
    cols["pmem_id"].append(pmem)
    cols["stream"].append(number("stream", required=False))  # -1: not said
    t = record.get("t")
    times.append(None if t is None else _integer(t, "t", fail))
    tag = record.get("tag")
    if tag is not None and not isinstance(tag, str):
        raise fail(f"tag {tag!r} is not a string")
    tag_values.append(tag)


def _integer(value: Any, key: str, fail: Callable[[str], TraceError]) -> int:
    """An int, or a hex string such as DebugPrintHook's ``"0x7f39200c5278"``."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise fail(f"{key} {value!r} is negative")
        number = value
    elif isinstance(value, str) and value.isascii() and len(value) <= MAX_DIGITS:
        try:   # int() alone takes "١٢" and 5,000-digit text (ascii_numbers.py)
            number = int(value, 0)
        except ValueError:
            pass
    if number is None:
        raise fail(f"{key} {value!r} is not an integer")
    problem = int64_problem(number)
    if problem:
        raise fail(f"{key} {problem}")
    return number


register_format(FORMAT_NAME, (".log", ".log.gz", ".cupy.jsonl", ".cupy.jsonl.gz"),
                read_cupy_log, detect=detect_cupy_log, recorded=True,
                options=("device_index",))
