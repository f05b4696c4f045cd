"""Every rule-edge mutation listed in tests/rule_mutations.toml fails at least one test.

A mutation changes one comparison of a rule (``>=`` to ``>`` at BFC's 128 MiB split edge, the
expandable walk's tie, …) in a copy of the source; its listed test files then run against the
copy and must fail (pytest exit status 1: tests ran and some failed — not a collection or
import error). An unmutated copy must pass the same files, so a failure is the mutation's.
The copy is importable as ``allocsim`` ahead of the installed (editable) project: the
repository's folders are laid out as the installed namespace (allocsim/policies, …).

A mutation of the native core (``file`` under native/) is held the same way in the other
implementation: the copy of native/ is built once with CMake (the CMakeLists.txt pip's build
runs), the mutated file rebuilt, and the module put into the copy's ``allocsim`` package, so
the listed tests run against the mutated core (its unmutated build must pass them first).

A mutation is keyed by its rule's name: ``function`` names the function that writes the rule
(a ``def`` in Python, a function definition in C++), and ``find`` must occur exactly once
inside that function's body, where the mutation is made. Code moved around the rule, or the
same text elsewhere in the file, does not break it; renaming the rule does, on purpose. Each
rule of the Python models has its twin in the core: the same function name (less Python's
leading underscore for a private method) in the twin file (tests/twin_files.py), so a rule the
core writes as an unnamed expression has nothing to mutate and fails here.

The slow part (a pytest run per mutation) is marked ``slow``; that each mutation still applies
to today's source (its function is found, its ``find`` text occurs there exactly once) is
checked on every run.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from twin_files import twin_file, twin_name

if sys.version_info >= (3, 11):
    import tomllib
else:                                       # the project's test extra installs tomli on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
LIST = Path(__file__).with_name("rule_mutations.toml")
MUTATIONS: list[dict[str, Any]] = tomllib.loads(LIST.read_text())["mutation"]
# The installed namespace's packages and the folders they come from (pyproject.toml's
# package-dir).
PACKAGES = {"allocsim": "allocsim", "allocsim/policies": "policies", "allocsim/sim": "sim",
            "allocsim/traces": "traces"}
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
NATIVE = "native/"                  # mutations of the core's sources
NATIVE_MUTATIONS = [m for m in MUTATIONS if m["file"].startswith(NATIVE)]


def test_the_list_holds_the_mutations_the_issue_names() -> None:
    names = {mutation["name"] for mutation in MUTATIONS}
    assert len(names) == len(MUTATIONS), "two mutations share a name"
    assert {"bfc-split-slack-edge", "pytorch-expandable-walk-tie"} <= names
    families = {name.split("-")[0] for name in names}
    assert {"bfc", "pytorch", "cupy", "cuda", "buddy", "best"} <= families
    # The native core's twins of the edges its newer policies share with the Python models.
    native = {m["name"] for m in MUTATIONS if m["file"].startswith(NATIVE)}
    assert {"native-pytorch-expandable-walk-tie", "native-cupy-limit-fits",
            "native-cuda-async-trim-to-threshold"} <= native


def test_every_rule_edge_is_held_in_both_implementations() -> None:
    """Issue 27.3 and 38.3: each listed mutation must fail a test in each implementation, so
    each mutation of the Python models has its twin in the native core, made in the function
    of the same name in the twin file."""
    native = {m["name"]: m for m in MUTATIONS if m["file"].startswith(NATIVE)}
    python = [m for m in MUTATIONS if not m["file"].startswith(NATIVE)]
    missing = sorted(m["name"] for m in python if f"native-{m['name']}" not in native)
    assert not missing, f"no native twin: {missing}"
    assert {f"native-{m['name']}" for m in python} >= native.keys(), (
        "a native mutation without its model")
    for model in python:
        twin = native[f"native-{model['name']}"]
        assert (twin["file"], twin["function"]) == (
            twin_file(model["file"]), twin_name(model["function"])), (
            f"{model['name']}: the rule {model['function']} of {model['file']} has its twin "
            f"in {twin['file']} as {twin['function']}, not as {twin_name(model['function'])} "
            f"in {twin_file(model['file'])}")


_CPP_DEFINITION = (r"^[ \t]*(?:(?:inline|static|constexpr|virtual)\s+)*[\w:<>]+[\s*&]+"
                   r"(?:\w+::)?{name}\((?:[^;{{}}()]|\([^()]*\))*\)\s*(?:const\s*)?"
                   r"(?:noexcept\s*)?\{{")


def function_span(path: str, text: str, name: str) -> tuple[int, int]:
    """Where the one function ``name`` of a source file is (its definition through its
    body's end, as offsets in ``text``); LookupError when the file defines none, or more than
    one, so a rule written as an unnamed expression is found nowhere."""
    if path.endswith(".py"):
        starts = [0]
        for line in text.splitlines(keepends=True):
            starts.append(starts[-1] + len(line))
        spans = [(starts[node.lineno - 1], starts[node.end_lineno])
                 for node in ast.walk(ast.parse(text))
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.name == name and node.end_lineno is not None]
    else:
        spans = []
        for match in re.finditer(_CPP_DEFINITION.format(name=re.escape(name)), text, re.M):
            depth, end = 0, match.end() - 1
            for end in range(match.end() - 1, len(text)):
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                if depth == 0:
                    break
            spans.append((match.start(), end + 1))
    if len(spans) != 1:
        raise LookupError(f"{path} defines {len(spans)} functions named {name} (one is needed)")
    return spans[0]


def mutated(path: str, text: str, mutation: dict[str, Any]) -> str:
    """``text`` with the mutation made inside its rule's function; AssertionError naming the
    mutation when its function is not found or ``find`` does not occur there exactly once."""
    try:
        start, end = function_span(path, text, mutation["function"])
    except LookupError as err:
        raise AssertionError(f"{mutation['name']}: {err}: update tests/rule_mutations.toml "
                             "or name the rule") from None
    body = text[start:end]
    found = body.count(mutation["find"])
    assert found == 1, (
        f"{mutation['name']}: {mutation['find']!r} occurs {found} times in "
        f"{mutation['function']} of {path} (it must occur once): update "
        "tests/rule_mutations.toml")
    return text[:start] + body.replace(mutation["find"], mutation["replace"]) + text[end:]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m["name"] for m in MUTATIONS])
def test_each_mutation_still_applies_to_the_source(mutation: dict[str, Any]) -> None:
    text = (ROOT / mutation["file"]).read_text()
    assert mutated(mutation["file"], text, mutation) != text
    assert mutation["replace"] != mutation["find"]
    for test in mutation["tests"]:
        assert (ROOT / test).is_file(), f"{mutation['name']}: no test file {test}"


def copy_of_the_source(into: Path) -> Path:
    """The project's packages laid out as the installed namespace under ``into``, with the
    tests and pytest's configuration beside them."""
    for target, source in PACKAGES.items():
        shutil.copytree(ROOT / source, into / target, ignore=IGNORED)
    shutil.copytree(ROOT / "tests", into / "tests", ignore=IGNORED)
    shutil.copy(ROOT / "pyproject.toml", into / "pyproject.toml")
    return into


# An editable install of the project (scikit-build-core's) puts a finder at the front of
# sys.meta_path that PYTHONPATH cannot outrank: the copy's interpreter drops it first, so
# `allocsim` is the copy's (and, with no native module there, its Python models).
WITHOUT_THE_INSTALLED_PACKAGE = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
                                 "if not type(f).__module__.startswith('_editable')]; ")


def run_tests(copy: Path, tests: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(copy), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("ALLOCSIM_NATIVE", None)
    return subprocess.run(
        [sys.executable, "-c",
         WITHOUT_THE_INSTALLED_PACKAGE + "import pytest; sys.exit(pytest.main(sys.argv[1:]))",
         "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly", *tests],
        cwd=copy, env=env, capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An unmutated copy; it must import as the copy and pass every listed test file."""
    copy = copy_of_the_source(tmp_path_factory.mktemp("pristine"))
    env = dict(os.environ, PYTHONPATH=str(copy))
    where = subprocess.run([sys.executable, "-c", WITHOUT_THE_INSTALLED_PACKAGE
                            + "import allocsim.policies as p; print(p.__file__)"], cwd=copy,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).resolve().is_relative_to(copy.resolve()), where
    tests = sorted({test for mutation in MUTATIONS for test in mutation["tests"]})
    passed = run_tests(copy, tests)     # the core is not in the copy: its tests skip
    assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-2000:]
    return copy


class NativeBuild:
    """A CMake build of a copy of native/: :meth:`module` builds it as its sources are now
    (only what changed is recompiled) and returns the module's path."""

    def __init__(self, root: Path) -> None:
        self.source = root / "native"
        shutil.copytree(ROOT / "native", self.source)
        self.build = root / "build"
        done = subprocess.run(
            ["cmake", "-S", str(self.source), "-B", str(self.build), "-DCMAKE_BUILD_TYPE=Release",
             f"-DPython_EXECUTABLE={sys.executable}"], capture_output=True, text=True,
            check=False)
        if done.returncode or "not built" in done.stderr:
            pytest.skip(f"the native core cannot be built here: {done.stderr[-500:]}")

    def module(self) -> Path:
        done = subprocess.run(["cmake", "--build", str(self.build)], capture_output=True,
                              text=True, timeout=1200, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        (found,) = self.build.glob("_native*")
        return found


@pytest.fixture(scope="module")
def native_build(tmp_path_factory: pytest.TempPathFactory) -> NativeBuild:
    if shutil.which("cmake") is None:
        pytest.skip("no cmake: the native core's mutations need a build")
    return NativeBuild(tmp_path_factory.mktemp("native"))


@pytest.fixture(scope="module")
def pristine_native(pristine: Path, native_build: NativeBuild,
                    tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The unmutated copy with the unmutated core in it; it must pass the native mutations'
    test files, with the core in use."""
    copy = tmp_path_factory.mktemp("pristine-native") / "copy"
    shutil.copytree(pristine, copy, ignore=IGNORED)
    shutil.copy(native_build.module(), copy / "allocsim")
    tests = sorted({test for mutation in NATIVE_MUTATIONS for test in mutation["tests"]})
    passed = run_tests(copy, [*tests, "-rs"])
    assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-2000:]
    assert "native core is not in use" not in passed.stdout, passed.stdout[-3000:]
    return copy


@pytest.mark.slow
@pytest.mark.parametrize("mutation", NATIVE_MUTATIONS, ids=[m["name"] for m in NATIVE_MUTATIONS])
def test_each_native_mutation_fails_a_test(mutation: dict[str, Any], pristine_native: Path,
                                           native_build: NativeBuild, tmp_path: Path) -> None:
    copy = tmp_path / "mutant"
    shutil.copytree(pristine_native, copy, ignore=IGNORED)
    path = native_build.source / mutation["file"].removeprefix(NATIVE)
    text = path.read_text()
    try:
        path.write_text(mutated(mutation["file"], text, mutation))
        shutil.copy(native_build.module(), copy / "allocsim")
    finally:
        path.write_text(text)
    ran = run_tests(copy, mutation["tests"])
    assert ran.returncode == 1, (
        f"{mutation['name']} ({mutation['rule']}) survived {mutation['tests']} in the native "
        f"core (pytest exit {ran.returncode}):\n{ran.stdout[-3000:]}{ran.stderr[-2000:]}")


PYTHON_MUTATIONS = [m for m in MUTATIONS if not m["file"].startswith(NATIVE)]


@pytest.mark.slow
@pytest.mark.parametrize("mutation", PYTHON_MUTATIONS, ids=[m["name"] for m in PYTHON_MUTATIONS])
def test_each_mutation_fails_a_test(mutation: dict[str, Any], pristine: Path,
                                    tmp_path: Path) -> None:
    copy = tmp_path / "mutant"
    shutil.copytree(pristine, copy, ignore=IGNORED)
    path = copy / PACKAGES_TARGET[mutation["file"].split("/")[0]] / mutation["file"].split(
        "/", 1)[1]
    path.write_text(mutated(mutation["file"], path.read_text(), mutation))
    ran = run_tests(copy, mutation["tests"])
    assert ran.returncode == 1, (
        f"{mutation['name']} ({mutation['rule']}) survived {mutation['tests']} "
        f"(pytest exit {ran.returncode}):\n{ran.stdout[-3000:]}{ran.stderr[-2000:]}")


# Source folder → where it sits in the copy.
PACKAGES_TARGET = {source: target for target, source in PACKAGES.items()}


def test_a_rule_is_written_only_in_its_model_and_its_twin() -> None:
    """An importer or a question asks the policy's rule instead of copying it (issue 38.3: the
    snapshot importer once held a third copy of should_split): no module of traces/ or sim/
    defines a function named as a rule (the Policy interface's own names aside)."""
    from allocsim.policies.base import Policy
    interface = {name for name in vars(Policy) if not name.startswith("__")}
    rules = {m["function"] for m in MUTATIONS if not m["file"].startswith(NATIVE)} - interface
    copies = []
    for folder in ("traces", "sim"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        node.name in rules):
                    copies.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not copies, f"a rule written again outside policies/: {copies}"
