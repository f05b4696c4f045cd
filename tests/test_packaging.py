"""What a user installs: one `allocsim` namespace, its data, its metadata and entry points."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import allocsim
from allocsim.sim.kernel.native import implementation

REPO = Path(__file__).resolve().parents[1]


def test_python_dash_m_allocsim_runs_the_command_line() -> None:
    done = subprocess.run([sys.executable, "-m", "allocsim", "--version"], capture_output=True,
                          text=True, check=False, cwd="/")
    assert done.returncode == 0
    assert done.stdout.strip() == f"allocsim {allocsim.__version__} ({implementation()})"


def test_the_allocsim_script_reports_its_version() -> None:
    script = shutil.which("allocsim")
    if script is None:
        pytest.skip("the allocsim script is not on PATH")
    done = subprocess.run([script, "--version"], capture_output=True, text=True, check=False)
    assert done.stdout.strip() == f"allocsim {allocsim.__version__} ({implementation()})"


def test_the_version_says_which_implementation_runs() -> None:
    off = subprocess.run([sys.executable, "-m", "allocsim", "--version"], capture_output=True,
                         text=True, check=False, cwd="/", env={**os.environ,
                                                               "ALLOCSIM_NATIVE": "0"})
    assert off.stdout.strip() == (f"allocsim {allocsim.__version__} "
                                  "(Python models (ALLOCSIM_NATIVE=0))")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    # Built from a copy: pip builds in the source folder, and a test writes only its own files.
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    for folder in ("allocsim", "sim", "policies", "traces", "native"):
        shutil.copytree(REPO / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                           "-w", str(out), str(source)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        pytest.skip(f"could not build the wheel here: {done.stderr.strip()[-300:]}")
    (path,) = out.glob("allocsim-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_installs_one_top_level_package(wheel: zipfile.ZipFile) -> None:
    top = {name.split("/")[0] for name in wheel.namelist()}
    assert {t for t in top if not t.endswith(".dist-info")} == {"allocsim"}


def test_the_wheel_holds_the_rooms_the_data_and_the_type_marker(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for expected in ("allocsim/__init__.py", "allocsim/__main__.py", "allocsim/py.typed",
                     "allocsim/errors.py", "allocsim/sim/kernel/engine.py",
                     "allocsim/sim/cli/main.py", "allocsim/policies/bfc.py",
                     "allocsim/traces/formats/__init__.py",
                     "allocsim/traces/data/default-training.npz",
                     # the report's chart library, its licence and the page's script
                     "allocsim/sim/output/vendor/uPlot.iife.min.js",
                     "allocsim/sim/output/vendor/uPlot.min.css",
                     "allocsim/sim/output/vendor/uPlot.LICENSE",
                     "allocsim/sim/output/report_charts.js"):
        assert expected in names, expected
    assert not any(name.startswith(("allocsim/experiments", "experiments/", "allocsim/benchmarks",
                                    "benchmarks/", "tests/"))
                   for name in names)
    assert any(name.startswith("allocsim/sim/output/schemas/") and name.endswith(".json")
               for name in names)
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)


def test_the_wheel_holds_every_package_folder(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for folder, package in (("allocsim", "allocsim"), ("sim", "allocsim/sim"),
                            ("policies", "allocsim/policies"), ("traces", "allocsim/traces")):
        for init in (REPO / folder).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            inside = init.relative_to(REPO / folder).as_posix()
            assert f"{package}/{inside}" in names, f"{package}/{inside}"


def test_the_wheel_holds_the_native_core_where_a_compiler_is(wheel: zipfile.ZipFile) -> None:
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler here: the wheel is built without the native core")
    assert any(name.startswith("allocsim/_native") and name.endswith((".so", ".pyd"))
               for name in wheel.namelist())


@pytest.mark.slow
def test_without_a_compiler_the_wheel_builds_with_the_python_models_only(
        tmp_path: Path) -> None:
    # CMake checks for C++ and skips the module when there is none (native/CMakeLists.txt):
    # a compiler that does not exist stands in for a machine without one.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    for folder in ("allocsim", "sim", "policies", "traces", "native"):
        shutil.copytree(REPO / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "wheel"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                           "-w", str(out), str(source)], capture_output=True, text=True,
                          check=False, env={**os.environ, "CXX": "/nonexistent/c++"})
    if done.returncode != 0 and "scikit-build-core" in done.stderr and "nanobind" in done.stderr:
        pytest.skip(f"could not fetch the build requirements here: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = out.glob("allocsim-*.whl")
    names = zipfile.ZipFile(path).namelist()
    assert "allocsim/sim/kernel/engine.py" in names
    assert not any(name.startswith("allocsim/_native") for name in names)


def test_the_wheel_metadata_names_the_license_and_the_python_versions(
        wheel: zipfile.ZipFile) -> None:
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    text = wheel.read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
    assert "Requires-Python: >=3.10" in text
    assert "Classifier: Typing :: Typed" in text
    assert any(n.endswith("licenses/LICENSE") for n in wheel.namelist())
    requires = [line for line in text.splitlines() if line.startswith("Requires-Dist:")]
    core = [line for line in requires if "extra ==" not in line]
    assert not any("sortedcontainers" in line for line in core)


def test_the_installed_command_runs_outside_the_repository(tmp_path: Path) -> None:
    # `python -m pytest` puts the repository on sys.path, which can hide a lookup of an old
    # top-level name; a process started elsewhere sees only what is installed.
    done = subprocess.run([sys.executable, "-m", "allocsim", "compare", "--policies", "bfc"],
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "default-training" in done.stdout and "winner: bfc" in done.stdout
