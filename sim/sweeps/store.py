"""The resumable results store: one JSON line per finished cell, appended and fsync'ed.

Results file
============

JSON lines, one object per finished cell, appended and fsync'ed as each cell finishes::

    {"cell": "traces/a.npz | bfc | a100-40g | 17179869184", "trace": "traces/a.npz",
     "policy": "bfc", "device": "a100-40g", "capacity": 17179869184,   # null: the device's own
     "status": "ok" | "error", "error": null | "TraceError: ...",
     "result": RunResult.to_json_dict() (no timeline) | null,
     "wall_s": 0.21, "trace_loaded": true, "worker": "host:pid"}

``cell`` (``TRACE | POLICY | DEVICE | CAPACITY-BYTES-or-default``, policy in canonical form) is
what resuming matches on. ``wall_s``, ``trace_loaded`` (did this cell have to load its trace,
or did the worker already hold it) and ``worker`` are diagnostics that differ between runs;
everything else is deterministic. On start the file is read (a truncated last line — a crash
mid-write — is cut off), cells with ``status: ok`` are skipped, and errored cells are skipped
too unless ``retry_errors`` (a retried cell appends a new line; the last line of a cell wins,
an ``ok`` line over an ``error`` line).

Only files the store recognises as its own are ever written: a missing or empty file, or one
whose every complete line is a record (a JSON object with a string ``cell`` first, a
``status`` of ``ok`` or ``error`` and the keys above) and whose bytes after the last newline,
if any, are the start of a record cut short (or, after records, zeros a power loss left).
Anything else — a trace, a JSON document, a text or binary file given to ``--output`` by
mistake — is refused with a :class:`~allocsim.sim.sweeps.grid.SweepError` before a byte of it
changes. Files written by earlier versions of allocsim have the same lines, so they resume.

Only the coordinating process writes the file, under an exclusive ``flock`` on its
descriptor, so two sweeps cannot interleave lines in one file. Why ``flock`` (and not a lock
file recording the owner's pid and start time): the kernel releases it when the last
descriptor of that open file closes — at the latest when its holder dies, SIGKILL included —
so a lock can never be left stale, there is nothing to judge (pid reuse, clocks, a lock file
on another machine's view of NFS) and no second file to leave behind. That holds only if no
other process shares the descriptor: it is opened close-on-exec, and the local pool's forked
workers close their copy first thing (:mod:`allocsim.sim.sweeps.executors`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from allocsim.printable import printable
from allocsim.sim.sweeps.grid import SweepError

__all__ = ["ResultsFile", "latest_records", "load_results"]

RECORD_KEYS = ("cell", "trace", "policy", "device", "capacity", "status", "error", "result")
RECORD_START = b'{"cell":"'    # how every line the store writes begins (compact JSON, cell first)
STATUSES = ("ok", "error")
# A line json cannot parse for its depth (``[[[[...]]]]`` 100,000 deep: RecursionError).
NESTED = "nested too deeply to read (not a sweep record)"


def load_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record in a results file, in file order. A last line without its newline (a crash
    mid-write) and lines that are not JSON objects are skipped. A missing file is empty. A line
    nested too deeply to parse (no record the store writes is) is refused: :class:`SweepError`,
    one line naming the file and the line."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    return _parse_lines(raw, path)[0]


def _parse_lines(raw: bytes, path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], int]:
    """(records, length of the good prefix: everything up to the last newline)."""
    end = raw.rfind(b"\n") + 1
    records = []
    for number, text in enumerate(raw[:end].split(b"\n")[:-1], start=1):
        for line in text.splitlines():   # as before: a lone \r also ends a line
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            except RecursionError:
                raise SweepError(f"{printable(path)}: line {number} is {NESTED}") from None
            if isinstance(record, dict) and isinstance(record.get("cell"), str):
                records.append(record)
    return records, end


def latest_records(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """One record per cell: the last ``ok`` line, or the last line if the cell never succeeded."""
    latest: dict[str, dict[str, Any]] = {}
    for record in records:
        key = record["cell"]
        kept = latest.get(key)
        if kept is None or record.get("status") == "ok" or kept.get("status") != "ok":
            latest[key] = dict(record)
    return latest


def _is_record(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("cell"), str)
            and value.get("status") in STATUSES and all(key in value for key in RECORD_KEYS))


def _torn_line(tail: bytes) -> bool:
    """Whether ``tail`` (bytes after the last newline) is what a crash mid-append leaves: the
    start of a record line, incomplete (a whole JSON value is not a torn line)."""
    if not (tail.startswith(RECORD_START) or RECORD_START.startswith(tail)):
        return False
    try:
        json.loads(tail)
    except ValueError:
        return True
    except RecursionError:   # no record the store writes nests that deep
        return False
    return False


def foreign_content(raw: bytes) -> str | None:
    """Why ``raw`` is not a results file this store wrote (None when it is one, or empty)."""
    if not (raw.startswith(RECORD_START) or RECORD_START.startswith(raw)):
        return "it does not start with a sweep record"   # cheap: most foreign files stop here
    end = raw.rfind(b"\n") + 1
    for number, line in enumerate(raw[:end].split(b"\n")[:-1], start=1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        except RecursionError:
            return f"line {number} is {NESTED}"
        if not _is_record(record):
            return f"line {number} is not a sweep record"
    tail = raw[end:]
    # After whole records: a line cut short, or the zeros a power loss can leave instead.
    if tail and not _torn_line(tail) and not (end and not tail.strip(b"\0")):
        return "its last line is not a sweep record"
    return None


class ResultsFile:
    """The append-only results file, locked for the sweep's duration.

    Opening it refuses (:class:`SweepError`) a file that is not a results file, and one that
    another sweep holds; then cuts a half-written last line and reads the records in it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._refuse_unless_regular()
        path.parent.mkdir(parents=True, exist_ok=True)
        # Close-on-exec: a program started from this one must not share the lock (below).
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        self.fd = os.open(path, flags, 0o666)
        try:
            if not stat.S_ISREG(os.fstat(self.fd).st_mode):
                self._refuse("not a regular file")
            self._lock()
            self._refuse_unless_it_starts_as_ours()
            raw = self._read_all()
            problem = foreign_content(raw)
            if problem is not None:
                self._refuse(problem)
            records, good = _parse_lines(raw, self.path)
            if good < len(raw):
                # A crash left half a line: cut it so the next line starts on its own.
                try:
                    os.ftruncate(self.fd, good)
                    os.fsync(self.fd)
                except OSError as err:
                    raise OSError(err.errno, err.strerror, os.fspath(self.path)) from None
            self.truncated = len(raw) - good
            self.previous = latest_records(records)
        except BaseException:
            os.close(self.fd)
            raise

    def _refuse(self, why: str) -> None:
        raise SweepError(f"{printable(self.path)}: not a sweep results file; {why}, so it is "
                         "left as it is (give another --output, or remove it)")

    def _refuse_unless_it_starts_as_ours(self) -> None:
        """A file that does not open with a record (a 6 GB sparse file, a trace) is refused
        from its head alone: only a results file of the store's is read whole (to resume)."""
        head = os.pread(self.fd, len(RECORD_START), 0)
        if not (head.startswith(RECORD_START) or RECORD_START.startswith(head)):
            self._refuse("it does not start with a sweep record")

    def _refuse_unless_regular(self) -> None:
        # Before opening: opening a FIFO or a device for writing can block or act on it.
        try:
            mode = self.path.stat().st_mode
        except FileNotFoundError:
            return
        except OSError:
            return   # os.open below reports it (one line through the CLI's OSError handler)
        if not stat.S_ISREG(mode):
            self._refuse("not a regular file")

    def identity(self) -> tuple[int, int, int]:
        """(fd, st_dev, st_ino): what a forked worker needs to close its copy of the fd."""
        info = os.fstat(self.fd)
        return self.fd, info.st_dev, info.st_ino

    def _lock(self) -> None:
        try:
            import fcntl
        except ModuleNotFoundError:  # not POSIX: no lock, one sweep per file is on the user
            return
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SweepError(f"{self.path}: another sweep is writing this results file") from None

    def _read_all(self) -> bytes:
        chunks: list[bytes] = []
        offset = 0
        while True:
            chunk = os.pread(self.fd, 1 << 20, offset)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            offset += len(chunk)

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record as one line and fsync it."""
        # One write of a whole line (O_APPEND), then fsync: a crash loses at most this line,
        # and at worst leaves half of it, which the next start cuts off.
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        view = memoryview(data)
        try:
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
            os.fsync(self.fd)
        except OSError as err:  # a full disk, ``ulimit -f``: the error names the file
            raise OSError(err.errno, err.strerror, os.fspath(self.path)) from None

    def close(self) -> None:
        os.close(self.fd)  # closing releases the flock
