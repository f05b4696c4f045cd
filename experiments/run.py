"""Run an experiment: ``python -m experiments.run NAME`` (or ``--all``).

An experiment is a folder ``experiments/NAME/`` with ``experiment.toml`` (what to run) and
``README.md`` (the claim, the setup, the verdict — written by a person). Running it writes
``results.json`` and figures next to them and rewrites the part of README.md between
``<!-- results:start -->`` and ``<!-- results:end -->`` with the tables, so the numbers in the
write-up are always the ones the command produced.

``experiment.toml``::

    title = "..."
    device = "a100-40g"            # profile; optional "capacity" overrides its size
    policies = ["jax", "bfc", "offline"]
    min_capacity = true            # also find each policy's minimum capacity per trace
    resolution = "auto"             # or a size; auto = about 1/1024 of the trace's peak live

    [[traces]]                     # a generated trace ...
    label = "training"
    generate = "training"
    params = { steps = 10 }
    [[traces]]                     # ... or a file (relative to the repository root)
    label = "mlp (recorded)"
    file = "traces/data/sample-torch-cpu-mlp.npz"
    optional = true                # skip (and say so) when the file is absent

    [[scenarios]]                  # processes sharing one device (optional)
    label = "two JAX defaults"
    capacity = "24GiB"
    processes = ["training:jax", "training:jax@10ms"]   # TRACE_LABEL[:POLICY][@START]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from allocsim.policies import format_size, parse_size
from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.output.figures import pyplot
from allocsim.sim.output.files import write_json
from allocsim.sim.output.tables import format_table
from allocsim.sim.questions.capacity import min_capacity
from allocsim.sim.questions.compare import compare
from allocsim.sim.questions.share import parse_share_spec, share
from allocsim.traces import formats, synth
from allocsim.traces.model import Trace

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
START, END = "<!-- results:start -->", "<!-- results:end -->"


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
        trace.metadata["name"] = label
        traces[label] = trace
    return traces, skipped


def run_experiment(name: str | Path, *, quiet: bool = False) -> dict[str, Any]:
    """Run ``experiments/NAME`` (or any folder holding an experiment.toml)."""
    folder = Path(name) if Path(name).is_dir() else HERE / str(name)
    name = folder.name
    definition = tomllib.loads((folder / "experiment.toml").read_text())
    device = resolve_device(definition.get("device"), definition.get("capacity"))
    policies = definition.get("policies", [])
    traces, skipped = load_traces(definition)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr))
    comparisons, capacities, scenarios = [], [], []
    for label, trace in traces.items():
        if policies:
            say(f"[{name}] compare {label} ({len(trace):,} events)")
            comparisons.append(compare(trace, policies, device).to_json_dict())
        if definition.get("min_capacity"):
            resolution = _resolution(definition.get("resolution", "auto"), trace)
            for policy in definition.get("capacity_policies", policies):
                say(f"[{name}] min-capacity {label} {policy}")
                answer = min_capacity(trace, policy, device, resolution=resolution)
                capacities.append({"trace": label, **answer.to_json_dict()})
    for scenario in definition.get("scenarios", []):
        profile = resolve_device(scenario.get("device", definition.get("device")),
                                 scenario.get("capacity"))
        specs = [parse_share_spec(text) for text in scenario["processes"]]
        say(f"[{name}] share {scenario['label']}")
        run = share([traces[s.trace] for s in specs], specs, profile)
        scenarios.append({
            "label": scenario["label"], "device": profile.name, "capacity": profile.capacity,
            "processes": [{"trace": s.trace, "policy": s.policy, "start_ns": s.start_ns,
                           "completed": r.completed, "peak_reserved": r.peak_reserved,
                           "first_oom_event": r.first_oom_event,
                           "first_oom_others": r.to_json_dict()["first_oom_others"]}
                          for s, r in zip(specs, run.results)],
            "device_peak": run.device_peak})
    results = {"experiment": name, "title": definition.get("title", name),
               "device": device.name, "skipped": skipped, "comparisons": comparisons,
               "capacities": capacities, "scenarios": scenarios}
    write_json(results, folder / "results.json")
    figures = _figures(results, folder)
    _update_readme(folder / "README.md", _markdown(results, figures))
    return results


def _resolution(setting: str, trace: Trace) -> int:
    """A size, or "auto": the power of two nearest 1/1024 of the trace's peak live (≥ 512 B),
    so small and large traces are both answered to about 0.1%."""
    if setting != "auto":
        return parse_size(setting)
    peak, _ = trace.peak_live()
    return max(512, 1 << max(0, (peak // 1024).bit_length() - 1))


# -- figures and tables ----------------------------------------------------------------------
def _figures(results: dict[str, Any], folder: Path) -> list[str]:
    plt = pyplot()
    written = []
    comparisons = results["comparisons"]
    if comparisons:
        policies = [r["policy"] for r in comparisons[0]["results"]]
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(comparisons) + 3), 3.8))
        width = 0.8 / (len(policies) + 1)
        x = np.arange(len(comparisons))
        for k, policy in enumerate(policies):
            values = [next((r["peak_reserved"] for r in c["results"] if r["policy"] == policy), 0)
                      / max(c["trace"]["peak_live"], 1) for c in comparisons]
            ax.bar(x + k * width, values, width, label=policy)
        ax.axhline(1.0, color="black", lw=1, ls="--", label="peak live")
        ax.set_xticks(x + width * (len(policies) - 1) / 2,
                      [c["trace"]["name"] for c in comparisons],
                      fontsize=8, rotation=15, ha="right")
        ax.set_ylabel("peak reserved / peak live")
        ax.set_yscale("log")
        ax.legend(fontsize=7, ncol=2)
        ax.set_title(results["title"], fontsize=10)
        fig.tight_layout()
        fig.savefig(folder / "peak_reserved.png", dpi=110)
        plt.close(fig)
        written.append("peak_reserved.png")
    if results["capacities"]:
        labels = sorted({c["trace"] for c in results["capacities"]},
                        key=[c["trace"] for c in results["capacities"]].index)
        policies = list(dict.fromkeys(c["policy"] for c in results["capacities"]))
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(labels) + 3), 3.8))
        width = 0.8 / (len(policies) + 1)
        for k, policy in enumerate(policies):
            values = []
            for label in labels:
                answer = next(c for c in results["capacities"]
                              if c["trace"] == label and c["policy"] == policy)
                values.append((answer["min_capacity"] or 0) / max(answer["lower_bound"], 1))
            ax.bar(np.arange(len(labels)) + k * width, values, width, label=policy)
        ax.axhline(1.0, color="black", lw=1, ls="--", label="peak live")
        ax.set_xticks(np.arange(len(labels)) + width * (len(policies) - 1) / 2, labels, fontsize=8,
                      rotation=15, ha="right")
        ax.set_ylabel("min capacity / peak live")
        ax.set_ylim(bottom=0.9)   # every ratio is ≥ 1: start near it so differences show
        ax.legend(fontsize=7, ncol=2)
        ax.set_title("smallest device each policy needs", fontsize=10)
        fig.tight_layout()
        fig.savefig(folder / "min_capacity.png", dpi=110)
        plt.close(fig)
        written.append("min_capacity.png")
    return written


def _markdown(results: dict[str, Any], figures: list[str]) -> str:
    parts = [f"_Generated by `python -m experiments.run {results['experiment']}` on device "
             f"`{results['device']}`; do not edit between the markers._", ""]
    for note in results["skipped"]:
        parts.append(f"- skipped: {note}")
    for c in results["comparisons"]:
        rows = [[r["policy"], "yes" if r["completed"] else "**no**",
                 format_size(r["peak_reserved"]), f"{r['utilization']:.1%}", str(r["ooms"]),
                 f"{r['device_mallocs'] + r['device_frees']:,}",
                 f"{r['alloc_time_s'] * 1e3:.3g} ms",
                 f"{r['slowdown']:.3f}x"] for r in c["results"]]
        parts += [f"**{c['trace']['name']}** — {c['trace']['events']:,} events, peak live "
                  f"{format_size(c['trace']['peak_live'])}; winner: `{c['winner']}`", "",
                  "```", format_table(rows, ["policy", "done", "peak reserved", "util", "OOMs",
                                             "device calls", "alloc time", "slowdown"]), "```", ""]
    if results["capacities"]:
        rows = [[c["trace"], c["policy"],
                 "never" if c["min_capacity"] is None else format_size(c["min_capacity"]),
                 format_size(c["lower_bound"]),
                 "-" if c["headroom_ratio"] is None else f"+{c['headroom_ratio']:.1%}",
                 "yes" if c["monotone"] else "no"] for c in results["capacities"]]
        parts += ["Minimum capacity (resolution as configured):", "", "```",
                  format_table(rows, ["trace", "policy", "min capacity", "peak live", "headroom",
                                      "monotone"], left=(0, 1)), "```", ""]
    for s in results["scenarios"]:
        rows = [[p["trace"], p["policy"], f"{p['start_ns'] / 1e9:g}s",
                 "yes" if p["completed"] else "**OOM**", format_size(p["peak_reserved"])]
                for p in s["processes"]]
        parts += [f"**{s['label']}** on {format_size(s['capacity'])}: device peak "
                  f"{format_size(s['device_peak'])}", "", "```",
                  format_table(rows, ["trace", "policy", "start", "completed", "peak reserved"],
                               left=(0, 1)), "```", ""]
    parts += [f"![{name}]({name})" for name in figures]
    return "\n".join(parts)


def _update_readme(path: Path, body: str) -> None:
    text = path.read_text() if path.exists() else f"# {path.parent.name}\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        text = text.rstrip() + f"\n\n## Results\n\n{START}\n{END}\n"
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{START}\n{body}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run allocsim experiments")
    parser.add_argument("names", nargs="*", help="experiment folders under experiments/")
    parser.add_argument("--all", action="store_true")
    args = parser.parse_args(argv)
    names = (sorted(p.parent.name for p in HERE.glob("*/experiment.toml")) if args.all
             else args.names)
    if not names:
        parser.error("name an experiment or use --all")
    for name in names:
        run_experiment(name)
        print(f"experiments/{name}: results.json, figures and README tables updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
