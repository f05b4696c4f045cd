"""PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``) in and out.

What it is for
    Reading the pickle that ``torch.cuda.memory._record_memory_history()`` +
    ``_dump_snapshot(path)`` write, as a :class:`~allocsim.traces.model.Trace` the simulator
    can replay (one device at a time), and writing a trace — or a simulated run of one, with
    the simulated policy's addresses and device calls — back as a snapshot that PyTorch's own
    viewer (pytorch.org/memory_viz, ``torch/utils/viz/MemoryViz.js``) opens.

Where each part lives (modules of this package, ``allocsim.traces.formats.torch_snapshot``)
    This module is the format: :func:`read_snapshot` runs the steps below in order and sets
    the metadata; :func:`detect_snapshot` and the registration make
    :func:`allocsim.traces.formats.load` choose it.
    ``unpickler`` (step 1), ``shape`` (step 2: the typed records, PyTorch's constants,
    segment-list operations), ``entries`` (steps 3 and 5: device choice, times, stream ids,
    the forward replay into columns), ``start_state`` (step 4), ``tags`` (step 6) and
    ``writer`` (:func:`snapshot_of_run`,
    :func:`write_snapshot`). Everything named in ``__all__`` here stays importable from here.

Reading, in order
    1. *Safe unpickling.* A snapshot holds only dicts, lists, tuples, str, int, float, bool and
       None, so the unpickler refuses every class (``collections.OrderedDict`` excepted, which
       old files use): a crafted pickle cannot run code, it gets a
       :class:`~allocsim.traces.model.TraceError`.
    2. *Shape.* A dict with ``segments`` (the allocator state when the file was written),
       ``device_traces`` (one list of entries per device) and, in newer files,
       ``allocator_settings``; or a bare list (legacy: the segments only, no trace).
       ``device_index`` picks the device; by default the one with the most segments and allocator
       entries (``snapshot`` markers not counted).
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
       alloc, and the segments at the start go to ``metadata["initial_segments"]``; with
       expandable segments, one per contiguous mapped range (``is_expandable``), as
       memory_snapshot() reports them (the unmapped rest of a virtual range is not in the
       file; ``PyTorchCachingAllocator.seed`` lays each (stream, pool)'s ranges out in one).
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

    Where these modules depart from them: the viewer pins the raw stream 0 to name 0, here the
    ids follow first appearance only; the viewer's timeline counts only ``active_allocated``
    blocks at the end, here ``active_pending_free`` blocks are live too (their memory is not
    reusable yet), which keeps the live bytes at the end equal to the active blocks' bytes.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from allocsim.traces.formats.native import file_metadata
from allocsim.traces.formats.registry import register_format
from allocsim.traces.formats.torch_snapshot.entries import (
    PROLOGUE_TAG,
    StreamIds,
    choose_device,
    device_counts,
    device_segments,
    parse_entries,
    replay,
    times_ns,
)
from allocsim.traces.formats.torch_snapshot.shape import (
    BLOCK_ACTIONS,
    KNOWN_ACTIONS,
    REFERENCE_ACTIONS,
    parse_snapshot,
)
from allocsim.traces.formats.torch_snapshot.start_state import start_state
from allocsim.traces.formats.torch_snapshot.tags import MAX_STACK_FRAMES, Tagger
from allocsim.traces.formats.torch_snapshot.unpickler import load_pickle
from allocsim.traces.formats.torch_snapshot.writer import snapshot_of_run, write_snapshot
from allocsim.traces.model import Trace

__all__ = [
    "FORMAT_NAME",
    "MAX_STACK_FRAMES",
    "PROLOGUE_TAG",
    "REFERENCE_ACTIONS",
    "detect_snapshot",
    "load_pickle",
    "read_snapshot",
    "snapshot_of_run",
    "write_snapshot",
]

FORMAT_NAME = "torch-snapshot"
_PICKLE_MAGIC = b"\x80"


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

    ``device_index`` chooses the device (default: the one with the most segments and allocator
    entries, see :func:`~allocsim.traces.formats.torch_snapshot.entries.choose_device`).
    Raises a one-line :class:`~allocsim.traces.model.TraceError` naming ``source`` for any
    problem with the file.
    """
    snap = parse_snapshot(load_pickle(data, source), source)
    device = choose_device(snap, device_index, source)
    raw = snap.device_traces[device] if 0 <= device < len(snap.device_traces) else []
    entries = parse_entries(raw, device, source)
    times, time_meta = times_ns(raw, device, source)
    segments = [s for s in snap.segments if s.device is None or s.device == device]

    streams = StreamIds()
    for e in entries:  # traces before segments, as MemoryViz's annotate_snapshot
        if e.action in BLOCK_ACTIONS or e.action in REFERENCE_ACTIONS:
            streams(e.stream)
    for s in segments:
        streams(s.stream)

    problems: collections.Counter[str] = collections.Counter()
    start = start_state(entries, segments, streams, problems)
    tagger = Tagger()
    cols, refs, prologue, pending = replay(entries, times, start.blocks, streams, tagger,
                                           problems)

    meta = file_metadata({}, source, name)
    meta.update({
        "format": FORMAT_NAME,
        "device": device,
        "devices": {str(d): n for d, n in device_counts(snap).items()},
        "device_segments": {str(d): n for d, n in device_segments(snap).items()},
        "actions": dict(collections.Counter(e.action for e in entries)),
        "frees_pending_at_end": pending,
        "stream_handles": streams.handles(),
        **time_meta,
        "prologue_events": prologue,
        "initial_segments": start.segments,
        "initial_block_sizes_inferred": start.inferred,
        "reference_events": refs,
        "tag_stacks": tagger.stacks,
    })
    if snap.allocator_settings is not None:
        meta["allocator_settings"] = _plain(snap.allocator_settings)
    if problems:
        meta["inconsistencies"] = dict(sorted(problems.items()))
    unknown = [(i, e.action) for i, e in enumerate(entries) if e.action not in KNOWN_ACTIONS]
    if unknown:  # a repair validate() counts (or, strict, fails on): traces/validate.py
        entry, action = unknown[0]
        meta["entry_anomalies"] = {"unknown_actions": {
            "count": len(unknown), "first_event": None,
            "problem": f"device {device} entry {entry}: unknown trace action {str(action)!r}"}}
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


register_format(FORMAT_NAME, (".pickle", ".pkl"), read_snapshot, write_snapshot,
                detect_snapshot, recorded=True, options=("device_index",))
