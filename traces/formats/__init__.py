"""Trace files in and out: :func:`load` any known format, :func:`save` by extension.

The registry :data:`FORMATS` (kept in :mod:`allocsim.traces.formats.registry`, re-exported
here) maps a format name to a :class:`Format` ``(extensions, reader, writer, detect)``. The
native formats (``npz``, ``csv``, ``jsonl``, see :mod:`allocsim.traces.formats.native`)
register there first; an importer for another tool's files is one more module that calls
``registry.register_format`` when imported (this package imports them all), with

- ``reader(data: bytes, source: str, name: str) -> Trace`` — ``data`` already un-gzipped;
  raise :class:`TraceError` for user mistakes; use ``source``/``name`` as the metadata's
  ``source``/``name`` where the file does not carry them (``native.file_metadata`` helps);
- ``writer(trace, stream)`` writing bytes, or ``None`` for an import-only format;
- ``detect(path: str, head: bytes) -> bool`` looking at the first few KiB (un-gzipped), or
  ``None`` to be chosen by extension only;
- ``recorded``: True for other tools' recordings, which are validated leniently by default
  (unmatched frees dropped, leaks kept, every repair counted) — native files strictly;
- ``options``: the keyword options the reader accepts (e.g. ``device_index``), passed through
  from :func:`load`; an option the format does not take is a one-line error;
- ``streams``: the reader also takes the open file (a seekable binary stream, from
  ``limits.open_input``) in place of ``data``, and :func:`load` hands it that when the file
  is not gzip: it reads only what it needs, never the whole file at once (``npz``).

Choosing a reader: gzip is recognised by its magic bytes, whatever the name. Then among the
formats whose ``detect`` accepts the content, the one owning the file's extension wins, else
the most recently registered (importers are more specific than the native text formats, which
accept any text); if none accepts it, the extension decides and that reader reports what is
wrong.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path

from allocsim.atomic_files import atomic_output
from allocsim.traces.formats.limits import (
    GZIP_MAGIC,
    MAX_INPUT_ENV,
    max_input_bytes,
    open_input,
    read_input,
)
from allocsim.traces.formats.registry import (
    FOLDER_FORMATS,
    FORMATS,
    Format,
    register_folder_format,
    register_format,
)
from allocsim.traces.metadata import check_metadata
from allocsim.traces.model import Trace, TraceError
from allocsim.traces.validate import ValidationReport, validate_recording

__all__ = [
    "FOLDER_FORMATS",
    "FORMATS",
    "MAX_INPUT_ENV",
    "Format",
    "format_for",
    "load",
    "load_with_report",
    "max_input_bytes",
    "register_folder_format",
    "register_format",
    "save",
    "supported_extensions",
]

_HEAD_BYTES = 8192
_GZIP_LEVEL = 6  # level 9 is several times slower for a few percent smaller files


def supported_extensions(*, writable: bool = False) -> list[str]:
    return [ext for fmt in FORMATS.values() if fmt.writer or not writable
            for ext in fmt.extensions]


def _by_extension(path: str) -> tuple[str, str] | None:
    """``(format name, extension)`` owning the longest matching extension of ``path``."""
    lower = path.lower()
    best: tuple[str, str] | None = None
    for name, fmt in FORMATS.items():
        for ext in fmt.extensions:
            if lower.endswith(ext) and (best is None or len(ext) > len(best[1])):
                best = (name, ext)
    return best


def _stem(path: Path) -> str:
    """The file name without its format extension: ``run1.csv.gz`` -> ``run1``."""
    match = _by_extension(path.name)
    if match:
        return path.name[: len(path.name) - len(match[1])] or path.name
    name = path.name[:-3] if path.name.lower().endswith(".gz") else path.name
    return Path(name).stem or name


def format_for(path: str | os.PathLike[str], head: bytes) -> str:
    """The name of the format to read ``path`` with, given its first (un-gzipped) bytes."""
    by_ext = _by_extension(os.fspath(path))
    accepted = [name for name, fmt in reversed(FORMATS.items())
                if fmt.detect is not None and fmt.detect(os.fspath(path), head)]
    if by_ext and by_ext[0] in accepted:
        return by_ext[0]
    if accepted:
        return accepted[0]
    if by_ext:
        return by_ext[0]
    raise TraceError("unrecognised trace format (supported: "
                     + ", ".join(supported_extensions()) + ")", source=os.fspath(path))


def _read_bytes(path: Path, source: str) -> bytes:
    """The file's bytes, un-gzipped, through the one guard every reader uses."""
    return read_input(path, source=source, gunzip=True)


def _read_file(path: Path, source: str, given: dict[str, object]) -> tuple[Trace, bool]:
    """The trace in the file at ``path`` and whether its format is a recording: a reader that
    streams gets the open file (not gzip), any other the file's bytes, un-gzipped."""
    with open_input(path, source=source) as stream:
        head = stream.read(_HEAD_BYTES)
        if not head.startswith(GZIP_MAGIC):
            name = format_for(source, head)
            fmt = FORMATS[name]
            if fmt.streams:
                _check_options(name, fmt.options, given, source)
                stream.seek(0)
                reader: Callable[..., Trace] = fmt.reader    # takes the stream (``streams``)
                return reader(stream, source, _stem(path), **given), fmt.recorded
    data = _read_bytes(path, source)
    name = format_for(source, data[:_HEAD_BYTES])
    fmt = FORMATS[name]
    _check_options(name, fmt.options, given, source)
    return fmt.reader(data, source, _stem(path), **given), fmt.recorded


def _check_options(name: str, accepted: tuple[str, ...], given: dict[str, object],
                   source: str) -> None:
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise TraceError(f"option {unknown[0]!r} does not apply to {name} files"
                         + (f" (it takes: {', '.join(accepted)})" if accepted else ""),
                         source=source)


def _read_folder(folder: Path, source: str, given: dict[str, object]) -> tuple[Trace, bool]:
    """A folder another tool wrote (an XLA dump, a TensorBoard log folder), read by the first
    folder format that recognises it."""
    for name, fmt in FOLDER_FORMATS.items():
        if fmt.detect(folder):
            _check_options(name, fmt.options, given, source)
            return fmt.reader(folder, source, folder.name, **given), fmt.recorded
    known = ", ".join(FOLDER_FORMATS) or "none"
    raise TraceError(f"is a directory that holds no trace allocsim can read (folder formats: "
                     f"{known})", source=source)


def load_with_report(path: str | os.PathLike[str], *, strict: bool | None = None,
                     **options: object) -> tuple[Trace, ValidationReport]:
    """Read and validate a trace file; returns ``(trace, report)``. See :func:`load`."""
    source = os.fspath(path)
    p = Path(source)
    given = {key: value for key, value in options.items() if value is not None}
    if p.is_dir():
        try:
            trace, recorded = _read_folder(p, source, given)
        except OverflowError:
            raise TraceError("holds a number too large for a 64-bit trace column",
                             source=source) from None
        except RecursionError:
            raise TraceError("is nested too deeply to read", source=source) from None
    else:
        try:
            trace, recorded = _read_file(p, source, given)
        except OverflowError:
            # The class "numbers a format cannot hold": readers refuse them by field; this
            # catches any one that a reader does not name, still as one line for the file.
            raise TraceError("holds a number too large for a 64-bit trace column",
                             source=source) from None
        except RecursionError:
            raise TraceError("is nested too deeply to read", source=source) from None
    _check_text(trace, source)
    check_metadata(trace.metadata, source)
    if strict is None:
        strict = not recorded
    return validate_recording(trace, strict=strict, source=source)


def _check_text(trace: Trace, source: str) -> None:
    """Tags and metadata are text that can be printed and written: a lone surrogate (JSON's
    ``"\\ud800"``) is refused here, as one line, rather than where it is first printed."""
    try:
        "\n".join(trace.tags).encode("utf-8")
    except UnicodeEncodeError:
        index = next(i for i, tag in enumerate(trace.tags) if not _is_text(tag))
        raise TraceError(f"tag {trace.tags[index]!r} is not text (it holds a lone UTF-16 "
                         "surrogate)", source=source) from None
    try:
        json.dumps(trace.metadata, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError:
        raise TraceError("the trace's metadata is not text (it holds a lone UTF-16 "
                         "surrogate)", source=source) from None
    except (TypeError, ValueError, RecursionError):
        pass  # not JSON-shaped: whoever writes it judges it


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def load(path: str | os.PathLike[str], *, strict: bool | None = None, **options: object) -> Trace:
    """Read the trace at ``path`` (format from content and extension) and validate it.

    ``strict`` defaults to True for native files and False for recorded formats (other tools'
    files). ``options`` go to the format's reader (e.g. ``device_index=1``). ``strict=False``
    repairs what recorded traces commonly get wrong (see :mod:`allocsim.traces.validate`) and,
    when it repaired anything, records the report in ``metadata['validation']``. Metadata
    ``source`` and ``name`` default to the path and the file stem when the file does not
    carry them. Raises :class:`TraceError` (one line: file,
    event, problem) for any problem with the file; never writes to it.
    """
    return load_with_report(path, strict=strict, **options)[0]


def save(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write ``trace`` in the format its extension names (``.npz``, ``.csv``, ``.csv.gz``,
    ``.jsonl``, ``.jsonl.gz``; ``.pickle`` / ``.pkl``: a PyTorch memory snapshot for its
    viewer), atomically: a temporary file in the same directory is written completely, then
    renamed over ``path``, so a reader never sees half a file."""
    target = os.fspath(path)
    match = _by_extension(target)
    if match is None or FORMATS[match[0]].writer is None:
        raise TraceError("cannot tell the format from the extension (supported: "
                         + ", ".join(supported_extensions(writable=True)) + ")", source=target)
    name, ext = match
    writer = FORMATS[name].writer
    assert writer is not None
    p = Path(target)
    folder = p.parent
    if not folder.is_dir():
        raise TraceError(f"directory {str(folder)!r} does not exist", source=target)
    try:
        # allocsim.atomic_files: a temporary file beside the target, renamed over it when
        # whole; a killed writer's temporary file is removed by the next save to the same name.
        with atomic_output(path) as stream:   # a claimed output keeps its claim
            if ext.endswith(".gz"):
                # mtime=0 and no file name: the same trace always gives the same bytes.
                with gzip.GzipFile(filename="", mode="wb", fileobj=stream,
                                   compresslevel=_GZIP_LEVEL, mtime=0) as gz:
                    writer(trace, gz)  # type: ignore[arg-type]
            else:
                writer(trace, stream)
    except OSError as err:
        raise TraceError(f"cannot write: {err.strerror or err}", source=target) from None
    except TraceError as err:
        raise err.located(target) from None


# Importers of other tools' files register themselves on import (after the native formats, so
# their content detection is consulted first).
from allocsim.traces.formats import (  # noqa: E402,F401
    cupy_log,
    malloclab,
    rmm_csv,
    torch_profiler,
    torch_snapshot,
)
from allocsim.traces.formats.xla import dump as xla_dump  # noqa: E402,F401
from allocsim.traces.formats.xla import xplane  # noqa: E402,F401
