"""Files the tool writes: JSON results, atomically, readable by anyone who can read the folder."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from allocsim.sim.output.ownership import guard


def write_json(data: Any, path: str | Path) -> None:
    """Write JSON atomically (temp file + rename); keys in schema order, not sorted."""
    path = Path(path)
    guard(path)     # never replaces a file allocsim did not write
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes 0600; a results file is as readable as any
    with os.fdopen(handle, "w") as out:
        json.dump(data, out, indent=2)
        out.write("\n")
    os.replace(tmp, path)


def write_bytes(data: bytes, path: str | Path) -> Path:
    """Write ``data`` atomically (temp file in the same folder + rename), as readable as any
    file the user makes; the temp file goes if the write fails. The caller has checked the
    path with :func:`guard`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
