"""Importer for PyTorch profiler chrome traces: the ``"[memory]"`` events of ``.json(.gz)`` files.

Follows ``shared/reference/trace-formats.md`` ("PyTorch profiler chrome trace"). Such a file
comes from ``torch.profiler.profile(activities=[CPU(, CUDA)], profile_memory=True)`` and
``prof.export_chrome_trace(path)``; it works on CPU-only PyTorch too. The top level is
``{"traceEvents": [...], ...}`` or a bare list of events. A memory event is::

    {"ph": "i", "name": "[memory]", "pid": 6398, "tid": 6398, "ts": 5152584063608.445,
     "args": {"Addr": 139754685849664, "Bytes": 16777216, "Total Allocated": 16777216,
              "Total Reserved": 0, "Device Type": 0, "Device Id": -1}}

``Bytes`` is positive for an allocation and negative for a free; ``ts`` is microseconds.

How the events become a :class:`~allocsim.traces.model.Trace`:

- **Device.** A file may mix devices (``Device Type`` 0 = CPU, 1 = CUDA, with ``Device Id``).
  One device is imported: option ``device_index`` = ``"cpu"``, ``"cuda:N"`` or an int ``N``
  (meaning ``cuda:N``); by default the CUDA device with the most memory events, else the CPU.
  ``metadata["devices"]`` counts the memory events of every device, e.g.
  ``{"cpu": 1240, "cuda:1": 26770}``; ``metadata["device"]`` names the one imported.
- **Ids.** Addresses are reused, so every allocation gets a fresh id and the importer keeps
  ``address -> id of the live buffer`` (keyed by pid too, as addresses are per process).
- **Recording that starts mid-run.** A free of an address that is not live freed a buffer
  allocated before the profiler started. Rather than let lenient validation drop such frees
  (which would make the live bytes wrong until the end), a *prologue* of synthetic allocations
  at time 0, tagged ``"<allocated before recording>"``, opens those buffers (size ``|Bytes|``
  of their free), so the trace's live bytes are what the program really had live among the
  buffers it touched. ``metadata["prologue_events"]`` / ``["prologue_bytes"]`` count them.
  Buffers allocated before recording and never freed in the window stay invisible; the
  difference between the file's ``Total Allocated`` and the trace's live bytes, per event, is
  reported as ``metadata["unrecorded_live_bytes"] = {"min": ..., "max": ...}`` (equal when
  the file is self-consistent).
- **Time.** ``ts`` (float microseconds) becomes integer nanoseconds from the first imported
  event. Events are sorted stably by time (files list them per thread, not in time order);
  ``metadata["reordered_events"]`` counts the events whose position changed.
- **Tags.** The op that caused the event: the innermost complete (``"ph": "X"``) CPU event on
  the same pid/tid whose ``[ts, ts + dur]`` contains the memory event's ``ts`` (a sweep over
  the thread's ops sorted by start, with a stack of open ops). CUDA runtime calls, kernels
  and memcpys are not ops and are ignored.
- **Kept from the file:** ``metadata["total_allocated_first"]`` (``Total Allocated`` at the
  first imported event, in time order) and ``["total_reserved_max"]``.

Traces from 2021 PyTorch lack ``Addr``: their frees cannot be matched to allocations, so they
cannot be replayed and reading them is a :class:`~allocsim.traces.model.TraceError`. Errors name the
file and the event; event N is the index in ``traceEvents``.

The module also holds :class:`AddressMatcher` and :func:`build_trace`, the address-to-id
matching and prologue assembly shared with the CuPy and RMM importers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from allocsim.ascii_numbers import is_whole_number
from allocsim.traces.formats.native import file_metadata
from allocsim.traces.formats.registry import register_format
from allocsim.traces.model import (
    INT64_MAX,
    NO_TAG,
    OP_ALLOC,
    OP_FREE,
    Trace,
    TraceError,
    int64_problem,
)

__all__ = [
    "FORMAT_NAME",
    "PROLOGUE_TAG",
    "AddressMatcher",
    "build_trace",
    "detect_torch_profiler",
    "intern_tags",
    "parse_device_index",
    "read_torch_profiler",
]

FORMAT_NAME = "torch-profiler"
PROLOGUE_TAG = "<allocated before recording>"
MEMORY_EVENT = "[memory]"
# torch's c10::DeviceType numbers for the devices a profiler trace reports memory of.
_DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 12: "xpu", 13: "mps"}
# Complete events on a CPU thread that are not ops: they never enclose an allocation
# meaningfully (a cudaMalloc call nested in an op would hide the op's name).
_NOT_OPS = frozenset({"cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset",
                      "Trace", "overhead", "gpu_user_annotation", "ac2g"})


# ====================================================================== shared helpers
class AddressMatcher:
    """Turns a log that names buffers by (reused) address into trace ids.

    Every allocation gets a fresh id and ``key -> (id, size, event)`` of the live buffer is
    kept. A free of a key that is not live (its buffer was allocated before recording began)
    gets a fresh id as well and is remembered in :attr:`prologue` as ``(id, size, stream,
    process)``, so that :func:`build_trace` can open it with a synthetic alloc at time 0.
    """

    def __init__(self) -> None:
        self._live: dict[Hashable, tuple[int, int, int]] = {}
        self._next = 0
        self.prologue: list[tuple[int, int, int, int]] = []
        self.reallocated_while_live = 0  # allocs at a key still live: the old one leaks
        # The file's event index of the first of each anomaly, for --strict's error line.
        self.first_unknown_free: tuple[int, Hashable] | None = None
        self.first_live_realloc: tuple[int, Hashable] | None = None

    def _fresh(self) -> int:
        self._next += 1
        return self._next - 1

    def alloc(self, key: Hashable, size: int, event: int) -> int:
        """The id of a new buffer at ``key``."""
        if key in self._live:
            self.reallocated_while_live += 1  # missed free: the old buffer stays live
            if self.first_live_realloc is None:
                self.first_live_realloc = (event, key)
        buffer_id = self._fresh()
        self._live[key] = (buffer_id, size, event)
        return buffer_id

    def free(self, key: Hashable, size: int, *, stream: int = 0,
             process: int = 0, event: int = -1) -> tuple[int, int, int]:
        """``(id, size, alloc event)`` of the buffer freed at ``key``.

        For a key that is not live, ``size`` (the free's own) opens a prologue buffer and the
        alloc event is -1.
        """
        live = self._live.pop(key, None)
        if live is not None:
            return live
        buffer_id = self._fresh()
        self.prologue.append((buffer_id, size, stream, process))
        if self.first_unknown_free is None:
            self.first_unknown_free = (event, key)
        return buffer_id, size, -1

    def live_count(self) -> int:
        return len(self._live)


def _address_text(key: Hashable) -> str:
    address = key[-1] if isinstance(key, tuple) and key else key
    return f"address {address:#x}" if isinstance(address, int) else f"address {address}"


def intern_tags(values: Sequence[str | None], table: list[str] | None = None
                ) -> tuple[np.ndarray, list[str]]:
    """Tag codes for ``values`` (``None``: no tag) and the table, in first-use order."""
    tags = list(table or [])
    index = {tag: i for i, tag in enumerate(tags)}
    codes = np.empty(len(values), dtype=np.int32)
    for i, value in enumerate(values):
        if value is None:
            codes[i] = NO_TAG
            continue
        code = index.get(value)
        if code is None:
            code = index[value] = len(tags)
            tags.append(value)
        codes[i] = code
    return codes, tags


def build_trace(matcher: AddressMatcher, *, time_ns: Sequence[int] | np.ndarray,
                op: Sequence[int] | np.ndarray, ids: Sequence[int] | np.ndarray,
                size: Sequence[int] | np.ndarray, stream: Sequence[int] | np.ndarray,
                process: Sequence[int] | np.ndarray, tag: np.ndarray, tags: list[str],
                metadata: dict[str, Any], unknown_frees_are_anomalies: bool = False) -> Trace:
    """The recorded events, preceded by ``matcher``'s prologue of synthetic allocs at time 0.

    ``time_ns`` must already be relative (>= 0). Sets ``metadata["prologue_events"]`` and
    ``["prologue_bytes"]``, and ``["reallocated_while_live"]`` when the log missed frees.
    ``metadata["address_anomalies"]`` names the first of each anomaly (an alloc at an address
    still live; with ``unknown_frees_are_anomalies``, for logs that record from the start, a
    free of an address never allocated): :func:`~allocsim.traces.validate.validate` counts
    them as repairs, or fails on them when strict.
    """
    pro = matcher.prologue
    n_pro = len(pro)
    tags = list(tags)
    if n_pro:
        if PROLOGUE_TAG not in tags:
            tags.append(PROLOGUE_TAG)
        pro_tag = tags.index(PROLOGUE_TAG)
    else:
        pro_tag = NO_TAG

    def column(prologue: list[int], events: Any, dtype: type) -> np.ndarray:
        return np.concatenate([np.asarray(prologue, dtype=dtype), np.asarray(events, dtype=dtype)])

    pro_cols = list(zip(*pro)) if pro else [(), (), (), ()]
    metadata["prologue_events"] = n_pro
    metadata["prologue_bytes"] = int(sum(pro_cols[1]))
    if matcher.reallocated_while_live:
        metadata["reallocated_while_live"] = matcher.reallocated_while_live
    anomalies: dict[str, dict[str, Any]] = {}
    if matcher.first_live_realloc is not None:
        event, key = matcher.first_live_realloc
        anomalies["allocs_at_live_addresses"] = {
            "count": matcher.reallocated_while_live, "first_event": event,
            "problem": f"alloc at {_address_text(key)}, which is still live (a missed free)"}
    if unknown_frees_are_anomalies and matcher.first_unknown_free is not None:
        event, key = matcher.first_unknown_free
        anomalies["frees_of_unknown_addresses"] = {
            "count": n_pro, "first_event": event,
            "problem": f"free of {_address_text(key)}, which was never allocated"}
    if anomalies:
        metadata["address_anomalies"] = anomalies
    return Trace(
        time_ns=column([0] * n_pro, time_ns, np.int64),
        op=column([OP_ALLOC] * n_pro, op, np.int8),
        id=column(list(pro_cols[0]), ids, np.int64),
        size=column(list(pro_cols[1]), size, np.int64),
        stream=column(list(pro_cols[2]), stream, np.int32),
        process=column(list(pro_cols[3]), process, np.int32),
        tag=column([pro_tag] * n_pro, tag, np.int32),
        tags=tags, metadata=metadata)


def parse_device_index(device_index: object, source: str) -> str | None:
    """``"cpu"`` / ``"cuda:N"`` / int ``N`` / ``"N"`` as a device key; ``None`` or ``"cuda"``
    stay ``None``-like (``"cuda"`` means: the busiest CUDA device)."""
    if device_index is None:
        return None
    if isinstance(device_index, bool):
        raise TraceError(f"device_index {device_index!r} is not a device", source=source)
    if isinstance(device_index, int):
        return f"cuda:{device_index}"
    if isinstance(device_index, str):
        text = device_index.strip().lower()
        if is_whole_number(text):
            return f"cuda:{int(text)}"
        kind, _, number = text.partition(":")
        if kind and (not number or is_whole_number(number)):
            return f"{kind}:{int(number)}" if number else kind
    raise TraceError(f"device_index {device_index!r} is not 'cpu', 'cuda:N' or an integer",
                     source=source)


# ====================================================================== detection
def detect_torch_profiler(path: str, head: bytes) -> bool:
    """JSON whose first bytes mention ``traceEvents`` or a ``[memory]`` event."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return text[:1] in (b"{", b"[") and (b'"traceEvents"' in text or b'"[memory]"' in text)


# ====================================================================== reading
class _Memory:
    """The memory events of one file, as parallel lists (in file order)."""

    def __init__(self) -> None:
        self.index: list[int] = []  # position in traceEvents
        self.ts: list[float] = []
        self.thread: list[tuple[Any, Any]] = []  # (pid, tid)
        self.addr: list[int] = []
        self.nbytes: list[int] = []
        self.total_allocated: list[int] = []
        self.total_reserved: list[int] = []
        self.device: list[str] = []


UNRECORDED_TAG = "<live before recording, not in the trace>"
START_STATES = ("unrecorded",)


def read_torch_profiler(data: bytes, source: str, name: str, *,
                        device_index: object = None, start_state: object = None) -> Trace:
    """Read a PyTorch profiler chrome trace (see the module docstring). ``start_state=
    "unrecorded"`` adds the bytes that were live before recording started and are not in the
    trace (the least of the file's ``Total Allocated`` minus the trace's live bytes) as one
    buffer allocated at time 0 and never freed, so that a replay starts as full as the GPU
    was."""
    if start_state is not None and start_state not in START_STATES:
        raise TraceError(f"start state {start_state!r} is not one of: "
                         f"{', '.join(START_STATES)}", source=source)
    events, top = _trace_events(data, source)
    memory = _memory_events(events, source)
    counts: dict[str, int] = {}
    for device in memory.device:
        counts[device] = counts.get(device, 0) + 1
    device = _choose_device(counts, parse_device_index(device_index, source), source)
    rows = [i for i, d in enumerate(memory.device) if d == device]
    ts_ns = np.array([round(memory.ts[i] * 1000) for i in rows], dtype=np.int64)
    order = np.argsort(ts_ns, kind="stable")  # files list events per thread
    rows = [rows[i] for i in order.tolist()]
    ts_ns = ts_ns[order]

    metadata = file_metadata({}, source, name)
    metadata.update(format=FORMAT_NAME, device=device, devices=dict(sorted(counts.items())),
                    reordered_events=int(np.count_nonzero(order != np.arange(len(order)))))
    metadata.update(_file_facts(top))
    trace = _events_to_trace(memory, rows, ts_ns, events, source, metadata)
    _total_allocated_facts(trace, memory, rows, metadata)
    if start_state == "unrecorded":
        trace = _with_unrecorded_buffer(trace, source)
    return trace


def _with_unrecorded_buffer(trace: Trace, source: str) -> Trace:
    unrecorded = trace.metadata.get("unrecorded_live_bytes")
    if not unrecorded or unrecorded["min"] <= 0:
        raise TraceError("no bytes were live before recording beyond the trace's own (the "
                         "file's Total Allocated never exceeds them): nothing to add",
                         source=source)
    tags = list(trace.tags) if trace.tags else []
    tags.append(UNRECORDED_TAG)
    first_id = int(trace.id.max()) + 1 if len(trace) else 0
    metadata = dict(trace.metadata)
    metadata["start_state"] = {"unrecorded_buffer_bytes": int(unrecorded["min"])}
    return Trace.from_columns(
        np.r_[0, trace.time_ns], np.r_[OP_ALLOC, trace.op], np.r_[first_id, trace.id],
        np.r_[int(unrecorded["min"]), trace.size], np.r_[0, trace.stream],
        np.r_[0, trace.process], np.r_[len(tags) - 1, trace.tag], tags, **metadata)


def _trace_events(data: bytes, source: str) -> tuple[list[Any], dict[str, Any]]:
    """``(traceEvents, top-level object)`` of the file."""
    try:
        top = json.loads(data)
    except UnicodeDecodeError as err:
        raise TraceError(f"not UTF-8 text (bad byte at offset {err.start})",
                         source=source) from None
    except ValueError as err:
        raise TraceError(f"not a JSON chrome trace: {err}", source=source) from None
    except RecursionError:
        raise TraceError("not a chrome trace: JSON nested too deeply to read",
                         source=source) from None
    if isinstance(top, list):
        return top, {}
    if isinstance(top, dict) and isinstance(top.get("traceEvents"), list):
        return top["traceEvents"], top
    raise TraceError('not a chrome trace: expected {"traceEvents": [...]} or a list of events',
                     source=source)


def _memory_events(events: list[Any], source: str) -> _Memory:
    memory = _Memory()
    for i, event in enumerate(events):
        if not isinstance(event, dict) or event.get("name") != MEMORY_EVENT:
            continue
        args = event.get("args")
        if not isinstance(args, dict):
            raise TraceError("[memory] event without args", source=source, event=i)
        if "Addr" not in args:
            raise TraceError("[memory] event without Addr: written by a PyTorch from 2021 or "
                             "earlier, whose allocations and frees cannot be matched, so the "
                             "trace cannot be replayed (only summed)", source=source, event=i)
        ts = event.get("ts")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)):
            raise TraceError(f"[memory] event ts {ts!r} is not a number", source=source, event=i)
        if not math.isfinite(ts) or abs(ts) * 1000 > INT64_MAX:
            raise TraceError(f"[memory] event ts {ts!r} is not a time in microseconds a trace "
                             "can hold (finite, within 64-bit nanoseconds)", source=source,
                             event=i)
        memory.index.append(i)
        memory.ts.append(float(ts))
        memory.thread.append((_hashable(event.get("pid")), _hashable(event.get("tid"))))
        memory.addr.append(_int_arg(args, "Addr", i, source))
        memory.nbytes.append(_int_arg(args, "Bytes", i, source))
        memory.total_allocated.append(_int_arg(args, "Total Allocated", i, source, default=-1))
        memory.total_reserved.append(_int_arg(args, "Total Reserved", i, source, default=-1))
        memory.device.append(_device_key(_int_arg(args, "Device Type", i, source, default=0),
                                         _int_arg(args, "Device Id", i, source, default=-1)))
    if not memory.index:
        raise TraceError("no [memory] events: was the profiler run with profile_memory=True?",
                         source=source)
    return memory


def _hashable(value: Any) -> Hashable:
    return value if isinstance(value, (str, int, float, type(None))) else json.dumps(value)


def _int_arg(args: dict[str, Any], key: str, event: int, source: str,
             default: int | None = None) -> int:
    value = args.get(key, default)
    if value is None:
        raise TraceError(f"[memory] event without {key!r}", source=source, event=event)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"[memory] {key} {value!r} is not an integer", source=source,
                         event=event)
    problem = int64_problem(value)
    if problem:
        raise TraceError(f"[memory] {key} {problem}", source=source, event=event)
    return value


def _device_key(device_type: int, device_id: int) -> str:
    kind = _DEVICE_TYPES.get(device_type, f"device{device_type}")
    return "cpu" if kind == "cpu" else f"{kind}:{max(device_id, 0)}"


def _choose_device(counts: dict[str, int], wanted: str | None, source: str) -> str:
    def busiest(keys: list[str]) -> str:
        return max(sorted(keys), key=lambda k: counts[k])  # ties: the lowest name

    if wanted is None or wanted == "cuda":
        cuda = [k for k in counts if k.startswith("cuda:")]
        if cuda:
            return busiest(cuda)
        if wanted is None:
            return "cpu" if "cpu" in counts else busiest(list(counts))
    elif wanted in counts:
        return wanted
    have = ", ".join(f"{k} ({v} events)" for k, v in sorted(counts.items()))
    raise TraceError(f"no [memory] events for device {wanted!r} (the file has: {have})",
                     source=source)


def _file_facts(top: dict[str, Any]) -> dict[str, Any]:
    """A few JSON-safe facts about the recording from the file's top level."""
    facts: dict[str, Any] = {}
    if isinstance(top.get("traceName"), str):
        facts["profiler_trace_name"] = top["traceName"]
    info = top.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        facts["distributed_rank"] = info["rank"]
    return facts


def _events_to_trace(memory: _Memory, rows: list[int], ts_ns: np.ndarray,
                     events: list[Any], source: str, metadata: dict[str, Any]) -> Trace:
    matcher = AddressMatcher()
    pids: dict[Any, int] = {}
    n = len(rows)
    op = np.empty(n, dtype=np.int8)
    ids = np.empty(n, dtype=np.int64)
    size = np.empty(n, dtype=np.int64)
    process = np.empty(n, dtype=np.int32)
    keep = np.ones(n, dtype=bool)
    for k, row in enumerate(rows):
        pid = memory.thread[row][0]
        process[k] = pids.setdefault(pid, len(pids))
        key = (pid, memory.addr[row])
        nbytes = memory.nbytes[row]
        if nbytes > 0:
            op[k], ids[k], size[k] = OP_ALLOC, matcher.alloc(key, nbytes, memory.index[row]), nbytes
        elif nbytes < 0:
            buffer_id, alloc_size, alloc_event = matcher.free(key, -nbytes,
                                                              process=int(process[k]),
                                                              event=int(memory.index[row]))
            if alloc_size != -nbytes:
                raise TraceError(f"free of {-nbytes} bytes at address {memory.addr[row]:#x}, "
                                 f"which was allocated with {alloc_size} bytes at event "
                                 f"{alloc_event}", source=source, event=memory.index[row])
            op[k], ids[k], size[k] = OP_FREE, buffer_id, alloc_size
        else:
            keep[k] = False  # 0 bytes: neither an allocation nor a free
    skipped = n - int(np.count_nonzero(keep))
    if skipped:
        metadata["zero_byte_events_skipped"] = skipped
    kept = [row for row, k in zip(rows, keep.tolist()) if k]
    tag, tags = intern_tags(_enclosing_ops(memory, kept, ts_ns[keep], events, source))
    t0 = int(ts_ns[0]) if len(ts_ns) else 0
    metadata["start_ts_us"] = memory.ts[rows[0]] if rows else 0.0
    if len(pids) > 1:
        metadata["pids"] = list(pids)
    return build_trace(matcher, time_ns=ts_ns[keep] - t0, op=op[keep], ids=ids[keep],
                       size=size[keep], stream=np.zeros(len(kept), dtype=np.int32),
                       process=process[keep], tag=tag, tags=tags, metadata=metadata)


def _enclosing_ops(memory: _Memory, rows: list[int], ts_ns: np.ndarray,
                   events: list[Any], source: str) -> list[str | None]:
    """For each memory event (in time order), the name of the innermost op containing it."""
    by_thread: dict[tuple[Any, Any], list[int]] = {}
    for k, row in enumerate(rows):
        by_thread.setdefault(memory.thread[row], []).append(k)
    ops = _ops_by_thread(events, set(by_thread), source)
    names: list[str | None] = [None] * len(rows)
    times = ts_ns.tolist()
    for thread, positions in by_thread.items():
        spans = ops.get(thread, [])
        spans.sort(key=lambda s: (s[0], -s[1]))  # outer op first when two start together
        stack: list[tuple[int, str]] = []  # (end, name) of ops open at the sweep's time
        j = 0
        for k in positions:  # already in time order
            t = times[k]
            while j < len(spans) and spans[j][0] <= t:
                start, end, op_name = spans[j]
                while stack and stack[-1][0] < start:
                    stack.pop()
                stack.append((end, op_name))
                j += 1
            while stack and stack[-1][0] < t:
                stack.pop()
            names[k] = stack[-1][1] if stack else None
    return names


def _ops_by_thread(events: list[Any], threads: set[tuple[Any, Any]], source: str
                   ) -> dict[tuple[Any, Any], list[tuple[int, int, str]]]:
    """``(start ns, end ns, name)`` of the complete CPU-op events on each of ``threads``.
    An op whose ts or dur is not a number only costs a tag; one that is NaN or infinite
    (which JSON cannot even spell) is refused, naming the event: no time would be right."""
    ops: dict[tuple[Any, Any], list[tuple[int, int, str]]] = {}
    for i, event in enumerate(events):
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        if event.get("cat") in _NOT_OPS:
            continue
        thread = (_hashable(event.get("pid")), _hashable(event.get("tid")))
        if thread not in threads:
            continue
        ts, dur, op_name = event.get("ts"), event.get("dur", 0), event.get("name")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue  # a malformed op only costs a tag
        for key, value in (("ts", ts), ("dur", dur)):
            if not math.isfinite(value):
                raise TraceError(f"op {str(op_name)[:80]!r}: {key} {value!r} is not a finite "
                                 "number of microseconds", source=source, event=i)
        ops.setdefault(thread, []).append(
            (round(ts * 1000), round((ts + dur) * 1000), str(op_name)))
    return ops


def _total_allocated_facts(trace: Trace, memory: _Memory, rows: list[int],
                           metadata: dict[str, Any]) -> None:
    """Compare the file's running ``Total Allocated`` with the trace's live bytes."""
    allocated = [memory.total_allocated[r] for r in rows if memory.nbytes[r] != 0]
    reserved = [memory.total_reserved[r] for r in rows]
    if rows:
        metadata["total_allocated_first"] = memory.total_allocated[rows[0]]
        metadata["total_reserved_max"] = max(reserved)
    n_pro = int(metadata.get("prologue_events", 0))
    if not allocated or min(allocated) < 0:
        return
    live = trace.live_bytes()[n_pro:]
    unrecorded = np.asarray(allocated, dtype=np.int64) - live
    metadata["unrecorded_live_bytes"] = {"min": int(unrecorded.min()),
                                         "max": int(unrecorded.max())}


register_format(FORMAT_NAME, (".json", ".json.gz"), read_torch_profiler,
                detect=detect_torch_profiler, recorded=True,
                options=("device_index", "start_state"))
