"""allocsim's own trace files: ``.npz`` (fast, exact) and ``.csv`` / ``.jsonl`` (interchange).

Every reader here has the signature ``reader(data, source, name) -> Trace``: ``data`` is the
file's bytes (already un-gzipped by :func:`allocsim.traces.formats.load`), ``source`` the path
used in error messages, ``name`` the default trace name (the file stem). Every writer is
``writer(trace, stream)`` writing bytes to a binary stream. Readers turn every user mistake
into one :class:`~allocsim.traces.model.TraceError` line naming the file, the event (0-based)
and, for text formats, the line number; they do *not* validate the events (``load`` does that next).

``.npz``
    One array per column (``time_ns``, ``op``, ``id``, ``size``, ``stream``, ``process``,
    ``tag``) plus ``tags`` and ``metadata`` (JSON text in 0-d unicode arrays) and ``format``
    (``"allocsim-trace/1"``). Uncompressed, so loading is a memcpy; needs no pickle.

``.csv`` (and ``.csv.gz``) — the documented interchange format::

    # allocsim-metadata: {"name": "resnet", "source": "memory"}
    time_ns,op,id,size,stream,process,tag
    0,alloc,1,4096,0,0,aten::empty
    10,free,1,,0,0,

    One event per row. ``op`` is ``alloc`` or ``free``. ``size`` may be empty on a free
    (unknown). ``stream``, ``process`` and ``tag`` columns are optional (absent: 0, 0, no tag);
    ``tag`` holds the tag string, empty for none (surrounding spaces are ignored, so
    such tags and the empty tag cannot be written to CSV). Columns may come in any order; unknown
    columns are an error. Lines starting with ``#`` before the header are comments, except
    ``# allocsim-metadata: {json}`` (the trace metadata) and ``# allocsim-tags: [json]`` (the
    tag table, written only when it is not simply the used tags in first-use order). Blank
    lines are ignored.

``.jsonl`` (and ``.jsonl.gz``)::

    {"allocsim-metadata": {"name": "resnet", "source": "memory"}}
    {"time_ns": 0, "op": "alloc", "id": 1, "size": 4096, "stream": 0, "process": 0, "tag": "x"}
    {"time_ns": 10, "op": "free", "id": 1, "size": null, "stream": 0, "process": 0}

    One JSON object per line with the CSV's field names; ``size`` may be null or absent on a
    free, ``stream`` / ``process`` / ``tag`` may be absent. An optional first line holds
    ``allocsim-metadata`` (and, like CSV, ``allocsim-tags`` when needed). Blank lines and
    leading ``#`` lines are ignored.

Where each lives: ``npz``, ``csv`` and ``jsonl`` (modules of this package,
``allocsim.traces.formats.native``), with what they share (metadata, column checks, the
:data:`Reader` / :data:`Writer` signatures) in ``common``; ``npz_stream`` writes an ``.npz``
a block at a time. This module gathers their public names, which stay importable from here.
"""

from __future__ import annotations

from allocsim.traces.formats.native.common import (
    CSV_COLUMNS,
    REQUIRED_COLUMNS,
    Reader,
    Writer,
    file_metadata,
)
from allocsim.traces.formats.native.csv import detect_csv, read_csv, write_csv
from allocsim.traces.formats.native.jsonl import detect_jsonl, read_jsonl, write_jsonl
from allocsim.traces.formats.native.npz import NPZ_FORMAT, detect_npz, read_npz, write_npz

__all__ = [
    "CSV_COLUMNS",
    "NPZ_FORMAT",
    "REQUIRED_COLUMNS",
    "Reader",
    "Writer",
    "detect_csv",
    "detect_jsonl",
    "detect_npz",
    "file_metadata",
    "read_csv",
    "read_jsonl",
    "read_npz",
    "write_csv",
    "write_jsonl",
    "write_npz",
]
