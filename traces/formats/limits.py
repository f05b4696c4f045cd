"""The input limits every reader keeps, and the one guard every reader of a user's file uses.

:func:`read_input` is how allocsim reads any file a user names (a trace, a device profile, a
baseline, a results file, a sweep file): only a regular file, checked before it is opened, so a
FIFO never blocks and ``/dev/zero`` is never read; at most the input limit, counted as it is
read (``st_size`` is not trusted: ``/proc`` files say 0); gzip streamed through a bounded
decompressor that stops a bomb by its ratio long before the limit. :func:`open_input` is the
same guard for a reader that takes the open file piece by piece (the ``.npz`` reader), with
the file's size held to the limit up front. Every problem is one :class:`TraceError` line
naming the file.
"""

from __future__ import annotations

import io
import os
import stat
import zlib

from allocsim.ascii_numbers import is_whole_number
from allocsim.errors import UserInputError
from allocsim.traces.model import TraceError

__all__ = ["DEFAULT_MAX_INPUT_BYTES", "GZIP_MAGIC", "MAX_GZIP_RATIO", "MAX_INPUT_ENV",
           "decompress_gzip", "max_input_bytes", "open_input", "read_input", "read_input_text",
           "regular_file_problem", "too_large"]

MAX_INPUT_ENV = "ALLOCSIM_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 2 << 30   # 2 GiB of file (after decompression): ~60M events of CSV
GZIP_MAGIC = b"\x1f\x8b"
# gzip of a trace expands 4-18x (measured: the three recorded profiler traces in shared/traces
# 16-18x, the four generators' .csv.gz 4-6x and .jsonl.gz 8-12x); deflate's ceiling is 1032x,
# which is what a bomb reaches. 200x refuses a bomb within its first few hundred KiB of input
# and leaves a real trace a margin of 10x.
MAX_GZIP_RATIO = 200
# Below this much output no ratio is judged (a tiny file of repeated rows may compress far).
_RATIO_FLOOR = 16 << 20
_CHUNK = 1 << 20

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"))


def max_input_bytes() -> int:
    """The most bytes a trace file may hold once decompressed, ``ALLOCSIM_MAX_INPUT_BYTES``
    or 2 GiB. Readers hold the file in memory (a few times its size while parsing), so a
    larger one — or a small ``.gz`` that expands to gigabytes — is refused up front."""
    text = os.environ.get(MAX_INPUT_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_INPUT_BYTES
    if not is_whole_number(text) or int(text) == 0:
        raise UserInputError(f"{MAX_INPUT_ENV}: expected a whole number of bytes > 0 in ASCII "
                             f"digits, got {text[:40]!r}")
    return int(text)


def too_large(limit: int, source: str, what: str) -> TraceError:
    return TraceError(f"{what} more than {limit:,} bytes, the input limit (set "
                      f"{MAX_INPUT_ENV}=BYTES to lift it)", source=source)


def regular_file_problem(mode: int) -> str | None:
    """Why a file of ``mode`` (``st_mode``) is no input, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, kind in _KINDS:
        if test(mode):
            return f"is {kind}, not a regular file"
    return "is not a regular file"


def read_input(path: str | os.PathLike[str], *, source: str | None = None,
               limit: int | None = None, gunzip: bool = False) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` (default: the input
    limit) of them; with ``gunzip``, gzip data (known by its magic bytes) is decompressed,
    bounded the same way. Raises :class:`TraceError` naming ``source`` (default: the path)."""
    where = source if source is not None else os.fspath(path)
    limit = max_input_bytes() if limit is None else limit
    try:
        with _open_regular(path, where) as stream:
            raw = _read_bounded(stream, limit, where)
    except OSError as err:
        raise TraceError(f"cannot read: {err.strerror or err}", source=where) from None
    if gunzip and raw.startswith(GZIP_MAGIC):
        return decompress_gzip(raw, where, limit)
    return raw


def open_input(path: str | os.PathLike[str], *, source: str | None = None,
               limit: int | None = None) -> io.BufferedReader:
    """The regular file at ``path``, open for reading, for a reader that takes what it needs
    from it piece by piece rather than the whole file at once (the ``.npz`` reader: a column
    at a time, straight into its packed array). The guards of :func:`read_input`, and a file
    larger than ``limit`` is refused before a byte is read; the reader bounds what it reads
    by what the file's own structure claims."""
    where = source if source is not None else os.fspath(path)
    limit = max_input_bytes() if limit is None else limit
    stream = _open_regular(path, where)
    try:
        if os.fstat(stream.fileno()).st_size > limit:
            raise too_large(limit, where, "the file holds")
        return io.BufferedReader(stream)     # small reads (zip headers) buffered
    except OSError as err:
        stream.close()
        raise TraceError(f"cannot read: {err.strerror or err}", source=where) from None
    except BaseException:
        stream.close()
        raise


def _open_regular(path: str | os.PathLike[str], where: str) -> io.FileIO:
    """``path`` opened unbuffered, if it is a regular file (before and after the open)."""
    try:
        # stat first: a FIFO is refused without being opened (opening one blocks).
        problem = regular_file_problem(os.stat(path).st_mode)
        if problem:
            raise TraceError(problem, source=where)
        # O_NONBLOCK: should the path have become a FIFO since, the open does not block.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise TraceError("no such file", source=where) from None
    except IsADirectoryError:
        raise TraceError("is a directory, not a regular file", source=where) from None
    except OSError as err:
        raise TraceError(f"cannot read: {err.strerror or err}", source=where) from None
    stream = io.FileIO(fd, "rb")
    try:
        problem = regular_file_problem(os.fstat(fd).st_mode)
        if problem:
            raise TraceError(problem, source=where)
    except OSError as err:
        stream.close()
        raise TraceError(f"cannot read: {err.strerror or err}", source=where) from None
    except BaseException:
        stream.close()
        raise
    return stream


def _read_bounded(stream: object, limit: int, where: str) -> bytes:
    """Read to the end, but never more than ``limit`` bytes (``st_size`` is a hint only); into
    one growing buffer, handed over without a copy."""
    read = stream.read  # type: ignore[attr-defined]
    output = io.BytesIO()
    total = 0
    while True:
        chunk = read(min(_CHUNK << 4, limit + 1 - total))
        if not chunk:
            break
        output.write(chunk)
        total += len(chunk)
        if total > limit:
            raise too_large(limit, where, "the file holds")
    return output.getvalue()


def read_input_text(path: str | os.PathLike[str], *, source: str | None = None,
                    limit: int | None = None, what: str = "text") -> str:
    """:func:`read_input` decoded as UTF-8 (a BOM is dropped); one line if it is not."""
    where = source if source is not None else os.fspath(path)
    data = read_input(path, source=where, limit=limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TraceError(f"not {what}: not UTF-8 at byte {err.start}", source=where) from None


def decompress_gzip(raw: bytes, source: str, limit: int | None = None) -> bytes:
    """Decompress gzip ``raw`` (one or more members) in a stream: refused as soon as the
    output passes ``limit`` or, past the first 16 MiB, :data:`MAX_GZIP_RATIO` times the input
    consumed so far — a bomb stops within megabytes, whatever it would expand to."""
    limit = max_input_bytes() if limit is None else limit
    # BytesIO, not a list joined at the end: getvalue() hands over its buffer without a copy,
    # so the peak is the output once, not twice.
    output = io.BytesIO()
    total = 0
    position = 0
    view = memoryview(raw)
    try:
        while position < len(raw):
            if not raw.startswith(GZIP_MAGIC, position):
                if raw[position:].strip(b"\0"):
                    raise TraceError("corrupt gzip data: trailing bytes after the last member",
                                     source=source)
                break  # padding of NULs after the last member, as gzip(1) allows
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            offset = position  # the next input byte not yet given to the inflater
            while not inflater.eof:
                data_in: bytes | memoryview = inflater.unconsumed_tail
                if not data_in:
                    if offset >= len(raw):
                        raise TraceError("corrupt gzip data: the file is cut short",
                                         source=source)
                    data_in = view[offset:offset + _CHUNK]
                    offset += len(data_in)
                out = inflater.decompress(data_in, _CHUNK)
                output.write(out)
                total += len(out)
                if total > limit:
                    raise too_large(limit, source, "it decompresses to")
                consumed = offset - len(inflater.unconsumed_tail)
                if total > _RATIO_FLOOR and total > MAX_GZIP_RATIO * consumed:
                    raise TraceError(
                        f"it decompresses more than {MAX_GZIP_RATIO} times over ({total:,} "
                        f"bytes from the first {consumed:,}): a compression bomb, not a "
                        "trace", source=source)
            position = offset - len(inflater.unused_data)
    except zlib.error as err:
        raise TraceError(f"corrupt gzip data: {err}", source=source) from None
    return output.getvalue()
