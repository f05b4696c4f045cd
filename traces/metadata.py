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
from typing import Any

from allocsim.traces.model import INT64_MAX, INT64_MIN, TraceError

__all__ = ["SCHEMA", "check_metadata"]

# A check returns the problem with ``value`` (naming the path below the key), or None.
Check = Callable[[Any, str], "str | None"]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def whole(lo: int = 0, hi: int = INT64_MAX, what: str = "a whole number") -> Check:
    """An int (not a bool) in [lo, hi]."""
    def check(value: Any, path: str) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{path} must be {what}, got {_shown(value)}"
        if not lo <= value <= hi:
            return f"{path} must be {what} from {lo:,} to {hi:,}, got {_shown(value)}"
        return None
    return check


COUNT = whole(what="a count")
BYTES = whole(what="a number of bytes")
SIGNED = whole(INT64_MIN, INT64_MAX, "a 64-bit integer")


def text(value: Any, path: str) -> str | None:
    return None if isinstance(value, str) else f"{path} must be text, got {_shown(value)}"


def flag(value: Any, path: str) -> str | None:
    return None if isinstance(value, bool) else f"{path} must be true or false, got " \
        f"{_shown(value)}"


def number(value: Any, path: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value):
        return f"{path} must be a finite number, got {_shown(value)}"
    return None


def optional(inner: Check) -> Check:
    return lambda value, path: None if value is None else inner(value, path)


def either(*checks: Check) -> Check:
    def check(value: Any, path: str) -> str | None:
        problems = [c(value, path) for c in checks]
        return None if None in problems else problems[0]
    return check


def list_of(item: Check) -> Check:
    def check(value: Any, path: str) -> str | None:
        if not isinstance(value, list):
            return f"{path} must be a list, got {_shown(value)}"
        for index, entry in enumerate(value):
            problem = item(entry, f"{path}[{index}]")
            if problem:
                return problem
        return None
    return check


def map_of(item: Check) -> Check:
    """An object with text keys, every value passing ``item``."""
    def check(value: Any, path: str) -> str | None:
        if not isinstance(value, dict):
            return f"{path} must be an object, got {_shown(value)}"
        for key, entry in value.items():
            problem = item(entry, f"{path}[{key!r}]")
            if problem:
                return problem
        return None
    return check


def record(fields: Mapping[str, Check], required: tuple[str, ...] = ()) -> Check:
    """An object whose listed fields pass their checks (others are free) and that holds every
    field in ``required``."""
    def check(value: Any, path: str) -> str | None:
        if not isinstance(value, dict):
            return f"{path} must be an object, got {_shown(value)}"
        for key in required:
            if key not in value:
                return f"{path} has no {key!r}"
        for key, inner in fields.items():
            if key in value:
                problem = inner(value[key], f"{path}[{key!r}]")
                if problem:
                    return problem
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
# What each format's questions read of every entry (fidelity.py, bfc_fidelity.py).
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
    "sdpa_backends": map_of(lambda value, path: None), "inconsistencies": map_of(
        lambda value, path: None),
}


def _format_requirements(metadata: Mapping[str, Any]) -> list[tuple[str, Check]]:
    """The fields a trace of this format's questions need, beyond :data:`SCHEMA`."""
    checks: list[tuple[str, Check]] = []
    required = _REFERENCE_REQUIRED.get(metadata.get("format"))  # type: ignore[arg-type]
    if required and "reference_events" in metadata:
        checks.append(("reference_events",
                       list_of(record(_REFERENCE_FIELDS, required=required))))
    xla = metadata.get("xla")
    if isinstance(xla, dict) and xla.get("view") == "buffers":
        checks.append(("xla", record(_XLA_FIELDS, required=_XLA_BUFFERS_REQUIRED)))
    return checks


def check_metadata(metadata: Mapping[str, Any], source: str) -> None:
    """Raise :class:`TraceError` (``"FILE: metadata 'KEY'...: problem"``) for the first key of
    :data:`SCHEMA` whose value is not of the shape allocsim's readers write. O(size of the
    listed values)."""
    checks = [(key, check) for key, check in SCHEMA.items() if key in metadata]
    for key, check in checks + _format_requirements(metadata):
        problem = check(metadata[key], f"metadata {key!r}")
        if problem:
            raise TraceError(problem, source=source)
