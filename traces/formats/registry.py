"""The registry of trace file formats: :data:`FORMATS`, filled by :func:`register_format`.

The native formats (``npz``, ``csv``, ``jsonl``) are registered here, first; every importer of
another tool's files registers itself when imported (``allocsim.traces.formats`` imports them
all, after this module, so their content detection is consulted first). The contract of a
reader, writer and ``detect`` is described in ``allocsim.traces.formats``. Importers import
:func:`register_format` from here, not from the package, so that the package importing them
is no import circle.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from allocsim.traces.formats import native
from allocsim.traces.formats.native import Reader, Writer
from allocsim.traces.model import Trace

__all__ = ["FOLDER_FORMATS", "FORMATS", "Detect", "DetectFolder", "FolderFormat", "FolderReader",
           "Format", "register_folder_format", "register_format"]

Detect = Callable[[str, bytes], bool]


class Format(NamedTuple):
    """One registered file format."""

    extensions: tuple[str, ...]  # lower case, with the dot: (".csv", ".csv.gz")
    reader: Reader
    writer: Writer | None
    detect: Detect | None
    recorded: bool = False
    options: tuple[str, ...] = ()
    # The reader also takes the open file (a binary stream) in place of its bytes, and reads
    # only what it needs from it (the .npz reader: a column at a time); load hands it the file.
    streams: bool = False


FORMATS: dict[str, Format] = {}

DetectFolder = Callable[[Path], bool]
FolderReader = Callable[..., Trace]  # (folder, source, name, **options) -> Trace


class FolderFormat(NamedTuple):
    """A format whose input is a folder another tool writes (an XLA dump, a TensorBoard
    log folder): ``detect`` looks at the folder, ``reader`` reads it."""

    detect: DetectFolder
    reader: FolderReader
    recorded: bool = True
    options: tuple[str, ...] = ()


FOLDER_FORMATS: dict[str, FolderFormat] = {}


def register_format(name: str, extensions: tuple[str, ...] | list[str], reader: Reader,
                    writer: Writer | None = None, detect: Detect | None = None, *,
                    recorded: bool = False, options: tuple[str, ...] = (),
                    streams: bool = False) -> Format:
    """Add (or replace) format ``name``; returns its :class:`Format`."""
    fmt = Format(tuple(e.lower() for e in extensions), reader, writer, detect, recorded,
                 tuple(options), streams)
    FORMATS.pop(name, None)  # re-registering moves it to the end (most specific)
    FORMATS[name] = fmt
    return fmt


def register_folder_format(name: str, reader: FolderReader, detect: DetectFolder, *,
                           recorded: bool = True, options: tuple[str, ...] = ()) -> FolderFormat:
    """Add (or replace) a folder format ``name``; returns its :class:`FolderFormat`."""
    fmt = FolderFormat(detect, reader, recorded, tuple(options))
    FOLDER_FORMATS.pop(name, None)
    FOLDER_FORMATS[name] = fmt
    return fmt


register_format("npz", (".npz",), native.read_npz, native.write_npz, native.detect_npz,
                streams=True)
register_format("csv", (".csv", ".csv.gz"), native.read_csv, native.write_csv, native.detect_csv)
register_format("jsonl", (".jsonl", ".jsonl.gz"), native.read_jsonl, native.write_jsonl,
                native.detect_jsonl)
