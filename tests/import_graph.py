"""The import graph of the `allocsim` package, read from the source with `ast`.

Every import counts, also those inside functions (a lazy import still ties two modules), and
`from X import name` counts as an import of `X.name` when that is a module. Modules are named
as installed (pyproject.toml maps `sim/` to `allocsim.sim`, `policies/` to `allocsim.policies`,
`traces/` to `allocsim.traces`), which is why this reads files rather than asking import-linter
or grimp: both walk the folder of the installed package and would not see the mapped folders.

    python tests/import_graph.py        # rooms, cycles (none expected), the longest modules
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The native core (native/, built): a module of the package with no Python source here.
NATIVE_CORE = "allocsim._native"
# Folder in the repository -> its name in the installed namespace (pyproject package-dir).
FOLDERS = {"allocsim": "allocsim", "sim": "allocsim.sim", "policies": "allocsim.policies",
           "traces": "allocsim.traces"}


@dataclass
class Module:
    name: str
    path: Path
    lines: int
    imports: set[str] = field(default_factory=set)   # allocsim modules it imports
    foreign: set[str] = field(default_factory=set)   # top-level names of everything else


def module_files() -> Iterator[tuple[str, Path]]:
    for folder, package in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join([package, *parts]), path


def _resolve(module: str, level: int, current: str, is_package: bool) -> str:
    if not level:
        return module
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def read_graph() -> dict[str, Module]:
    files = dict(module_files())
    graph: dict[str, Module] = {}
    for name, path in files.items():
        text = path.read_text()
        module = Module(name, path, text.count("\n") + 1)
        for node in ast.walk(ast.parse(text, str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node.module or "", node.level, name, path.name == "__init__.py")
                named = [f"{base}.{alias.name}" for alias in node.names]
                targets = [full if full in files or full == NATIVE_CORE else base
                           for full in named]
            for target in targets:
                if target == NATIVE_CORE:
                    module.foreign.add(target)    # compiled, no source: not the package's
                elif target == "allocsim" or target.startswith("allocsim."):
                    while target not in files and "." in target:
                        target = target.rsplit(".", 1)[0]
                    if target != name:
                        module.imports.add(target)
                else:
                    module.foreign.add(target.split(".")[0])
        graph[name] = module
    return graph


def cycles(graph: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), or a self-loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node].imports):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def depth(graph: dict[str, Module]) -> int:
    """The longest chain of imports (levels), on the acyclic graph."""
    memo: dict[str, int] = {}

    def level(node: str) -> int:
        if node not in memo:
            memo[node] = 0
            memo[node] = 1 + max((level(t) for t in graph[node].imports), default=0)
        return memo[node]

    return max(level(node) for node in graph)


def room_of(module: str) -> str:
    """`allocsim.sim.kernel.engine` -> `sim.kernel`; `allocsim.policies.bfc` -> `policies`;
    `allocsim.api` -> `api`."""
    parts = module.split(".")[1:]
    if not parts:
        return "allocsim"
    if parts == ["api"]:
        return "api"      # the flat Python API: on top of the questions, beside the CLI
    if parts[0] == "sim" and len(parts) > 1 and not parts[1].startswith("_"):
        return f"sim.{parts[1]}" if len(parts) > 2 or parts[1] in ROOMS_OF_SIM else "sim"
    return parts[0] if parts[0] in ("sim", "policies", "traces") else "allocsim"


ROOMS_OF_SIM = ("kernel", "questions", "output", "sweeps", "validation", "cli")


def main() -> int:
    graph = read_graph()
    found = cycles(graph)
    edges = sum(len(m.imports) for m in graph.values())
    print(f"{len(graph)} modules, {edges} imports between them, "
          f"{depth(graph) if not found else '-'} levels deep")
    print("cycles: " + ("none" if not found else "; ".join(" <-> ".join(c) for c in found)))
    rooms: dict[str, set[str]] = {}
    for module in graph.values():
        for target in module.imports:
            if room_of(target) != room_of(module.name):
                rooms.setdefault(room_of(module.name), set()).add(room_of(target))
    for room in sorted(rooms):
        print(f"  {room:16s} imports {', '.join(sorted(rooms[room]))}")
    print("longest modules:")
    for module in sorted(graph.values(), key=lambda m: -m.lines)[:5]:
        print(f"  {module.lines:5d}  {module.path.relative_to(REPO)}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
