"""The picture in docs/architecture.md ("From a file to an answer"), drawn from the imports.

Reads the package's import graph (tests/import_graph.py: every import, lazy ones too, modules
named as installed), folds it into the rooms a trace passes through on its way to an answer,
and writes the rooms and who imports whom as a Mermaid flowchart — the text the document holds
between its ``mermaid`` fences (tests/test_architecture.py fails when they differ) — or, with
``--png``, draws the same graph with matplotlib to look at without a Mermaid viewer::

    python docs/draw_rooms.py               # the Mermaid text, to paste into the document
    python docs/draw_rooms.py --png rooms.png

An arrow ``A --> B`` is "A imports B"; data goes the other way round (B hands A its values).
An import that a longer chain of arrows already implies is not drawn (the transitive
reduction), and neither are imports of the root package's helpers (errors, atomic files,
printable names), which every room uses: either would tie most boxes to most others.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from import_graph import read_graph

# The rooms drawn, in the order a trace meets them, each with what it holds. A module belongs
# to the first room whose prefix its name starts with.
ROOMS = (
    ("traces.formats", "traces/formats", "files in: readers by format"),
    ("traces.record", "traces/record", "recorders of running programs"),
    ("traces.synth", "traces/synth", "generated workloads"),
    ("traces.bundled", "traces/bundled", "the bundled samples"),
    ("traces", "traces", "the Trace, its checks"),
    ("policies", "policies", "allocator models"),
    ("sim.kernel", "sim/kernel", "device, engine, run report"),
    ("sim.questions", "sim/questions", "compare, capacity, tune, fidelity"),
    ("sim.output", "sim/output", "tables, JSON, figures, report"),
    ("sim.sweeps", "sim/sweeps", "grids of runs"),
    ("sim.validation", "sim/validation", "the policies on real memory"),
    ("api", "allocsim.api", "the Python API"),
    ("sim.cli", "sim/cli", "the commands"),
)
LEFT_OUT = ("allocsim",)    # the root package's helpers (module docstring)


def room(module: str) -> str | None:
    """The drawn room of ``allocsim.X.Y`` (None: the root's helpers, left out)."""
    name = module.removeprefix("allocsim.")
    for key, _, _ in ROOMS:
        if name == key or name.startswith(key + "."):
            return key
    return None


def room_edges() -> list[tuple[str, str]]:
    """(importer, imported) between drawn rooms, in the order of :data:`ROOMS`."""
    order = {key: index for index, (key, _, _) in enumerate(ROOMS)}
    edges: set[tuple[str, str]] = set()
    for name, module in read_graph().items():
        source = room(name)
        for target in module.imports:
            imported = room(target)
            if source and imported and imported != source:
                edges.add((source, imported))
    return sorted(edges, key=lambda e: (order[e[0]], order[e[1]]))


def reduced_edges() -> list[tuple[str, str]]:
    """:func:`room_edges` less every import a longer chain of drawn imports already implies
    (the transitive reduction, of the graph with each cycle taken as one room: formats and
    synth import each other), so that what is left shows the layers, not every shortcut."""
    edges = room_edges()
    targets: dict[str, set[str]] = {}
    for source, target in edges:
        targets.setdefault(source, set()).add(target)

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        stack = list(targets.get(start, ()))
        while stack:
            node = stack.pop()
            if node not in seen:
                seen.add(node)
                stack.extend(targets.get(node, ()))
        return seen

    reached = {key: reach(key) for key, _, _ in ROOMS}
    group = {key: frozenset([key, *(o for o in reached[key] if key in reached[o])])
             for key, _, _ in ROOMS}
    # Between groups: A → B is implied when some other group C, reached from A, reaches B.
    kept = []
    for source, target in edges:
        a, b = group[source], group[target]
        if a == b:
            kept.append((source, target))
            continue
        between = {group[n] for n in reached[source]} - {a, b}
        if not any(next(iter(b)) in reached[next(iter(c))] for c in between):
            kept.append((source, target))
    return kept


def _node(key: str) -> str:
    return key.replace(".", "_")


def mermaid() -> str:
    """The flowchart: one box per room (its folder and what it holds), one arrow per import."""
    lines = ["flowchart BT"]
    for key, folder, holds in ROOMS:
        lines.append(f'    {_node(key)}["{folder}<br/>{holds}"]')
    for source, target in reduced_edges():
        lines.append(f"    {_node(source)} --> {_node(target)}")
    return "\n".join(lines) + "\n"


def layers() -> dict[str, int]:
    """Each room's row: 0 imports no drawn room; else one above the highest it imports. Two
    rooms that import each other (formats and synth share two helpers) are read in the order
    met, the second one's import of the first left out of its row."""
    edges = room_edges()
    level: dict[str, int] = {}

    def of(key: str) -> int:
        if key not in level:
            level[key] = 0                  # in progress: a cycle back here counts as 0
            level[key] = 1 + max((of(t) for s, t in edges if s == key), default=-1)
        return level[key]

    for key, _, _ in ROOMS:
        of(key)
    return level


def draw_png(path: Path) -> None:
    """The same graph with matplotlib, rooms in rows by :func:`layers` (bottom: level 0)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    level = layers()
    rows: dict[int, list[str]] = {}
    for key, _, _ in ROOMS:
        rows.setdefault(level[key], []).append(key)
    place: dict[str, tuple[float, float]] = {}
    for row, keys in rows.items():
        for index, key in enumerate(keys):
            place[key] = ((index + 1) / (len(keys) + 1), row)
    labels = {key: f"{folder}\n{holds}" for key, folder, holds in ROOMS}
    fig, ax = plt.subplots(figsize=(11, 1.6 * (max(rows) + 1)))
    for source, target in reduced_edges():
        (x0, y0), (x1, y1) = place[source], place[target]
        ax.annotate("", xy=(x1, y1 + 0.22), xytext=(x0, y0 - 0.22),
                    arrowprops={"arrowstyle": "->", "color": "0.55", "lw": 0.9,
                                "shrinkA": 0, "shrinkB": 0})
    for key, (x, y) in place.items():
        ax.text(x, y, labels[key], ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round,pad=0.4", "fc": "white", "ec": "0.3"})
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.6, max(rows) + 0.6)
    ax.axis("off")
    ax.set_title("allocsim's rooms; an arrow is an import (data flows against it)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", type=Path, metavar="PATH", help="draw it with matplotlib")
    args = parser.parse_args(argv)
    if args.png:
        draw_png(args.png)
    else:
        sys.stdout.write(mermaid())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
