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
- JSON documents: each kind by its own mark (:data:`JSON_KINDS`): the ``kind`` value its
  writer puts in every document (``allocsim-compare``, ``allocsim-min-capacity``,
  ``allocsim-share``, ``allocsim-validation``) or a key of its own (``allocsim_baseline``);
  files of earlier versions, which had no ``kind``, by the shape they had, down to the field
  names of their run results. A writer names the kind it writes, and only a file of that
  kind is replaced (a device profile called results.json is not compare's results);
- figures: the ``Software`` text chunk :func:`figure_metadata` puts in every PNG;
- validation reports in Markdown: their first line, :data:`MARKDOWN_MARK`;
- the HTML report: its ``made by allocsim`` byline, :data:`REPORT_MARK`.

:func:`guard` picks the recogniser from the kind of JSON a writer names, or else from the
file's suffix; the writers of JSON, figures and Markdown call it, so ``--out DIR`` pointed at a
folder of the user's own files refuses rather than replacing a ``results.json`` or a
``share.png`` it did not write.
"""

from __future__ import annotations

import gzip
import json
import os
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from allocsim.atomic_files import OutputClaim, claim_output
from allocsim.errors import UserInputError
from allocsim.printable import printable
from allocsim.sim.questions.capacity.minimum import MIN_CAPACITY_KIND
from allocsim.sim.questions.compare import COMPARE_KIND, KIND_KEY
from allocsim.sim.questions.share import SHARE_KIND
from allocsim.traces.formats.cupy_log import HEADER_KEY
from allocsim.traces.formats.native.common import METADATA_KEY
from allocsim.traces.formats.native.npz import NPZ_FORMAT
from allocsim.traces.formats.torch_snapshot.writer import EXPORT_MARK

_HEAD = 1 << 16
# A JSON output larger than this is not parsed whole to tell whose it is (a 6 GB file, sparse or
# not, would be read into memory): only its head is read, for the mark today's writers put
# near the top (:attr:`JsonKind.head_mark`).
JSON_WHOLE_BYTES = 64 << 20
# What reading a file that is not what its name says can raise, besides OSError and
# ValueError: a corrupt gzip stream, a zip member packed by a method Python lacks, JSON nested
# deeper than the parser's recursion allows. Any of them means "not a file allocsim wrote".
UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile, gzip.BadGzipFile, zlib.error,
              NotImplementedError, RecursionError)


def _has(document: object, *keys: str) -> bool:
    return isinstance(document, dict) and all(key in document for key in keys)


def _list_of(value: object, *keys: str) -> bool:
    return isinstance(value, list) and bool(value) and all(_has(item, *keys) for item in value)


def _marked(key: str, value: object) -> Callable[[object], bool]:
    """A document that holds ``key: value`` (the mark its writer puts in every document)."""
    return lambda document: isinstance(document, dict) and document.get(key) == value


# The fields every run result of compare and share holds (sim/kernel/results.py): allocsim's
# own names, two levels down, which is what makes a file of an earlier version recognisable.
RUN_RESULT_KEYS = ("policy", "completed", "peak_allocated", "peak_reserved", "fragmentation",
                   "jw_fragmentation", "first_oom_event", "device_mallocs", "alloc_time_s",
                   "peak_reserved_event", "policy_stats")
ANSWER_KEYS = ("policy", "min_capacity", "lower_bound", "resolution", "monotone", "evaluations",
               "headroom_ratio")


def _legacy_comparison(document: object) -> bool:
    """results.json before its ``kind`` mark: schema 1, the comparison's keys, and in
    ``results`` run results with allocsim's field names."""
    return (_has(document, "schema", "trace", "device", "results", "winner", "reason")
            and document["schema"] == 1                                      # type: ignore[index]
            and _list_of(document["results"], *RUN_RESULT_KEYS))             # type: ignore[index]


def _legacy_min_capacity(document: object) -> bool:
    return (_has(document, "trace", "device", "resolution", "answers")
            and _list_of(document["answers"], *ANSWER_KEYS))                 # type: ignore[index]


def _legacy_share(document: object) -> bool:
    return (_has(document, "device", "device_peak", "all_completed", "processes")
            and _list_of(document["processes"], "spec", "start_ns", *RUN_RESULT_KEYS))  # type: ignore[index]


@dataclass(frozen=True)
class JsonKind:
    """One kind of JSON document allocsim writes, and how a file of that kind is known.

    ``mark`` recognises the mark today's writer puts in every document of the kind (a
    ``kind`` value, or a key of its own such as ``allocsim_baseline``); ``legacy``, where
    earlier versions wrote no mark, the shape they wrote instead, down to field names only
    allocsim uses. A document of one kind is never taken for another: ``compare -o DIR``
    replaces a results.json of compare's, not a device profile or a baseline that happens
    to be called results.json."""

    what: str                                   # for the refusal: "compare's results"
    keys: tuple[str, ...]                       # keys every document holds (by its schema)
    mark: Callable[[object], bool]
    legacy: Callable[[object], bool] | None = None
    # The mark as today's writer spells it in a document's first lines (``"kind":
    # "allocsim-compare"``): how a file too large to parse (JSON_WHOLE_BYTES) is still known.
    head_mark: bytes | None = None

    def recognises(self, document: object) -> bool:
        return self.mark(document) or (self.legacy is not None and self.legacy(document))


def _kind_head(kind: str) -> bytes:
    """``"kind": "<kind>"`` as :func:`~allocsim.sim.output.files.write_json` writes it."""
    return json.dumps({KIND_KEY: kind}, indent=2).encode().split(b"\n")[1].strip()


JSON_KINDS: dict[str, JsonKind] = {
    "baseline": JsonKind("a baseline", ("allocsim_baseline", "device", "policies", "cells"),
                         lambda d: _has(d, "allocsim_baseline", "cells")),
    "results": JsonKind("compare's results", ("schema", "kind", "trace", "device", "results"),
                        _marked(KIND_KEY, COMPARE_KIND), _legacy_comparison,
                        _kind_head(COMPARE_KIND)),
    "min-capacity": JsonKind("min-capacity's answers", ("kind", "trace", "device", "answers"),
                             _marked(KIND_KEY, MIN_CAPACITY_KIND), _legacy_min_capacity,
                             _kind_head(MIN_CAPACITY_KIND)),
    "share": JsonKind("share's results", ("kind", "device", "device_peak", "processes"),
                      _marked(KIND_KEY, SHARE_KIND), _legacy_share,
                      _kind_head(SHARE_KIND)),
    "validate": JsonKind("a validation report", ("schema", "kind", "backend", "policy"),
                         _marked(KIND_KEY, "allocsim-validation"),
                         head_mark=_kind_head("allocsim-validation")),
    # A device profile is also a file users write by hand for --device-profile; calibrate -o
    # may replace one (a profile by a measured profile), nothing else may.
    "device-profile": JsonKind("a device profile", ("name", "capacity"),
                               lambda d: _has(d, "name", "capacity")),
    "calibrate-measurements": JsonKind(
        "a calibration measurements file", ("date", "latencies", "footprints", "packing",
                                            "profile"),
        lambda d: _has(d, "date", "latencies", "footprints", "packing", "profile")
        and _has(d["profile"], "name", "capacity")),                          # type: ignore[index]
    # tune.json and tune-share.json (one schema): the framework searched and the device, with
    # the answer (one job) or the jobs (several on one card)
    "tune": JsonKind("tune's answer", ("framework", "device"),
                     lambda d: _has(d, "framework", "device")
                     and (_has(d, "answer", "front") or _has(d, "jobs", "fits"))),
    # experiments/NAME/results.json (python -m experiments.run; no schema: not a user format)
    "experiment": JsonKind("an experiment's results", ("experiment", "title", "device",
                                                      "comparisons", "capacities"),
                           lambda d: _has(d, "experiment", "title", "device", "comparisons",
                                          "capacities")),
}

FIGURE_SOFTWARE = "allocsim"
MARKDOWN_MARK = "<!-- written by allocsim -->"
REPORT_MARK = "<p class=meta>made by allocsim"


def claim_unless_foreign(path: str | os.PathLike[str], what: str,
                         is_ours: Callable[[Path], bool], *,
                         keep_refused: bool = False) -> OutputClaim:
    """:func:`refuse_unless_ours`, then the output claimed as it was checked
    (:func:`~allocsim.atomic_files.claim_output`): an absolute path, and the file found there,
    which is all a later write may replace. A file rewritten while it was being checked is
    refused too."""
    claim = claim_output(path, keep_refused=keep_refused)
    refuse_unless_ours(claim, what, is_ours)
    if claim_output(claim.path).found != claim.found:
        raise UserInputError(f"{printable(path)}: changed while allocsim checked it; refusing "
                             "to overwrite it (another program is writing it?)")
    return claim


def refuse_unless_ours(path: str | os.PathLike[str], what: str,
                       is_ours: Callable[[Path], bool]) -> None:
    """Raise a one-line :class:`UserInputError` when ``path`` exists and is not an allocsim
    ``what`` (as ``is_ours`` recognises it); return quietly when it is missing or ours."""
    target = Path(path)
    shown = printable(path.shown if isinstance(path, OutputClaim) else target)
    if not target.exists() and not target.is_symlink():
        return
    if not target.is_file():
        raise UserInputError(f"{shown}: exists and is not a file; refusing to write "
                             f"{what} there")
    try:
        ours = is_ours(target)
    except UNREADABLE:
        ours = False
    if not ours:
        raise UserInputError(f"{shown}: exists and is not {what} allocsim wrote; "
                             "refusing to overwrite it (choose another output path, or move "
                             "the file)")


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


def is_allocsim_json(path: Path, kind: str) -> bool:
    """A JSON document of ``kind`` (a key of :data:`JSON_KINDS`), or a list of them, as
    results.json for several traces is. A file past :data:`JSON_WHOLE_BYTES` is judged by its
    head alone: the kind's :attr:`~JsonKind.head_mark` in its first lines (a kind without one
    is not recognised that large)."""
    json_kind = JSON_KINDS[kind]
    with path.open("rb") as handle:
        if os.fstat(handle.fileno()).st_size > JSON_WHOLE_BYTES:
            head = handle.read(4096)
            return json_kind.head_mark is not None and json_kind.head_mark in head
        data = json.loads(handle.read(JSON_WHOLE_BYTES + 1))
    documents = data if isinstance(data, list) and data else [data]
    return all(json_kind.recognises(d) for d in documents)


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
    ".png": ("a figure", is_allocsim_figure),
    ".md": ("a Markdown report", is_allocsim_markdown),
    ".html": ("an HTML report", is_allocsim_report),
}


def guard(path: str | os.PathLike[str], json_kind: str | None = None) -> OutputClaim:
    """Refuse to replace ``path`` unless allocsim wrote it: a JSON document of ``json_kind``
    (a key of :data:`JSON_KINDS`) when that is given, else by the path's suffix (``.png``,
    ``.md``, ``.html``); a suffix with no recogniser here is the caller's to check. Returns
    the output claimed as checked: written through it (``write_bytes(claim, ...)``), the file
    is replaced only if nobody wrote it since."""
    if json_kind is not None:
        kind = JSON_KINDS[json_kind]
        return claim_unless_foreign(path, kind.what, lambda p: is_allocsim_json(p, json_kind))
    if Path(path).suffix.lower() == ".json":
        raise TypeError(f"guard({path}): a JSON output is checked against its kind (json_kind)")
    recogniser = _BY_SUFFIX.get(Path(path).suffix.lower())
    if recogniser is not None:
        return claim_unless_foreign(path, *recogniser)
    return claim_output(path)
