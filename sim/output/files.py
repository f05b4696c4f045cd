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

import hashlib
import json
import os
import re
import unicodedata
from pathlib import Path
from typing import Any

from allocsim.atomic_files import atomic_output, write_bytes, write_text
from allocsim.sim.output.ownership import guard

__all__ = ["atomic_output", "atomic_savefig", "safe_stem", "write_bytes", "write_json",
           "write_text"]

# Longest stem kept, in UTF-8 bytes: with a prefix (``NN-``), a suffix
# (``-memory_timeline.png``) and the writer's temporary name it stays within 255 bytes.
MAX_STEM_BYTES = 96
_UNSAFE = re.compile(r"[^\w.+-]+")        # \w: letters and digits of any script, and _
_DOTS = re.compile(r"\.{2,}")
# Names Windows reserves whatever the extension (a results folder may be shared with it).
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)),
             *(f"LPT{i}" for i in range(10))}


def safe_stem(name: str, default: str = "trace") -> str:
    """``name`` (a trace's metadata name, anything a file or a recorder put there) as the
    start of a file name that stays inside the folder it is joined to: the one function by
    which a name becomes a path.

    Separators (``/``, ``\\``), NUL and every other character but letters, digits, ``.``,
    ``_``, ``+`` and ``-`` become ``_``; runs of dots become one, leading and trailing dots
    go (no ``..``, no hidden file); a name Windows reserves gets a ``_`` in front; past
    :data:`MAX_STEM_BYTES` it is cut and ends in 8 hex digits of the whole name's SHA-1, so
    two long names stay apart; nothing left: ``default``."""
    text = unicodedata.normalize("NFC", str(name))
    stem = _DOTS.sub(".", _UNSAFE.sub("_", text)).strip("._ ")
    if not stem:
        return default
    if stem.split(".", 1)[0].upper() in _RESERVED:
        stem = "_" + stem
    if len(stem.encode()) > MAX_STEM_BYTES:
        digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        cut = stem
        while len(cut.encode()) > MAX_STEM_BYTES - 9:
            cut = cut[:-1]
        stem = f"{cut.rstrip('._ ')}-{digest}"
    return stem


def write_json(data: Any, path: str | os.PathLike[str], *, kind: str) -> None:
    """Write JSON atomically; keys in schema order, not sorted. ``kind`` (a key of
    :data:`~allocsim.sim.output.ownership.JSON_KINDS`) is what the document is: an existing
    file at ``path`` is replaced only when it is a document of that kind."""
    claim = guard(path, kind)     # never replaces a file allocsim did not write
    claim.path.parent.mkdir(parents=True, exist_ok=True)
    write_text(claim, json.dumps(data, indent=2) + "\n")


def atomic_savefig(fig: Any, path: str | Path, **kwargs: Any) -> Path:
    """``fig.savefig(path, **kwargs)``, atomically: a killed or failed save leaves the
    previous figure whole. The format is the path's suffix unless ``format`` is given (a
    file object gives matplotlib no name to read it from)."""
    path = Path(path)
    kwargs.setdefault("format", path.suffix.lstrip(".").lower() or "png")
    with atomic_output(path) as stream:
        fig.savefig(stream, **kwargs)
    return path
