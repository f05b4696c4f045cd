"""Does the ``pytorch`` model make the decisions the real allocator made? (``allocsim fidelity``)

What it is for
    A PyTorch memory snapshot records, next to every allocation and free, the real caching
    allocator's own device calls: ``segment_alloc`` / ``segment_free`` (cudaMalloc/cudaFree of
    a segment), ``segment_map`` / ``segment_unmap`` (expandable segments) and ``oom``. The
    snapshot importer (:mod:`allocsim.traces.formats.torch_snapshot`) keeps them, in order, in
    ``metadata["reference_events"]``, each with the index of the trace event it comes before.
    :func:`fidelity` replays the trace through :class:`~allocsim.policies.pytorch.caching.
    PyTorchCachingAllocator` configured as the recording was, and compares the device calls
    the model makes with the recorded ones: same action, same size (exactly), in the same
    order, at the same place in the trace; then the segment list at the end.

What it follows
    - Settings: the snapshot's ``allocator_settings`` (torch/csrc/cuda/memory_snapshot.cpp,
      ``_memory_snapshot_pickled``: ``PYTORCH_CUDA_ALLOC_CONF`` (the string as set),
      ``max_split_size`` (bytes; -1 / SIZE_MAX = unlimited), ``garbage_collection_threshold``,
      ``expandable_segments``, ``roundup_power2_divisions`` ({"1": d, "2": d, …, "32768": d},
      keyed by interval lower bound in MiB) and host-side keys (``pinned_*``,
      ``release_lock_on_cudamalloc``, ``graph_capture_record_stream_reuse``) that do not place
      device memory). Keys not modelled are listed in the report; files without settings get
      PyTorch's defaults, said so.
    - Capacity: an ``oom`` entry carries ``device_free`` (cudaMemGetInfo at the failure, after
      the allocator released its cache); the process could have held the bytes it had
      reserved then plus that. Without an oom entry the device is large (1 TiB) and never
      binds, said so; ``capacity=`` overrides.
    - Start state: recording usually starts mid-run. The importer rebuilt the segments at the
      start (``initial_segments``) and added every block live then as a synthetic alloc at
      the start of the trace (the *prologue*). The model is seeded with those segments
      (``PyTorchCachingAllocator.seed``): the prologue's allocs are the recorded active
      blocks, not new segments, and the inactive blocks are cached free blocks.
    - Addresses: the best fit breaks ties by address, so the model's device hands out the
      recorded address for a segment when the model asks for the segment the recording made
      next (same size, range free); otherwise a fresh address above every recorded one.
    - Streams: the importer numbers streams by first appearance; PyTorch orders a pool by
      the raw ``cudaStream_t`` (stream, size, address), which decides the order segments are
      released in, so the model sees streams numbered in raw-handle order.
    - ``empty_cache()``: it leaves no entry of its own, only a burst of ``segment_free`` /
      ``segment_unmap``. A burst that no failed cudaMalloc explains (no ``oom`` follows it,
      and with a known capacity the next recorded segment would still have fitted) is the
      program calling ``torch.cuda.empty_cache()``: it is replayed as one, at that point.
      Where the capacity is unknown, a burst right before an alloc that then takes a new
      segment may also be that alloc's retry after a failed cudaMalloc; the two release the
      same segments unless max_split_size is set (the retry first frees oversize blocks one
      by one), so there, a burst that is not exactly what empty_cache() would release is
      replayed as a failed cudaMalloc: the device refuses memory until as many segments as
      recorded went back. An empty_cache() that released nothing left no trace at all.
    - A recorded ``oom`` is a request that failed, so it is not in the trace: the model gets
      the same (rounded) request there, is expected to fail it too, and (if it does not) gives
      the block straight back.

Counting: ``total`` = recorded segment and oom entries (``snapshot`` markers are not
decisions and are ignored); ``matched`` = those the model made too, aligned within each point
of the trace (difflib's longest matching blocks), so one divergence does not hide every
later match; ``extra`` = calls the model made that the recording did not. The run passes
(exit status 0) when everything matched, nothing extra was made and the final segments agree.

Limits: blocks live when recording started but freed during it have inferred sizes (the
file records requested sizes only): ``fidelity.start`` sizes them with the model's own
rounding and split rule, ending each where the recording later carves the space after it,
else keeping the room up to the next live block when the rule would not have split it off;
a seeded start can still differ where a block kept a rest that nothing later shows;
expandable segments at the start are seeded as one virtual range
per (stream, pool) whose base is inferred from the recording (policies/pytorch/snapshot.py
says what a snapshot cannot tell); record_stream / cross-stream frees, CUDA graph pools and
a memory fraction (not in the file) are not modelled.

Speed: one pass in a plain loop (no per-event allocation, device calls are rare); a
1,000,000-entry snapshot takes well under 30 s, most of it in the importer (measured on one
core: 1,004,319 entries, 670,000 events — import 6-14 s, fidelity 1.6-3 s). The first
divergence's "model segments then" come from a second, deterministic replay stopped there.

Modules (one concept each), all in ``allocsim.sim.questions.fidelity``:

- ``pytorch`` (this one): the entry point, :func:`fidelity`; it re-exports the public names;
- ``recording``: the recorded entries read (capacity, episodes, final segments);
- ``settings``: ``allocator_settings`` ↔ the ``pytorch`` policy's parameters;
- ``device``: the device that hands out recorded addresses;
- ``start``: the start blocks' sizes, by the model's own split rule;
- ``replay``: the seeded replay;
- ``match``: matching device calls, the first divergence, the final segments;
- ``report``: the report as text and JSON;
- ``oom``: the recorded OOM and the model stopped before it (for explain-oom);
- ``simulate``: snapshots the model writes itself (the round trip).

The command, ``allocsim fidelity``: :mod:`allocsim.sim.cli.fidelity`.
"""

from __future__ import annotations

import time
from typing import Any

from allocsim.policies import format_size
from allocsim.sim.questions.fidelity.match import (
    final_comparison,
    segment_summary,
    trace_context,
)
from allocsim.sim.questions.fidelity.oom import (
    RecordedOOM,
    model_at_recorded_oom,
    recorded_oom,
)
from allocsim.sim.questions.fidelity.recording import (
    COMPARED_ACTIONS,
    LARGE_CAPACITY,
    FidelityError,
    check_snapshot_trace,
    episodes,
    final_reserved,
    snapshot_capacity,
)
from allocsim.sim.questions.fidelity.replay import Replay, stream_ranks
from allocsim.sim.questions.fidelity.report import FidelityReport, segments_text
from allocsim.sim.questions.fidelity.settings import (
    SnapshotSettings,
    settings_from_snapshot,
    settings_record,
)
from allocsim.sim.questions.fidelity.simulate import simulate_snapshot
from allocsim.traces.model import Trace

__all__ = [
    "COMPARED_ACTIONS",
    "LARGE_CAPACITY",
    "FidelityError",
    "FidelityReport",
    "RecordedOOM",
    "SnapshotSettings",
    "check_snapshot_trace",
    "fidelity",
    "model_at_recorded_oom",
    "recorded_oom",
    "segment_summary",
    "segments_text",
    "settings_from_snapshot",
    "settings_record",
    "simulate_snapshot",
    "snapshot_capacity",
    "stream_ranks",
]


def fidelity(trace: Trace, *, capacity: int | None = None) -> FidelityReport:
    """Replay a snapshot trace through the ``pytorch`` model as recorded; compare (see the
    module docstring). ``capacity`` overrides the one taken from the recording."""
    started = time.perf_counter()
    check_snapshot_trace(trace)
    meta = trace.metadata
    settings = settings_from_snapshot(meta.get("allocator_settings"))
    all_refs = meta.get("reference_events") or []
    refs = [r for r in all_refs if r.get("action") in COMPARED_ACTIONS]
    recorded_capacity, capacity_source, _ = snapshot_capacity(trace, refs)
    known = recorded_capacity
    if capacity is not None:
        capacity_source = "given" + (f" (the recording implies {format_size(recorded_capacity)})"
                                     if recorded_capacity is not None else "")
        known = capacity
    chosen = known if known is not None else LARGE_CAPACITY
    initial = meta.get("initial_segments") or []
    initial_reserved = sum(int(s["total_size"]) for s in initial)
    found, reserved_before = episodes(refs, trace.op.tolist(), initial_reserved, known)
    replay = Replay(trace, settings, chosen, refs, found)
    replay.run()
    notes = list(settings.notes) + replay.notes + _notes(trace, len(all_refs) - len(refs))
    match = replay.match
    divergence = match.divergence
    if divergence is not None:
        event, episode = match.divergence_at or (divergence["event"], None)
        again = Replay(trace, settings, chosen, refs, found)
        again.run(stop=(event, episode))
        start = divergence.pop("episode_start")
        divergence["model_segments"] = segment_summary(again.policy)
        divergence["model_reserved"] = again.view.reserved
        divergence["recorded_reserved"] = (reserved_before[start] if start < len(refs)
                                           else final_reserved(initial_reserved, refs))
        divergence["trace_events"] = trace_context(trace, min(event, len(trace) - 1)) \
            if len(trace) else []
    final = final_comparison(initial, refs, replay.policy)
    return FidelityReport(
        trace=trace.name, source=str(meta.get("source", "")), events=len(trace),
        policy=str(settings.spec), settings=settings.to_json_dict(),
        not_modelled=settings.not_modelled, capacity=chosen, capacity_source=capacity_source,
        matched=match.matched, total=len(refs), extra=match.extra,
        by_action=_by_action(refs, match.matched_by_action), first_divergence=divergence,
        final_segments_match=final["match"], final_segments=final,
        empty_cache_calls=replay.empty_cache_calls, injected_ooms=replay.injected_ooms,
        seeded_segments=replay.seeded_segments, seeded_blocks=replay.seeded_blocks,
        notes=notes, elapsed_s=time.perf_counter() - started)


def _notes(trace: Trace, markers: int) -> list[str]:
    """What the report says about the recording and what is not modelled in it."""
    meta = trace.metadata
    notes = []
    if markers:
        notes.append(f"{markers} 'snapshot' markers in the recording are not decisions: "
                     "ignored")
    if meta.get("inconsistencies"):
        notes.append("the importer found inconsistencies: " + ", ".join(
            f"{k} {v}" for k, v in meta["inconsistencies"].items()))
    if meta.get("initial_block_sizes_inferred"):
        notes.append(f"{meta['initial_block_sizes_inferred']} start blocks have inferred sizes")
    if len(trace.streams()) > 1:
        notes.append("record_stream / cross-stream frees are not modelled (each free "
                     "completes at once)")
    return notes


def _by_action(refs: list[dict[str, Any]], matched: dict[str, int]
               ) -> dict[str, dict[str, int]]:
    """Recorded and matched calls per compared action, in :data:`COMPARED_ACTIONS` order."""
    by_action = {action: {"recorded": 0, "matched": 0} for action in COMPARED_ACTIONS}
    for ref in refs:
        by_action[ref["action"]]["recorded"] += 1
    for action, count in matched.items():
        by_action[action]["matched"] = count
    return by_action
