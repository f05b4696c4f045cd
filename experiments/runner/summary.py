"""experiments/README.md's summary table held to the data behind each line (issue 40: it quoted
numbers and verdict words no check read).

Each line of the table links to its experiment (``[NAME](NAME/README.md...)``). Its bold verdict
words are checked by :mod:`experiments.runner.verdict_words`; here every size and percentage it
writes ("+5.3%", "45.79 MiB", "−35.9% to −83.5%") must be a number the linked experiment's data
renders — its results.json's tables (:func:`experiments.runner.render.markdown`) or its
population.json's (:func:`experiments.preallocate_vs_grow.population.markdown`) — at the
precision written, or be declared on the line itself as ``<!-- numbers: 59–82% (literature)
-->`` (for numbers from outside the data: the literature, a ratio worked out by hand).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from experiments.preallocate_vs_grow.population import markdown as population_markdown
from experiments.runner.readme_check import declared
from experiments.runner.readme_check_numbers import quantities
from experiments.runner.render import markdown as results_markdown
from experiments.runner.verdict_words import verdict_word_problems

_LINK = re.compile(r"\]\((?P<name>[\w-]+)/README\.md")
_COMMENT = re.compile(r"<!--.*?-->", re.S)


def rendered_data(folder: Path) -> str:
    """Every table ``folder``'s data renders: its results.json's and its population.json's."""
    parts = []
    if (folder / "results.json").exists():
        parts.append(results_markdown(json.loads((folder / "results.json").read_text())))
    if (folder / "population.json").exists():
        parts.append(population_markdown(json.loads((folder / "population.json").read_text())))
    return "\n".join(parts)


def summary_number_problems(readme: Path) -> list[str]:
    """Every size or percentage of ``readme``'s linked lines that the linked data does not
    render and the line does not declare."""
    here = readme.parent
    problems = []
    cache: dict[str, list] = {}
    for number, line in enumerate(readme.read_text().splitlines(), 1):
        names = [m["name"] for m in _LINK.finditer(line) if (here / m["name"]).is_dir()]
        if not names:
            continue
        for name in names:
            if name not in cache:
                cache[name] = quantities(rendered_data(here / name))
        table = [q for name in names for q in cache[name]]
        marked = [d for d in declared(line) if d.unit != "?"]
        for q in quantities(_COMMENT.sub("", line)):
            if not any(q.matches(t) for t in table) and not any(
                    q.matches(d) and d.matches(q) for d in marked):
                problems.append(f"{readme.name}:{number}: {q.canonical()} is in no table of "
                                f"{', '.join(names)}'s data and not declared on the line "
                                "(<!-- numbers: ... -->)")
    return problems


def summary_problems(readme: Path) -> list[str]:
    """The summary's verdict words and quoted numbers against the data."""
    return verdict_word_problems(readme) + summary_number_problems(readme)
