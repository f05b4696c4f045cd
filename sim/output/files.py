"""Files the tool writes: every one atomically, and never over a file allocsim did not write.

The one writer underneath is :func:`allocsim.atomic_files.atomic_output` (a temporary file in
the same folder, fsynced, renamed over the target; temporary files of killed writers removed
by the next write of the same output; errors name the target). It lives at the package's root
so that traces/ (``allocsim gen``, ``convert``) uses the same one; this module adds what the
output room needs on top: JSON by kind, text, bytes and figures, each checked by
:func:`~allocsim.sim.output.ownership.guard` first where the caller asks.

    write_json(document, "out/results.json", kind="results")
    atomic_savefig(fig, "out/peaks.png", dpi=110)
    with atomic_output("run.pickle") as stream: pickle.dump(obj, stream)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from allocsim.atomic_files import atomic_output, write_bytes, write_text
from allocsim.sim.output.ownership import guard

__all__ = ["atomic_output", "atomic_savefig", "write_bytes", "write_json", "write_text"]


def write_json(data: Any, path: str | Path, *, kind: str) -> None:
    """Write JSON atomically; keys in schema order, not sorted. ``kind`` (a key of
    :data:`~allocsim.sim.output.ownership.JSON_KINDS`) is what the document is: an existing
    file at ``path`` is replaced only when it is a document of that kind."""
    path = Path(path)
    guard(path, kind)     # never replaces a file allocsim did not write
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(data, indent=2) + "\n")


def atomic_savefig(fig: Any, path: str | Path, **kwargs: Any) -> Path:
    """``fig.savefig(path, **kwargs)``, atomically: a killed or failed save leaves the
    previous figure whole. The format is the path's suffix unless ``format`` is given (a
    file object gives matplotlib no name to read it from)."""
    path = Path(path)
    kwargs.setdefault("format", path.suffix.lstrip(".").lower() or "png")
    with atomic_output(path, "wb") as stream:
        fig.savefig(stream, **kwargs)
    return path
