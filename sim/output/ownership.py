"""Which existing files allocsim may replace: only the ones it wrote itself.

The rule of the house is that nothing a user gave is modified or lost, so every command that
writes a file checks the path first. A missing path is free; an existing one is replaced only
when it is recognisably allocsim's own output of the same kind (a trace it saved, a snapshot it
exported, a baseline it wrote, ...); anything else is refused in one line, and the file is
left as it was. ``allocsim convert run.csv run.npz`` next to a user's RMM log called
``run.csv`` must not be able to turn the log into a trace.

Each kind is recognised by what allocsim writes into every file of that kind:

- traces: ``.npz`` with a ``format`` array of ``allocsim-trace/N``; ``.csv`` whose first line
  is ``# allocsim-metadata: …``; ``.jsonl`` whose first line is ``{"allocsim-metadata": …}``
  (gzipped or not);
- exported snapshots: the ``allocsim_export`` key the writer puts first in the pickle;
- CuPy hook logs (``record --log``): the recorder's header line;
- JSON documents: the keys every document of one kind holds (:data:`JSON_KINDS`, held to the
  schemas in sim/output/schemas/ by a test), an object or a list of such objects;
- figures: the ``Software`` text chunk :func:`figure_metadata` puts in every PNG;
- validation reports in Markdown: their first line, :data:`MARKDOWN_MARK`;
- the HTML report: its ``made by allocsim`` byline, :data:`REPORT_MARK`.

:func:`guard` picks the recogniser from the file's suffix; the writers of JSON, figures and
Markdown call it, so ``--out DIR`` pointed at a folder of the user's own files refuses rather
than replacing a ``results.json`` or a ``share.png`` it did not write.
"""

from __future__ import annotations

import gzip
import json
import zipfile
from collections.abc import Callable
from pathlib import Path

from allocsim.errors import UserInputError
from allocsim.traces.formats.cupy_log import HEADER_KEY
from allocsim.traces.formats.native_common import METADATA_KEY
from allocsim.traces.formats.native_npz import NPZ_FORMAT
from allocsim.traces.formats.snapshot_writer import EXPORT_MARK

_HEAD = 1 << 16

# The keys that name each kind of JSON document allocsim writes (each kind's required keys,
# or enough of them to tell it from any other file).
JSON_KINDS: dict[str, tuple[str, ...]] = {
    "baseline": ("allocsim_baseline", "device", "policies", "cells"),
    "results": ("schema", "trace", "device", "results", "winner"),
    "min-capacity": ("trace", "device", "resolution", "answers"),
    "share": ("device", "device_peak", "all_completed", "processes"),
    "validate": ("schema", "kind", "backend", "policy", "passed"),
    "device-profile": ("name", "capacity"),
    "calibrate-measurements": ("date", "latencies", "footprints", "packing", "profile"),
    "tune": ("framework", "device"),    # tune.json and tune-share.json (one schema)
    # experiments/NAME/results.json (python -m experiments.run; no schema: not a user format)
    "experiment": ("experiment", "title", "device", "comparisons", "capacities"),
}
FIGURE_SOFTWARE = "allocsim"
MARKDOWN_MARK = "<!-- written by allocsim -->"
REPORT_MARK = "<p class=meta>made by allocsim"


def refuse_unless_ours(path: str | Path, what: str, is_ours: Callable[[Path], bool]) -> None:
    """Raise a one-line :class:`UserInputError` when ``path`` exists and is not an allocsim
    ``what`` (as ``is_ours`` recognises it); return quietly when it is missing or ours."""
    target = Path(path)
    if not target.exists() and not target.is_symlink():
        return
    if not target.is_file():
        raise UserInputError(f"{target}: exists and is not a file; refusing to write {what} there")
    try:
        ours = is_ours(target)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, gzip.BadGzipFile):
        ours = False
    if not ours:
        raise UserInputError(f"{target}: exists and is not {what} allocsim wrote; refusing to "
                             "overwrite it (choose another output path, or move the file)")


def _head(path: Path) -> bytes:
    with path.open("rb") as handle:
        head = handle.read(_HEAD)
    if head[:2] == b"\x1f\x8b":
        with gzip.open(path, "rb") as unpacked:
            head = unpacked.read(_HEAD)
    return head


def is_allocsim_trace(path: Path) -> bool:
    """An allocsim trace file (.npz, .csv, .jsonl; gzipped or not) or an exported snapshot."""
    head = _head(path)
    if head.startswith(b"PK"):
        with zipfile.ZipFile(path) as archive:
            if "format.npy" not in archive.namelist():
                return False
            with archive.open("format.npy") as member:
                return NPZ_FORMAT.rsplit("/", 1)[0].encode("utf-32-le") in member.read(4096)
    first_line = head.split(b"\n", 1)[0]
    if first_line.startswith(f"# {METADATA_KEY}:".encode()):
        return True
    if first_line.startswith(f'{{"{METADATA_KEY}"'.encode()):
        return True
    return is_allocsim_snapshot(path)


def is_allocsim_snapshot(path: Path) -> bool:
    """A snapshot pickle that ``export-snapshot`` wrote: its first key is the export mark."""
    head = _head(path)
    return head[:1] == b"\x80" and EXPORT_MARK.encode() in head[:64]


def is_allocsim_hook_log(path: Path) -> bool:
    """A CuPy hook log that ``record --log`` wrote: its first line is the recorder's header."""
    first_line = _head(path).split(b"\n", 1)[0]
    return first_line.startswith(b"{") and f'"{HEADER_KEY}"'.encode() in first_line


def is_allocsim_json(path: Path) -> bool:
    """A JSON document of one of :data:`JSON_KINDS` (or a list of them, as results.json for
    several traces is)."""
    with path.open("rb") as handle:
        data = json.loads(handle.read())
    documents = data if isinstance(data, list) and data else [data]
    return all(isinstance(d, dict) and any(all(k in d for k in keys)
                                           for keys in JSON_KINDS.values()) for d in documents)


def figure_metadata() -> dict[str, str]:
    """The PNG text chunks of every figure allocsim saves: how it knows its own figures."""
    from allocsim import __version__
    return {"Software": f"{FIGURE_SOFTWARE} {__version__}"}


def is_allocsim_figure(path: Path) -> bool:
    head = _head(path)
    return (head.startswith(b"\x89PNG") and
            f"Software\x00{FIGURE_SOFTWARE} ".encode() in head)


def is_allocsim_markdown(path: Path) -> bool:
    return _head(path).startswith(MARKDOWN_MARK.encode())


def is_allocsim_report(path: Path) -> bool:
    """An HTML report that ``allocsim report`` or ``compare --out`` wrote (its byline)."""
    with path.open("rb") as handle:
        return REPORT_MARK.encode() in handle.read(1 << 20)


_BY_SUFFIX: dict[str, tuple[str, Callable[[Path], bool]]] = {
    ".json": ("a JSON document", is_allocsim_json),
    ".png": ("a figure", is_allocsim_figure),
    ".md": ("a Markdown report", is_allocsim_markdown),
    ".html": ("an HTML report", is_allocsim_report),
}


def guard(path: str | Path) -> None:
    """Refuse to replace ``path`` unless allocsim wrote it, recognised by its suffix
    (``.json``, ``.png``, ``.md``, ``.html``); a suffix with no recogniser here is the
    caller's to check."""
    kind = _BY_SUFFIX.get(Path(path).suffix.lower())
    if kind is not None:
        refuse_unless_ours(path, *kind)


def json_with(*keys: str) -> Callable[[Path], bool]:
    """A recogniser for a JSON object holding every one of ``keys``."""
    def recognise(path: Path) -> bool:
        with path.open("rb") as handle:
            data = json.loads(handle.read())
        return isinstance(data, dict) and all(key in data for key in keys)
    return recognise
