"""What every segment loop shares: the trace's alloc op code, and the engine's bookkeeping of an
alloc that a loop sent the general way.

A segment loop (:meth:`~allocsim.policies.base.Policy.segment_loop`) writes its policy's hot
malloc and free into a copy of the engine's per-event loop. Where a malloc finds nothing free
and runs the policy's own method instead (growth, the release path, an OOM — the only events
that call the device in policies/chunk_loop.py and pytorch_loop.py), what the engine would
then note is the same for every loop, and a function call costs nothing there: it is here,
once. policies/cuda_async_loop.py keeps it inline, since with release at every free a quarter
of its events are such mallocs.
"""

from __future__ import annotations

from allocsim.policies.base import SegmentReplay

# The trace's op code of an alloc (allocsim.traces.model.OP_ALLOC, which policies/ may not
# import), read by every segment loop; tests/test_segment_loop.py holds it to the trace's.
OP_ALLOC = 0


def note_general_alloc(replay: SegmentReplay, event: int, buffer: int, size: int,
                       address: int | None, in_use: int, allocated: int, peak: int, top: int,
                       calls: int) -> tuple[int, int, int, int]:
    """Alloc ``event`` (``buffer``, ``size`` bytes) got ``address`` (None: out of memory) with
    ``in_use`` bytes in use after it: the buffer is live (or the OOM noted), allocated bytes
    and their peak move, and if the device was called since ``calls``, the timeline bucket's
    ``top`` and the run's peak of reserved bytes move as the engine's loop moves them.
    Returns allocated, peak, top and the device's call counter."""
    if address is None:
        replay.note_out_of_memory(event, size, allocated)
    else:
        replay.live[buffer] = address
        allocated += size
        if allocated > peak:
            peak = allocated
            replay.peak_allocated_event = event
            replay.in_use_at_peak_allocated = in_use
    view = replay.view
    if view.calls != calls:
        calls = view.calls
        reserved = view.reserved
        if reserved > top:                          # the bucket's most (-1: none yet)
            if top < 0:
                replay.buckets.first_call = event
            top = reserved
            if reserved > replay.reserved_at_peak:  # never above the run's peak else
                replay.reserved_at_peak = reserved
                replay.peak_reserved_event = event
                replay.in_use_at_peak_reserved = in_use
    return allocated, peak, top, calls
