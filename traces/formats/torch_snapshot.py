"""PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``) in and out.

What it is for
    Reading the pickle that ``torch.cuda.memory._record_memory_history()`` +
    ``_dump_snapshot(path)`` write, as a :class:`~allocsim.traces.model.Trace` the simulator can replay
    (one device at a time), and writing a trace — or a simulated run of one, with the simulated
    policy's addresses and device calls — back as a snapshot that PyTorch's own viewer
    (pytorch.org/memory_viz, ``torch/utils/viz/MemoryViz.js``) opens.

Reading, in order
    1. *Safe unpickling.* A snapshot holds only dicts, lists, tuples, str, int, float, bool and
       None, so the unpickler refuses every class (``collections.OrderedDict`` excepted, which
       old files use): a crafted pickle cannot run code, it gets a :class:`TraceError`.
    2. *Shape.* A dict with ``segments`` (the allocator state when the file was written),
       ``device_traces`` (one list of entries per device) and, in newer files,
       ``allocator_settings``; or a bare list (legacy: the segments only, no trace).
       ``device_index`` picks the device; by default the one with the most trace entries.
    3. *Events.* ``alloc`` becomes an alloc of its ``size``, which is the *requested* size. A
       free is ``free_requested`` then ``free_completed``; the Trace frees the buffer at
       ``free_completed`` (only then can the allocator reuse the block); a block whose free
       was requested but not completed when the file was written stays live. Addresses are
       reused, so every allocation gets a fresh id. Raw ``cudaStream_t`` handles become small
       ids in order of first appearance. ``time_us`` becomes nanoseconds from the first entry;
       files without it get synthetic times 1 µs apart; times that go backwards are clamped
       and counted.
    4. *State at the start.* Recording usually starts mid-run. Like MemoryViz, the state at
       the start of the trace is rebuilt by undoing the trace backwards from the final
       ``segments``; every block live then becomes an alloc at the very start of the Trace
       (the *prologue*, tag ``<allocated before recording>``), so every free matches an
       alloc, and the segments at the start go to ``metadata["initial_segments"]``.
    5. *Reference events.* ``segment_*``, ``oom`` and ``snapshot`` entries are the real
       allocator's own decisions; they are kept, in file order, in
       ``metadata["reference_events"]`` for fidelity checks.
    6. *Tags.* Each alloc is tagged with the first frame of its stack that is in user code,
       as ``file:line:name`` (C++-only stacks of the backward pass: their autograd node or
       ATen op); the stack itself is kept once per tag.

Metadata set on the Trace (all JSON-serialisable)
    ``source``, ``name``, ``format`` (``"torch-snapshot"``), ``device`` (the device read),
    ``devices`` (``{"0": entries, ...}`` for every device with entries or segments),
    ``actions`` (count per action on that device), ``frees_pending_at_end``,
    ``stream_handles`` (``{"0": raw handle, ...}``), ``time_origin_us`` (absolute time of
    the first entry; absent with synthetic times), ``synthetic_times``, ``times_clamped`` and
    ``times_clamped_max_ns``, ``prologue_events``, ``initial_segments``,
    ``initial_block_sizes_inferred`` (start blocks whose rounded size had to be inferred),
    ``reference_events``, ``allocator_settings`` (when the file has them), ``tag_stacks``,
    ``inconsistencies`` (counts of entries that contradict the rest of the file, when any),
    ``legacy`` / ``note`` (segments-only files).

What it follows (PyTorch sources, read at github.com/pytorch/pytorch)
    - ``torch/csrc/cuda/memory_snapshot.cpp`` (``_memory_snapshot_pickled``): the file's
      keys; block states ``active_allocated`` / ``active_pending_free`` / ``inactive``; an
      ``oom`` entry carries ``device_free`` in place of ``addr``; ``frames`` may be absent.
    - ``torch/cuda/_memory_viz.py``: ``_read`` (a bare list is segments only),
      ``_frame_filter`` (the same omitted functions and files) and ``_frame_fmt``
      (``file:line:name``, base name of the file) for tags, ``_block_extra`` (legacy blocks'
      ``history[0]['real_size']``).
    - ``torch/utils/viz/MemoryViz.js``: ``annotate_snapshot`` (block addresses = segment
      address + running sum of block sizes when a file lacks them; missing ``requested_size``
      falls back to the history or the size; stream names by first appearance, traces before
      segments), ``MemoryView.simulate_memory`` (undoing the trace backwards: ``alloc``
      deletes the block, ``free_completed`` restores it as free-requested,
      ``free_requested`` clears that, ``segment_alloc`` / ``segment_map`` remove memory,
      ``segment_free`` / ``segment_unmap`` restore it, merging neighbours for expandable
      segments), ``process_alloc_data`` (a free counts at ``free_completed``; frees of
      addresses not allocated in the trace, and active blocks never allocated in it, are the
      initially allocated ones), and ``unpickle`` (the viewer reads protocols 2-4 and only
      plain types, so the writer uses protocol 4 and nothing else).

    Where this module departs from them: the viewer pins the raw stream 0 to name 0, here the
    ids follow first appearance only; the viewer's timeline counts only ``active_allocated``
    blocks at the end, here ``active_pending_free`` blocks are live too (their memory is not
    reusable yet), which keeps the live bytes at the end equal to the active blocks' bytes.
"""

from __future__ import annotations

import bisect
import collections
import io
import pickle
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from allocsim.traces.formats import register_format
from allocsim.traces.formats.native import file_metadata
from allocsim.traces.model import NO_TAG, OP_ALLOC, OP_FREE, Trace, TraceError

__all__ = [
    "PROLOGUE_TAG",
    "REFERENCE_ACTIONS",
    "detect_snapshot",
    "load_pickle",
    "read_snapshot",
    "snapshot_of_run",
    "write_snapshot",
]

FORMAT_NAME = "torch-snapshot"
PROLOGUE_TAG = "<allocated before recording>"
REFERENCE_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom",
                     "snapshot")
SEGMENT_ACTIONS = REFERENCE_ACTIONS[:4]
BLOCK_ACTIONS = ("alloc", "free_requested", "free_completed")
ACTIVE_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free")
MAX_STACK_FRAMES = 64
PICKLE_PROTOCOL = 4  # MemoryViz.js's unpickler reads protocols 2 to 4 only

# PyTorch CUDACachingAllocator constants (c10/cuda/CUDACachingAllocator.cpp).
MIN_BLOCK_SIZE = 512          # kMinBlockSize: block sizes are multiples of this
SMALL_SIZE = 1 << 20          # kSmallSize: a large-pool remainder up to this is not split off
SMALL_BUFFER = 2 << 20        # kSmallBuffer: every small-pool segment is this big

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_EXPORT_BASE = 1 << 32        # where the bump-pointer layout of an export starts
_TAG_FILENAME = "<tag>"       # a frame that carries a bare tag (not a call site), see _frames_of_tag
_PICKLE_MAGIC = b"\x80"


# ====================================================================== safe unpickling
class _SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only: every class lookup is refused, so no
    ``__reduce__`` payload (``os.system``, ``eval``, ...) can be reached."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict  # old snapshots; a dict subclass, harmless
        raise TraceError(f"refuses to load class {module}.{name}: a snapshot holds only "
                         "plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise TraceError("refuses a persistent id: a snapshot holds only plain data")


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def load_pickle(data: bytes, source: str = "<snapshot>") -> Any:
    """Unpickle ``data`` refusing every class (see :class:`_SafeUnpickler`); one-line
    :class:`TraceError` naming ``source`` for anything that is not a readable plain pickle."""
    try:
        return _SafeUnpickler(io.BytesIO(data)).load()
    except TraceError as err:
        raise err.located(source) from None
    except RecursionError:
        raise TraceError("not a readable pickle: nested too deeply", source=source) from None
    except Exception as err:
        raise TraceError(f"not a readable pickle: {_one_line(err)}", source=source) from None


# ====================================================================== the file's shape
class _Block(NamedTuple):
    addr: int
    size: int | None        # the block's (rounded) size; None where it is not known
    requested: int
    stream: int             # raw handle
    pending: bool           # free requested, not completed


@dataclass
class _Segment:
    address: int
    total_size: int
    stream: int             # raw handle
    segment_type: str
    is_expandable: bool
    device: int | None
    blocks: list[tuple[int, int, int, str]] = field(default_factory=list)  # addr, size, req, state


class _Entry(NamedTuple):
    action: str
    addr: int | None
    size: int
    stream: int             # raw handle
    frames: Any
    device_free: int | None


@dataclass
class _Snapshot:
    segments: list[_Segment]
    device_traces: list[list[Any]]
    allocator_settings: Any
    legacy: bool


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _int_field(obj: dict, key: str, where: str, source: str, *, default: Any = None,
               minimum: int | None = None) -> int:
    value = obj.get(key, default)
    if not _is_int(value):
        shown = "missing" if key not in obj else f"{value!r}"[:40]
        raise TraceError(f"{where}: {key!r} is {shown}, expected an integer", source=source)
    if minimum is not None and value < minimum:
        raise TraceError(f"{where}: {key!r} is {value}, expected at least {minimum}",
                         source=source)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise TraceError(f"{where}: {key!r} is {value}, which does not fit in 64 bits",
                         source=source)
    return value


def _parse_snapshot(raw: Any, source: str) -> _Snapshot:
    """Check the top-level shape: a snapshot dict, or a bare list of segments (legacy)."""
    if isinstance(raw, list):
        return _Snapshot(_parse_segments(raw, source), [], None, legacy=True)
    if not isinstance(raw, dict):
        raise TraceError(f"not a PyTorch memory snapshot: the pickle holds a "
                         f"{type(raw).__name__}, expected a dict with 'segments' and "
                         "'device_traces'", source=source)
    if "segments" not in raw and "device_traces" not in raw:
        keys = ", ".join(repr(k) for k in list(raw)[:5]) or "none"
        raise TraceError(f"not a PyTorch memory snapshot: no 'segments' or 'device_traces' "
                         f"(keys: {keys})", source=source)
    traces = raw.get("device_traces", [])
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise TraceError("'device_traces' should be a list with one list of entries per "
                         "device", source=source)
    return _Snapshot(_parse_segments(raw.get("segments", []), source), traces,
                     raw.get("allocator_settings"), legacy=False)


def _parse_segments(raw: Any, source: str) -> list[_Segment]:
    if not isinstance(raw, list):
        raise TraceError(f"'segments' is a {type(raw).__name__}, expected a list",
                         source=source)
    return [_parse_segment(seg, k, source) for k, seg in enumerate(raw)]


def _parse_segment(seg: Any, k: int, source: str) -> _Segment:
    where = f"segments[{k}]"
    if not isinstance(seg, dict):
        raise TraceError(f"{where} is a {type(seg).__name__}, expected a dict", source=source)
    address = _int_field(seg, "address", where, source)
    total = _int_field(seg, "total_size", where, source, minimum=0)
    stream = _int_field(seg, "stream", where, source, default=0)
    expandable = bool(seg.get("is_expandable", False))
    kind = seg.get("segment_type")
    if kind not in ("small", "large"):
        kind = _segment_type(total, expandable)
    device = seg.get("device")
    blocks_raw = seg.get("blocks", [])
    if not isinstance(blocks_raw, list):
        raise TraceError(f"{where}: 'blocks' should be a list", source=source)
    blocks = []
    addr = address
    for j, b in enumerate(blocks_raw):
        bwhere = f"{where}.blocks[{j}]"
        if not isinstance(b, dict):
            raise TraceError(f"{bwhere} is a {type(b).__name__}, expected a dict",
                             source=source)
        size = _int_field(b, "size", bwhere, source, minimum=0)
        state = b.get("state")
        if not isinstance(state, str):
            raise TraceError(f"{bwhere}: 'state' should be a string", source=source)
        # Newer files give each block's address; older ones imply it (MemoryViz does this).
        baddr = b["address"] if _is_int(b.get("address")) else addr
        blocks.append((baddr, size, _requested_size(b, size), state))
        addr = baddr + size
    return _Segment(address, total, stream, kind, expandable,
                    device if _is_int(device) else None, blocks)


def _requested_size(block: dict, size: int) -> int:
    """A block's requested bytes; legacy files keep them in ``history[0]['real_size']``."""
    value = block.get("requested_size")
    if _is_int(value) and value > 0:
        return value
    history = block.get("history")
    if isinstance(history, list) and history and isinstance(history[0], dict):
        real = history[0].get("real_size")
        if _is_int(real) and real > 0:
            return real
    return size


def _segment_type(total_size: int, expandable: bool) -> str:
    """Small-pool segments are exactly kSmallBuffer; anything bigger is large-pool."""
    return "small" if total_size <= SMALL_BUFFER and not expandable else "large"


# ====================================================================== device choice
def _device_counts(snap: _Snapshot) -> dict[int, int]:
    counts = {i: len(t) for i, t in enumerate(snap.device_traces)}
    for seg in snap.segments:
        if seg.device is not None:
            counts.setdefault(seg.device, 0)
    return dict(sorted(counts.items()))


def _choose_device(snap: _Snapshot, device_index: Any, source: str) -> int:
    counts = _device_counts(snap)
    with_events = [d for d, n in counts.items() if n]
    listing = ", ".join(f"{d} ({counts[d]} entries)" for d in with_events) or "none"
    if device_index is None:
        if with_events:
            return max(with_events, key=lambda d: (counts[d], -d))  # ties: lowest index
        with_segments = sorted({s.device for s in snap.segments if s.device is not None})
        return with_segments[0] if with_segments else 0
    if not _is_int(device_index):
        try:
            device_index = int(str(device_index), 10)
        except ValueError:
            raise TraceError(f"device_index {device_index!r} is not an integer",
                             source=source) from None
    if device_index in with_events:
        return device_index
    if not with_events and (snap.legacy or not counts or device_index in counts):
        return device_index  # a state-only file: read that device's segments
    raise TraceError(f"device {device_index} has no trace entries (devices with entries: "
                     f"{listing})", source=source)


# ====================================================================== entries
def _parse_entries(raw: list[Any], device: int, source: str) -> list[_Entry]:
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
            addr = _int_field(e, "addr", where, source)
            size = _int_field(e, "size", where, source, minimum=0)
            stream = _int_field(e, "stream", where, source, default=0)
        elif action in ("oom", "snapshot"):
            size = _int_field(e, "size", where, source, default=0, minimum=0)
            stream = _int_field(e, "stream", where, source, default=0)
            if action == "oom":
                device_free = _int_field(e, "device_free", where, source, default=0)
            elif _is_int(e.get("addr")):
                addr = e["addr"]
        entries.append(_Entry(action, addr, size, stream, e.get("frames"), device_free))
    return entries


def _times_ns(raw: list[Any], device: int, source: str) -> tuple[list[int], dict[str, Any]]:
    """Nanoseconds from the first entry, non-decreasing, and the metadata saying how."""
    stamps = [e.get("time_us") if isinstance(e, dict) else None for e in raw]
    if not stamps or any(s is None for s in stamps):
        # Files from before time_us (2023) have no clock at all: keep the order, 1 µs apart.
        return [1000 * i for i in range(len(stamps))], {"synthetic_times": bool(stamps)}
    for i, s in enumerate(stamps):
        if isinstance(s, bool) or not isinstance(s, (int, float)) or s != s:
            raise TraceError(f"device {device} entry {i}: 'time_us' is {s!r}, expected a "
                             "number", source=source)
    origin = stamps[0]
    times: list[int] = []
    clamped = 0
    worst = 0
    previous = 0
    for s in stamps:
        t = int(round((s - origin) * 1000))
        if t < previous:
            # Clocks of different threads can disagree by a little; never let time run back.
            clamped += 1
            worst = max(worst, previous - t)
            t = previous
        times.append(t)
        previous = t
    if times and times[-1] > _INT64_MAX:
        raise TraceError(f"device {device}: the trace spans {times[-1]} ns, more than 64 bits "
                         "hold", source=source)
    meta: dict[str, Any] = {"synthetic_times": False, "time_origin_us": origin,
                            "times_clamped": clamped}
    if clamped:
        meta["times_clamped_max_ns"] = worst
    return times, meta


class _StreamIds:
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


# ====================================================================== tags
@cache
def _frame_filter(name: str, filename: str) -> bool:
    """_memory_viz._frame_filter / MemoryViz.js frameFilter: drop the allocator's own,
    dispatcher and interpreter frames."""
    omit_functions = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp",
                      "_start", "__libc_start_main", "PyEval_", "PyObject_", "PyFunction_")
    omit_filenames = ("core/boxing", "/Register", "/Redispatch", "pythonrun.c",
                      "Modules/main.c", "Objects/call.c", "Objects/methodobject.c",
                      "pycore_ceval.h", "ceval.c", "cpython/abstract.h")
    return not (any(f in name for f in omit_functions)
                or any(f in filename for f in omit_filenames))


_STDLIB = re.compile(r"[\\/]lib[\\/]python\d")
_LIBRARY_PARTS = ("/torch/", "\\torch\\", "site-packages", "dist-packages", "<frozen ")


@cache
def _is_python(filename: str) -> bool:
    """A Python source frame (C++ frames are '??', '' or a .cpp/.h file, with line 0)."""
    return filename.endswith((".py", ".pyx")) or (
        filename.startswith("<") and filename.endswith(">") and len(filename) > 2)


@cache
def _is_user(name: str, filename: str) -> bool:
    """A Python frame outside torch, installed packages and the standard library."""
    if not _is_python(filename) or not _frame_filter(name, filename):
        return False
    if filename.startswith("torch/") or any(p in filename for p in _LIBRARY_PARTS):
        return False
    return not _STDLIB.search(filename)


def _frame_parts(frame: Any) -> tuple[str, int, str] | None:
    if not isinstance(frame, dict):
        return None
    filename, line, name = frame.get("filename", ""), frame.get("line", 0), frame.get("name", "")
    return (filename if isinstance(filename, str) else str(filename),
            line if _is_int(line) else 0,
            name if isinstance(name, str) else str(name))


def _basename(filename: str) -> str:
    return re.split(r"[\\/]", filename)[-1]


_AUTOGRAD_NODE = re.compile(r"torch::autograd::generated::(\w+)::apply\b")
_ATEN_OP = re.compile(r"^at::_ops::(\w+)::call\b")


def _tag_text(parts: list[tuple[str, int, str]]) -> str | None:
    """The tag of a stack: its first user frame as ``file:line:name`` (base name, as
    _memory_viz._frame_fmt), else its first kept Python frame (a torch call site).

    Stacks recorded on the autograd engine's thread (the backward pass) have no Python
    frame at all; they are tagged by their autograd node (``autograd:MulBackward0``), else by
    their ATen op (``aten::mul``). None when there is nothing to go by. A single ``<tag>``
    frame is a bare tag written by :func:`snapshot_of_run`.
    """
    if len(parts) == 1 and parts[0][0] == _TAG_FILENAME:
        return parts[0][2]
    chosen = (next((p for p in parts if _is_user(p[2], p[0])), None)
              or next((p for p in parts if _is_python(p[0]) and _frame_filter(p[2], p[0])),
                      None))
    if chosen is not None:
        return f"{_basename(chosen[0])}:{chosen[1]}:{chosen[2]}"
    for pattern, prefix in ((_AUTOGRAD_NODE, "autograd:"), (_ATEN_OP, "aten::")):
        match = next((m for m in (pattern.search(p[2]) for p in parts) if m), None)
        if match:
            return prefix + match[1]
    return None


class _Tagger:
    """Tags allocations by call site and keeps one stack per tag.

    The frame lists of a snapshot are shared objects (PyTorch dedups identical tracebacks),
    so results are cached by the list's identity while the unpickled data is alive.
    """

    def __init__(self) -> None:
        self.tags: list[str] = []
        self.index: dict[str, int] = {}
        self.stacks: dict[str, list[str]] = {}
        self._by_list: dict[int, int] = {}

    def intern(self, tag: str) -> int:
        code = self.index.get(tag)
        if code is None:
            code = self.index[tag] = len(self.tags)
            self.tags.append(tag)
        return code

    def __call__(self, frames: Any) -> int:
        if not isinstance(frames, list) or not frames:
            return NO_TAG
        key = id(frames)
        code = self._by_list.get(key)
        if code is None:
            code = self._by_list[key] = self._tag_of(frames)
        return code

    def _tag_of(self, frames: list[Any]) -> int:
        parts = [p for p in map(_frame_parts, frames) if p is not None]
        tag = _tag_text(parts)
        if tag is None:
            return NO_TAG
        if tag not in self.stacks:
            self.stacks[tag] = [f"{f}:{line}:{n}" for f, line, n in parts
                                if _frame_filter(n, f)][:MAX_STACK_FRAMES]
        return self.intern(tag)


# ====================================================================== state at the start
def _final_blocks(segments: list[_Segment]) -> dict[int, _Block]:
    blocks: dict[int, _Block] = {}
    for seg in segments:
        for addr, size, requested, state in seg.blocks:
            if state in ACTIVE_STATES:
                blocks[addr] = _Block(addr, size, requested, seg.stream,
                                      state != "active_allocated")
    return blocks


def _undo_blocks(entries: list[_Entry], final: dict[int, _Block],
                 problems: collections.Counter) -> dict[int, _Block]:
    """The blocks live at the start: MemoryView.simulate_memory run back to before entry 0."""
    blocks = dict(final)
    for e in reversed(entries):
        if e.action == "alloc":
            if blocks.pop(e.addr, None) is None:
                problems["allocs_of_blocks_not_live_later"] += 1
        elif e.action == "free_completed":
            # Its rounded size is not in the entry; None marks it for inference.
            blocks[e.addr] = _Block(e.addr, None, e.size, e.stream, True)
        elif e.action == "free_requested":
            block = blocks.get(e.addr)
            if block is None:
                problems["free_requests_of_unknown_blocks"] += 1
            else:
                blocks[e.addr] = block._replace(pending=False)
    return blocks


def _undo_segments(entries: list[_Entry], final: list[_Segment],
                   problems: collections.Counter) -> list[_Segment]:
    """The segments at the start, undoing segment events backwards (MemoryViz's
    map_segment / unmap_segment, which merge neighbours only for expandable segments)."""
    segs = sorted((_Segment(s.address, s.total_size, s.stream, s.segment_type,
                            s.is_expandable, s.device) for s in final),
                  key=lambda s: s.address)
    for e in reversed(entries):
        if e.action == "segment_alloc":
            at = next((k for k, s in enumerate(segs) if s.address == e.addr), None)
            if at is None:
                problems["segment_allocs_of_unknown_segments"] += 1
            else:
                del segs[at]
        elif e.action == "segment_free":
            _insert_segment(segs, _Segment(e.addr, e.size, e.stream,
                                           _segment_type(e.size, False), False, None))
        elif e.action == "segment_unmap":
            _map_range(segs, e.addr, e.size, e.stream)
        elif e.action == "segment_map":
            if not _unmap_range(segs, e.addr, e.size):
                problems["segment_maps_of_unknown_ranges"] += 1
    return segs


def _insert_segment(segs: list[_Segment], seg: _Segment) -> int:
    at = bisect.bisect_left([s.address for s in segs], seg.address)
    segs.insert(at, seg)
    return at


def _map_range(segs: list[_Segment], addr: int, size: int, stream: int) -> None:
    """Add a mapped range of an expandable segment, merging touching neighbours."""
    at = _insert_segment(segs, _Segment(addr, size, stream, "large", True, None))
    if at + 1 < len(segs):
        nxt = segs[at + 1]
        if nxt.is_expandable and addr + size == nxt.address and nxt.stream == stream:
            segs[at].total_size += nxt.total_size
            del segs[at + 1]
    if at > 0:
        prev = segs[at - 1]
        if prev.is_expandable and prev.address + prev.total_size == addr \
                and prev.stream == stream:
            prev.total_size += segs[at].total_size
            del segs[at]


def _unmap_range(segs: list[_Segment], addr: int, size: int) -> bool:
    """Remove ``[addr, addr + size)`` from the segment holding it (splitting it if needed)."""
    end = addr + size
    at = next((k for k, s in enumerate(segs)
               if s.address <= addr and end <= s.address + s.total_size), None)
    if at is None:
        return False
    seg = segs[at]
    seg_end = seg.address + seg.total_size
    if seg.address == addr:
        seg.address += size
        seg.total_size -= size
        if seg.total_size == 0:
            del segs[at]
    elif seg_end == end:
        seg.total_size -= size
    else:
        seg.total_size = addr - seg.address
        segs.insert(at + 1, _Segment(end, seg_end - end, seg.stream, seg.segment_type,
                                     seg.is_expandable, seg.device))
    return True


def _rounded(requested: int) -> int:
    """CUDACachingAllocator round_size without power-of-two divisions: 512-byte multiples."""
    return max(MIN_BLOCK_SIZE, -(-requested // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE)


def _initial_segments(segs: list[_Segment], blocks: dict[int, _Block], streams: _StreamIds,
                      problems: collections.Counter) -> tuple[list[dict[str, Any]], int]:
    """The segment list at the start, blocks laid out in each (inactive gaps filled in).

    Blocks restored from a ``free_completed`` have no known rounded size; it is inferred as
    the allocator would have cut it: the 512-rounded request, plus the rest of the room up to
    the next block when that rest is too small for a large-pool split (<= 1 MiB).
    """
    starts = sorted(blocks)
    result = []
    inferred = 0
    placed = 0
    for seg in segs:
        end = seg.address + seg.total_size
        lo = bisect.bisect_left(starts, seg.address)
        hi = bisect.bisect_left(starts, end)
        inside = [blocks[a] for a in starts[lo:hi]]
        placed += len(inside)
        out: list[dict[str, Any]] = []
        cursor = seg.address
        for k, b in enumerate(inside):
            if b.addr > cursor:
                out.append(_block_dict(cursor, b.addr - cursor, 0, "inactive"))
            room = (inside[k + 1].addr if k + 1 < len(inside) else end) - b.addr
            size = b.size
            if size is None:
                inferred += 1
                size = _rounded(b.requested)
                if seg.segment_type == "large" and 0 < room - size <= SMALL_SIZE:
                    size = room
            if size > room or b.addr < cursor:
                problems["initial_blocks_overlapping"] += 1
                size = max(0, min(size, room))
            out.append(_block_dict(b.addr, size, b.requested,
                                   "active_pending_free" if b.pending else "active_allocated"))
            cursor = max(cursor, b.addr + size)
        if cursor < end:
            out.append(_block_dict(cursor, end - cursor, 0, "inactive"))
        result.append({"address": seg.address, "total_size": seg.total_size,
                       "stream": streams(seg.stream), "segment_type": seg.segment_type,
                       "is_expandable": seg.is_expandable, "blocks": out})
    if placed < len(blocks):
        problems["initial_blocks_outside_segments"] += len(blocks) - placed
    return result, inferred


def _block_dict(address: int, size: int, requested: int, state: str) -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": requested, "state": state}


# ====================================================================== building the Trace
class _Columns:
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


def _reference_event(e: _Entry, time_ns: int, event: int, stream: int) -> dict[str, Any]:
    ref: dict[str, Any] = {"action": e.action, "addr": e.addr, "size": e.size,
                           "stream": stream, "time_ns": time_ns, "event": event}
    if e.action == "oom":
        ref["device_free"] = e.device_free
    return ref


def _replay(entries: list[_Entry], times: list[int], start: dict[int, _Block],
            streams: _StreamIds, tagger: _Tagger, problems: collections.Counter
            ) -> tuple[_Columns, list[dict[str, Any]], int, int]:
    """Columns, reference events, prologue length and frees pending at the end."""
    cols = _Columns()
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
        if e.action == "alloc":
            if e.addr in live:
                # Two live blocks at one address cannot happen; keep the old one as a leak.
                problems["allocs_of_live_addresses"] += 1
            pending.discard(e.addr)
            buf = (next_id, e.size, streams(e.stream), tagger(e.frames))
            live[e.addr] = buf
            cols.add(t, OP_ALLOC, *buf)
            next_id += 1
        elif e.action == "free_requested":
            if e.addr in live:
                pending.add(e.addr)
        elif e.action == "free_completed":
            buf = live.pop(e.addr, None)
            pending.discard(e.addr)
            if buf is None:
                problems["unmatched_frees_dropped"] += 1
                continue
            if e.size != buf[1]:
                problems["free_size_mismatches"] += 1
            cols.add(t, OP_FREE, *buf)
        elif e.action in REFERENCE_ACTIONS:
            refs.append(_reference_event(e, t, len(cols), streams(e.stream)))
    return cols, refs, prologue, len(pending)


def _plain(value: Any) -> Any:
    """JSON-friendly copy of unpickled plain data (tuples -> lists, keys -> str)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def read_snapshot(data: bytes, source: str, name: str, *,
                  device_index: int | None = None) -> Trace:
    """Read a PyTorch memory snapshot pickle as a Trace of one device (see module docstring).

    ``device_index`` chooses the device (default: the one with the most trace entries).
    Raises a one-line :class:`TraceError` naming ``source`` for any problem with the file.
    """
    snap = _parse_snapshot(load_pickle(data, source), source)
    device = _choose_device(snap, device_index, source)
    raw = snap.device_traces[device] if device < len(snap.device_traces) else []
    entries = _parse_entries(raw, device, source)
    times, time_meta = _times_ns(raw, device, source)
    segments = [s for s in snap.segments if s.device is None or s.device == device]

    streams = _StreamIds()
    for e in entries:  # traces before segments, as MemoryViz's annotate_snapshot
        if e.action in BLOCK_ACTIONS or e.action in REFERENCE_ACTIONS:
            streams(e.stream)
    for s in segments:
        streams(s.stream)

    problems: collections.Counter = collections.Counter()
    start_blocks = _undo_blocks(entries, _final_blocks(segments), problems)
    start_segments = _undo_segments(entries, segments, problems)
    initial, inferred = _initial_segments(start_segments, start_blocks, streams, problems)
    tagger = _Tagger()
    cols, refs, prologue, pending = _replay(entries, times, start_blocks, streams, tagger,
                                            problems)

    meta = file_metadata({}, source, name)
    meta.update({
        "format": FORMAT_NAME,
        "device": device,
        "devices": {str(d): n for d, n in _device_counts(snap).items()},
        "actions": dict(collections.Counter(e.action for e in entries)),
        "frees_pending_at_end": pending,
        "stream_handles": streams.handles(),
        **time_meta,
        "prologue_events": prologue,
        "initial_segments": initial,
        "initial_block_sizes_inferred": inferred,
        "reference_events": refs,
        "tag_stacks": tagger.stacks,
    })
    if snap.allocator_settings is not None:
        meta["allocator_settings"] = _plain(snap.allocator_settings)
    if problems:
        meta["inconsistencies"] = dict(sorted(problems.items()))
    if snap.legacy:
        meta["legacy"] = True
        meta["note"] = ("legacy snapshot: segments only, no trace; the events are the blocks "
                        "live when it was taken")
    elif not entries:
        meta["note"] = ("no trace entries for this device (history was not recorded); the "
                        "events are the blocks live when the snapshot was taken")
    return Trace(time_ns=np.array(cols.time, dtype=np.int64),
                 op=np.array(cols.op, dtype=np.int8),
                 id=np.array(cols.id, dtype=np.int64),
                 size=np.array(cols.size, dtype=np.int64),
                 stream=np.array(cols.stream, dtype=np.int32),
                 process=np.zeros(len(cols), dtype=np.int32),
                 tag=np.array(cols.tag, dtype=np.int32),
                 tags=tagger.tags, metadata=meta)


def detect_snapshot(path: str, head: bytes) -> bool:
    """A pickle of protocol 2 or later (first byte 0x80), or a ``.pickle`` / ``.pkl`` name."""
    return head.startswith(_PICKLE_MAGIC) or path.lower().endswith((".pickle", ".pkl"))


# ====================================================================== export
_CALL_SITE = re.compile(r"^(.*?):(-?\d+):(.*)$")


def _frame_of(text: str) -> dict[str, Any]:
    """A frame dict from ``file:line:name``; anything else travels as a bare tag."""
    match = _CALL_SITE.match(text)
    if match:
        return {"filename": match[1], "line": int(match[2]), "name": match[3]}
    return {"filename": _TAG_FILENAME, "line": 0, "name": text}


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
        if not kept or _tag_text([_frame_parts(f) for f in kept]) != tag:
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
        cursor += _rounded(max(size, 1))
    return out


class _Intervals:
    """The device ranges held as segments, for checking that every block lies in one."""

    def __init__(self) -> None:
        self.segs: list[_Segment] = []
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
            _insert_segment(self.segs, _Segment(addr, size, stream,
                                                _segment_type(size, False), False, 0))
            return True
        if action == "segment_map":
            _map_range(self.segs, addr, size, stream)
            return True
        if action == "segment_free":
            at = next((k for k, s in enumerate(self.segs) if s.address == addr), None)
            if at is None:
                return False
            del self.segs[at]
            return True
        return _unmap_range(self.segs, addr, size)  # segment_unmap


def _covering_segments(spans: Iterable[tuple[int, int, int]]) -> list[_Segment]:
    """Segments covering every ``(addr, size, raw stream)`` span: touching spans merged."""
    segs: list[_Segment] = []
    for addr, size, stream in sorted(spans):
        end = addr + max(size, 1)
        if segs and addr <= segs[-1].address + segs[-1].total_size:
            last = segs[-1]
            last.total_size = max(last.total_size, end - last.address)
        else:
            segs.append(_Segment(addr, end - addr, stream, "large", False, 0))
    for seg in segs:
        seg.segment_type = _segment_type(seg.total_size, False)
    return segs


def _check_segment_event(ev: Any, k: int, n: int) -> dict[str, Any]:
    where = f"segment_events[{k}]"
    if not isinstance(ev, dict) or ev.get("action") not in REFERENCE_ACTIONS:
        raise TraceError(f"{where}: expected a dict whose 'action' is one of "
                         + ", ".join(REFERENCE_ACTIONS))
    event = ev.get("event")
    if not _is_int(event) or not 0 <= event <= n:
        raise TraceError(f"{where}: 'event' is {event!r}, expected an index 0..{n}")
    required = ("addr", "size") if ev["action"] in SEGMENT_ACTIONS else ()
    for key in ("addr", "size", "stream"):
        value = ev.get(key, None if key in required else 0)
        if key == "addr" and key not in required and value is None:
            continue  # an oom has no address
        if not _is_int(value) or value < 0:
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
        missing = next((r for r in rows_alloc if not _is_int(addresses.get(r))), None)
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
        span = _rounded if bump else (lambda size: size)
        segs = _covering_segments((int(addresses[r]), span(max(sizes[r], 1)),
                                   raw_stream.get(streams[r], streams[r])) for r in rows_alloc)
    return {"segments": _final_segments(segs, live, tag_frames),
            "device_traces": [entries],
            "allocator_settings": {}}


def _device_entry(ev: dict[str, Any], times: list[int], raw_stream: dict[int, int],
                  held: _Intervals | None) -> dict[str, Any]:
    """A trace entry for one simulated device call (or oom / snapshot marker)."""
    at = ev["event"]
    time_ns = ev.get("time_ns")
    if not _is_int(time_ns):
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


def _final_segments(segs: list[_Segment], live: dict[int, tuple[int, int, int, int]],
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


register_format(FORMAT_NAME, (".pickle", ".pkl"), read_snapshot, write_snapshot,
                detect_snapshot, recorded=True, options=("device_index",))
