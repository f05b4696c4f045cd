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

A sweep may also give each process memory outside its allocator (issue 40: a real card gives
every process its own CUDA context and loads module images at its first step), as amounts on
a real card scaled to each capacity of the sweep (× capacity / ``outside_card``, the card the
amounts are of): every cell is run again at each level; the context is taken when the process
starts, the first-step load just before its first train step (the first ``jit(NAME)/temp``
alloc; the first event without such tags) — sim/kernel/engine.py's SharedProcess::

    outside_card = "40GiB"
    outside = [["0", "0"], ["300MiB", "0"], ["500MiB", "400MiB"]]   # [context, first-step load]

``[[sweep_findings]]`` (verdict words computed from the sweeps, not written by hand): a claim
that a configuration's two jobs both complete at every offset, in every sweep (start order)
that runs it, on ``capacities``, judged at every level of ``outside``; the verdict is
**supported** where it holds at every capacity and level, **not supported** where at none,
**depends** otherwise, with the part of the population it holds over::

    claim = "..."
    config = "JAX default (75% each)"
    capacities = ["112MiB", "160MiB"]
    kind = "race"        # optional: instead, in every start order both complete at some
                         # offsets, the first job alone at others and the second alone at
                         # others (who dies depends on the timing)

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
from dataclasses import replace
from typing import Any

import numpy as np

from allocsim.policies import parse_size
from allocsim.sim.kernel.device import DeviceProfile, resolve_device
from allocsim.sim.questions.share import OutsideMemory, ShareSpec, share
from allocsim.traces.model import Trace

_STEP_TAG = re.compile(r"^(jit\([^)]*\))/temp$")


def _train_step(trace: Trace) -> tuple[int, int] | None:
    """(index of the first train step's first event, executions): the train step is the
    executable whose temp the recording allocates most often; None without such tags."""
    if not trace.tags:                       # no tags at all (tag 0 names nothing)
        return None
    names = [trace.tags[k] for k in np.asarray(trace.tag)]
    steps = Counter(m.group(1) for n, op in zip(names, np.asarray(trace.op))
                    if op == 0 and (m := _STEP_TAG.match(n)))
    if not steps:
        return None
    step, count = steps.most_common(1)[0]
    return next(i for i, n in enumerate(names) if n == f"{step}/temp"), count


def steady_phase(trace: Trace) -> tuple[int, int, int]:
    """(first train step, end, executions) in the trace's own ns, measured from its first
    event. The train step is the executable whose temp the recording allocates most often;
    without such tags (not a JAX recording) the whole trace is the steady phase."""
    times = np.asarray(trace.time_ns, dtype=np.int64)
    t0 = int(times[0]) if len(times) else 0
    step = _train_step(trace)
    if step is None:
        return 0, int(times[-1]) - t0 if len(times) else 0, 0
    first, count = step
    return int(times[first]) - t0, int(times[-1]) - t0, count


def first_step_event(trace: Trace) -> int:
    """The event before which a process loads what its first step needs (module images): its
    first train step's first event (0 without train-step tags)."""
    step = _train_step(trace)
    return 0 if step is None else step[0]


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
         device: DeviceProfile, outside: list[OutsideMemory] | None = None) -> dict[str, Any]:
    specs = [ShareSpec(t.metadata["name"], p, s) for t, p, s in zip(traces, policies, starts)]
    if outside is not None:
        specs = [replace(spec, outside=held) for spec, held in zip(specs, outside)]
    run = share(traces, specs, device)
    return {"completed": [r.completed for r in run.results],
            "peak_reserved": [r.peak_reserved for r in run.results],
            "device_peak": run.device_peak,
            **({"refused": run.refused_outside} if outside is not None else {})}


def failures(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many processes died over ``rows`` (every cell, cost scale and job), by what the
    device refused them: ``allocator`` (a malloc), ``context``, ``first-step load``."""
    seen: Counter[str] = Counter()
    for row in rows:
        for cell in row["cells"]:
            for run in cell.get("by_cost_scale", [cell]):
                refused = run.get("refused") or [None] * len(run["completed"])
                seen.update(why or "allocator" for done, why in zip(run["completed"], refused)
                            if not done)
    return dict(sorted(seen.items()))


def scaled(nbytes: int, capacity: int, card: int) -> int:
    """``nbytes`` on a ``card``-byte card as the same share of a ``capacity``-byte one."""
    return nbytes * capacity // card


Rescale = Callable[[DeviceProfile, float], DeviceProfile]


def offset_sweep(sweep: dict[str, Any], loaded: dict[str, Trace], default_device: str | None,
                 rescale: Rescale | None = None) -> dict[str, Any]:
    """The sweep's outcomes; with ``cost_scales`` (and ``rescale``, execute.scaled_costs) each
    cell is run at every device-call cost scale (the costs delay allocations, so they can move
    who gets memory first) and holds one run per scale."""
    traces = [loaded[label] for label in sweep["traces"]]
    phases = [steady_phase(t) for t in traces]
    scales = [float(x) for x in sweep.get("cost_scales", [1])]
    loads_at = [first_step_event(t) for t in traces]

    def rows_at(context: int = 0, first_step: int = 0, card: int = 1) -> list[dict[str, Any]]:
        rows = []
        for offset in sweep["offsets"]:
            starts = _starts(phases, float(offset))
            for name, *policies in sweep["configs"]:
                cells = []
                for capacity in sweep["capacities"]:
                    device = resolve_device(sweep.get("device", default_device), capacity)
                    # Outside each allocator, scaled to this capacity (none: as before).
                    outside = ([OutsideMemory(scaled(context, device.capacity, card),
                                              scaled(first_step, device.capacity, card), at)
                                for at in loads_at] if context or first_step else None)
                    runs = [_run(traces, policies, starts,
                                 rescale(device, x) if rescale and x != 1 else device, outside)
                            for x in scales]
                    cells.append(runs[scales.index(1.0)] if scales == [1.0] else
                                 {**runs[0], "by_cost_scale": runs})
                rows.append({"offset_s": float(offset), "starts_ns": starts,
                             "overlap_s": overlap_s(phases, starts), "config": name,
                             "policies": policies, "cells": cells})
        return rows

    rows = rows_at()
    out = {"label": sweep["label"], "traces": sweep["traces"], "cost_scales": scales,
           "steady": [{"first_step_ns": p[0], "end_ns": p[1], "steps": p[2]} for p in phases],
           "capacities": [parse_size(c) for c in sweep["capacities"]], "rows": rows}
    if sweep.get("outside"):
        card = parse_size(sweep["outside_card"])
        levels = [(parse_size(c), parse_size(f)) for c, f in sweep["outside"]]
        # Who completes, per level: one outcome per row and capacity (the level with nothing
        # outside is the sweep's own rows).
        out["outside"] = {"card": card, "first_step_events": loads_at, "levels": []}
        for c, f in levels:
            ran = rows if not (c or f) else rows_at(c, f, card)
            out["outside"]["levels"].append({
                "context": c, "first_step": f,
                "outcomes": [[_outcome(cell) for cell in row["cells"]] for row in ran],
                "failures": {name: failures([r for r in ran if r["config"] == name])
                             for name in dict.fromkeys(r["config"] for r in ran)}})
    return out


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
                         left=(0, 2)), "```", ""] + (render_outside(s) if s.get("outside")
                                                     else [])


def level_name(level: dict[str, Any]) -> str:
    """A level of memory outside each allocator, as on the card it is given for."""
    from allocsim.policies import format_size

    context, load = level["context"], level["first_step"]
    if not (context or load):
        return "nothing outside"
    return " + ".join([f"{format_size(context)} context"] * bool(context)
                      + [f"{format_size(load)} first-step load"] * bool(load))


def render_outside(s: dict[str, Any]) -> list[str]:
    """Per configuration and capacity, the offsets at which both complete at each level of
    memory outside each allocator, and what each level is at each capacity."""
    from allocsim.policies import format_size
    from allocsim.sim.output.tables import format_table

    held = s["outside"]
    card, levels = held["card"], held["levels"]
    configs = list(dict.fromkeys(r["config"] for r in s["rows"]))
    n = len(dict.fromkeys(r["offset_s"] for r in s["rows"]))
    rows = []
    for name in configs:
        mine = [i for i, r in enumerate(s["rows"]) if r["config"] == name]
        for k, capacity in enumerate(s["capacities"]):
            rows.append([name, format_size(capacity),
                         *(f"{sum(level['outcomes'][i][k] == 'both' for i in mine)}/{n}"
                           for level in levels)])
    sizes = [[level_name(level), *(
        f"{format_size(scaled(level['context'], c, card))} + "
        f"{format_size(scaled(level['first_step'], c, card))}" for c in s["capacities"])]
        for level in levels]
    at = ", ".join(f"event {e:,} of `{label}`"
                   for e, label in zip(held["first_step_events"], s["traces"]))
    died = [[name, *(", ".join(f"{why} {n}" for why, n in level["failures"][name].items())
                     or "-" for level in levels)] for name in configs]
    return [f"**{s['label']}, with memory outside each allocator** — each process holds a "
            "context, taken when it starts, and a first-step load, taken before its first "
            f"train step ({at}), given as on a {format_size(card)} card and scaled to each "
            f"capacity (× capacity / {format_size(card)}). Cells: the offsets (of {n}) at "
            "which both complete at every device-call cost scale.", "", "```",
            format_table(rows, ["config", "capacity", *(level_name(v) for v in levels)],
                         left=(0,)), "```", "",
            "Each level at each capacity (context + first-step load, per process):", "", "```",
            format_table(sizes, [f"on a {format_size(card)} card",
                                 *(format_size(c) for c in s["capacities"])], left=(0,)),
            "```", "", "Processes that died, by what the device refused them (a malloc of its "
            "allocator, its context, its first-step load; over every offset, capacity, cost "
            "scale and job):", "", "```",
            format_table(died, ["config", *(level_name(v) for v in levels)], left=(0,)),
            "```", ""]


def judge_finding(finding: dict[str, Any], sweeps: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``[[sweep_findings]]`` claim judged on the sweeps that run its configuration with
    memory outside each allocator: per level and capacity, the offsets (over every such
    sweep: both start orders) at which both complete; the claim holds at a level and
    capacity when that is all of them (``kind = "race"``: when in every order both complete
    at some offsets and each job dies alone at others). The verdict: supported (holds at
    all), not supported (at none), depends."""
    mine = [s for s in sweeps if s.get("outside")
            and any(r["config"] == finding["config"] for r in s["rows"])]
    if not mine:
        raise ValueError(f"finding {finding['claim']!r}: no sweep runs {finding['config']!r} "
                         "with memory outside each allocator")
    levels = mine[0]["outside"]["levels"]
    cells = []
    for index, level in enumerate(levels):
        for capacity in finding["capacities"]:
            per_order, races = [], []
            for s in mine:
                k = s["capacities"].index(capacity)
                rows = [i for i, r in enumerate(s["rows"]) if r["config"] == finding["config"]]
                outcomes = s["outside"]["levels"][index]["outcomes"]
                seen = {outcomes[i][k] for i in rows}
                per_order.append([sum(outcomes[i][k] == "both" for i in rows), len(rows)])
                races.append({"both", "1st only", "2nd only"} <= seen)
            both, total = (sum(c[0] for c in per_order), sum(c[1] for c in per_order))
            holds = all(races) if finding.get("kind") == "race" else both == total
            cells.append({"level": level_name(level), "capacity": capacity, "both": both,
                          "offsets": total, "per_order": per_order, "holds": holds})
    holding = sum(c["holds"] for c in cells)
    verdict = ("supported" if holding == len(cells) else
               "not supported" if holding == 0 else "depends")
    return {"claim": finding["claim"], "config": finding["config"], "orders": len(mine),
            "verdict": verdict, "cells": cells}


def render_finding(judged: dict[str, Any]) -> list[str]:
    """A judged finding: its verdict, computed, and where it holds."""
    from allocsim.policies import format_size
    from allocsim.sim.output.tables import format_table

    cells = judged["cells"]
    rows = [[c["level"], format_size(c["capacity"]), f"{c['both']}/{c['offsets']}",
             ", ".join(f"{b}/{n}" for b, n in c["per_order"]), "yes" if c["holds"] else "no"]
            for c in cells]
    held = [c for c in cells if c["holds"]]
    broken = [c for c in cells if not c["holds"]]
    if broken:
        where = " Where it holds, by capacity: " + "; ".join(
            f"{format_size(capacity)}: " + (", ".join(
                c["level"] for c in held if c["capacity"] == capacity) or "at no level")
            for capacity in dict.fromkeys(c["capacity"] for c in cells)) + (
            ". Where not: " + "; ".join(f"{c['both']}/{c['offsets']} offsets at "
                                        f"{format_size(c['capacity'])} with {c['level']}"
                                        for c in broken) + ".")
    else:
        where = " It holds at every capacity and level tried."
    return [f"**Finding: {judged['claim']}** ({judged['config']}, {judged['orders']} start "
            f"orders) — **{judged['verdict']}**: it holds at {len(held)} of {len(cells)} "
            f"capacity × level pairs.{where}", "", "```",
            format_table(rows, ["outside each allocator", "capacity", "both complete",
                                "by start order", "holds"], left=(0,)), "```", ""]


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
