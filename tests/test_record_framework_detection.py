"""``allocsim record`` without ``--framework`` records the framework the program imports
(issue 37.5): its imports are read with ``ast``, never run — torch is pytorch, jax is jax,
cupy is cupy. A program that imports none of them, or several, is one line asking to name it
with ``--framework``; nothing runs and nothing is written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from allocsim.errors import UserInputError
from allocsim.sim.cli.main import main
from allocsim.traces.record.script_framework import imported_frameworks, program_framework


@pytest.mark.parametrize("source, found", [
    ("import torch\n", {"pytorch"}),
    ("import torch.nn as nn\n", {"pytorch"}),
    ("from torch import optim\n", {"pytorch"}),
    ("import jax.numpy as jnp\n", {"jax"}),
    ("from jax import numpy\n", {"jax"}),
    ("import cupy as cp\n", {"cupy"}),
    ("def main():\n    import torch\n", {"pytorch"}),
    ("try:\n    import cupy\nexcept ImportError:\n    cupy = None\n", {"cupy"}),
    ("import numpy, os\n", set()),
    ("import torchvision\nimport jaxlib\n", set()),      # the name, not a prefix of it
    ("import torch, jax\n", {"pytorch", "jax"}),
    ("s = 'import torch'\n# import jax\n", set()),        # text, not an import
])
def test_imports_read_without_running(tmp_path: Path, source: str, found: set[str]) -> None:
    script = tmp_path / "prog.py"
    script.write_text(source + "raise SystemExit('ran')\n")
    assert imported_frameworks(script) == found


def test_the_program_s_own_modules_are_read_when_it_imports_no_framework(tmp_path) -> None:
    (tmp_path / "model.py").write_text("import torch\n")
    (tmp_path / "train.py").write_text("import model\n")
    assert program_framework(["python", str(tmp_path / "train.py")]) == "pytorch"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "nets.py").write_text("import jax\n")
    (tmp_path / "pkg" / "run.py").write_text("from . import nets\n")
    (tmp_path / "go.py").write_text("from pkg import run\n")
    assert program_framework([str(tmp_path / "go.py")]) == "jax"


def test_the_script_s_own_imports_come_first(tmp_path) -> None:
    """A helper that imports another framework too does not make the script ambiguous."""
    (tmp_path / "helpers.py").write_text("import cupy\n")
    (tmp_path / "train.py").write_text("import torch\nimport helpers\n")
    assert program_framework([str(tmp_path / "train.py")]) == "pytorch"


def test_a_module_run_with_m_is_read_from_the_working_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "train.py").write_text("import jax\n")
    (tmp_path / "app" / "__main__.py").write_text("import cupy\n")
    assert program_framework(["python", "-m", "app.train"]) == "jax"
    assert program_framework(["python", "-m", "app"]) == "cupy"


@pytest.mark.parametrize("source, says", [
    ("print('hello')\n", "prog.py imports none of torch, jax, cupy: name the framework with "
                         "--framework pytorch, jax or cupy"),
    ("import torch\nimport jax\n", "prog.py imports torch and jax: name the one to record with "
                                   "--framework pytorch or jax"),
    ("def broken(:\n", "prog.py: cannot read its imports (invalid syntax, line 1): name the "
                       "framework with --framework pytorch, jax or cupy"),
])
def test_none_several_or_unreadable_is_one_line_and_nothing_runs(tmp_path, capsys, monkeypatch,
                                                                 source: str, says: str) -> None:
    monkeypatch.chdir(tmp_path)
    Path("prog.py").write_text(source + "open('ran', 'w').close()\n")
    assert main(["record", "-o", "out.npz", "--", "python", "prog.py"]) == 2
    err = capsys.readouterr().err
    assert err == f"allocsim: error: record: {says}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prog.py"]


@pytest.mark.parametrize("module, source, says", [
    ("jax", "import jax.numpy as jnp\n", "record: JAX is not installed"),
    ("torch", "import torch\n", "record --framework pytorch needs PyTorch"),
    ("cupy", "import cupy\n", "record: CuPy is not installed"),
])
def test_the_recorder_of_the_imported_framework_runs(tmp_path, capsys, monkeypatch, module: str,
                                                      source: str, says: str) -> None:
    """Seen through the missing framework's own line: the recorder asked for is the one
    whose framework the script imports, not CuPy's by default."""
    monkeypatch.setitem(sys.modules, module, None)       # not importable, installed or not
    monkeypatch.chdir(tmp_path)
    Path("prog.py").write_text(source)
    assert main(["record", "-o", "out.npz", "--", "python", "prog.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"allocsim: error: {says}") and err.count("\n") == 1, err


def test_a_named_framework_is_not_second_guessed(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.chdir(tmp_path)
    Path("prog.py").write_text("import torch\n")
    assert main(["record", "--framework", "cupy", "-o", "out.npz", "--", "prog.py"]) == 2
    assert capsys.readouterr().err.startswith("allocsim: error: record: CuPy is not installed")


def test_a_missing_script_is_named_as_before(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["record", "-o", "out.npz", "--", "nosuch.py"]) == 2
    assert capsys.readouterr().err == "allocsim: error: nosuch.py: no such script\n"
    with pytest.raises(FileNotFoundError):
        program_framework(["nosuch.py"])


def test_an_unfound_module_asks_for_the_framework(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserInputError, match="name the framework with --framework"):
        program_framework(["python", "-m", "no_such_module_here"])
