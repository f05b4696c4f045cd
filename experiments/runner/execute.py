"""Run an experiment definition (experiment.toml) into the results dict written as results.json.

The keys of issue 15 (``[sensitivity]``, a trace's ``note``, a scenario's ``both_orders``,
``trace_kinds``) add to the results only when the definition uses one of them, so a definition
written before them gives byte-for-byte the results (and README section) it gave before.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

from allocsim.errors import UserInputError
from allocsim.policies import parse_size
from allocsim.sim.kernel.device import CostModel, DeviceProfile, resolve_device
from allocsim.sim.kernel.results import RunResult
from allocsim.sim.questions.capacity.minimum import min_capacity
from allocsim.sim.questions.compare import DEFAULT_MAX_SLOWDOWN, compare, pick_winner
from allocsim.sim.questions.share import ShareSpec, parse_share_spec, share
from allocsim.traces import formats, synth
from allocsim.traces.model import Trace
from experiments.runner.contrasts import contrast, spread_of
from experiments.runner.portable import machine_details
from experiments.runner.sweeps import fraction_grid, offset_sweep
from experiments.runner.versions import versions_of

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "experiments"


class DefinitionError(UserInputError):
    """An experiment.toml that asks for something the runner cannot do."""


def load_traces(definition: dict[str, Any]) -> tuple[dict[str, Trace], list[str]]:
    traces: dict[str, Trace] = {}
    skipped: list[str] = []
    for entry in definition.get("traces", []):
        label = entry["label"]
        if "generate" in entry:
            trace = synth.generate(entry["generate"], seed=entry.get("seed", 0),
                                   **entry.get("params", {}))
        else:
            path = (ROOT / entry["file"]).resolve()
            if not path.exists() and entry.get("optional"):
                skipped.append(f"{label}: {entry['file']} not present")
                continue
            trace = formats.load(path, **entry.get("options", {}))
            # As written (relative to the repository), so no result holds this machine's path.
            trace.metadata["source"] = entry["file"]
        trace.metadata["name"] = label
        traces[label] = trace
    return traces, skipped


def uses_method_keys(definition: dict[str, Any]) -> bool:
    """Whether the definition uses any key of issue 15 — then the results state each trace's
    kind (recorded or generated) and notes; otherwise they are exactly as before those keys."""
    return bool("sensitivity" in definition or definition.get("trace_kinds")
                or any("note" in t for t in definition.get("traces", []))
                or any(s.get("both_orders") for s in definition.get("scenarios", [])))


def trace_facts(definition: dict[str, Any], loaded: dict[str, Trace]) -> list[dict[str, Any]]:
    """Each loaded trace's label, kind (``recorded``: a ``file``; ``generated``: ``generate``),
    where it came from, its note, and (a file in a stamped data folder) the jax, jaxlib,
    libtpu and XLA versions it came from (experiments/runner/versions.py)."""
    out = []
    for entry in definition.get("traces", []):
        if entry["label"] not in loaded:
            continue
        recorded = "generate" not in entry
        # ``kind`` overrides what a file is called: "compiled" for XLA's own buffer assignment.
        kind = entry.get("kind", "recorded" if recorded else "generated")
        versions = versions_of(Path(entry["file"]), ROOT) if recorded else None
        out.append({"label": entry["label"], "kind": kind,
                    "source": entry["file"] if recorded else entry["generate"],
                    "note": entry.get("note"), **({"versions": versions} if versions else {})})
    return out


def _numbers(table: dict[str, Any], key: str, default: list[float]) -> list[float]:
    values = table.get(key, default)
    if (not isinstance(values, list) or not values
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)):
        raise DefinitionError(f"[sensitivity] {key} must be a non-empty list of numbers, "
                              f"got {values!r}")
    if any(not v > 0 or math.isnan(v) for v in values):
        raise DefinitionError(f"[sensitivity] {key} values must be positive, got {values!r}")
    return [float(v) for v in values]


def sensitivity_grid(definition: dict[str, Any]) -> tuple[list[float], list[float]] | None:
    """The cost scales and slowdown budgets of ``[sensitivity]`` (None when absent)."""
    table = definition.get("sensitivity")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise DefinitionError("sensitivity must be a table: [sensitivity]")
    unknown = sorted(set(table) - {"cost_scale", "max_slowdown"})
    if unknown:
        raise DefinitionError(f"[sensitivity]: unknown key {unknown[0]!r} "
                              "(known: cost_scale, max_slowdown)")
    return (_numbers(table, "cost_scale", [1.0]),
            _numbers(table, "max_slowdown", [DEFAULT_MAX_SLOWDOWN]))


def scaled_costs(device: DeviceProfile, scale: float) -> DeviceProfile:
    """``device`` with every device-call cost (cudaMalloc, cudaFree, map, unmap; base and
    per-GiB) multiplied by ``scale``."""
    if scale == 1:
        return device
    costs = device.costs
    changed: dict[str, Any] = {f.name: getattr(costs, f.name) * scale
                               for f in fields(CostModel) if f.name != "source"}
    changed["source"] = f"{costs.source} ×{scale:g}"
    return replace(device, costs=replace(costs, **changed))


def winners_across(trace: Trace, policies: list[str], device: DeviceProfile,
                   grid: tuple[list[float], list[float]],
                   baseline: list[RunResult]) -> dict[str, Any]:
    """The winner under every cost scale × slowdown budget. Scale 1 reuses ``baseline`` (the
    main comparison's results); other scales replay on the rescaled device. Traces with
    synthesised times are judged without a budget, as :func:`compare` does."""
    scales, budgets = grid
    synthetic = bool(trace.metadata.get("synthetic_times"))
    winners = []
    for scale in scales:
        results = (baseline if scale == 1 else
                   compare(trace, policies, scaled_costs(device, scale)).results)
        for budget in budgets:
            best, _ = pick_winner(results, None if synthetic else budget)
            winners.append({"cost_scale": scale, "max_slowdown": budget,
                            "winner": best.policy if best else None})
    return {"trace": trace.metadata["name"], "budget_applied": not synthetic,
            "winners": winners,
            "stable": len({w["winner"] for w in winners}) == 1}


def reversed_order(specs: list[ShareSpec]) -> list[ShareSpec]:
    """The processes started in the opposite order: the one that started k-th earliest starts
    k-th latest (ties in the order written), and the list is reversed so simultaneous starts
    are also handed to the simulation the other way round. Same order as ``specs``."""
    ranked = sorted(range(len(specs)), key=lambda i: (specs[i].start_ns, i))
    starts = sorted(s.start_ns for s in specs)
    new_start = {index: starts[len(specs) - 1 - rank] for rank, index in enumerate(ranked)}
    return [ShareSpec(s.trace, s.policy, new_start[i]) for i, s in enumerate(specs)]


def _shared(traces: dict[str, Trace], specs: list[ShareSpec],
            profile: DeviceProfile) -> tuple[list[dict[str, Any]], int]:
    run = share([traces[s.trace] for s in specs], specs, profile)
    return ([{"trace": s.trace, "policy": s.policy, "start_ns": s.start_ns,
              "completed": r.completed, "peak_reserved": r.peak_reserved,
              "first_oom_event": r.first_oom_event,
              "first_oom_others": r.to_json_dict()["first_oom_others"]}
             for s, r in zip(specs, run.results)], run.device_peak)


def run_scenario(scenario: dict[str, Any], definition: dict[str, Any],
                 traces: dict[str, Trace]) -> dict[str, Any]:
    profile = resolve_device(scenario.get("device", definition.get("device")),
                             scenario.get("capacity"))
    specs = [parse_share_spec(text) for text in scenario["processes"]]
    processes, peak = _shared(traces, specs, profile)
    out: dict[str, Any] = {"label": scenario["label"], "device": profile.label,
                           "capacity": profile.capacity, "processes": processes,
                           "device_peak": peak}
    if scenario.get("both_orders"):
        # Run in reversed order; the processes are listed as written, so rows line up.
        flipped = reversed_order(specs)
        order = list(range(len(specs)))[::-1]
        rows, peak = _shared(traces, [flipped[i] for i in order], profile)
        by_index = dict(zip(order, rows))
        out["reversed"] = {"processes": [by_index[i] for i in range(len(specs))],
                           "device_peak": peak}
    return out


def resolution(setting: str, trace: Trace) -> int:
    """A size, or "auto": the power of two nearest 1/1024 of the trace's peak live (≥ 512 B),
    so small and large traces are both answered to about 0.1%."""
    if setting != "auto":
        return parse_size(setting)
    peak, _ = trace.peak_live()
    return max(512, 1 << max(0, (peak // 1024).bit_length() - 1))


def execute(folder: Path, say: Callable[..., None] | None = None) -> dict[str, Any]:
    """The results of ``folder/experiment.toml`` (nothing written)."""
    say = say or (lambda *a: print(*a, file=sys.stderr))
    name = folder.name
    definition = tomllib.loads((folder / "experiment.toml").read_text())
    device = resolve_device(definition.get("device"), definition.get("capacity"))
    policies = definition.get("policies", [])
    grid = sensitivity_grid(definition)
    traces, skipped = load_traces(definition)
    comparisons, capacities, scenarios, sensitivity = [], [], [], []
    for label, trace in traces.items():
        entry = next(t for t in definition["traces"] if t["label"] == label)
        if policies and entry.get("compare", True):
            say(f"[{name}] compare {label} ({len(trace):,} events)")
            comparison = compare(trace, policies, device)
            comparisons.append(comparison.to_json_dict())
            if grid is not None:
                say(f"[{name}] sensitivity {label}")
                sensitivity.append(winners_across(trace, policies, device, grid,
                                                  comparison.results))
        if definition.get("min_capacity"):
            step = resolution(definition.get("resolution", "auto"), trace)
            for policy in definition.get("capacity_policies", policies):
                say(f"[{name}] min-capacity {label} {policy}")
                answer = min_capacity(trace, policy, device, resolution=step)
                capacities.append({"trace": label, **answer.to_json_dict()})
    for scenario in definition.get("scenarios", []):
        say(f"[{name}] share {scenario['label']}")
        scenarios.append(run_scenario(scenario, definition, traces))
    results: dict[str, Any] = {
        "experiment": name, "title": definition.get("title", name), "device": device.label,
        "skipped": skipped, "comparisons": comparisons, "capacities": capacities,
        "scenarios": scenarios}
    if uses_method_keys(definition):
        results["traces"] = trace_facts(definition, traces)
    if grid is not None:
        results["sensitivity"] = {"cost_scale": grid[0], "max_slowdown": grid[1],
                                  "traces": sensitivity}
    # Added keys (issue 30): each appears only when the definition uses it.
    compiled = [{"trace": label, "target": t.metadata["xla_gpu"]["target"],
                 **{k: e[k] for k in ("argument", "output", "alias", "temp", "peak_bytes")}}
                for label, t in traces.items() if isinstance(t.metadata.get("xla_gpu"), dict)
                for e in t.metadata["xla_gpu"].get("executables", [])[:1]]
    if compiled and definition.get("compiled_table"):
        results["compiled"] = compiled
    if definition.get("contrasts"):
        results["contrasts"] = [contrast(entry, traces, capacities)
                                for entry in definition["contrasts"]]
    if definition.get("spreads"):
        results["spreads"] = [spread_of(entry, capacities) for entry in definition["spreads"]]
    if definition.get("offset_sweeps"):
        say(f"[{name}] offset sweeps")
        results["offset_sweeps"] = [offset_sweep(entry, traces, definition.get("device"),
                                                 scaled_costs)
                                    for entry in definition["offset_sweeps"]]
    if definition.get("sweep_findings"):
        results["sweep_findings"] = [{"claim": f["claim"], "config": f["config"],
                                      "capacities": [parse_size(c) for c in f["capacities"]],
                                      **({"kind": f["kind"]} if "kind" in f else {})}
                                     for f in definition["sweep_findings"]]
    if definition.get("fraction_grids"):
        say(f"[{name}] fraction grids")
        results["fraction_grids"] = [fraction_grid(entry, traces, definition.get("device"))
                                     for entry in definition["fraction_grids"]]
    found = machine_details(results)
    if found:
        raise DefinitionError(f"{name}: the results would hold a machine detail ({found[0]}); "
                              "name files relative to the repository")
    return results
