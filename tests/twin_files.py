"""Which file of the native core mirrors which module of the Python models, and under which
name a rule appears there: the one-to-one correspondence the twins keep (CPython's heapq.py
and _heapqmodule.c name their operations alike, file for file).

``policies/X.py`` is mirrored by ``native/src/X.hpp``; a package of one model in several
modules, ``policies/X/`` (PyTorch's), by the one ``native/src/X.hpp``. A rule keeps its name,
less the leading underscore Python gives a private method.
"""

from __future__ import annotations

from pathlib import Path

NATIVE_SOURCES = "native/src/"


def twin_file(python_file: str) -> str:
    """The core's file that mirrors ``python_file`` (a path from the repository's root)."""
    parts = Path(python_file).parts           # ("policies", "X.py") or ("policies", "X", …)
    stem = parts[1] if len(parts) > 2 else Path(python_file).stem
    return f"{NATIVE_SOURCES}{stem}.hpp"


def twin_name(python_function: str) -> str:
    """A Python rule's name in the core: the same, less a private method's underscore."""
    return python_function.lstrip("_")
