"""A profile's allocator records, checked once before anything replays them.

A TensorFlow/XLA BFC or TPU runtime profile read from its ``.xplane.pb`` carries the
allocator's own records in ``metadata["reference_events"]`` (traces/formats/xla/xplane.py
says their fields). A native copy of such a trace (``NAME.runtime.npz`` beside a JAX
recording, a ``.npz`` written by ``allocsim convert``) carries them as they were saved, so
they may have been edited or cut: :func:`check_allocator_records` holds every record to what
``allocsim fidelity`` reads of it — an action the allocator writes, a trace event that exists,
whole numbers where numbers are read, a memory limit the records determine — and says the first
problem in one line (:class:`~allocsim.traces.model.TraceError`, naming the file and the
record), instead of a traceback from deep in a replay.
"""

from __future__ import annotations

from typing import Any

from allocsim.traces.model import Trace, TraceError

__all__ = ["ACTIONS", "check_allocator_records"]

# The actions each allocator's profile records (xplane.py writes "alloc" and "free" only).
ACTIONS = frozenset({"alloc", "free"})
# Fields fidelity reads of every record, each a whole number of bytes (or an offset).
WHOLE_FIELDS = ("chunk", "addr", "in_use")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_allocator_records(trace: Trace, source: str | None = None) -> list[dict[str, Any]]:
    """The trace's allocator records, each checked (module docstring); raises TraceError
    naming ``source`` (the file read: a native copy's metadata names the profile it was
    made from)."""
    source = source or str(trace.metadata.get("source", trace.name))
    records = trace.metadata.get("reference_events")
    if not isinstance(records, list) or not records:
        raise TraceError("the profile carries no allocator records (reference_events)",
                         source=source)
    events = len(trace)
    for k, record in enumerate(records):
        where = f"allocator record {k}"
        if not isinstance(record, dict):
            raise TraceError(f"{where}: not a record ({type(record).__name__})", source=source)
        action = record.get("action")
        if action not in ACTIONS:
            raise TraceError(f"{where}: action {action!r} is not one the allocator records "
                             f"({', '.join(sorted(ACTIONS))})", source=source)
        event = record.get("event")
        if not isinstance(event, int) or not _whole(event) or event >= events:
            raise TraceError(f"{where}: event {event!r} is not an event of the trace "
                             f"(0 to {events - 1:,})", source=source)
        for name in WHOLE_FIELDS:
            if not _whole(record.get(name)):
                raise TraceError(f"{where}: {name} {record.get(name)!r} is not a whole number "
                                 "of bytes", source=source)
    limit = trace.metadata.get("bfc_memory_limit")
    if limit is not None and not _whole(limit):
        raise TraceError(f"bfc_memory_limit {limit!r} is not a whole number of bytes",
                         source=source)
    if not limit:      # none, or 0: the first record's own fields give it
        first = records[0]
        parts = {name: first.get(name) for name in ("available", "reserved")}
        bad = [name for name, value in parts.items() if not _whole(value)]
        if bad:
            raise TraceError(f"allocator record 0: no memory limit (bfc_memory_limit) and "
                             f"{bad[0]} {parts[bad[0]]!r} is not a whole number of bytes to "
                             "read it from", source=source)
        if sum(parts.values()) + first["in_use"] <= 0:
            raise TraceError("allocator record 0: the memory limit it gives is 0",
                             source=source)
    return records
