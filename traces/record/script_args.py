"""The command line of a recorded program: ``[python] script.py args`` or
``[python] -m module args``, as ``allocsim record -- ...`` takes it (every recorder)."""

from __future__ import annotations

import os
import re
import sys

from allocsim.errors import UserInputError

__all__ = ["split_argv"]

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
