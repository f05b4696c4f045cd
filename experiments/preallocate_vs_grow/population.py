"""A finding over a population, not one trace: seeds, model sizes, target GPUs, cost scales and
slowdown budgets (issue 30). A shared helper of preallocate_vs_grow, fragmentation and
arena_vs_growth (it uses the runner's pieces and changes none of them).

``python -m experiments.preallocate_vs_grow.population NAME`` reads
``experiments/NAME/population.toml``, writes ``population.json`` and ``population.png`` there
and rewrites the README part between ``<!-- population:start -->`` and ``<!-- population:end
-->``; ``--check`` runs nothing and holds the README to population.json
(:func:`population_problems`). The definition::

    title = "..."
    device = "a100-80g"                 # the device of generated and recorded members
    policies = ["jax", "bfc"]           # each member's minimum capacity under each
    reserved = false                    # also peak reserved on the (roomy) device
    [[families]]                        # generated: one member per seed
    label = "transformer varlen (generated, pattern=jax)"
    generate = "transformer"
    params = { steps = 30 }
    seeds = 12                          # seeds 0..11
    [[families]]                        # recorded or compiled files
    label = "XLA:GPU jobs"
    kind = "compiled"                   # "recorded" (CPU recording) or "compiled" (XLA:GPU)
    jobs = ["size", "remat"]            # experiments/data/xla-gpu jobs with any of these tags
    view = "runtime"                    # or "buffers" (the job's .buffers.npz)
    [[families]]
    label = "recorded"
    kind = "recorded"
    files = ["experiments/data/jax/train-jit-donate.npz"]
    [[claims]]                          # lower's metric below higher's on every member?
    text = "growth needs a smaller device than preallocation"
    metric = "min_capacity"             # or "peak_reserved"
    lower = "jax:preallocate=false"
    higher = "jax"
    families = ["..."]                  # default: every family
    [sensitivity]                       # the winner rule on members with measured times
    cost_scale = [0.25, 1, 4]
    max_slowdown = [1.05, 1.10, 1.25]

A compiled member (an XLA:GPU job) is sized on its own target's profile. A claim's verdict is
``supported`` where it holds on every member, ``not supported`` where it holds on none, and
``depends`` otherwise, naming the members where it flips. Two values within the search's
resolution (about 0.1% of peak live) are a tie, neither direction — unless the claim says
"no more than" (``compare = "<="``), where a tie holds.

Method (issue 40): a member is a distinct trace. Seeds whose traces differ only in their times
(the same ops, ids and sizes: :func:`fingerprint`) are one member, counted once in every claim.
A minimum capacity is stored with its ``monotone`` flag, judged by the search's own check and
by a scan of a 1%-of-peak-live grid above the answer (:func:`grid_failures`), and, where it is
not monotone, the failures seen above it and the range from the smallest capacity that
completes to the one from which every capacity tried completed (:func:`capacity_record`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

from allocsim.atomic_files import write_text
from allocsim.policies import format_size
from allocsim.sim.questions.capacity.minimum import min_capacity
from allocsim.traces.model import Trace
from experiments.preallocate_vs_grow.member import (
    JOBS,
    XLA_PLAN,
    MemberTask,
    capacity_record,
    fingerprint,
    grid_failures,
    sources,
    xla_plan,
)
from experiments.preallocate_vs_grow.pool import measure_all
from experiments.runner.execute import HERE, DefinitionError, sensitivity_grid
from experiments.runner.figure_data import png_metadata
from experiments.runner.marked import between, write_between
from experiments.runner.render import sensitivity_line

# Re-exported: the population's tests and scripts name these here.
__all__ = ["JOBS", "XLA_PLAN", "capacity_record", "fingerprint", "grid_failures", "main",
           "measure", "members", "min_capacity", "run", "xla_plan"]

START, END = "<!-- population:start -->", "<!-- population:end -->"
# Numbers the findings quote from outside the population (the old verdicts', facts): declared as
# ``<!-- findings-numbers: ... -->`` (readme_check's ``numbers:`` belong to the Verdict).
_DECLARED = re.compile(r"<!--\s*findings-numbers:(.*?)-->", re.S)


def members(family: dict[str, Any], device: str) -> list[tuple[str, str, Trace]]:
    """``(member, device, trace)`` of a family, in a fixed order."""
    return [(s.member, s.device, s.load()) for s in sources(family, device)]


def distinct_members(rows: Sequence[dict[str, Any]]) -> int:
    """How many distinct traces a family's members are (each row counted where it has no
    fingerprint, as results from before fingerprints were stored)."""
    return len({r.get("fingerprint") or id(r) for r in rows})


def settings_digest(definition: dict[str, Any]) -> str:
    """A digest of a population's definition (the parsed population.toml: comments and layout
    do not count), stored in population.json as ``settings`` and checked by
    :mod:`experiments.preallocate_vs_grow.verify`."""
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tasks(definition: dict[str, Any]) -> list[tuple[str, MemberTask]]:
    """``(family label, task)`` for every member of every family, in the population's order."""
    grid = sensitivity_grid(definition) if "sensitivity" in definition else None
    frozen = (tuple(grid[0]), tuple(grid[1])) if grid else None
    return [(family["label"], MemberTask(source, tuple(definition["policies"]),
                                         bool(definition.get("reserved")), frozen,
                                         family.get("kind") == "recorded"))
            for family in definition["families"]
            for source in sources(family, definition["device"])]


def measure(definition: dict[str, Any], say: Any, workers: int = 1) -> dict[str, Any]:
    """Every member's minimum capacity (and peak reserved) under every policy, measured by
    ``workers`` processes (:mod:`experiments.preallocate_vs_grow.pool`; the rows are the same
    for any number)."""
    policies = definition["policies"]
    grid = sensitivity_grid(definition) if "sensitivity" in definition else None
    work = tasks(definition)
    rows = measure_all([task for _, task in work], workers, say,
                       [f"{label}: {task.source.member}" for label, task in work])
    families, skipped = [], []
    for family in definition["families"]:
        mine = [row for (label, _), row in zip(work, rows) if label == family["label"]]
        if not mine:
            skipped.append(family["label"])
            continue
        families.append({"label": family["label"],
                         "kind": family.get("kind", "generated" if "generate" in family
                                            else "recorded"),
                         "source": family.get("generate") or family.get("jobs")
                         or family.get("files"),
                         "note": family.get("note", ""), "members": mine})
    return {"title": definition["title"], "device": definition["device"],
            "settings": settings_digest(definition),
            "reserved": bool(definition.get("reserved")),
            "policies": policies, "families": families, "skipped": skipped,
            "claims": [judge(claim, families, skipped)
                       for claim in definition.get("claims", [])],
            **({"sensitivity": {"cost_scale": grid[0], "max_slowdown": grid[1]}}
               if grid else {})}


def _value(row: dict[str, Any], metric: str, policy: str) -> float:
    value = row[metric].get(policy)
    return float("inf") if value is None else float(value)


NON_STRICT = ("no more than", "at most", "not more than")   # claims a tie satisfies


def comparison(claim: dict[str, Any]) -> str:
    """The claim's comparison: ``<`` (less by more than the resolution; the default) or
    ``<=`` (a tie holds too). A claim worded "no more than" must say ``compare = "<="``."""
    compare = claim.get("compare", "<")
    if compare not in ("<", "<="):
        raise DefinitionError(f"claim {claim['text']!r}: compare must be \"<\" or \"<=\", "
                              f"got {compare!r}")
    worded = next((w for w in NON_STRICT if w in claim["text"].lower()), None)
    if worded and compare == "<":
        raise DefinitionError(f"claim {claim['text']!r} says {worded!r}: "
                              "a tie satisfies it, so it needs compare = \"<=\"")
    return compare


def _outcome(a: float, b: float, tolerance: float, compare: str = "<") -> str:
    if a == b or abs(a - b) <= tolerance:
        return "holds" if compare == "<=" else "tie"
    return "holds" if a < b else "reversed"


def _claim(claim: dict[str, Any], test: str, outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """A claim's outcome on each member, counted once per member (a compiled job in several
    families, e.g. the reference job of the size and remat families, is one member)."""
    seen, unique = set(), []
    for o in outcomes:
        if o["key"] not in seen:
            seen.add(o["key"])
            unique.append(o)
    counts = {k: sum(o["outcome"] == k for o in unique) for k in ("holds", "reversed", "tie")}
    verdict = ("supported" if counts["holds"] == len(unique)
               else "not supported" if not counts["holds"] else "depends")
    gaps = [o["gap"] for o in unique if o["gap"] is not None]
    return {"text": claim["text"], "test": test, "members": len(unique), **counts,
            "verdict": verdict,
            "gap": [min(gaps), statistics.median(gaps), max(gaps)] if gaps else None,
            "outcomes": [{k: o[k] for k in ("family", "member", "outcome", "gap")}
                         for o in outcomes]}


def _key(family: dict[str, Any], row: dict[str, Any]) -> str:
    """One key per distinct member: a compiled job by its name (one job in several families is
    one member), any other by its trace where the fingerprint is known (seeds that change only
    the times are one member)."""
    if family["kind"] == "compiled":
        return row["member"]
    if row.get("fingerprint"):
        return f"trace {row['fingerprint']} on {row['device']}"
    return f"{family['label']}: {row['member']}"


def judge_pairs(claim: dict[str, Any], families: list[dict[str, Any]],
                skipped: list[str]) -> dict[str, Any]:
    """Is ``policy``'s headroom lower on the first family of each pair of ``pairs`` than on
    the second, member by member (the i-th of each: the same seed, or the same job with other
    shapes)?"""
    compare = comparison(claim)
    by_label = {f["label"]: f for f in families}
    outcomes = []
    for first, second in claim["pairs"]:
        if first in skipped or second in skipped:
            continue
        for label in (first, second):
            if label not in by_label:
                raise DefinitionError(f"claim {claim['text']!r}: unknown family {label!r}")
        low, high = by_label[first], by_label[second]
        if len(low["members"]) != len(high["members"]):
            raise DefinitionError(f"claim {claim['text']!r}: {first!r} and {second!r} differ "
                                  "in size")
        for a_row, b_row in zip(low["members"], high["members"]):
            a, b = _headroom(a_row, claim["policy"]), _headroom(b_row, claim["policy"])
            tolerance = (a_row["resolution"] / a_row["peak_live"]
                         + b_row["resolution"] / b_row["peak_live"])
            where = (a_row["member"] if a_row["member"] == b_row["member"]
                     else f"{a_row['member']} vs {b_row['member']}")
            key = (f"{_key(low, a_row)} vs {_key(high, b_row)}"
                   if a_row.get("fingerprint") and b_row.get("fingerprint")
                   else f"{first}: {a_row['member']} vs {b_row['member']}")
            outcomes.append({"family": f"{first} vs {second}", "member": where, "key": key,
                             "outcome": _outcome(_finite(a), _finite(b), tolerance, compare),
                             "gap": None if a is None or b is None else b - a})
    sign = "≤" if compare == "<=" else "<"
    return _claim(claim, f"`{claim['policy']}` headroom: first family {sign} second", outcomes)


def _finite(value: float | None) -> float:
    return float("inf") if value is None else value


def judge(claim: dict[str, Any], families: list[dict[str, Any]],
          skipped: Sequence[str] = ()) -> dict[str, Any]:
    """Where ``lower``'s metric is below ``higher``'s (beyond the resolution), where above.
    Families in ``skipped`` (no member present) are left out of the claim."""
    if "policy" in claim:
        return judge_pairs(claim, families, list(skipped))
    metric, lower, higher = claim.get("metric", "min_capacity"), claim["lower"], claim["higher"]
    compare = comparison(claim)
    chosen = [c for c in claim.get("families") or [f["label"] for f in families]
              if c not in skipped]
    unknown = [c for c in chosen if c not in {f["label"] for f in families}]
    if unknown:
        raise DefinitionError(f"claim {claim['text']!r}: unknown family {unknown[0]!r}")
    outcomes = []
    for family in families:
        if family["label"] not in chosen:
            continue
        for row in family["members"]:
            a, b = _value(row, metric, lower), _value(row, metric, higher)
            finite = a != float("inf") and b != float("inf")
            outcomes.append({"family": family["label"], "member": row["member"],
                             "key": _key(family, row),
                             "outcome": _outcome(a, b, row["resolution"], compare),
                             "gap": (b - a) / row["peak_live"] if finite else None})
    sign = "≤" if compare == "<=" else "<"
    return _claim(claim, f"`{lower}` {sign} `{higher}` ({metric.replace('_', ' ')})", outcomes)


def _headroom(row: dict[str, Any], policy: str) -> float | None:
    value = row["min_capacity"].get(policy)
    return None if value is None else value / row["peak_live"] - 1


def _spread(values: list[float | None], fmt: str = "{:+.1%}") -> list[str]:
    known = sorted(v for v in values if v is not None)
    never = len(values) - len(known)
    if not known:
        return ["never"] * 3
    cells = [fmt.format(known[0]), fmt.format(statistics.median(known)), fmt.format(known[-1])]
    return [*cells[:2], cells[2] + (f" ({never} never)" if never else "")]


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(r) + " |" for r in rows]]


def _gap(gap: list[float] | None) -> str:
    return "-" if gap is None else " / ".join(f"{g:+.1%}" for g in gap)


def _where(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return (shown + (f" and {len(items) - limit} more" if len(items) > limit else "")) or "-"


def markdown(results: dict[str, Any]) -> str:
    """The README's population section: a pure function of population.json."""
    parts = ["_Generated by `python -m experiments.preallocate_vs_grow.population "
             f"{results['experiment']}`; do not edit between the markers._", "",
             "**Population** (each member's minimum capacity found to about 0.1% of its peak "
             "live; compiled jobs sized on their own target GPU's profile):", ""]
    parts += [f"- skipped (no member present): {label}" for label in results["skipped"]]
    rows = []
    for f in results["families"]:
        lives = [m["peak_live"] for m in f["members"]]
        devices = sorted({m["device"] for m in f["members"]})
        count, distinct = len(f["members"]), distinct_members(f["members"])
        rows.append([f["label"], f["kind"],
                     str(count) + (f" ({distinct} distinct)" if distinct < count else ""),
                     f"{format_size(min(lives))} – {format_size(max(lives))}",
                     ", ".join(devices)])
    parts += [*_table(rows, ["family", "kind", "members", "peak live", "devices"]), ""]
    parts += ["**Headroom** (minimum capacity over peak live, min / median / max over the "
              "family's members):", ""]
    rows = []
    for f in results["families"]:
        for policy in results["policies"]:
            values = [_headroom(m, policy) for m in f["members"]]
            if policy == XLA_PLAN and all(v is None for v in values):
                continue   # not a logical-buffer family: XLA's plan is not a member's answer
            rows.append([f["label"], f"`{policy}`", *_spread(values)])
    parts += [*_table(rows, ["family", "policy", "min", "median", "max"]), ""]
    parts += _not_monotone(results)
    if results["reserved"]:
        parts += ["**Peak reserved on the roomy device** over peak live (min / median / max):",
                  ""]
        rows = []
        for f in results["families"]:
            if not all(m["peak_reserved"] for m in f["members"]):
                continue
            for policy in results["policies"]:
                if policy in f["members"][0]["peak_reserved"]:
                    rows.append([f["label"], f"`{policy}`", *_spread(
                        [m["peak_reserved"][policy] / m["peak_live"] - 1
                         for m in f["members"]])])
        parts += [*_table(rows, ["family", "policy", "min", "median", "max"]), ""]
    if results["claims"]:
        parts += ["**Claims** (on a member, `lower` needs less than `higher` when it is below "
                  "by more than the search's resolution; gap = (higher − lower) / peak live, "
                  "min / median / max; a compiled job in several families counts once):", ""]
        rows = []
        for c in results["claims"]:
            rows.append([c["text"], c["test"], f"{c['holds']}/{c['members']}", _gap(c["gap"]),
                         f"**{c['verdict']}**"])
        parts += [*_table(rows, ["claim", "test", "holds", "gap", "verdict"]), ""]
        for c in results["claims"]:
            parts += [f"*{c['text']}*, by family:", ""]
            rows = []
            for label in dict.fromkeys(o["family"] for o in c["outcomes"]):
                mine = [o for o in c["outcomes"] if o["family"] == label]
                gaps = [o["gap"] for o in mine if o["gap"] is not None]
                rows.append([label, *(str(sum(o["outcome"] == k for o in mine))
                                      for k in ("holds", "reversed", "tie")),
                             _gap([min(gaps), statistics.median(gaps), max(gaps)]
                                  if gaps else None),
                             _where([o["member"] for o in mine if o["outcome"] != "holds"])])
            parts += [*_table(rows, ["family", "holds", "reversed", "tie", "gap",
                                     "not holding at"]), ""]
    sens = results.get("sensitivity")
    if sens:
        lines = [f"- {f['label']}: {m['member']}: " + sensitivity_line(
                    {"budget_applied": True, "winners": m["winners"],
                     "stable": len({w["winner"] for w in m["winners"]}) == 1}, sens)
                 for f in results["families"] for m in f["members"] if "winners" in m]
        if lines:
            parts += ["**Winner** (least memory within the slowdown budget) on the recorded "
                      "members, whose times are measured (CPU times; no other member's time is "
                      "a finding):", "", *lines, ""]
    parts.append("![population.png](population.png)")
    return "\n".join(parts)


def _not_monotone(results: dict[str, Any]) -> list[str]:
    """The minimum capacities that are not monotone, each as the range it spans (the headroom
    tables give the smallest capacity that completes: the range's low end)."""
    lines = []
    for f in results["families"]:
        for m in f["members"]:
            for policy, record in m.get("capacity", {}).items():
                low, high = record["range"]
                if record["monotone"] or low is None:
                    continue
                span = "–".join(f"{v / m['peak_live'] - 1:+.1%}" for v in (low, high or low))
                failures = record.get("failures", [])
                lines.append(f"- {f['label']}: {m['member']}: `{policy}` {span} "
                             f"(fails at {len(failures)} capacities above the low end"
                             + "".join(f"; {e}" for e in record["exceptions"][:2]) + ")")
    if not lines:
        return []
    return ["**Not monotone** (the policy completes at the low end, fails somewhere above it, "
            "and completes at every capacity the search tried from the high end; headroom "
            "over peak live):", "", *lines, ""]


def figure(results: dict[str, Any], path: Path) -> None:
    """Families x policies: the colour is the median headroom (capped at +100%), the text the
    median over min-max, so a direction that flips within a family shows as a wide range. The
    PNG names the digest of ``results`` (experiments/runner/figure_data.py)."""
    from allocsim.sim.output.figures import pyplot
    from allocsim.sim.output.files import atomic_savefig
    plt = pyplot()
    families, policies = results["families"], results["policies"]
    grid = np.full((len(families), len(policies)), np.nan)
    fig, ax = plt.subplots(figsize=(1.45 * len(policies) + 3.6, 0.52 * len(families) + 1.6))
    for i, f in enumerate(families):
        for j, policy in enumerate(policies):
            values = sorted(100 * h for m in f["members"]
                            if (h := _headroom(m, policy)) is not None)
            if not values:
                ax.text(j, i, "-", ha="center", va="center", fontsize=7, color="grey")
                continue
            median = statistics.median(values)
            grid[i, j] = min(median, 100.0)
            digits = 1 if values[-1] < 10 else 0
            ax.text(j, i, f"{median:+.{digits}f}%\n{values[0]:.{digits}f}–{values[-1]:.{digits}f}",
                    ha="center",
                    va="center", fontsize=6.5, color="white" if median > 55 else "black")
    image = ax.imshow(grid, cmap="YlOrRd", vmin=0, vmax=100,
                      aspect="auto")
    ax.set_xticks(range(len(policies)), policies, rotation=25, ha="right", fontsize=7.5)
    ax.set_yticks(range(len(families)),
                  [f"{f['label']} ({len(f['members'])})" for f in families], fontsize=7.5)
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.02).set_label(
        "median headroom % (capped at 100)", fontsize=7)
    ax.set_title(f"{results['title']}: minimum capacity over peak live — median, min–max over "
                 "each family's members (count in brackets)", fontsize=8.5)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110, metadata=png_metadata(results))
    plt.close(fig)


def section(text: str) -> str | None:
    return between(text, START, END)


def update_readme(path: Path, body: str) -> None:
    write_between(path, START, END, body, "## Over the population")


def population_problems(folder: Path) -> list[str]:
    """The README's population section against population.json, and every size or percentage
    of its ``## Findings`` section against that section (numbers from outside it declared in
    ``<!-- findings-numbers: ... -->``)."""
    from experiments.runner.readme_check import declared, quantities
    name = folder.name
    readme, stored = folder / "README.md", folder / "population.json"
    if not stored.exists():
        return [f"{name}: population.json missing"]
    text = readme.read_text()
    rendered = markdown(json.loads(stored.read_text()))
    problems = []
    if section(text) != rendered:
        problems.append(f"{name}: the population section is not what population.json renders;"
                        f" rerun `python -m experiments.preallocate_vs_grow.population {name}`")
    found = text.split("## Findings", 1)
    if len(found) < 2:
        return [*problems, f"{name}: README.md has no ## Findings section"]
    findings = found[1].split("\n## ", 1)[0]
    table = quantities(rendered)
    marked = declared("".join(f"<!-- numbers:{block}-->"
                              for block in _DECLARED.findall(findings)))
    for q in quantities(_DECLARED.sub("", findings)):
        if not any(q.matches(t) for t in table) and not any(
                q.matches(d) and d.matches(q) for d in marked):
            problems.append(f"{name}: the findings' {q.canonical()} is in no population table "
                            "and not declared in <!-- numbers: ... -->")
    return problems


def rejudge(definition: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """``results`` with each member's fingerprint (its trace made again: no replay) and every
    claim judged again from the stored measurements under ``definition``'s claims: what a
    change to the judging or to a claim's wording changes, without measuring anything."""
    for stored, family in zip(results["families"],
                              [f for f in definition["families"]
                               if f["label"] not in results["skipped"]]):
        traces = {member: trace for member, _, trace in members(family, definition["device"])}
        for row in stored["members"]:
            if row["member"] in traces:
                row["fingerprint"] = fingerprint(traces[row["member"]])
    return {**results, "claims": [judge(claim, results["families"], results["skipped"])
                                  for claim in definition.get("claims", [])]}


def run(name: str | Path, say: Any = None, *, render_only: bool = False,
        judge_only: bool = False, workers: int = 1) -> dict[str, Any]:
    """Measure (or, ``render_only``, read population.json; ``judge_only``, read it and judge
    its claims again) and write the results: ``experiments/NAME`` (or any folder holding a
    population.toml and a README.md), in ``workers`` processes."""
    folder = Path(name) if Path(name).is_dir() else HERE / str(name)
    definition_path = folder / "population.toml"
    say = say or (lambda *a: print(*a, file=sys.stderr))
    if render_only or judge_only:
        results = json.loads((folder / "population.json").read_text())
        if judge_only:
            results = rejudge(tomllib.loads(definition_path.read_text()), results)
    else:
        definition = tomllib.loads(definition_path.read_text())
        results = {"experiment": folder.name, **measure(definition, say, workers)}
    write_text(folder / "population.json", json.dumps(results, indent=1) + "\n")
    figure(results, folder / "population.png")
    update_readme(folder / "README.md", markdown(results))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+")
    parser.add_argument("--check", action="store_true",
                        help="run nothing: hold each README to its population.json")
    parser.add_argument("--render", action="store_true",
                        help="measure nothing: redraw the figure and README from population.json")
    parser.add_argument("--rejudge", action="store_true",
                        help="measure nothing: fingerprint the members and judge the claims "
                             "again from population.json")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="measure members in N processes (the same population.json for "
                             "any N; default 1)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if args.check:
        problems = [p for n in args.names for p in population_problems(HERE / n)]
        print("\n".join(problems) or f"{len(args.names)} population section(s) agree")
        return 1 if problems else 0
    for name in args.names:
        run(name, render_only=args.render, judge_only=args.rejudge, workers=args.workers)
        print(f"experiments/{name}: population.json, population.png and README updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
