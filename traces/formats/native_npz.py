"""allocsim's ``.npz`` trace files: one array per column, fast and exact, no pickle.

The format is described in ``allocsim.traces.formats.native``.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
import zlib
from typing import Any, BinaryIO

import numpy as np

from allocsim.traces.formats.limits import MAX_GZIP_RATIO, max_input_bytes, too_large
from allocsim.traces.formats.native_common import (
    REQUIRED_COLUMNS,
    ZIP_MAGIC,
    check_tag_column,
    file_metadata,
    metadata_json,
)
from allocsim.traces.model import COLUMN_DTYPES, NO_TAG, Held, Trace, TraceError, pack_column

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


def read_npz(data: bytes, source: str, name: str) -> Trace:
    """Read an ``.npz`` written by :func:`write_npz` (never unpickles anything).

    Each column is held packed as soon as it is checked, and its array as read dropped
    (:meth:`Trace.from_owned_columns`: the arrays are this reader's own), so the trace comes
    back at ~18 bytes/event for a training trace rather than the file's 37."""
    arrays = _read_members(data, source)

    def text(key: str, default: Any) -> Any:
        if key not in arrays:
            return default
        value = arrays[key]
        if value.dtype.kind != "U" or value.size != 1:
            raise TraceError(f"array {key!r} should hold JSON text", source=source)
        try:
            return json.loads(str(value.reshape(())))
        except ValueError as err:
            raise TraceError(f"array {key!r} is not valid JSON: {err}", source=source) from None

    fmt: Any = arrays.get("format")
    if fmt is not None:
        if fmt.dtype.kind != "U" or fmt.size != 1:
            raise TraceError(f"array 'format' should hold one string such as {NPZ_FORMAT!r}, "
                             f"not a {fmt.dtype} array of shape {fmt.shape}", source=source)
        fmt = str(fmt.reshape(()))
    missing = [c for c in REQUIRED_COLUMNS if c not in arrays]
    if missing:
        raise TraceError("not an allocsim trace .npz: missing array(s) "
                         + ", ".join(repr(c) for c in missing), source=source)
    if fmt not in (None, NPZ_FORMAT):
        raise TraceError(f"unsupported .npz format {fmt!r} (this version reads {NPZ_FORMAT!r})",
                         source=source)
    columns: dict[str, Held] = {}
    if arrays["time_ns"].ndim != 1:
        raise TraceError(f"array 'time_ns' has shape {arrays['time_ns'].shape}, expected 1-D",
                         source=source)
    n = len(arrays["time_ns"])
    for column, dtype in COLUMN_DTYPES.items():
        if column not in arrays:
            continue
        values = arrays[column]
        if values.ndim != 1 or len(values) != n:
            raise TraceError(f"array {column!r} has shape {values.shape}, expected ({n},)",
                             source=source)
        if values.dtype.kind not in "iu":
            raise TraceError(f"array {column!r} has dtype {values.dtype}, expected integers",
                             source=source)
        if values.dtype != dtype and len(values):
            info = np.iinfo(dtype)
            out = np.flatnonzero((values < info.min) | (values > info.max))
            if len(out):
                raise TraceError(f"{column} {values[out[0]]} does not fit in {np.dtype(dtype)}",
                                 source=source, event=int(out[0]))
        columns[column] = pack_column(values, dtype)
        del arrays[column], values
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


def _read_members(data: bytes, source: str) -> dict[str, np.ndarray]:
    """The known arrays of the archive, each judged by its zip entry and its ``.npy`` header
    before a byte of it is read: the sizes the archive claims (against the input limit and,
    for a compressed member, the compression ratio a bomb shows), and a header whose shape
    and dtype must account for the member's bytes exactly. Never unpickles."""
    limit = max_input_bytes()
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = {info.filename[:-4]: info for info in archive.infolist()
                     if info.filename.endswith(".npy") and info.filename[:-4] in _MEMBERS}
            claimed = sum(info.file_size for info in infos.values())
            if claimed > limit:
                raise too_large(limit, source, "its arrays hold")
            return {key: _read_member(archive, info, key, source)
                    for key, info in infos.items()}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError,
            KeyError, NotImplementedError, zlib.error) as err:
        if isinstance(err, TraceError):
            raise
        raise TraceError(f"not a readable .npz file: {err}", source=source) from None


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, key: str,
                 source: str) -> np.ndarray:
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
    with archive.open(info) as stream:
        return np.lib.format.read_array(stream, allow_pickle=False)


def _check_tag_indices(tag: np.ndarray, count: int, source: str) -> None:
    """Every tag index names an entry of the tag table, or is NO_TAG (untagged)."""
    if len(tag):
        bad = np.flatnonzero((tag < NO_TAG) | (tag >= count))
        if len(bad):
            raise TraceError(f"tag index {int(tag[bad[0]])} is not in the file's {count} "
                             "tags", source=source, event=int(bad[0]))
