"""allocsim's ``.npz`` trace files: one array per column, fast and exact, no pickle.

The format is described in ``allocsim.traces.formats.native``.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from allocsim.traces.formats.limits import MAX_GZIP_RATIO, max_input_bytes, too_large
from allocsim.traces.formats.native.common import (
    REQUIRED_COLUMNS,
    ZIP_MAGIC,
    check_tag_column,
    file_metadata,
    metadata_json,
)
from allocsim.traces.model import (
    COLUMN_DTYPES,
    NO_TAG,
    Held,
    Trace,
    TraceError,
    pack_column,
    packed_dtype,
)

__all__ = ["NPZ_FORMAT", "detect_npz", "read_npz", "write_npz"]

NPZ_FORMAT = "allocsim-trace/1"


def detect_npz(path: str, head: bytes) -> bool:
    """A zip archive (``.npz`` files are zips of ``.npy`` arrays)."""
    return head.startswith(ZIP_MAGIC)


def write_npz(trace: Trace, stream: BinaryIO) -> None:
    """Write ``trace`` as an uncompressed ``.npz``: one array per column, JSON for the rest."""
    check_tag_column(trace)
    # At the file's dtypes, without unpacking the trace's packed columns for good.
    arrays: dict[str, np.ndarray] = {name: np.ascontiguousarray(trace.column(name), dtype=dtype)
                                     for name, dtype in COLUMN_DTYPES.items()}
    arrays["tags"] = np.array(json.dumps(trace.tags, ensure_ascii=True))
    arrays["metadata"] = np.array(metadata_json(trace))
    arrays["format"] = np.array(NPZ_FORMAT)
    np.savez(stream, allow_pickle=False, **arrays)


def read_npz(data: bytes | BinaryIO, source: str, name: str) -> Trace:
    """Read an ``.npz`` written by :func:`write_npz` (never unpickles anything), from its
    bytes or from the open file (``load`` hands it the file: :func:`open_input`).

    Each column is read in pieces of :data:`_PIECE` values straight from the archive, twice:
    once for its range (which says the dtype the trace holds it in,
    :func:`~allocsim.traces.model.packed_dtype`) and once into that packed array
    (:meth:`Trace.from_owned_columns` takes the arrays over). Loading so holds the packed
    trace (~18 bytes/event for a training trace; the file has 37) and one piece: never a
    column as stored, nor the file."""
    stream = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    try:
        with zipfile.ZipFile(stream) as archive:
            return _read_trace(_members(archive, source), source, name)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError,
            KeyError, NotImplementedError, zlib.error) as err:
        if isinstance(err, TraceError):
            raise
        raise TraceError(f"not a readable .npz file: {err}", source=source) from None


def _read_trace(members: dict[str, _Member], source: str, name: str) -> Trace:
    """The trace in the archive's ``members``, each judged before it is read."""

    def text(key: str, default: Any) -> Any:
        if key not in members:
            return default
        value = members[key].array()
        if value.dtype.kind != "U" or value.size != 1:
            raise TraceError(f"array {key!r} should hold JSON text", source=source)
        try:
            return json.loads(str(value.reshape(())))
        except ValueError as err:
            raise TraceError(f"array {key!r} is not valid JSON: {err}", source=source) from None

    fmt: Any = members["format"].array() if "format" in members else None
    if fmt is not None:
        if fmt.dtype.kind != "U" or fmt.size != 1:
            raise TraceError(f"array 'format' should hold one string such as {NPZ_FORMAT!r}, "
                             f"not a {fmt.dtype} array of shape {fmt.shape}", source=source)
        fmt = str(fmt.reshape(()))
    missing = [c for c in REQUIRED_COLUMNS if c not in members]
    if missing:
        raise TraceError("not an allocsim trace .npz: missing array(s) "
                         + ", ".join(repr(c) for c in missing), source=source)
    if fmt not in (None, NPZ_FORMAT):
        raise TraceError(f"unsupported .npz format {fmt!r} (this version reads {NPZ_FORMAT!r})",
                         source=source)
    columns: dict[str, Held] = {}
    if len(members["time_ns"].shape) != 1:
        raise TraceError(f"array 'time_ns' has shape {members['time_ns'].shape}, expected 1-D",
                         source=source)
    n = members["time_ns"].shape[0]
    for column, dtype in COLUMN_DTYPES.items():
        if column not in members:
            continue
        member = members[column]
        if len(member.shape) != 1 or member.shape[0] != n:
            raise TraceError(f"array {column!r} has shape {member.shape}, expected ({n},)",
                             source=source)
        if member.dtype.kind not in "iu":
            raise TraceError(f"array {column!r} has dtype {member.dtype}, expected integers",
                             source=source)
        columns[column] = member.packed(column, dtype)
    tags = text("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise TraceError("array 'tags' should be a JSON list of strings", source=source)
    metadata = text("metadata", {})
    if not isinstance(metadata, dict):
        raise TraceError("array 'metadata' should be a JSON object", source=source)
    tag = columns.get("tag")
    if tag is not None:
        _check_tag_indices(np.atleast_1d(tag), len(tags), source)
    return Trace.from_owned_columns(columns, n, tags=tags,
                                    metadata=file_metadata(metadata, source, name))


# The members a trace .npz holds; any other member is not read.
_MEMBERS = frozenset(COLUMN_DTYPES) | {"tags", "metadata", "format"}
# Values of a column read at a time: 128 KiB of int64 (the zip reader holds a copy or two of
# a piece as it reads), a rounding error beside a trace of a million events, and few enough
# reads that a piece costs nothing to ask for.
_PIECE = 1 << 14


def _members(archive: zipfile.ZipFile, source: str) -> dict[str, _Member]:
    """The known arrays of the archive, each judged by its zip entry and its ``.npy`` header
    before a byte of it is read: the sizes the archive claims (against the input limit and,
    for a compressed member, the compression ratio a bomb shows), and a header whose shape
    and dtype must account for the member's bytes exactly. Never unpickles."""
    limit = max_input_bytes()
    infos = {info.filename[:-4]: info for info in archive.infolist()
             if info.filename.endswith(".npy") and info.filename[:-4] in _MEMBERS}
    claimed = sum(info.file_size for info in infos.values())
    if claimed > limit:
        raise too_large(limit, source, "its arrays hold")
    return {key: _Member.judged(archive, info, key, source) for key, info in infos.items()}


@dataclass(frozen=True)
class _Member:
    """One ``.npy`` member whose entry and header were judged (:meth:`judged`); its values
    are read only when asked for, as an array (:meth:`array`) or packed (:meth:`packed`)."""

    archive: zipfile.ZipFile
    info: zipfile.ZipInfo
    key: str
    source: str
    header: int                 # bytes of the .npy header before the values
    shape: tuple[int, ...]
    dtype: np.dtype

    @classmethod
    def judged(cls, archive: zipfile.ZipFile, info: zipfile.ZipInfo, key: str,
               source: str) -> _Member:
        where = f"array {key!r}"
        if (info.compress_type != zipfile.ZIP_STORED and info.file_size > 16 << 20
                and info.file_size > MAX_GZIP_RATIO * max(info.compress_size, 1)):
            raise TraceError(f"{where} decompresses more than {MAX_GZIP_RATIO} times over "
                             f"({info.file_size:,} bytes from {info.compress_size:,}): a "
                             "compression bomb, not a trace", source=source)
        with archive.open(info) as stream:
            try:
                version = np.lib.format.read_magic(stream)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
                elif version in ((2, 0), (3, 0)):
                    shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
                else:
                    raise ValueError(f"npy format version {version}")
            except (ValueError, SyntaxError, TypeError) as err:
                raise TraceError(f"{where} is not a .npy array: {str(err).splitlines()[0]}",
                                 source=source) from None
            header = stream.tell()
        if dtype.hasobject:
            raise TraceError(f"{where} holds Python objects (a pickle), which allocsim never "
                             "loads", source=source)
        body = math.prod(shape) * dtype.itemsize
        if header + body != info.file_size:
            raise TraceError(f"{where}: its header claims shape {shape} of {dtype} "
                             f"({body:,} bytes) but the member holds {info.file_size - header:,}",
                             source=source)
        return cls(archive, info, key, source, header, tuple(shape), dtype)

    def array(self) -> np.ndarray:
        """The member's values as stored (for the small ones: format, tags, metadata)."""
        with self.archive.open(self.info) as stream:
            return np.lib.format.read_array(stream, allow_pickle=False)

    def pieces(self) -> Iterator[tuple[int, np.ndarray]]:
        """(index of its first value, values) of a 1-D member, :data:`_PIECE` at a time."""
        n = self.shape[0]
        with self.archive.open(self.info) as stream:
            stream.read(self.header)
            for start in range(0, n, _PIECE):
                count = min(_PIECE, n - start)
                raw = stream.read(count * self.dtype.itemsize)
                if len(raw) != count * self.dtype.itemsize:
                    raise EOFError(f"array {self.key!r} ends early")
                yield start, np.frombuffer(raw, dtype=self.dtype)

    def packed(self, column: str, dtype: type) -> Held:
        """The column held as the trace holds it (:func:`pack_column`'s rule), read twice
        piece by piece: its range first (every value must fit ``dtype``), then its values
        into the packed array."""
        n = self.shape[0]
        if not n:
            return pack_column(np.zeros(0, dtype=self.dtype), dtype)
        info = np.iinfo(dtype)
        lo, hi = info.max, info.min
        for start, values in self.pieces():
            if self.dtype != dtype:
                out = np.flatnonzero((values < info.min) | (values > info.max))
                if len(out):
                    raise TraceError(f"{column} {values[out[0]]} does not fit in "
                                     f"{np.dtype(dtype)}", source=self.source,
                                     event=start + int(out[0]))
            lo, hi = min(lo, int(values.min())), max(hi, int(values.max()))
        held = packed_dtype(lo, hi, dtype)
        if held is None:
            return lo
        packed: np.ndarray = np.empty(n, dtype=held)
        for start, values in self.pieces():
            packed[start:start + len(values)] = values
        return packed


def _check_tag_indices(tag: np.ndarray, count: int, source: str) -> None:
    """Every tag index names an entry of the tag table, or is NO_TAG (untagged). Checked
    :data:`_PIECE` values at a time: the masks of the whole column were 2 bytes/event more
    than the trace at loading's peak (500M events: 1 GB)."""
    for start in range(0, len(tag), _PIECE):
        piece = tag[start:start + _PIECE]
        bad = np.flatnonzero((piece < NO_TAG) | (piece >= count))
        if len(bad):
            raise TraceError(f"tag index {int(piece[bad[0]])} is not in the file's {count} "
                             "tags", source=source, event=start + int(bad[0]))
