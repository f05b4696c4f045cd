"""The verdict words of experiments/README.md held to the data that makes them (issue 40).

A line of the summary table that links to a population experiment (one with a
``population.json``) writes its verdicts in bold — **supported**, **not supported**,
**depends** — and binds each to the claim(s) it comes from with a comment right after it::

    **depends** <!-- claim: arena_vs_growth: Dynamic shapes hurt PyTorch's allocator -->

Several claims are separated by `` | ``; the word must be the verdict of each of them as
``population.json`` computes it. A bold verdict on such a line without a binding, a binding to
a claim that does not exist, and a word that is not the data's verdict are each a problem.
A line linking to an experiment whose results.json judges findings of its sweeps
(``sweep_findings``, experiments/runner/sweeps.py) is held the same way, to the verdicts those
findings compute. Lines whose evidence is neither (one trace, a sweep without findings) keep a
person's verdict, held to its numbers by readme_check.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

WORDS = ("supported", "not supported", "depends")
_BOLD = re.compile(r"\*\*(not supported|supported|depends)\*\*"
                   r"(?:\s*<!--\s*claim:\s*(?P<name>[\w-]+):\s*(?P<texts>.*?)\s*-->)?")
_LINK = re.compile(r"\]\((?P<name>[\w-]+)/README\.md")


def computed_verdicts(folder: Path) -> dict[str, str] | None:
    """Claim text → verdict word, as ``folder``'s data computes them: its population.json's
    claims, or its results.json's sweep findings; None when it computes none."""
    if (folder / "population.json").exists():
        return {c["text"]: c["verdict"]
                for c in json.loads((folder / "population.json").read_text())["claims"]}
    if (folder / "results.json").exists():
        from experiments.runner.sweeps import judge_finding

        results = json.loads((folder / "results.json").read_text())
        if results.get("sweep_findings"):
            return {f["claim"]: judge_finding(f, results["offset_sweeps"])["verdict"]
                    for f in results["sweep_findings"]}
    return None


def verdict_word_problems(readme: Path) -> list[str]:
    """Every bold verdict word of ``readme``'s population (or sweep-finding) lines that the
    data does not make."""
    here = readme.parent
    problems = []
    for number, line in enumerate(readme.read_text().splitlines(), 1):
        linked = {m["name"] for m in _LINK.finditer(line)}
        populations = {n for n in linked if computed_verdicts(here / n) is not None}
        if not populations:
            continue
        for match in _BOLD.finditer(line):
            word, name = match.group(1), match["name"]
            where = f"{readme.name}:{number}: **{word}**"
            if name is None:
                problems.append(f"{where} is bound to no claim (<!-- claim: NAME: TEXT -->)")
                continue
            verdicts = computed_verdicts(here / name)
            if verdicts is None:
                problems.append(f"{where}: {name} has no population.json or sweep findings")
                continue
            for text in (t.strip() for t in match["texts"].split(" | ")):
                if text not in verdicts:
                    problems.append(f"{where}: {name} has no claim {text!r}")
                elif verdicts[text] != word:
                    source = ("population.json" if (here / name / "population.json").exists()
                              else "results.json")
                    problems.append(f"{where}: {name}'s claim {text!r} is "
                                    f"{verdicts[text]!r} in {source}")
    return problems
