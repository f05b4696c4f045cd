"""The metadata keys allocsim's readers write and its questions read back, checked once where
a trace is loaded.

A native file (``.npz``, ``.csv``, ``.jsonl``) carries its metadata as JSON that anyone may
have written; the questions read it as if an importer had (``fidelity`` reads
``bfc_memory_limit`` as a byte count and ``xla["alignment"]`` as a positive one, ``info``
formats ``prologue_events`` with ``:,``). So every key in :data:`SCHEMA` that a trace holds is
checked against the shape its readers write, and a value of another shape is one line naming
the file and the key (:func:`check_metadata`) — not a ``TypeError``, a ``KeyError`` or a
"limit -1.00TiB" later. Keys not listed are free-form (printed, never computed with).

Fields a question needs are *required* where the format that writes them always does
(``reference_events`` of a PyTorch snapshot, ``xla`` of an XLA dump's buffers view), so a
trace that claims that format holds them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from allocsim.traces.model import INT64_MAX, INT64_MIN, TraceError

__all__ = ["SCHEMA", "check_metadata"]

class Bad(NamedTuple):
    """What a check found: where below the key (``['size']``, ``[3]``) and what is wrong."""

    path: str
    problem: str


# A check returns None for a value of its shape, else a :class:`Bad`. The path is built only
# on the way out of a failure (checking 200,000 reference events builds no string).
Check = Callable[[Any], "Bad | None"]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def whole(lo: int = 0, hi: int = INT64_MAX, what: str = "a whole number") -> Check:
    """An int (not a bool) in [lo, hi]."""
    def check(value: Any) -> Bad | None:
        if type(value) is int and lo <= value <= hi:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            return Bad("", f"must be {what}, got {_shown(value)}")
        if not lo <= value <= hi:
            return Bad("", f"must be {what} from {lo:,} to {hi:,}, got {_shown(value)}")
        return None
    return check


COUNT = whole(what="a count")
BYTES = whole(what="a number of bytes")
SIGNED = whole(INT64_MIN, INT64_MAX, "a 64-bit integer")


def text(value: Any) -> Bad | None:
    return None if isinstance(value, str) else Bad("", f"must be text, got {_shown(value)}")


def flag(value: Any) -> Bad | None:
    return None if isinstance(value, bool) else Bad(
        "", f"must be true or false, got {_shown(value)}")


def number(value: Any) -> Bad | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value):
        return Bad("", f"must be a finite number, got {_shown(value)}")
    return None


def anything(value: Any) -> Bad | None:
    return None


def optional(inner: Check) -> Check:
    return lambda value: None if value is None else inner(value)


def list_of(item: Check) -> Check:
    def check(value: Any) -> Bad | None:
        if not isinstance(value, list):
            return Bad("", f"must be a list, got {_shown(value)}")
        for index, entry in enumerate(value):
            bad = item(entry)
            if bad:
                return Bad(f"[{index}]{bad.path}", bad.problem)
        return None
    return check


def map_of(item: Check) -> Check:
    """An object, every value passing ``item``."""
    def check(value: Any) -> Bad | None:
        if not isinstance(value, dict):
            return Bad("", f"must be an object, got {_shown(value)}")
        for key, entry in value.items():
            bad = item(entry)
            if bad:
                return Bad(f"[{key!r}]{bad.path}", bad.problem)
        return None
    return check


def record(fields: Mapping[str, Check], required: tuple[str, ...] = ()) -> Check:
    """An object whose listed fields pass their checks (others are free) and that holds every
    field in ``required``."""
    def check(value: Any) -> Bad | None:
        if not isinstance(value, dict):
            return Bad("", f"must be an object, got {_shown(value)}")
        for key in required:
            if key not in value:
                return Bad("", f"has no {key!r}")
        for key, entry in value.items():
            inner = fields.get(key)
            if inner is not None:
                bad = inner(entry)
                if bad:
                    return Bad(f"[{key!r}]{bad.path}", bad.problem)
        return None
    return check


# -- the keys -------------------------------------------------------------------------------
_ADDRESS = whole(0, INT64_MAX, "an address")
_REFERENCE_FIELDS: dict[str, Check] = {
    "action": text, "event": COUNT, "addr": optional(_ADDRESS), "size": optional(BYTES),
    "stream": optional(SIGNED), "time_ns": optional(SIGNED), "device_free": optional(BYTES),
    "requested": optional(BYTES), "chunk": optional(BYTES), "in_use": optional(BYTES),
    "available": optional(BYTES), "reserved": optional(BYTES), "peak": optional(BYTES),
    "fragmentation": optional(number),
}
# What each format's questions read of every entry (fidelity.py, fidelity/bfc.py).
_REFERENCE_REQUIRED = {
    "torch-snapshot": ("action", "addr", "size", "event"),
    "xplane": ("action", "event", "addr", "chunk", "in_use"),
}
_BLOCK = record({"size": BYTES, "requested_size": BYTES, "address": _ADDRESS, "state": text},
                required=("size", "state"))
_SEGMENT = record({"address": _ADDRESS, "total_size": BYTES, "stream": SIGNED,
                   "segment_type": text, "is_expandable": flag, "allocated_size": BYTES,
                   "active_size": BYTES, "requested_size": BYTES, "blocks": list_of(_BLOCK)},
                  required=("address", "total_size", "blocks"))
_ANOMALY = record({"count": COUNT, "first_event": optional(COUNT), "problem": text},
                  required=("count",))
_XLA_FIELDS: dict[str, Check] = {
    "module": text, "platform": text, "view": text, "alignment": whole(1, 1 << 30,
                                                                       "an alignment in bytes"),
    "values": COUNT, "shared_values": COUNT, "overlap_merges": COUNT, "buffers": COUNT,
    "left_out": map_of(COUNT), "id_ranges": map_of(list_of(COUNT)),
    **dict.fromkeys(("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes",
                     "constant_bytes", "total_bytes"), BYTES),
}
# What xla_fidelity reads of a buffers-view module.
_XLA_BUFFERS_REQUIRED = ("module", "platform", "alignment", "values", "shared_values",
                         "left_out", "id_ranges", "argument_bytes", "output_bytes",
                         "alias_bytes", "temp_bytes", "constant_bytes", "total_bytes")

SCHEMA: dict[str, Check] = {
    "name": text, "source": text, "format": text,
    "devices": map_of(COUNT), "device_segments": map_of(COUNT),
    "prologue_events": COUNT, "prologue_bytes": BYTES, "time_ties": COUNT,
    "synthetic_times": flag, "listing": list_of(text), "not_modelled": list_of(text),
    "partial": text, "target": text, "backing": text,
    "cublas_workspaces": COUNT, "cublas_workspace_bytes": BYTES,
    "total_reserved_max": BYTES, "total_allocated_first": SIGNED,
    "unrecorded_live_bytes": record({"min": SIGNED, "max": SIGNED}, required=("min", "max")),
    "bfc_memory_limit": BYTES,
    "reference_events": list_of(record(_REFERENCE_FIELDS, required=("action", "event"))),
    "initial_segments": list_of(_SEGMENT),
    "validation": record({"summary": text, "repairs": map_of(COUNT)}),
    "address_anomalies": map_of(_ANOMALY), "entry_anomalies": map_of(_ANOMALY),
    "size_anomalies": map_of(_ANOMALY),
    "xla": record(_XLA_FIELDS, required=("module", "platform", "alignment")),
    "xla_gpu": record({"target": text, "device_memory_size": BYTES}),
    "sdpa_backends": map_of(anything), "inconsistencies": map_of(anything),
}


def _checks(metadata: Mapping[str, Any]) -> dict[str, Check]:
    """The check of each key ``metadata`` holds: :data:`SCHEMA`'s, or, where the trace's
    format always writes more (the fields its questions read), that stricter one."""
    checks = {key: check for key, check in SCHEMA.items() if key in metadata}
    required = _REFERENCE_REQUIRED.get(metadata.get("format"))  # type: ignore[arg-type]
    if required and "reference_events" in metadata:
        checks["reference_events"] = list_of(record(_REFERENCE_FIELDS, required=required))
    xla = metadata.get("xla")
    if isinstance(xla, dict) and xla.get("view") == "buffers":
        checks["xla"] = record(_XLA_FIELDS, required=_XLA_BUFFERS_REQUIRED)
    return checks


def check_metadata(metadata: Mapping[str, Any], source: str) -> None:
    """Raise :class:`TraceError` (``"FILE: metadata 'KEY'[...] problem"``) for the first key of
    :data:`SCHEMA` whose value is not of the shape allocsim's readers write. O(size of the
    listed values), about 1 µs per field."""
    for key, check in _checks(metadata).items():
        bad = check(metadata[key])
        if bad:
            raise TraceError(f"metadata {key!r}{bad.path} {bad.problem}", source=source)
