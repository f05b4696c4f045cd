"""The command line of a recorded program: ``[python] script.py args`` or
``[python] -m module args``, as ``allocsim record -- ...`` takes it (every recorder)."""

from __future__ import annotations

import os
import re
import sys

from allocsim.errors import UserInputError

__all__ = ["interpreter_note", "split_argv"]

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
