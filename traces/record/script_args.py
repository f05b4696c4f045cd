"""The command line of a recorded program: ``[python] script.py args`` or
``[python] -m module args``, as ``allocsim record -- ...`` takes it, and the program run as
``python`` would run it (every recorder)."""

from __future__ import annotations

import os
import re
import runpy
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from allocsim.errors import UserInputError

__all__ = ["as_main", "interpreter_note", "run_as_main", "script_metadata", "split_argv"]

_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?(\.exe)?$", re.IGNORECASE)


def split_argv(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    """``(script path, module name, arguments)``; a leading ``python`` is dropped."""
    args = list(argv)
    if args and (_PYTHON.match(os.path.basename(args[0])) or args[0] == sys.executable):
        args = args[1:]
    if not args:
        raise UserInputError("no script to run: expected [python] script.py [args...]")
    if args[0] == "-m":
        if len(args) < 2:
            raise UserInputError("-m needs a module name")
        return None, args[1], args[2:]
    return args[0], None, args[1:]


def interpreter_note(argv: list[str]) -> str | None:
    """A line saying so when ``argv`` names another Python than the one recording: the
    script runs in this interpreter (the recorder's hooks live here), not in that one."""
    if not argv:
        return None
    first = argv[0]
    if not _PYTHON.match(os.path.basename(first)) or first == sys.executable:
        return None
    if os.path.sep not in first and first.lower().startswith("python"):
        return None  # a bare "python": whichever is first on PATH, taken to mean this one
    return (f"note: {first} is not the interpreter recording; the script runs in "
            f"{sys.executable} (the recorder's hooks live in its process)")


def script_metadata(script: str | None, module: str | None, argv: list[str],
                    extra: dict[str, Any] | None) -> dict[str, Any]:
    """The trace metadata naming the program run (``script`` or ``-m module``, its argv)."""
    meta: dict[str, Any] = {"script": script if script is not None else f"-m {module}",
                            "argv": list(argv)}
    meta.update(extra or {})
    return meta


@contextmanager
def as_main(script: str | None, module: str | None, args: list[str]) -> Iterator[None]:
    """``sys.argv`` and ``sys.path`` as ``python script.py args`` (or ``-m module``) sets them —
    the script's folder (or the working folder) first on the import path — restored after."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script if script is not None else str(module), *args]
    sys.path.insert(0, str(Path(script).resolve().parent) if script is not None else os.getcwd())
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


def run_as_main(script: str | None, module: str | None) -> dict[str, Any]:
    """Run the program as ``__main__``; returns its globals."""
    if script is not None:
        return runpy.run_path(script, run_name="__main__")
    return runpy.run_module(str(module), run_name="__main__", alter_sys=True)
