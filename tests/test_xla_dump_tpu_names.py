"""XLA:TPU's dump file names (JAX 0.10 through libtpu): the compiler appends its changelist to
the module's name and writes a bare ``after_optimizations`` stage, as in
``module_0000.jit_step.cl_933746096.after_optimizations-buffer-assignment.txt``. The module
is still ``jit_step`` (or ``step``) to ``--module``; its full key keeps working.

The files are the committed CPU dump's (tests/data/xla/cpu) copied under TPU-style names.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path

import pytest

from allocsim.sim.cli.main import main
from allocsim.traces import formats
from allocsim.traces.formats.xla.dump import is_dump_path, list_modules
from allocsim.traces.model import TraceError

CPU = Path(__file__).resolve().parent / "data" / "xla" / "cpu"
CL = "cl_933746096"
KINDS = ("live-range", "buffer-assignment", "buffer-assignment-values", "memory-usage-report")


def cli(*args: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main([str(a) for a in args])
        except SystemExit as exit_:
            status = int(exit_.code or 0)
    return status, out.getvalue(), err.getvalue()


def tpu_module(folder: Path, cpu_module: str, number: str, name: str) -> None:
    """Copy the CPU module ``cpu_module`` (``module_0008.jit_rnn_scan``) as the XLA:TPU module
    ``module_<number>.<name>.cl_933746096``."""
    folder.mkdir(exist_ok=True)
    for kind in KINDS:
        shutil.copyfile(CPU / f"{cpu_module}.cpu_after_optimizations-{kind}.txt",
                        folder / f"module_{number}.{name}.{CL}.after_optimizations-{kind}.txt")


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    folder = tmp_path / "dump"
    tpu_module(folder, "module_0008.jit_rnn_scan", "0000", "jit_step")
    tpu_module(folder, "module_0004.jit_update_cache", "0002", "jit_init")
    return folder


def test_the_modules_keep_their_full_keys_and_know_their_plain_names(dump: Path) -> None:
    modules = list_modules(dump)
    assert [m.key for m in modules] == [f"module_0000.jit_step.{CL}",
                                        f"module_0002.jit_init.{CL}"]
    assert [m.plain_name for m in modules] == ["jit_step", "jit_init"]
    assert {m.changelist for m in modules} == {"933746096"}
    assert {m.platform for m in modules} == {"tpu"}
    assert all(m.problem is None for m in modules)
    assert is_dump_path(dump)
    assert is_dump_path(next(dump.glob("*-buffer-assignment.txt")))


@pytest.mark.parametrize("wanted", ["jit_step", "step", f"jit_step.{CL}",
                                    f"module_0000.jit_step.{CL}", "module_0000.jit_step",
                                    "0", "0000", "module_0000"])
def test_module_names_as_users_know_them(dump: Path, wanted: str) -> None:
    trace = formats.load(dump, module=wanted, view="buffers")
    assert trace.name == f"module_0000.jit_step.{CL}"
    assert trace.metadata["xla"]["platform"] == "tpu"
    assert formats.load(dump, module=wanted).name  # the runtime view too


def test_a_cpu_name_is_not_read_as_a_changelist() -> None:
    modules = list_modules(CPU)
    assert all(m.plain_name == m.name and m.changelist is None for m in modules)
    assert {m.platform for m in modules} == {"cpu"}


def test_the_same_function_compiled_twice_is_ambiguous_by_its_plain_name(dump: Path) -> None:
    tpu_module(dump, "module_0008.jit_rnn_scan", "0004", "jit_step")
    with pytest.raises(TraceError, match=re.escape(f"ambiguous: module_0000.jit_step.{CL}, "
                                                   f"module_0004.jit_step.{CL}")):
        formats.load(dump, module="jit_step", view="buffers")
    assert formats.load(dump, module="4", view="buffers").name == f"module_0004.jit_step.{CL}"


def test_an_unknown_module_lists_the_full_keys(dump: Path) -> None:
    with pytest.raises(TraceError, match="no module 'nope'") as err:
        formats.load(dump, module="nope", view="buffers")
    assert f"module_0000.jit_step.{CL}" in str(err.value)


@pytest.mark.parametrize("wanted", ["jit_step", "step"])
def test_compare_finds_the_module(dump: Path, wanted: str) -> None:
    status, out, err = cli("compare", dump, "--module", wanted, "--policies", "bfc")
    assert status == 0, err
    assert out


def test_one_file_of_the_module_with_its_plain_name(dump: Path) -> None:
    path = dump / f"module_0000.jit_step.{CL}.after_optimizations-live-range.txt"
    trace = formats.load(path, module="jit_step", view="buffers")
    assert trace.name == f"module_0000.jit_step.{CL}"
    with pytest.raises(TraceError, match="not this file's module"):
        formats.load(path, module="init", view="buffers")
