"""Which framework a program records with, read from what it imports (``allocsim record``
without ``--framework``).

The program is never run to find out: its source is parsed with :mod:`ast` and every
``import`` statement counted, wherever it stands (inside a function or a ``try`` too, as a
script that imports torch in ``main()`` still uses it). ``torch`` is pytorch, ``jax`` is jax,
``cupy`` is cupy — the package's own name, not a prefix of it (``torchvision`` or ``jaxlib``
alone name no recorder). When the script imports none of them, its own modules (those beside
it, or in its packages, as Python would find them first) are read the same way, so
``train.py`` importing a local ``model.py`` that imports torch is pytorch; the script's own
imports come first, so a helper that also touches another framework does not make it
ambiguous. None found, several, or a source that cannot be read: one line asking to name
the framework with ``--framework``.
"""

from __future__ import annotations

import ast
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from allocsim.errors import UserInputError
from allocsim.traces.record.script_args import split_argv

# The package a program imports → the recorder's canonical framework name (allocsim.frameworks).
IMPORTED = {"torch": "pytorch", "jax": "jax", "cupy": "cupy"}

# The most local modules read when the script imports no framework itself: a bound on the
# time a large project could take, far above a training script's handful.
MAX_LOCAL_MODULES = 200

__all__ = ["IMPORTED", "imported_frameworks", "program_framework"]


class UnreadableSource(Exception):
    """A program's source that cannot be parsed (the reason, for the one-line error)."""


def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as err:
        raise UnreadableSource(f"{err.msg}, line {err.lineno}") from None
    except (ValueError, UnicodeDecodeError) as err:   # a NUL byte, an undecodable source
        raise UnreadableSource(str(err)) from None


def _imports(tree: ast.Module) -> Iterator[tuple[int, str, list[str]]]:
    """``(level, module, names)`` of every import: ``import a.b`` is ``(0, "a.b", [])``,
    ``from ..c import d`` is ``(2, "c", ["d"])``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield 0, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            yield node.level, node.module or "", [alias.name for alias in node.names]


def _frameworks_of(tree: ast.Module) -> set[str]:
    return {IMPORTED[module.split(".")[0]] for level, module, _ in _imports(tree)
            if level == 0 and module.split(".")[0] in IMPORTED}


def imported_frameworks(path: str | os.PathLike[str]) -> set[str]:
    """The canonical names of the frameworks the source file ``path`` imports itself."""
    return _frameworks_of(_parse(Path(path)))


def _module_file(root: Path, dotted: str) -> Path | None:
    """The source of module ``dotted`` under ``root`` (``a/b.py`` or ``a/b/__init__.py``)."""
    if not dotted:
        return None
    base = root.joinpath(*dotted.split("."))
    for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _local_modules(path: Path, tree: ast.Module, root: Path) -> Iterator[Path]:
    """The program's own modules that ``tree`` (the source at ``path``) imports: those found
    under ``root`` (the script's folder), absolute or relative to ``path``'s package."""
    for level, module, names in _imports(tree):
        if level:
            base = path.parent
            for _ in range(level - 1):
                base = base.parent
            try:
                dotted = ".".join(base.relative_to(root).parts + tuple(module.split(".")
                                                                       if module else ()))
            except ValueError:
                continue       # above the program's folder
        else:
            dotted = module
        parts = dotted.split(".") if dotted else []
        for depth in range(1, len(parts) + 1):     # a package's __init__ runs too
            found = _module_file(root, ".".join(parts[:depth]))
            if found is not None:
                yield found
        for name in names:                          # from pkg import submodule
            found = _module_file(root, ".".join([*parts, name]))
            if found is not None:
                yield found


def _local_frameworks(script: Path, tree: ast.Module, root: Path) -> set[str]:
    """The frameworks the program's own modules under ``root`` import (breadth first, each
    read once)."""
    root = root.resolve()
    seen = {script.resolve()}
    queue = [(script.resolve(), tree)]
    found: set[str] = set()
    while queue and len(seen) <= MAX_LOCAL_MODULES:
        path, source = queue.pop(0)
        for module in _local_modules(path, source, root):
            module = module.resolve()
            if module in seen:
                continue
            seen.add(module)
            try:
                parsed = _parse(module)
            except (UnreadableSource, OSError):
                continue       # Python would fail on it when the script runs: said then
            found |= _frameworks_of(parsed)
            queue.append((module, parsed))
    return found


def _program_source(argv: list[str]) -> tuple[Path, str, Path]:
    """The source file the command line runs, how to name it in a message, and the folder
    its own modules are imported from (the script's; the working folder for ``-m``)."""
    script, module, _ = split_argv(argv)
    if script is not None:
        if not Path(script).is_file():
            raise FileNotFoundError(errno.ENOENT, "no such script", script)
        return Path(script), script, Path(script).resolve().parent
    name = str(module)
    # ``python -m`` looks in the working folder first; a package runs its __main__.
    base = Path.cwd().joinpath(*name.split("."))
    for candidate in (base.with_name(base.name + ".py"), base / "__main__.py"):
        if candidate.is_file():
            return candidate, f"-m {name}", Path.cwd()
    raise UserInputError(f"record: cannot find the source of -m {name} in the working folder "
                         f"to read its imports: {_NAME_IT}")


_RECORDABLE = ", ".join(IMPORTED)                          # torch, jax, cupy
_NAME_IT = "name the framework with --framework " + ", ".join(
    list(IMPORTED.values())[:-1]) + " or " + list(IMPORTED.values())[-1]


def program_framework(argv: list[str]) -> str:
    """The one framework the program on ``argv`` (``[python] script.py args`` or
    ``[python] -m module args``) imports, by its canonical name; :class:`UserInputError` in
    one line when it imports none or several or cannot be read; ``FileNotFoundError`` for a
    missing script (the recorders' own "no such script")."""
    path, shown, root = _program_source(argv)
    try:
        tree = _parse(path)
    except UnreadableSource as err:
        raise UserInputError(f"record: {shown}: cannot read its imports ({err}): "
                             f"{_NAME_IT}") from None
    except OSError as err:
        raise UserInputError(f"record: {shown}: cannot read its imports "
                             f"({err.strerror or err}): {_NAME_IT}") from None
    found = _frameworks_of(tree) or _local_frameworks(path, tree, root)
    if len(found) == 1:
        return found.pop()
    if not found:
        raise UserInputError(f"record: {shown} imports none of {_RECORDABLE}: {_NAME_IT}")
    by_import = {name: package for package, name in IMPORTED.items()}
    ordered = [name for name in IMPORTED.values() if name in found]
    packages = [by_import[name] for name in ordered]
    raise UserInputError(f"record: {shown} imports {', '.join(packages[:-1])} and "
                         f"{packages[-1]}: name the one to record with --framework "
                         f"{', '.join(ordered[:-1])} or {ordered[-1]}")
