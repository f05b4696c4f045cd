"""A quoted number must be its subject's number: the policy, trace and quantity the verdict's
clause names (the binding half of the README check; readme_check.py calls it).

The rendered results section is read back into **cells**: every size or percentage with its
subject text — the table row's text cells (policy, trace, config, quantity), the column's
header and the words of the line above the table up to its first number (the trace of a
comparison) — or, for a
number outside a table, its own line. The verdict is cut into **clauses** (at ``, ; : . — (``
and line breaks, never inside a number) and each clause's mentions are read:

- **policies**: a policy spec written in backticks (`` `pytorch` ``), or a prose name:
  PyTorch, BFC, best fit, no cache / platform, offline, on-demand growth, JAX's default
  (:data:`POLICY_NAMES`); a name stands for every spec of that family (BFC: ``bfc``, ``jax``,
  ``jax:fraction=…``, ``jax:preallocate=false``);
- **traces** (named once a sentence): a trace label written out, or a name the README
  declares for one in ``<!-- traces: eager = jax eager (recorded, CPU); jitted = ... -->``;
- **quantities**: peak live, reserved/holds, utilization, headroom, min capacity / smallest
  device (:data:`QUANTITY_NAMES`).

A number of a clause that names policies must be a cell of one of them (or a cell with no policy:
a trace's own facts, such as its peak live); one that names traces must be a cell of one of
them; one that names quantities must be a cell of one of them. So "PyTorch's allocator holds
62.00 MiB" fails when 62.00 MiB is only BFC's, although the number is in the tables.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from experiments.runner.readme_check_numbers import GROUP, Quantity, quantities

Family = Callable[[str], bool]


def _bfc(spec: str) -> bool:
    return spec == "bfc" or spec.startswith("tensorflow") or (
        spec.split(":")[0] == "jax" and "allocator=" not in spec)


# Prose names of policies (lower case, matched at word boundaries) → which specs they name.
POLICY_NAMES: dict[str, Family] = {
    "pytorch": lambda s: s.startswith("pytorch"),
    "bfc": _bfc,
    "best fit": lambda s: s.startswith("best-fit"),
    "best-fit": lambda s: s.startswith("best-fit"),
    "no cache": lambda s: "platform" in s,
    "platform": lambda s: "platform" in s,
    "offline": lambda s: s.startswith("offline"),
    "on-demand": lambda s: "preallocate=false" in s or s == "bfc",
    "on demand": lambda s: "preallocate=false" in s or s == "bfc",
    "growth": lambda s: "preallocate=false" in s or s == "bfc",
    "jax's default": lambda s: s == "jax",
    "preallocated": lambda s: _bfc(s) and "preallocate=false" not in s and s != "bfc",
    "preallocation": lambda s: _bfc(s) and "preallocate=false" not in s and s != "bfc",
    "cuda_async": lambda s: "cuda_async" in s,
    "expandable": lambda s: "expandable" in s,
}
# Prose names of quantities → words of the column header or row text that hold them.
QUANTITY_NAMES: dict[str, tuple[str, ...]] = {
    "peak live": ("peak live",), "live": ("peak live",),
    "reserve": ("peak reserved", "device peak"), "reserved": ("peak reserved", "device peak"),
    "holds": ("peak reserved", "device peak"), "hold": ("peak reserved", "device peak"),
    "utilization": ("util",), "utilisation": ("util",),
    "headroom": ("headroom",),
    "over peak live": ("headroom", "peak live"), "of peak live": ("headroom", "peak live"),
    "above peak live": ("headroom", "peak live"), "over the bound": ("headroom",),
    "min capacity": ("min capacity",), "minimum capacity": ("min capacity",),
    "smallest device": ("min capacity",),
}
QUANTITY_REACH = 16   # characters between a quantity word and the number it names
_CLAUSE = re.compile(r"(?:,\s|;|:\s|\.\s|\s—\s|\(|\)|\n)")
_TICKED = re.compile(r"`([^`]+)`")
_TRACES = re.compile(r"<!--\s*traces:(.*?)-->", re.S)


@dataclass(frozen=True)
class Cell:
    """A number of the rendered section and the text naming its subject."""

    quantity: Quantity
    policies: frozenset[str]   # the policy specs among the row's text cells
    text: str                  # lower-cased: row text cells, column header, table title
    traced: bool = True        # whether the text names a trace (else no trace binds it)


def _spans(dashes: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"-+", dashes)]


def _cells_of_row(line: str, spans: list[tuple[int, int]]) -> list[str]:
    """A row's cells: each column is exactly as wide as its dashes (text left-aligned in it,
    numbers right-aligned)."""
    return [line[start:end].strip() for start, end in spans]


def cells(section: str, specs: set[str], labels: list[str] | None = None) -> list[Cell]:
    """Every size or percentage of the rendered ``section`` with its subject."""
    out: list[Cell] = []
    lines = section.splitlines()
    title = ""
    k = 0
    while k < len(lines):
        line = lines[k]
        if line.strip() == "```" and k + 2 < len(lines):
            header, dashes = lines[k + 1], lines[k + 2]
            spans = _spans(dashes)
            names = _cells_of_row(header, spans)
            k += 3
            while k < len(lines) and lines[k].strip() != "```":
                row = _cells_of_row(lines[k], spans)
                texts = [c for c in row if not quantities(c) and c]
                tokens = {t.strip("`") for c in texts for t in c.split()}
                policies = frozenset(t for t in tokens if t in specs)
                for name, value in zip(names, row):
                    for q in quantities(value):
                        out.append(Cell(q, policies,
                                        " | ".join([*texts, name, title]).lower()))
                k += 1
            k += 1
            continue
        if line.strip():
            # The line before a table names it: its words up to the first number (a
            # comparison's trace label and kind, not its peak live).
            title = re.split(r"\d", line, maxsplit=1)[0].replace("**", "").strip()
        for q in quantities(line):
            out.append(Cell(q, frozenset(), line.lower()))
        k += 1
    known = [label.lower() for label in labels or []]
    return [Cell(c.quantity, c.policies, c.text, any(k in c.text for k in known))
            for c in out]


def declared_traces(text: str) -> dict[str, str]:
    """The README's ``<!-- traces: NAME = LABEL; ... -->`` names (lower case)."""
    out = {}
    for block in _TRACES.findall(text):
        for entry in block.split(";"):
            name, eq, label = entry.partition("=")
            if eq and name.strip() and label.strip():
                out[name.strip().lower()] = label.strip().lower()
    return out


def _mentions(clause: str, names: list[str]) -> list[tuple[int, int, str]]:
    """(start, end, name) of each name in ``clause`` at word boundaries; a name inside a longer
    one found at the same place is dropped ("peak live" inside "over peak live")."""
    low = clause.lower()
    found = [(m.start(), m.end(), n) for n in names
             for m in re.finditer(rf"(?<![\w\-]){re.escape(n)}(?![\w\-=])", low)]
    return [f for f in found if not any(o != f and o[0] <= f[0] and f[1] <= o[1]
                                        for o in found)]


def _named(spec: str) -> Family:
    """The family of one spec named as itself (ticked): that spec only."""
    return lambda policy: policy == spec


def _nearest(mentions: list[tuple[int, int, str]], start: int, end: int) -> list[str]:
    """The mentions nearest the number group at ``start:end`` in its clause, before or after
    it ("PyTorch's allocator 54.00 MiB", "27.02 MiB under plain BFC"); every mention at that
    distance ("BFC growing on demand": both names)."""
    gaps = [(start - m[1] if m[1] <= start else m[0] - end, m[2]) for m in mentions
            if m[1] <= start or m[0] >= end]
    if not gaps:
        return []
    closest = min(g for g, _ in gaps)
    return [name for g, name in gaps if g <= closest + 1]


@dataclass(frozen=True)
class Subject:
    policies: list[Family]
    traces: list[str]
    quantities: list[tuple[str, ...]]


def subjects(clause: str, specs: set[str], labels: list[str],
             trace_names: dict[str, str], sentence: str | None = None
             ) -> list[tuple[list[Quantity], Subject]]:
    """Each number group of ``clause`` with the subject its clause names for it: the policy
    named nearest before it (else after it), the traces the clause names, the quantity written
    next to it (within a few words)."""
    ticked = [(m.start(), m.end(), m.group(1)) for m in _TICKED.finditer(clause)
              if m.group(1) in specs]
    bare = _TICKED.sub(lambda m: " " * len(m.group(0)), clause)
    policy_mentions = sorted(ticked + _mentions(bare, list(POLICY_NAMES)))
    quantity_mentions = sorted(_mentions(bare, list(QUANTITY_NAMES)))
    # Traces are named once a sentence ("On jax eager (recorded, CPU), PyTorch's ...").
    whole = (sentence or clause)
    traces = [label.lower() for label in labels if label.lower() in whole.lower()]
    traces += [trace_names[m[2]] for m in _mentions(whole, list(trace_names))]
    groups = list(GROUP.finditer(clause))
    words_of: dict[int, list[tuple[str, ...]]] = {}
    for start, end, name in quantity_mentions:
        # A quantity word names the number group nearest it (the following one on a tie),
        # a few words away at most.
        gaps = [(max(g.start() - end, start - g.end()), -g.start(), k)
                for k, g in enumerate(groups)]
        gap, _, k = min(gaps, default=(QUANTITY_REACH + 1, 0, -1))
        if gap <= QUANTITY_REACH:
            words_of.setdefault(k, []).append(QUANTITY_NAMES[name])
    out = []
    for k, group in enumerate(groups):
        families: list[Family] = []
        for name in _nearest(policy_mentions, group.start(), group.end()):
            families.append(POLICY_NAMES[name] if name in POLICY_NAMES else _named(name))
        out.append((quantities(group.group(0)), Subject(families, traces, words_of.get(k, []))))
    return out


def fits(cell: Cell, said: Quantity, who: Subject) -> bool:
    if not said.matches(cell.quantity):
        return False
    if who.policies and cell.policies and not any(
            family(spec) for family in who.policies for spec in cell.policies):
        return False
    if who.traces and cell.traced and not any(label in cell.text for label in who.traces):
        return False
    return not who.quantities or any(word in cell.text for words in who.quantities
                                     for word in words)


_SENTENCE = re.compile(r"(?:\.\s|;|\n)")


def clauses(verdict: str) -> list[tuple[str, str]]:
    """The verdict's (clause, its sentence); a paragraph's or bullet's lines are joined first
    (a line break inside a sentence is no boundary; a new bullet or a blank line is)."""
    joined = re.sub(r"[ \t]*\n(?![ \t]*(?:[-*] |\d+\. |\n))[ \t]*", " ", verdict)
    return [(c, sentence) for sentence in _SENTENCE.split(joined)
            for c in _CLAUSE.split(sentence) if c.strip()]


def unbound(verdict: str, section: str, specs: set[str], labels: list[str],
            trace_names: dict[str, str]) -> list[tuple[Quantity, str]]:
    """Each verdict number that is in the tables but not as the subject its clause names, with
    the clause."""
    table = cells(section, specs, labels)
    out = []
    for clause, sentence in clauses(verdict):
        for said, who in subjects(clause, specs, labels, trace_names, sentence):
            for q in said:
                anywhere = [c for c in table if q.matches(c.quantity)]
                if anywhere and not any(fits(c, q, who) for c in anywhere):
                    out.append((q, clause.strip()))
    return out
