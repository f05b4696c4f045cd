"""A sweep's trace glob, expanded as :func:`glob.glob` does but each file once (issue 36.6).

Python's glob follows a symlinked directory wherever ``**`` meets one: a ``latest -> .`` link
repeats every trace below it about 40 times (until the path is too long to resolve), and two
such links make the walk grow without end. Here ``**`` enters each directory once, by its
resolved path — the real directories first, a link only into a directory not otherwise
reached — and a file met under several names (a link to it, a linked folder) is listed once,
under its shallowest name, first in sorted order.

What stays glob's: ``*``, ``?`` and ``[...]`` match within one name, ``**`` any number of
folders, and neither matches a name starting with a dot unless the pattern's name does.
"""

from __future__ import annotations

import fnmatch
import os

__all__ = ["expand_trace_glob"]


def expand_trace_glob(pattern: str, root: str | None) -> list[str]:
    """The files and folders ``pattern`` names (relative to ``root`` unless absolute), one
    name per resolved path, sorted."""
    absolute = os.path.isabs(pattern)
    parts = [part for part in pattern.replace(os.sep, "/").split("/") if part]
    names = [os.sep] if absolute else [""]

    def on_disk(name: str) -> str:
        return name if absolute or root is None else os.path.join(root, name)

    for index, part in enumerate(parts):
        found: list[str] = []
        seen: set[str] = set()          # folders this ``**`` has entered, resolved
        for name in names:
            if part == "**":
                found += _below(name, on_disk(name), seen, index == len(parts) - 1)
            elif any(ch in part for ch in "*?["):
                entries = _entries(on_disk(name) or ".")
                if not part.startswith("."):
                    entries = [e for e in entries if not e.startswith(".")]
                found += [_join(name, e) for e in fnmatch.filter(entries, part)]
            elif os.path.lexists(on_disk(_join(name, part))):
                found.append(_join(name, part))
        names = found
    unique: dict[str, str] = {}
    for name in sorted(names, key=lambda n: (n.count(os.sep), n)):
        unique.setdefault(os.path.realpath(on_disk(name)), name)
    return sorted(unique.values())


def _below(name: str, path: str, seen: set[str], with_files: bool) -> list[str]:
    """``name`` and every folder below it (and with ``with_files`` every file), each resolved
    folder once: the real tree first, then the linked folders it did not reach."""
    out: list[str] = []
    links: list[tuple[str, str]] = []
    for folder, subfolders, files in os.walk(path or ".", followlinks=False):
        real = os.path.realpath(folder)
        if real in seen:
            subfolders.clear()
            continue
        seen.add(real)
        relative = os.path.relpath(folder, path or ".")
        shown = name if relative == "." else _join(name, relative)
        out.append(shown)
        subfolders[:] = sorted(s for s in subfolders if not s.startswith("."))
        links += [(_join(shown, s), os.path.join(folder, s)) for s in subfolders
                  if os.path.islink(os.path.join(folder, s))]
        if with_files:
            out += [_join(shown, f) for f in sorted(files) if not f.startswith(".")]
    for shown, linked in links:
        if os.path.realpath(linked) not in seen:
            out += _below(shown, linked, seen, with_files)
    return out


def _entries(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:             # not a folder, gone, unreadable: nothing matches below it
        return []


def _join(name: str, child: str) -> str:
    return os.path.join(name, child) if name else child
