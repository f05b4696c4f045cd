"""Hold an experiment's README to its results.json, without rerunning anything.

Two checks (:func:`readme_problems` returns one line per disagreement):

1. **Tables.** The section between the results markers must be exactly what
   :func:`render.markdown` renders from results.json now — every table, header line,
   sensitivity line and note. An edited table, a stale results.json or a renderer change
   that was not rerun all show up here.
2. **Quoted numbers.** Every size or percentage the hand-written verdict (the ``## Verdict``
   section) writes — ``+14%``, ``1.13 GiB``, ``2–20 MiB``, ``954 vs 855 MiB`` — must be a
   number of the rendered section *at the precision the verdict writes it*: ``19%`` matches a
   table's ``+18.8%``, ``0.84 GiB`` matches ``855.49MiB``, ``10.9 GiB`` matches ``10.88GiB``
   (units are converted; the table's number is taken as printed, so a verdict cannot be more
   precise than its table; the sign is not compared: "−22%" and "+22%" are the same number).
   A number the tables do not contain — a ratio worked out by hand, a figure from the
   literature, a fact about real GPUs — must be declared in the README in a comment::

       <!-- numbers: 22% (2.61 vs 3.36 GiB), 59–82% (STAlloc), 0.3–0.5GiB (CUDA context) -->

   Entries are separated by commas; text in parentheses is the reader's explanation and is not
   parsed. A declared number that the verdict no longer writes is reported too, so the list
   cannot silently grow into a blanket permit: the declarations are the short, reviewable list
   of the verdict's numbers that do not come from this run.
   Counts without a unit (events, device calls) and slowdowns (``1.12x``) are not checked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from experiments.runner import readme_bind
from experiments.runner.readme_check_numbers import UNITS, Quantity, quantities
from experiments.runner.render import markdown, results_section

__all__ = ["UNITS", "Quantity", "declared", "quantities", "readme_problems", "verdict"]

_DECLARED = re.compile(r"<!--\s*numbers:(.*?)-->", re.S)


def verdict(text: str) -> str:
    """The hand-written verdict: the ``## Verdict`` section (to the next ``## `` heading), or,
    without one, everything after the results section."""
    match = re.search(r"^## Verdict[^\n]*\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if match:
        return _DECLARED.sub("", match.group(1))
    return _DECLARED.sub("", text.split("<!-- results:end -->", 1)[-1])


def declared(text: str) -> list[Quantity]:
    """The numbers a README declares in ``<!-- numbers: ... -->`` comments."""
    out = []
    for block in _DECLARED.findall(text):
        for entry in re.sub(r"\([^)]*\)", "", block).split(","):
            found = quantities(entry)
            if entry.strip() and not found:
                found = [Quantity(float("nan"), 0, "?", entry.strip())]
            out += found
    return out


def readme_problems(folder: Path) -> list[str]:
    """What in ``folder/README.md`` disagrees with ``folder/results.json`` (empty: nothing)."""
    name = folder.name
    readme, results_file = folder / "README.md", folder / "results.json"
    if not readme.exists() or not results_file.exists():
        return [f"{name}: README.md or results.json missing"]
    text = readme.read_text()
    section = results_section(text)
    if section is None:
        return [f"{name}: README.md has no results markers"]
    results = json.loads(results_file.read_text())
    rendered = markdown(results)
    problems = []
    if section != rendered:
        got, want = section.splitlines(), rendered.splitlines()
        line = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                    min(len(got), len(want)))
        problems.append(
            f"{name}: the results section is not what results.json renders (first difference "
            f"at line {line + 1}: README {got[line] if line < len(got) else '<end>'!r}, "
            f"results.json {want[line] if line < len(want) else '<end>'!r}); "
            f"rerun `python -m experiments.run {name}`")
    table = quantities(rendered)
    marked = declared(text)
    said = list({q.canonical(): q for q in quantities(verdict(text))}.values())
    for q in marked:
        if q.unit == "?":
            problems.append(f"{name}: declared number {q.text!r} is not a size or percentage")
        elif not any(q.matches(s) and s.matches(q) for s in said):
            problems.append(f"{name}: declared number {q.canonical()} is not in the verdict")
    for q in said:
        if not any(q.matches(t) for t in table) and not any(
                q.matches(d) and d.matches(q) for d in marked if d.unit != "?"):
            problems.append(f"{name}: the verdict's {q.canonical()} is in no table from "
                            "results.json and not declared in <!-- numbers: ... -->")
    specs, labels = subjects(results)
    for q, clause in readme_bind.unbound(verdict(text), rendered, specs, labels,
                                         readme_bind.declared_traces(text)):
        if any(q.matches(d) and d.matches(q) for d in marked if d.unit != "?"):
            continue
        problems.append(f"{name}: the verdict's {q.canonical()} is in the tables, but not as "
                        f"the number of what its clause names ({clause[:120]!r})")
    return problems


def subjects(results: dict[str, Any]) -> tuple[set[str], list[str]]:
    """Every policy spec and trace label the results hold (what a clause can name)."""
    specs = {r["policy"] for c in results.get("comparisons", []) for r in c["results"]}
    specs |= {c["policy"] for c in results.get("capacities", [])}
    specs |= {p["policy"] for s in results.get("scenarios", []) for p in s["processes"]}
    for sweep in results.get("offset_sweeps", []):
        specs |= {p for row in sweep["rows"] for p in row["policies"]}
    labels = [c["trace"]["name"] for c in results.get("comparisons", [])]
    labels += [c["trace"] for c in results.get("capacities", [])]
    labels += [t["label"] for t in results.get("traces", [])]
    return specs, list(dict.fromkeys(labels))
