"""Reading results files for ``allocsim report``: every field the page shows, checked first.

A results file is input like any other: a user may hand-edit it, or hand over one from
someone else. Each field the report reads is checked for its kind and range before anything
is drawn, so that a missing field, a size given as a string or a number past what any device
holds (``1e400``, ``10**400``) is one line naming the file, the document and the field —
never a ``KeyError``, ``OverflowError`` or a silently wrong figure. Strings are only ever
shown escaped (sim/output/html_report.py); here they are only checked to be strings.

The checks follow the JSON Schemas of the documents (sim/output/schemas/results.schema.json,
min-capacity.schema.json) for the fields the page reads; jsonschema itself is a test
dependency, not a core one, and gives no bound on integer size.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from allocsim.errors import UserInputError
from allocsim.traces.formats.limits import read_input_text
from allocsim.traces.model import TraceError

INT64_MAX = (1 << 63) - 1
MAX_RESULTS_BYTES = 1 << 30     # a results file is kilobytes to megabytes; refuse a runaway


class Problem(Exception):
    """One field that is not what the report needs: where it is and what is wrong."""


def _whole(value: Any, where: str, *, low: int = 0, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT64_MAX:
        shown = json.dumps(value)[:40] if not isinstance(value, int) or abs(value) < 1 << 70 \
            else f"a number of {len(str(abs(value)))} digits"
        raise Problem(f"{where}: expected a whole number from {low} to 2^63-1"
                      f"{' or null' if nullable else ''}, got {shown}")


def _number(value: Any, where: str, *, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not -1e300 < value < 1e300:
        shown = (json.dumps(value)[:40] if isinstance(value, (str, float))
                 else "a number past 1e300" if isinstance(value, int) else type(value).__name__)
        raise Problem(f"{where}: expected a finite number{' or null' if nullable else ''}, "
                      f"got {shown}")


def _text(value: Any, where: str, *, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if not isinstance(value, str):
        raise Problem(f"{where}: expected a string, got {type(value).__name__}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # JSON's "\ud800": no font draws it, and matplotlib refuses it with a TypeError.
            raise Problem(f"{where}: not text (it holds a lone UTF-16 surrogate)") from None


def _flag(value: Any, where: str) -> None:
    if not isinstance(value, bool):
        raise Problem(f"{where}: expected true or false, got {json.dumps(value)[:40]}")


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Problem(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise Problem(f"{where}: expected an array, got {type(value).__name__}")
    return value


def _field(data: dict[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise Problem(f"{where}: missing field '{key}'")
    return data[key]


TIMELINE_ARRAYS = ("event", "time_ns", "allocated", "reserved", "in_use")


def _timeline(value: Any, where: str) -> None:
    timeline = _object(value, where)
    lengths = set()
    for key in (*TIMELINE_ARRAYS, "trace_time_ns"):
        if key not in timeline and key in ("in_use", "trace_time_ns"):
            continue            # older files: in_use falls back to allocated
        array = _list(_field(timeline, key, where), f"{where}.{key}")
        for index, item in enumerate(array):
            _whole(item, f"{where}.{key}[{index}]", low=-INT64_MAX if "time" in key else 0)
        lengths.add(len(array))
    if len(lengths) > 1:
        raise Problem(f"{where}: its arrays differ in length ({sorted(lengths)})")


def _trace(value: Any, where: str) -> None:
    trace = _object(value, where)
    _text(_field(trace, "name", where), f"{where}.name")
    _text(trace.get("source", ""), f"{where}.source")
    for key in ("events", "allocs", "peak_live"):
        if key in trace or key == "peak_live":
            _whole(_field(trace, key, where), f"{where}.{key}")
    if "duration_s" in trace:
        _number(trace["duration_s"], f"{where}.duration_s")


def _result(value: Any, where: str) -> None:
    result = _object(value, where)
    _text(_field(result, "policy", where), f"{where}.policy")
    _flag(_field(result, "completed", where), f"{where}.completed")
    for key in ("peak_reserved", "peak_allocated", "ooms", "device_mallocs", "device_frees"):
        _whole(_field(result, key, where), f"{where}.{key}")
    for key in ("external_fragmentation",):
        _whole(result.get(key, 0), f"{where}.{key}")
    _number(_field(result, "alloc_time_s", where), f"{where}.alloc_time_s")
    for key in ("slowdown", "fragmentation", "utilization", "external_fragmentation_mean"):
        if key in result:
            _number(result[key], f"{where}.{key}")
    for key in ("first_oom_event", "first_oom_size"):
        _whole(result.get(key), f"{where}.{key}", nullable=True)
    if result.get("timeline") is not None:
        _timeline(result["timeline"], f"{where}.timeline")


def _comparison(doc: dict[str, Any]) -> None:
    _trace(_field(doc, "trace", "document"), "trace")
    device = _object(_field(doc, "device", "document"), "device")
    _text(_field(device, "name", "device"), "device.name")
    _whole(_field(device, "capacity", "device"), "device.capacity")
    results = _list(doc["results"], "results")
    if not results:
        raise Problem("results: empty: no policy to show")
    for index, result in enumerate(results):
        _result(result, f"results[{index}]")
    _text(doc.get("winner"), "winner", nullable=True)
    _text(doc.get("reason", ""), "reason")
    _number(doc.get("max_slowdown"), "max_slowdown", nullable=True)


def _capacity(doc: dict[str, Any]) -> None:
    _trace(_field(doc, "trace", "document"), "trace")
    for index, answer in enumerate(_list(doc["answers"], "answers")):
        where = f"answers[{index}]"
        answer = _object(answer, where)
        _text(_field(answer, "policy", where), f"{where}.policy")
        _whole(_field(answer, "min_capacity", where), f"{where}.min_capacity", nullable=True)
        _whole(_field(answer, "lower_bound", where), f"{where}.lower_bound")
        _whole(answer.get("headroom"), f"{where}.headroom", nullable=True)
        _flag(answer.get("monotone", True), f"{where}.monotone")


def check_document(doc: dict[str, Any]) -> None:
    """Raise :class:`Problem` for the first field the report cannot show as it stands."""
    if "results" in doc:
        _comparison(doc)
    else:
        _capacity(doc)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def load_results(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Result documents from files: compare results.json (object or array), min_capacity.json;
    every field the report shows checked (one :class:`UserInputError` line otherwise)."""
    documents: list[dict[str, Any]] = []
    for path in paths:
        try:
            # The one guard every reader uses (traces/formats/limits.py): a regular file only
            # (a FIFO or /dev/zero is refused, never read), at most MAX_RESULTS_BYTES.
            text = read_input_text(path, limit=MAX_RESULTS_BYTES, what="a results file")
            data = json.loads(text, parse_constant=_refuse_constant)
        except TraceError:
            raise
        except RecursionError:
            raise UserInputError(f"{path}: cannot read results: nested too deeply") from None
        except (OSError, ValueError) as err:
            raise UserInputError(f"{path}: cannot read results: {err}") from None
        items = data if isinstance(data, list) else [data]
        for number, item in enumerate(items):
            label = f"document {number + 1}: " if len(items) > 1 else ""
            if not isinstance(item, dict) or not ("results" in item or "answers" in item):
                raise UserInputError(f"{path}: {label}not an allocsim results file "
                                     "(no 'results' or 'answers')")
            try:
                check_document(item)
            except Problem as problem:
                raise UserInputError(f"{path}: {label}{problem}") from None
            documents.append(item)
    return documents
