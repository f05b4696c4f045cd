"""Which jax, jaxlib, libtpu and XLA each compiled job and recording came from (issue 40: no trace
or index said, so a finding could not say which compiler made its numbers).

Every data folder of compiled jobs or recordings names them per file:
``experiments/data/xla-gpu/index.json`` in each job's entry (``versions``), the others
(``experiments/data/jax``, ``experiments/data/xla_gpu``, ``tests/data/tpu``) in a
``versions.json`` beside the files, ``{"FILE": {"jax": ..., "jaxlib": ..., "libtpu": ...,
"xla": ..., "from": ...}}``. A version nobody wrote down is ``"unknown"``, said so, never
guessed; ``from`` says where the known ones were read (the file's own metadata, the chip
session's env.json). XLA is the one bundled in jaxlib: its version is jaxlib's with the
extension version (:func:`installed`). New compiles and recordings stamp what is installed.

:func:`versions_of` is the one reader: the runner puts it in each file trace's facts
(results.json ``traces``) and the populations in each file member's row, so an experiment's
output names the compiler of every number it holds.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

KEYS = ("jax", "jaxlib", "libtpu", "xla")
UNKNOWN = "unknown"
JOBS_INDEX = Path("experiments") / "data" / "xla-gpu" / "index.json"
STAMPS = "versions.json"


def installed() -> dict[str, str]:
    """The versions a compile or recording made now comes from (``unknown`` where a package is
    not installed)."""
    found = {}
    for key in ("jax", "jaxlib", "libtpu"):
        try:
            found[key] = metadata.version(key)
        except metadata.PackageNotFoundError:
            found[key] = UNKNOWN
    try:
        from jax._src import lib
        extension = getattr(lib, "jaxlib_extension_version", None)
    except ImportError:
        extension = None
    found["xla"] = (UNKNOWN if found["jaxlib"] == UNKNOWN else
                    f"bundled with jaxlib {found['jaxlib']}"
                    + (f" (extension {extension})" if extension is not None else ""))
    return {**found, "from": "installed packages at the time"}


def _entry_name(path: Path) -> str:
    name = path.name
    for suffix in (".buffers.npz", ".npz"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def versions_of(path: Path, root: Path) -> dict[str, str] | None:
    """The versions stamped for the data file or recording folder ``path`` (relative to
    ``root`` or absolute), or None where ``path`` is in no stamped folder (a generated or
    hand-made trace, a sample shipped with the package)."""
    path = path if path.is_absolute() else root / path
    index = path.parent / "index.json"
    if path.parent == (root / JOBS_INDEX).parent and index.exists():
        entry = json.loads(index.read_text()).get(_entry_name(path))
        return None if entry is None else entry.get("versions")
    stamps = path.parent / STAMPS
    if stamps.exists():
        table: dict[str, Any] = json.loads(stamps.read_text())
        return table.get(path.name)
    return None


def stamp_problems(folder: Path) -> list[str]:
    """What in ``folder``'s stamps is missing or malformed: an entry without one of
    :data:`KEYS`, a value that is not a non-empty string (``"unknown"`` is one)."""
    if folder.name == "xla-gpu":
        entries = {name: job.get("versions") for name, job in
                   json.loads((folder / "index.json").read_text()).items()}
    else:
        entries = json.loads((folder / STAMPS).read_text())
    problems = []
    for name, versions in entries.items():
        if not isinstance(versions, dict):
            problems.append(f"{folder.name}/{name}: no versions")
            continue
        for key in KEYS:
            value = versions.get(key)
            if not isinstance(value, str) or not value:
                problems.append(f"{folder.name}/{name}: no {key} version (write \"unknown\" "
                                "where it is not known)")
    return problems


def stamp(folder: Path, names: list[str], versions: dict[str, str] | None = None) -> None:
    """Record in ``folder``'s versions.json that ``names`` (files or folders just written there)
    come from ``versions`` (default: what is :func:`installed`), keeping the other entries."""
    from allocsim.atomic_files import write_text
    path = folder / STAMPS
    table = json.loads(path.read_text()) if path.exists() else {}
    for name in names:
        table[name] = versions or installed()
    write_text(path, json.dumps(dict(sorted(table.items())), indent=1) + "\n")
