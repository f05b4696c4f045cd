"""Writing an ``.npz`` trace a block of events at a time, never holding the trace.

:func:`~allocsim.traces.formats.native.npz.write_npz` hands ``numpy.savez`` whole columns;
a trace of 500 million events does not fit in memory to be handed over. This writer lays the
archive out first: the number of events is known, so every member's size is, and each column
gets its place in the file (its zip entry, its ``.npy`` header with the final shape, then its
values). Each block's values are written at their column's place as they come (the zip's CRC
of each member kept as it grows), then the small members (tags, metadata, format), the zip
entries' headers and the central directory. Stored (uncompressed) ZIP64 entries, as
``numpy.savez`` writes them with ``force_zip64``, in the same order and under the same names,
so ``read_npz`` (and ``numpy.load``) read it as they read ``write_npz``'s file. The entries'
time stamps are the DOS epoch (1980-01-01): the same blocks always give the same bytes.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from allocsim.atomic_files import atomic_output
from allocsim.traces.formats.native.npz import NPZ_FORMAT
from allocsim.traces.model import COLUMN_DTYPES, NO_TAG, TraceError

__all__ = ["save_npz_blocks", "write_npz_blocks"]

# Values a column takes when the blocks leave it out (as Trace.from_columns defaults them).
_DEFAULTS = {"stream": 0, "process": 0, "tag": NO_TAG}
_VERSION = 45            # "needed to extract": 4.5, ZIP64
_DOS_DATE = (1 << 5) | 1  # 1980-01-01; time 00:00:00 is 0
_ZIP64_LIMIT = 0xFFFFFFFF
_LOCAL = struct.Struct("<4s2B4HL2L2H")
_LOCAL_ZIP64 = struct.Struct("<2H2Q")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_CENTRAL_ZIP64 = struct.Struct("<2H3Q")
_END64 = struct.Struct("<4sQ2H2L4Q")
_END64_LOCATOR = struct.Struct("<4sLQL")
_END = struct.Struct("<4s4H2LH")


@dataclass
class _Entry:
    """One stored member: where its zip entry starts, its name and content bytes, its CRC."""

    name: bytes
    offset: int
    size: int
    crc: int = 0

    @property
    def data_offset(self) -> int:
        return self.offset + _LOCAL.size + len(self.name) + _LOCAL_ZIP64.size

    @property
    def end(self) -> int:
        return self.data_offset + self.size

    def local_header(self) -> bytes:
        return (_LOCAL.pack(b"PK\x03\x04", _VERSION, 0, 0, 0, 0, _DOS_DATE, self.crc,
                            _ZIP64_LIMIT, _ZIP64_LIMIT, len(self.name), _LOCAL_ZIP64.size)
                + self.name + _LOCAL_ZIP64.pack(1, 16, self.size, self.size))

    def central_header(self) -> bytes:
        # made by 4.5 on Unix (3), a plain file readable and writable by its owner
        return (_CENTRAL.pack(b"PK\x01\x02", _VERSION, 3, _VERSION, 0, 0, 0, 0, _DOS_DATE,
                              self.crc, _ZIP64_LIMIT, _ZIP64_LIMIT, len(self.name),
                              _CENTRAL_ZIP64.size, 0, 0, 0, 0o100600 << 16, _ZIP64_LIMIT)
                + self.name + _CENTRAL_ZIP64.pack(1, 24, self.size, self.size, self.offset))


def _npy_header(dtype: type, n: int) -> bytes:
    """The ``.npy`` header ``numpy.save`` writes for a 1-D array of ``n`` values of ``dtype``."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
              "shape": (n,)})
    return out.getvalue()


def _npy_text(text: str) -> bytes:
    """A 0-d string array as ``numpy.save`` writes it (the tags, metadata and format)."""
    out = io.BytesIO()
    np.lib.format.write_array(out, np.array(text), allow_pickle=False)
    return out.getvalue()


def write_npz_blocks(stream: BinaryIO, n: int, blocks: Iterable[Mapping[str, np.ndarray]], *,
                     tags: list[str], metadata: Mapping[str, Any]) -> None:
    """Write a trace of ``n`` events to the seekable ``stream`` (positioned at its start) as
    :func:`~allocsim.traces.formats.native.npz.write_npz` would: ``blocks`` give consecutive
    events, each a mapping of column name to values (a column left out of every block holds
    its default: stream and process 0, tag untagged). Values are not checked beyond fitting
    their column's dtype; the blocks must add up to ``n`` events."""
    columns = list(COLUMN_DTYPES.items())
    headers = {name: _npy_header(dtype, n) for name, dtype in columns}
    entries: dict[str, _Entry] = {}
    offset = 0
    for name, dtype in columns:
        entry = _Entry(f"{name}.npy".encode(), offset,
                       len(headers[name]) + n * np.dtype(dtype).itemsize)
        entries[name] = entry
        offset = entry.end
    written = dict.fromkeys(COLUMN_DTYPES, 0)
    for name, _ in columns:
        entry = entries[name]
        stream.seek(entry.data_offset)
        stream.write(headers[name])
        entry.crc = zlib.crc32(headers[name])
    done = 0
    for block in blocks:
        count = len(next(iter(block.values()))) if block else 0
        if done + count > n:
            raise TraceError(f"the blocks hold more than the {n:,} events announced")
        for name, dtype in columns:
            values = block.get(name)
            data: np.ndarray
            if values is None:
                data = np.full(count, _DEFAULTS[name], dtype=dtype)
            else:
                if len(values) != count:
                    raise TraceError(f"a block's {name} column holds {len(values)} values, "
                                     f"its other columns {count}", event=done)
                data = np.ascontiguousarray(values, dtype=dtype)
            raw = data.data.cast("B")
            entry = entries[name]
            stream.seek(entry.data_offset + len(headers[name]) + written[name])
            stream.write(raw)
            entry.crc = zlib.crc32(raw, entry.crc)
            written[name] += len(raw)
        done += count
    if done != n:
        raise TraceError(f"the blocks hold {done:,} events, not the {n:,} announced")
    small = {"tags": _npy_text(json.dumps(tags, ensure_ascii=True)),
             "metadata": _npy_text(json.dumps(dict(metadata), ensure_ascii=True)),
             "format": _npy_text(NPZ_FORMAT)}
    for name, content in small.items():
        entry = _Entry(f"{name}.npy".encode(), offset, len(content), zlib.crc32(content))
        entries[name] = entry
        stream.seek(entry.data_offset)
        stream.write(content)
        offset = entry.end
    for entry in entries.values():
        stream.seek(entry.offset)
        stream.write(entry.local_header())
    stream.seek(offset)
    central = b"".join(entry.central_header() for entry in entries.values())
    stream.write(central)
    end64 = offset + len(central)
    count = len(entries)
    stream.write(_END64.pack(b"PK\x06\x06", _END64.size - 12, _VERSION, _VERSION, 0, 0, count,
                             count, len(central), offset))
    stream.write(_END64_LOCATOR.pack(b"PK\x06\x07", 0, end64, 1))
    stream.write(_END.pack(b"PK\x05\x06", 0, 0, count, count,
                           min(len(central), _ZIP64_LIMIT), min(offset, _ZIP64_LIMIT), 0))
    stream.truncate()


def save_npz_blocks(path: str | os.PathLike[str], n: int,
                    blocks: Iterable[Mapping[str, np.ndarray]], *, tags: list[str],
                    metadata: Mapping[str, Any]) -> None:
    """:func:`write_npz_blocks` into ``path``, atomically (a temporary file beside it renamed
    over it when whole, as :func:`allocsim.traces.formats.save` writes); an error is one
    :class:`TraceError` naming ``path``."""
    target = Path(path)
    if not target.parent.is_dir():
        raise TraceError(f"directory {str(target.parent)!r} does not exist", source=str(path))
    try:
        with atomic_output(path) as stream:     # a claimed output keeps its claim
            write_npz_blocks(stream, n, blocks, tags=tags, metadata=metadata)
    except OSError as err:
        raise TraceError(f"cannot write: {err.strerror or err}", source=str(path)) from None
    except TraceError as err:
        raise err.located(str(path)) from None
