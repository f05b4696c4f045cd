"""The rules of the house (docs/architecture.md, "Where things are"), checked on the source.

No import circles anywhere (lazy imports count); every room imports only the rooms below it;
the policies stay pure; nothing uses the old top-level names (`sim`, `policies`, `traces`),
which PyPI packages of the same names would shadow.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from import_graph import FOLDERS, REPO, Module, cycles, read_graph, room_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# Which rooms each room may import (besides itself). `allocsim` is the root package: its
# `errors` module imports nothing and may be raised from anywhere. `allocsim.api` is the flat
# Python API over the questions, which the root package loads on first use.
ALLOWED = {
    "allocsim": {"sim.cli", "api"},                   # __main__, to run the CLI; the API
    "api": {"allocsim", "policies", "traces", "sim.kernel", "sim.questions"},
    "policies": {"allocsim"},
    "traces": {"allocsim"},
    "sim": set(),
    "sim.kernel": {"allocsim", "policies", "traces"},
    "sim.questions": {"allocsim", "policies", "traces", "sim.kernel"},
    "sim.output": {"allocsim", "policies", "traces", "sim.kernel", "sim.questions"},
    "sim.sweeps": {"allocsim", "policies", "traces", "sim.kernel", "sim.questions",
                   "sim.output"},
    "sim.validation": {"allocsim", "policies", "traces", "sim.kernel", "sim.questions",
                       "sim.output"},
    "sim.cli": {"allocsim", "policies", "traces", "sim.kernel", "sim.questions",
                "sim.output", "sim.sweeps", "sim.validation"},
}
GRAPH = read_graph()


def test_the_import_graph_has_no_cycle() -> None:
    assert cycles(GRAPH) == []


def test_the_graph_reader_finds_a_cycle_when_there_is_one() -> None:
    graph = {"a": Module("a", Path("a.py"), 1, {"b"}), "b": Module("b", Path("b.py"), 1, {"c"}),
             "c": Module("c", Path("c.py"), 1, {"a"}), "d": Module("d", Path("d.py"), 1, {"a"})}
    assert cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_each_module_imports_only_the_rooms_below_its_own(module: str) -> None:
    room = room_of(module)
    wrong = sorted(target for target in GRAPH[module].imports
                   if room_of(target) != room and room_of(target) not in ALLOWED[room])
    assert not wrong, f"{module} (room {room}) imports {wrong}"


def test_only_the_command_line_and_the_entry_point_use_argparse() -> None:
    users = sorted(name for name, module in GRAPH.items() if "argparse" in module.foreign)
    assert all(room_of(name) == "sim.cli" for name in users), users


def test_the_policies_need_nothing_but_the_standard_library() -> None:
    # The same policy objects run against a real GPU: no simpy, numpy or files in them.
    third_party = {"numpy", "simpy", "matplotlib", "cupy", "torch"}
    for name, module in GRAPH.items():
        if room_of(name) == "policies":
            assert not module.foreign & third_party, (name, module.foreign & third_party)


def _imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("folder", ["allocsim", "sim", "policies", "traces", "tests",
                                    "experiments", "benchmarks"])
def test_nothing_imports_the_old_top_level_names(folder: str) -> None:
    old = {"sim", "policies", "traces"}
    offenders = sorted(str(path.relative_to(REPO)) for path in (REPO / folder).rglob("*.py")
                       if _imports_of(path) & old)
    assert offenders == []


def test_pyproject_maps_each_top_level_folder_to_its_subpackage() -> None:
    # scikit-build-core puts each mapped folder in the wheel whole (every subpackage and its
    # data); a folder left out of the mapping would be missing there.
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["scikit-build"]
    mapped = {target.replace("/", "."): folder
              for target, folder in config["wheel"]["packages"].items()}
    assert mapped == {package: folder for folder, package in FOLDERS.items()}


def _draw_rooms() -> ModuleType:
    spec = importlib.util.spec_from_file_location("draw_rooms", REPO / "docs" / "draw_rooms.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_picture_of_the_rooms_is_drawn_from_todays_imports() -> None:
    page = (REPO / "docs" / "architecture.md").read_text()
    blocks = re.findall(r"```mermaid\n(.*?)```", page, re.S)
    assert blocks == [_draw_rooms().mermaid()], "run python docs/draw_rooms.py and paste it"


def test_the_picture_keeps_every_room_a_trace_passes_through_connected() -> None:
    draw = _draw_rooms()
    edges = draw.reduced_edges()
    drawn = {room for edge in edges for room in edge}
    assert drawn == {key for key, _, _ in draw.ROOMS}
    # The path of `allocsim compare FILE`, as the paragraph above the picture tells it.
    for step in [("sim.cli", "sim.sweeps"), ("sim.output", "sim.questions"),
                 ("sim.questions", "sim.kernel"), ("sim.kernel", "policies"),
                 ("sim.kernel", "traces.formats"), ("traces.formats", "traces")]:
        assert step in draw.room_edges(), step


def test_the_picture_can_be_drawn_without_a_mermaid_viewer(tmp_path: Path) -> None:
    _draw_rooms().draw_png(tmp_path / "rooms.png")
    assert (tmp_path / "rooms.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
