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
import os
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

BASELINE_VERSION = 1
# Figures compared, and how to show them; lower is better for all of them.
FIGURES = {
    "peak_reserved": format_size,
    "device_calls": lambda v: f"{int(v):,}",
    "alloc_time_s": lambda v: f"{v * 1e3:.4g} ms",
}


def _fingerprint(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


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
    try:
        baseline = json.loads(path.read_text())
        device = DeviceProfile.from_dict(baseline["device"])
        cells = baseline["cells"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserInputError(f"{path}: not an allocsim baseline ({err})") from None
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
