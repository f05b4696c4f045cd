"""Sharing that shares: two recorded jobs whose steady phases overlap, start offsets swept.

A recorded JAX job spends its first second or more initialising and compiling; its *steady
phase* is the span of its train step's executions, read off the recording: the jit executable
that ran most often (the ``jit(NAME)/temp`` allocations of allocsim's JAX recorder), from its
first execution to the trace's end. An offset ``d`` starts the second job so that its first
train step comes ``d`` seconds after the first job's (the earlier of the two starts at 0), so
``d = 0`` lines the steady phases up, and the swept offsets say per offset how long the two
steady phases overlap — a sweep that never overlaps tests nothing about sharing.

``[[offset_sweeps]]`` (one table per sweep; rows: offset × configuration, a column per
capacity)::

    label = "..."
    traces = ["jit-varying", "jit-donate"]            # first job, second job
    capacities = ["96MiB", "128MiB"]
    offsets = [-0.4, 0, 0.4]                            # seconds, as above
    configs = [["JAX default", "jax", "jax"], ...]     # name, first's policy, second's

``[[fraction_grids]]`` (which XLA_PYTHON_CLIENT_MEM_FRACTION pairs make both fit): every pair
of ``fractions`` (policy ``jax:fraction=F``, JAX's BFC preallocating F × capacity) at every
offset of ``offsets`` on ``capacity``; a cell counts the offsets at which both complete::

    label = "..."
    traces = ["jit-varying", "jit-donate"]
    capacity = "128MiB"
    fractions = [0.2, 0.4, 0.6]
    offsets = [-0.4, 0, 0.4]
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from allocsim.policies import parse_size
from allocsim.sim.kernel.device import DeviceProfile, resolve_device
from allocsim.sim.questions.share import ShareSpec, share
from allocsim.traces.model import Trace

_STEP_TAG = re.compile(r"^(jit\([^)]*\))/temp$")


def steady_phase(trace: Trace) -> tuple[int, int, int]:
    """(first train step, end, executions) in the trace's own ns, measured from its first
    event. The train step is the executable whose temp the recording allocates most often;
    without such tags (not a JAX recording) the whole trace is the steady phase."""
    times = np.asarray(trace.time_ns, dtype=np.int64)
    t0 = int(times[0]) if len(times) else 0
    names = [trace.tags[k] for k in np.asarray(trace.tag)]
    steps = Counter(m.group(1) for n, op in zip(names, np.asarray(trace.op))
                    if op == 0 and (m := _STEP_TAG.match(n)))
    if not steps:
        return 0, int(times[-1]) - t0 if len(times) else 0, 0
    step, count = steps.most_common(1)[0]
    first = next(i for i, n in enumerate(names) if n == f"{step}/temp")
    return int(times[first]) - t0, int(times[-1]) - t0, count


def _starts(phases: list[tuple[int, int, int]], offset_s: float) -> list[int]:
    """Start times putting the second job's first train step ``offset_s`` after the first's."""
    gap = phases[0][0] - phases[1][0] + round(offset_s * 1e9)
    return [0, gap] if gap >= 0 else [-gap, 0]


def overlap_s(phases: list[tuple[int, int, int]], starts: list[int]) -> float:
    """How long both steady phases run at once (seconds, without allocation delays)."""
    lo = max(s + p[0] for s, p in zip(starts, phases))
    hi = min(s + p[1] for s, p in zip(starts, phases))
    return max(0, hi - lo) / 1e9


def _run(traces: list[Trace], policies: list[str], starts: list[int],
         device: DeviceProfile) -> dict[str, Any]:
    specs = [ShareSpec(t.metadata["name"], p, s) for t, p, s in zip(traces, policies, starts)]
    run = share(traces, specs, device)
    return {"completed": [r.completed for r in run.results],
            "peak_reserved": [r.peak_reserved for r in run.results],
            "device_peak": run.device_peak}


Rescale = Callable[[DeviceProfile, float], DeviceProfile]


def offset_sweep(sweep: dict[str, Any], loaded: dict[str, Trace], default_device: str | None,
                 rescale: Rescale | None = None) -> dict[str, Any]:
    """The sweep's outcomes; with ``cost_scales`` (and ``rescale``, execute.scaled_costs) each
    cell is run at every device-call cost scale (the costs delay allocations, so they can move
    who gets memory first) and holds one run per scale."""
    traces = [loaded[label] for label in sweep["traces"]]
    phases = [steady_phase(t) for t in traces]
    scales = [float(x) for x in sweep.get("cost_scales", [1])]
    rows = []
    for offset in sweep["offsets"]:
        starts = _starts(phases, float(offset))
        for name, *policies in sweep["configs"]:
            cells = []
            for capacity in sweep["capacities"]:
                device = resolve_device(sweep.get("device", default_device), capacity)
                runs = [_run(traces, policies, starts,
                             rescale(device, x) if rescale and x != 1 else device)
                        for x in scales]
                cells.append(runs[scales.index(1.0)] if scales == [1.0] else
                             {**runs[0], "by_cost_scale": runs})
            rows.append({"offset_s": float(offset), "starts_ns": starts,
                         "overlap_s": overlap_s(phases, starts), "config": name,
                         "policies": policies, "cells": cells})
    return {"label": sweep["label"], "traces": sweep["traces"], "cost_scales": scales,
            "steady": [{"first_step_ns": p[0], "end_ns": p[1], "steps": p[2]} for p in phases],
            "capacities": [parse_size(c) for c in sweep["capacities"]], "rows": rows}


def fraction_grid(grid: dict[str, Any], loaded: dict[str, Trace],
                  default_device: str | None) -> dict[str, Any]:
    traces = [loaded[label] for label in grid["traces"]]
    phases = [steady_phase(t) for t in traces]
    device = resolve_device(grid.get("device", default_device), grid["capacity"])
    fractions = [float(f) for f in grid["fractions"]]
    both: list[list[int]] = []
    for first in fractions:
        row = []
        for second in fractions:
            policies = [f"jax:fraction={first:g}", f"jax:fraction={second:g}"]
            row.append(sum(all(_run(traces, policies, _starts(phases, float(d)),
                                    device)["completed"]) for d in grid["offsets"]))
        both.append(row)
    return {"label": grid["label"], "traces": grid["traces"], "capacity": device.capacity,
            "fractions": fractions, "offsets": [float(d) for d in grid["offsets"]],
            "both_complete": both}


def _outcome(cell: dict[str, Any]) -> str:
    """Who completes; "varies" where the device-call cost scales disagree."""
    if "by_cost_scale" in cell:
        seen = {_outcome(run) for run in cell["by_cost_scale"]}
        return seen.pop() if len(seen) == 1 else "varies"
    done = cell["completed"]
    if all(done):
        return "both"
    return "neither" if not any(done) else ("1st only" if done[0] else "2nd only")


def render_sweep(s: dict[str, Any]) -> list[str]:
    from allocsim.policies import format_size
    from allocsim.sim.output.tables import format_table

    first, second = s["traces"]
    steady = "; ".join(f"`{label}` first train step at {p['first_step_ns'] / 1e9:.3f} s, "
                       f"{p['steps']} steps to {p['end_ns'] / 1e9:.3f} s"
                       for label, p in zip(s["traces"], s["steady"]))
    header = ["offset", "steady overlap", "config",
              *(f"{format_size(c)}" for c in s["capacities"])]
    rows = [[f"{r['offset_s']:+.2f}s", f"{r['overlap_s']:.3f}s", r["config"],
             *(_outcome(c) for c in r["cells"])] for r in s["rows"]]
    configs = list(dict.fromkeys(r["config"] for r in s["rows"]))
    summary = []
    for name in configs:
        mine = [r for r in s["rows"] if r["config"] == name]
        for k, capacity in enumerate(s["capacities"]):
            outcomes = Counter(_outcome(r["cells"][k]) for r in mine)
            overlapping = [r for r in mine if r["overlap_s"] > 0]
            summary.append([name, format_size(capacity),
                            ", ".join(f"{o} {n}" for o, n in sorted(outcomes.items())),
                            f"{sum(_outcome(r['cells'][k]) == 'both' for r in overlapping)}"
                            f" of {len(overlapping)}"])
    return [f"**{s['label']}** — first job `{first}`, second `{second}`; offset = the second's "
            f"first train step minus the first's (steady phases read off the recordings: "
            f"{steady}). Cells: which jobs complete"
            + (f" at every device-call cost scale ({', '.join(f'×{x:g}' for x in s['cost_scales'])}"
               "; `varies`: not the same at all)" if len(s.get("cost_scales", [1])) > 1 else "")
            + ".", "", "```",
            format_table(rows, header, left=(2,)), "```", "",
            "Per configuration and capacity, over the offsets:", "", "```",
            format_table(summary, ["config", "capacity", "outcomes (offsets)",
                                   "both complete where the steady phases overlap"],
                         left=(0, 2)), "```", ""]


def render_grid(g: dict[str, Any]) -> list[str]:
    from allocsim.policies import format_size
    from allocsim.sim.output.tables import format_table

    n = len(g["offsets"])
    header = [f"{g['traces'][0]} \\ {g['traces'][1]}", *(f"{f:g}" for f in g["fractions"])]
    rows = [[f"{f:g}", *(f"{c}/{n}" for c in row)]
            for f, row in zip(g["fractions"], g["both_complete"])]
    cells = [c for row in g["both_complete"] for c in row]
    return [f"**{g['label']}** on {format_size(g['capacity'])}: XLA_PYTHON_CLIENT_MEM_FRACTION "
            f"of the first job (rows) and the second (columns); a cell counts the offsets "
            f"({', '.join(f'{d:+g}s' for d in g['offsets'])}) at which both complete.", "",
            "```", format_table(rows, header), "```", "",
            f"Both complete at every offset for {sum(c == n for c in cells)} of {len(cells)} "
            f"pairs, at some offsets only for {sum(0 < c < n for c in cells)}, at none for "
            f"{sum(c == 0 for c in cells)}.", ""]


OUTCOME_COLOURS = {"both": "#4daf4a", "1st only": "#ff7f00", "2nd only": "#377eb8",
                   "neither": "#e41a1c", "varies": "#999999"}


def figure(sweeps: list[dict[str, Any]], path: Any,
           metadata: dict[str, str] | None = None) -> None:
    """One panel per sweep: a row per configuration × capacity, a column per offset, coloured
    by who completes; the steady phases' overlap drawn above. ``metadata``: the PNG's text
    chunks (the digest of the results it was drawn from: experiments/runner/figure_data.py)."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from allocsim.policies import format_size
    from allocsim.sim.output.figures import pyplot
    from allocsim.sim.output.files import atomic_savefig

    plt = pyplot()
    names = list(OUTCOME_COLOURS)
    fig, axes = plt.subplots(len(sweeps), 1, figsize=(9, 3.2 * len(sweeps) + 0.6),
                             squeeze=False)
    for ax, s in zip(axes[:, 0], sweeps):
        offsets = list(dict.fromkeys(r["offset_s"] for r in s["rows"]))
        configs = list(dict.fromkeys(r["config"] for r in s["rows"]))
        labels, grid = [], []
        for name in configs:
            for k, capacity in enumerate(s["capacities"]):
                labels.append(f"{name}, {format_size(capacity)}")
                grid.append([names.index(_outcome(next(
                    r for r in s["rows"] if r["config"] == name and r["offset_s"] == d
                )["cells"][k])) for d in offsets])
        ax.imshow(grid, aspect="auto", cmap=ListedColormap(list(OUTCOME_COLOURS.values())),
                  vmin=0, vmax=len(names) - 1, interpolation="nearest")
        overlap = {r["offset_s"]: r["overlap_s"] for r in s["rows"]}
        ax.set_xticks(range(len(offsets)),
                      [f"{d:+.1f}\n({overlap[d]:.2f})" for d in offsets], fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
        ax.set_xlabel("offset of the second job's first train step, s (steady overlap, s)",
                      fontsize=8)
        ax.set_title(s["label"], fontsize=9)
    fig.legend(handles=[Patch(color=c, label=n) for n, c in OUTCOME_COLOURS.items()],
               loc="upper right", fontsize=7, ncol=4, title="completes", title_fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    atomic_savefig(fig, path, dpi=110, metadata=metadata)
    plt.close(fig)
