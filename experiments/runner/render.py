"""Results → figures and the README's results section (everything between the markers).

:func:`markdown` is a pure function of the results dict, so a README can be held to its
results.json without rerunning anything (see readme_check).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.policies import format_size
from allocsim.sim.output.colours import policy_colours
from allocsim.sim.output.figures import pyplot
from allocsim.sim.output.files import atomic_savefig, write_text
from allocsim.sim.output.tables import format_table
from experiments.runner import contrasts, sweeps
from experiments.runner.figure_data import png_metadata
from experiments.runner.marked import between, write_between

START, END = "<!-- results:start -->", "<!-- results:end -->"


def figure_names(results: dict[str, Any]) -> list[str]:
    """The figures :func:`figures` writes for ``results``, in order."""
    return ((["peak_reserved.png"] if results["comparisons"] else [])
            + (["min_capacity.png"] if results["capacities"] else [])
            + (["offsets.png"] if results.get("offset_sweeps") else []))


def figures(results: dict[str, Any], folder: Path) -> list[str]:
    """Draw the figures of ``results`` into ``folder``, each naming the digest of the results
    it was drawn from (experiments/runner/figure_data.py); their names, in order."""
    plt = pyplot()
    named = png_metadata(results)
    written = []
    comparisons = results["comparisons"]
    if comparisons:
        policies = [r["policy"] for r in comparisons[0]["results"]]
        colours = policy_colours(policies)
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(comparisons) + 3), 3.8))
        width = 0.8 / (len(policies) + 1)
        x = np.arange(len(comparisons))
        for k, policy in enumerate(policies):
            values = [next((r["peak_reserved"] for r in c["results"] if r["policy"] == policy), 0)
                      / max(c["trace"]["peak_live"], 1) for c in comparisons]
            ax.bar(x + k * width, values, width, label=policy, color=colours[policy])
        ax.axhline(1.0, color="black", lw=1, ls="--", label="peak live")
        ax.set_xticks(x + width * (len(policies) - 1) / 2,
                      [c["trace"]["name"] for c in comparisons],
                      fontsize=8, rotation=15, ha="right")
        ax.set_ylabel("peak reserved / peak live")
        ax.set_yscale("log")
        # plain numbers on the log axis (the default mathtext labels need TeX fonts)
        from matplotlib.ticker import FuncFormatter
        plain = FuncFormatter(lambda value, _: f"{value:g}")
        ax.yaxis.set_major_formatter(plain)
        low, high = ax.get_ylim()
        if high / max(low, 1e-12) <= 30:    # within about a decade the minor ticks read too
            ax.yaxis.set_minor_formatter(plain)
            ax.tick_params(axis="y", which="minor", labelsize=7)
        else:                               # past it their labels run into each other
            from matplotlib.ticker import NullFormatter
            ax.yaxis.set_minor_formatter(NullFormatter())
        # outside the axes, so that no bar is hidden behind it
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        ax.set_title(textwrap.fill(results["title"], 70), fontsize=9)
        fig.tight_layout()
        atomic_savefig(fig, folder / "peak_reserved.png", dpi=110, metadata=named)
        plt.close(fig)
        written.append("peak_reserved.png")
    if results["capacities"]:
        labels = sorted({c["trace"] for c in results["capacities"]},
                        key=[c["trace"] for c in results["capacities"]].index)
        policies = list(dict.fromkeys(c["policy"] for c in results["capacities"]))
        colours = policy_colours(policies)
        # Many traces (over 10): bars across, one row per trace, so the figure stays
        # readable instead of growing wider than a page.
        across = len(labels) > 10
        fig, ax = plt.subplots(figsize=((9, 0.42 * len(labels) + 1.6) if across
                                        else (max(6, 1.6 * len(labels) + 3), 3.8)))
        width = 0.8 / (len(policies) + 1)
        for k, policy in enumerate(policies):
            values = []
            for label in labels:
                answer = next(c for c in results["capacities"]
                              if c["trace"] == label and c["policy"] == policy)
                values.append((answer["min_capacity"] or 0) / max(answer["lower_bound"], 1))
            draw = ax.barh if across else ax.bar
            draw(np.arange(len(labels)) + k * width, values, width, label=policy,
                 color=colours[policy])
        ticks = np.arange(len(labels)) + width * (len(policies) - 1) / 2
        if across:
            ax.axvline(1.0, color="black", lw=1, ls="--", label="peak live")
            ax.set_yticks(ticks, labels, fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel("min capacity / peak live")
            ax.set_xlim(left=0.9)
        else:
            ax.axhline(1.0, color="black", lw=1, ls="--", label="peak live")
            ax.set_xticks(ticks, labels, fontsize=8, rotation=15, ha="right")
            ax.set_ylabel("min capacity / peak live")
            ax.set_ylim(bottom=0.9)   # every ratio is ≥ 1: start near it so differences show
        # outside the axes, so that no bar is hidden behind it
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        ax.set_title("smallest device each policy needs", fontsize=10)
        fig.tight_layout()
        atomic_savefig(fig, folder / "min_capacity.png", dpi=110, metadata=named)
        plt.close(fig)
        written.append("min_capacity.png")
    if results.get("offset_sweeps"):
        sweeps.figure(results["offset_sweeps"], folder / "offsets.png", named)
        written.append("offsets.png")
    return written


def _notes(facts: dict[str, dict[str, Any]], labels: list[str]) -> list[str]:
    """The notes of ``labels`` (each once, in order), as lines under a table."""
    lines = [f"Note on **{label}**: {facts[label]['note']}"
             for label in dict.fromkeys(labels) if facts.get(label, {}).get("note")]
    return [*lines, ""] if lines else []


def _scale(scale: float) -> str:
    return f"×{scale:g}"


def sensitivity_line(entry: dict[str, Any], grid: dict[str, Any]) -> str:
    """One line: is the winner the same under every cost scale and budget tried, and if not,
    which won where."""
    tried = (f"device-call costs {', '.join(_scale(s) for s in grid['cost_scale'])}; "
             f"slowdown budget {', '.join(f'{b:.2f}x' for b in grid['max_slowdown'])}")
    if not entry["budget_applied"]:
        tried += " (not applied: the trace's times are synthesised)"
    if entry["stable"]:
        winner = entry["winners"][0]["winner"]
        shown = "no policy" if winner is None else f"`{winner}`"
        return f"Sensitivity ({tried}): winner: {shown} at every cost and budget tried."
    where: dict[str | None, list[str]] = {}
    for w in entry["winners"]:
        where.setdefault(w["winner"], []).append(
            f"{_scale(w['cost_scale'])}/{w['max_slowdown']:.2f}x")
    listed = "; ".join(f"{'no winner' if winner is None else f'`{winner}`'} at {', '.join(at)}"
                       for winner, at in where.items())
    return f"Sensitivity ({tried}): winner depends on costs/budget: {listed}."


def _comparison(c: dict[str, Any], facts: dict[str, dict[str, Any]] | None,
                sensitivity: dict[str, Any] | None) -> list[str]:
    rows = [[r["policy"], "yes" if r["completed"] else "**no**",
             format_size(r["peak_reserved"]), f"{r['utilization']:.1%}", str(r["ooms"]),
             f"{r['device_mallocs'] + r['device_frees']:,}",
             f"{r['alloc_time_s'] * 1e3:.3g} ms",
             f"{r['slowdown']:.3f}x"] for r in c["results"]]
    label = c["trace"]["name"]
    kind = ""
    if facts is not None and label in facts:
        kind = f" ({facts[label]['kind']}: `{facts[label]['source']}`)"
    parts = [f"**{label}**{kind} — {c['trace']['events']:,} events, peak live "
             f"{format_size(c['trace']['peak_live'])}; winner: `{c['winner']}`", "",
             "```", format_table(rows, ["policy", "done", "peak reserved", "util", "OOMs",
                                        "device calls", "alloc time", "slowdown"]), "```", ""]
    if sensitivity is not None:
        entry = next((s for s in sensitivity["traces"] if s["trace"] == label), None)
        if entry is not None:
            parts += [sensitivity_line(entry, sensitivity), ""]
    if facts is not None:
        parts += _notes(facts, [label])
    return parts


def not_sized(results: dict[str, Any]) -> list[str]:
    """Policies the experiment compares but does not size, in the order compared: said in
    the README, so that no policy drops out of the minimum-capacity table unnoticed."""
    compared = dict.fromkeys(r["policy"] for c in results["comparisons"] for r in c["results"])
    sized = {c["policy"] for c in results["capacities"]}
    return [policy for policy in compared if policy not in sized]


def _capacities(results: dict[str, Any], facts: dict[str, dict[str, Any]] | None) -> list[str]:
    rows = [[c["trace"], c["policy"],
             "never" if c["min_capacity"] is None else format_size(c["min_capacity"]),
             format_size(c["lower_bound"]),
             "-" if c["headroom_ratio"] is None else f"+{c['headroom_ratio']:.1%}",
             "yes" if c["monotone"] else "no"] for c in results["capacities"]]
    header = ["trace", "policy", "min capacity", "peak live", "headroom", "monotone"]
    left: tuple[int, ...] = (0, 1)
    if facts is not None:
        rows = [[row[0], facts.get(row[0], {}).get("kind", "?"), *row[1:]] for row in rows]
        header, left = [header[0], "source", *header[1:]], (0, 1, 2)
    parts = ["Minimum capacity (resolution as configured):", "", "```",
             format_table(rows, header, left=left), "```", ""]
    unsized = not_sized(results)
    if unsized:
        parts += ["Not sized (the experiment's `capacity_policies` leaves them out; compared "
                  "above only): " + ", ".join(f"`{p}`" for p in unsized) + ".", ""]
    if facts is not None:
        parts += _notes(facts, [c["trace"] for c in results["capacities"]])
    return parts


def _scenario(s: dict[str, Any], facts: dict[str, dict[str, Any]] | None) -> list[str]:
    def outcome(p: dict[str, Any]) -> list[str]:
        return [f"{p['start_ns'] / 1e9:g}s", "yes" if p["completed"] else "**OOM**",
                format_size(p["peak_reserved"])]

    header = ["trace", "policy", "start", "completed", "peak reserved"]
    rows = [[p["trace"], p["policy"], *outcome(p)] for p in s["processes"]]
    left: tuple[int, ...] = (0, 1)
    title = (f"**{s['label']}** on {format_size(s['capacity'])}: device peak "
             f"{format_size(s['device_peak'])}")
    flipped = s.get("reversed")
    if flipped is not None:
        header += ["start (reversed)", "completed (reversed)", "peak reserved (reversed)"]
        rows = [row + outcome(p) for row, p in zip(rows, flipped["processes"])]
        title += f" in the given order, {format_size(flipped['device_peak'])} reversed"
    if facts is not None:
        rows = [[row[0], facts.get(row[0], {}).get("kind", "?"), *row[1:]] for row in rows]
        header, left = [header[0], "source", *header[1:]], (0, 1, 2)
    parts = [title, "", "```", format_table(rows, header, left=left), "```", ""]
    if facts is not None:
        parts += _notes(facts, [p["trace"] for p in s["processes"]])
    return parts


def _compiled(rows: list[dict[str, Any]]) -> list[str]:
    """XLA's memory_analysis of each compiled step (bytes of one execution)."""
    table = [[r["trace"], r["target"], format_size(r["argument"]), format_size(r["output"]),
              format_size(r["alias"]), format_size(r["temp"]), format_size(r["peak_bytes"])]
             for r in rows]
    return ["XLA:GPU's memory_analysis of each compiled step (one execution; `alias`: output "
            "bytes written into donated arguments; `peak`: XLA's own peak of the module):", "",
            "```", format_table(table, ["trace", "target", "arguments", "outputs", "alias",
                                        "temp", "peak"], left=(0, 1)), "```", ""]


def markdown(results: dict[str, Any], figures: list[str] | None = None) -> str:
    """The README's results section for ``results`` (figures default to the ones the results
    make)."""
    figures = figure_names(results) if figures is None else figures
    facts = ({t["label"]: t for t in results["traces"]} if "traces" in results else None)
    sensitivity = results.get("sensitivity")
    parts = [f"_Generated by `python -m experiments.run {results['experiment']}` on device "
             f"`{results['device']}`; do not edit between the markers._", ""]
    for note in results["skipped"]:
        parts.append(f"- skipped: {note}")
    for c in results["comparisons"]:
        parts += _comparison(c, facts, sensitivity)
    if results["capacities"]:
        parts += _capacities(results, facts)
    for s in results["scenarios"]:
        parts += _scenario(s, facts)
    # Added sections (issue 30), present only when the definition asks for them.
    if results.get("compiled"):
        parts += _compiled(results["compiled"])
    for c in results.get("contrasts", []):
        parts += contrasts.render(c)
    for spread in results.get("spreads", []):
        parts += contrasts.render_spread(spread)
    for sweep in results.get("offset_sweeps", []):
        parts += sweeps.render_sweep(sweep)
    for finding in results.get("sweep_findings", []):
        parts += sweeps.render_finding(sweeps.judge_finding(finding, results["offset_sweeps"]))
    for grid in results.get("fraction_grids", []):
        parts += sweeps.render_grid(grid)
    parts += [f"![{name}]({name})" for name in figures]
    return "\n".join(parts)


def update_readme(path: Path, body: str) -> None:
    if not path.exists():
        write_text(path, f"# {path.parent.name}\n\n{START}\n{END}\n")
    write_between(path, START, END, body, "## Results")


def results_section(text: str) -> str | None:
    """What :func:`update_readme` put between the markers of README text ``text``."""
    return between(text, START, END)


