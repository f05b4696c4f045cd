"""CI regression checks: record a baseline of figures, re-run, fail on what got worse.

``allocsim baseline TRACES... --policies ... -o baseline.json`` replays each trace through each
policy and records, per (trace, policy): completed, OOMs, peak reserved, device calls and
modelled allocator time, with the device and a fingerprint of each trace file.
``allocsim check baseline.json [--tolerance 1%]`` re-runs the same cells and exits 1 with a
readable diff when any figure got worse beyond the tolerance (OOMs and "completed" have no
tolerance: any new OOM is a regression); improvements are reported; exit 0 otherwise.
Trace paths are stored relative to the baseline file, so the pair can live in a repository.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocsim.errors import UserInputError
from allocsim.policies import format_size
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.results import RunResult
from allocsim.sim.questions.compare import compare, normalize_spec
from allocsim.traces import formats
from allocsim.traces.formats.limits import read_input, read_input_text

BASELINE_VERSION = 1
# Figures compared, and how to show them; lower is better for all of them.
FIGURES = {
    "peak_reserved": format_size,
    "device_calls": lambda v: f"{int(v):,}",
    "alloc_time_s": lambda v: f"{v * 1e3:.4g} ms",
}


def _fingerprint(path: Path) -> str:
    return hashlib.sha256(read_input(path)).hexdigest()[:16]


def _figures(result: RunResult) -> dict[str, Any]:
    return {"completed": result.completed, "ooms": result.ooms,
            "peak_reserved": result.peak_reserved,
            "device_calls": result.device_mallocs + result.device_frees,
            "alloc_time_s": round(result.alloc_time_s, 9)}


def make_baseline(trace_paths: Sequence[str], policies: Sequence[str], device: DeviceProfile,
                  baseline_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Run every (trace, policy) and return the baseline document (paths relative to it)."""
    home = Path(baseline_path).resolve().parent
    specs = [str(normalize_spec(p)) for p in policies]
    cells = []
    for path in trace_paths:
        trace = formats.load(path)
        comparison = compare(trace, specs, device)
        for result in comparison.results:
            cells.append({"trace": os.path.relpath(Path(path).resolve(), home),
                          "fingerprint": _fingerprint(Path(path)), "policy": result.policy,
                          **_figures(result)})
    return {"allocsim_baseline": BASELINE_VERSION, "device": device.as_dict(),
            "policies": specs, "cells": cells}


# What each field of a baseline holds, as sim/output/schemas/baseline.schema.json says (kept
# by hand so that the core needs no jsonschema): (name, kind, minimum or None).
_CELL_FIELDS = (("trace", "string", None), ("fingerprint", "string", None),
                ("policy", "string", None), ("completed", "boolean", None),
                ("ooms", "integer", 0), ("peak_reserved", "integer", 0),
                ("device_calls", "integer", 0), ("alloc_time_s", "number", 0))
_DEVICE_FIELDS = (("name", "string", None), ("capacity", "integer", 1),
                  ("granularity", "integer", 1), ("map_granularity", "integer", 1),
                  ("costs", "object", None), ("source", "string", None),
                  ("context_bytes", "integer", 0))
_DEVICE_REQUIRED = ("name", "capacity")
_COST_FIELDS = (*((key, "number", 0) for key in (
    "malloc_base_s", "malloc_per_gib_s", "free_base_s", "free_per_gib_s", "map_base_s",
    "map_per_gib_s", "unmap_base_s")), ("source", "string", None))
_FINGERPRINT = re.compile(r"[0-9a-f]{16}")


def _kind_problem(where: str, value: Any, kind: str, minimum: float | None) -> str | None:
    """Why ``value`` is not a JSON ``kind`` (at least ``minimum``), or None when it is."""
    checks = {"string": lambda v: isinstance(v, str),
              "boolean": lambda v: isinstance(v, bool),
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)
                                   and math.isfinite(v)),
              "object": lambda v: isinstance(v, dict),
              "array": lambda v: isinstance(v, list)}
    article = "an" if kind[0] in "aeiou" else "a"
    if not checks[kind](value):
        return f"{where} must be {article} {kind}, got {json.dumps(value)[:40]}"
    if minimum is not None and value < minimum:
        return f"{where} must be {article} {kind} >= {minimum}, got {json.dumps(value)[:40]}"
    return None


def _object_problem(where: str, data: Any, fields: Sequence[tuple[str, str, float | None]],
                    required: Sequence[str]) -> str | None:
    """The first problem of the JSON object ``data`` with ``fields`` (others refused)."""
    if not isinstance(data, dict):
        return f"{where or 'the document'} must be an object, got {json.dumps(data)[:40]}"
    prefix = f"{where}." if where else ""
    for key in required:
        if key not in data:
            return f"{prefix}{key} is missing"
    known = {name for name, _, _ in fields}
    for key in data:
        if key not in known:
            return f"{prefix}{key} is not a baseline field"
    for name, kind, minimum in fields:
        if name in data:
            problem = _kind_problem(prefix + name, data[name], kind, minimum)
            if problem:
                return problem
    return None


def baseline_problem(document: Any) -> str | None:
    """The first way ``document`` is not what :func:`make_baseline` writes (the shape of
    ``baseline.schema.json``), naming the field, e.g. ``cells[2].ooms is missing``; None
    when it is a baseline."""
    top = (("allocsim_baseline", "integer", None), ("device", "object", None),
           ("policies", "array", None), ("cells", "array", None))
    problem = _object_problem("", document, top, [name for name, _, _ in top])
    if problem:
        return problem
    if document["allocsim_baseline"] != BASELINE_VERSION:
        return (f"allocsim_baseline is {document['allocsim_baseline']}; this allocsim reads "
                f"version {BASELINE_VERSION}")
    device = document["device"]
    problem = _object_problem("device", device, _DEVICE_FIELDS, _DEVICE_REQUIRED)
    if problem:
        return problem
    if "costs" in device:
        problem = _object_problem("device.costs", device["costs"], _COST_FIELDS, ())
        if problem:
            return problem
    policies = document["policies"]
    if not policies:
        return "policies is empty"
    for index, spec in enumerate(policies):
        problem = _kind_problem(f"policies[{index}]", spec, "string", None)
        if problem:
            return problem
    for index, cell in enumerate(document["cells"]):
        where = f"cells[{index}]"
        problem = _object_problem(where, cell, _CELL_FIELDS, [name for name, _, _ in _CELL_FIELDS])
        if problem:
            return problem
        if not _FINGERPRINT.fullmatch(cell["fingerprint"]):
            return (f"{where}.fingerprint must be 16 lowercase hex digits, "
                    f"got {cell['fingerprint']!r}")
    return None


@dataclass
class CheckOutcome:
    regressions: list[str]
    improvements: list[str]
    notes: list[str]

    @property
    def ok(self) -> bool:
        return not self.regressions

    def text(self) -> str:
        lines = []
        for title, items in (("REGRESSIONS", self.regressions), ("improvements", self.improvements),
                             ("notes", self.notes)):
            if items:
                lines.append(f"{title}:")
                lines.extend(f"  {item}" for item in items)
        verdict = "check failed" if self.regressions else "check passed"
        return "\n".join([*lines, f"{verdict}: {len(self.regressions)} regression(s), "
                                   f"{len(self.improvements)} improvement(s)"])


def check_baseline(baseline_path: str | os.PathLike[str], tolerance: float = 0.01) -> CheckOutcome:
    """Re-run the baseline's cells and compare (``tolerance`` is relative, 0.01 = 1%)."""
    path = Path(baseline_path)
    text = read_input_text(path, what="an allocsim baseline")
    try:
        baseline = json.loads(text)
    except ValueError as err:  # JSONDecodeError
        raise UserInputError(f"{path}: not an allocsim baseline: not JSON ({err})") from None
    except RecursionError:
        raise UserInputError(f"{path}: not an allocsim baseline: JSON nested too "
                             "deeply") from None
    problem = baseline_problem(baseline)
    if problem:
        raise UserInputError(f"{path}: not an allocsim baseline: {problem}")
    try:
        device = DeviceProfile.from_dict(baseline["device"])
    except (ValueError, TypeError) as err:
        raise UserInputError(f"{path}: not an allocsim baseline: device: {err}") from None
    cells = baseline["cells"]
    home = path.resolve().parent
    regressions: list[str] = []
    improvements: list[str] = []
    notes: list[str] = []
    by_trace: dict[str, list[dict]] = {}
    for cell in cells:
        by_trace.setdefault(cell["trace"], []).append(cell)
    for trace_name, trace_cells in by_trace.items():
        trace_path = home / trace_name
        if _fingerprint(trace_path) != trace_cells[0]["fingerprint"]:
            notes.append(f"{trace_name}: the trace file changed since the baseline")
        trace = formats.load(trace_path)
        results = compare(trace, [c["policy"] for c in trace_cells], device).results
        for cell, result in zip(trace_cells, results):
            now = _figures(result)
            where = f"{trace_name} / {cell['policy']}"
            if cell["completed"] and not now["completed"]:
                regressions.append(f"{where}: completed before, now runs out of memory "
                                   f"({now['ooms']} OOMs)")
            elif now["ooms"] > cell["ooms"]:
                regressions.append(f"{where}: OOMs {cell['ooms']} -> {now['ooms']}")
            elif now["ooms"] < cell["ooms"]:
                improvements.append(f"{where}: OOMs {cell['ooms']} -> {now['ooms']}")
            for key, show in FIGURES.items():
                before, after = cell[key], now[key]
                if after > before * (1 + tolerance) and after - before > 1e-12:
                    change = f"+{(after / before - 1):.1%}" if before else "new"
                    regressions.append(f"{where}: {key} {show(before)} -> {show(after)} ({change})")
                elif after < before * (1 - tolerance):
                    improvements.append(f"{where}: {key} {show(before)} -> {show(after)} "
                                        f"(-{(1 - after / before):.1%})")
    return CheckOutcome(regressions, improvements, notes)
