"""Running one cell: load (or reuse) its trace, replay it, and describe the outcome as a record.

This is the code that runs *in a worker* (a local pool process, a thread, or a Dask worker);
:func:`run_cell` never raises for a problem of the cell itself: a trace that cannot be loaded
or a replay that fails becomes a record with ``status: "error"`` and a one-line reason, so one
bad cell never stops the others. The record's shape is the results file's (see
:mod:`allocsim.sim.sweeps.store`).

A worker process keeps the last :data:`TRACE_CACHE_SIZE` traces it loaded, so the cells of a
trace that reach the same worker load it once (the executors submit cells trace by trace to
make that the common case); :func:`loads_in_this_process` counts the loads.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from allocsim.sim.kernel.engine import replay
from allocsim.sim.questions.offline import OFFLINE_NAME, offline_result
from allocsim.sim.sweeps.grid import Cell, TraceSource
from allocsim.traces.model import Trace

__all__ = ["Failed", "loads_in_this_process", "make_record", "materialise", "run_cell",
           "run_cells"]

TRACE_CACHE_SIZE = 2             # traces a local worker keeps (it never returns to one it left)


@dataclass(frozen=True)
class Failed:
    """A trace that could not be loaded: the cells that need it record this message."""

    message: str


_CACHE: collections.OrderedDict[str, Trace | Failed] = collections.OrderedDict()
_CACHE_LOCK = threading.Lock()   # a thread-pool executor shares one process's cache
_LOADS: collections.Counter[str] = collections.Counter()


def worker_name() -> str:
    """``host:pid`` of the process running a cell (the record's ``worker`` diagnostic)."""
    # At call time, not import time: forked pool workers inherit the parent's module globals.
    return f"{socket.gethostname()}:{os.getpid()}"


def loads_in_this_process() -> dict[str, int]:
    """How many times this process loaded (or decoded, or generated) each trace: the check that
    traces travel once (run it on Dask workers with ``client.run``)."""
    return dict(_LOADS)


def describe_error(err: BaseException) -> str:
    """``"TypeName: message"`` on one line: how a failure is recorded."""
    return f"{type(err).__name__}: {err}".replace("\n", " ")


def materialise(source: TraceSource, data: bytes | None = None) -> Trace | Failed:
    """Load a trace (from its file, from shipped bytes, or by generating it); failures become
    a :class:`Failed` so every cell of the trace records the same one-line reason."""
    _LOADS[source.key] += 1
    try:
        return source.load() if data is None else source.load_from_bytes(data)
    except Exception as err:
        return Failed(describe_error(err))


def _cached_trace(source: TraceSource) -> tuple[Trace | Failed, bool]:
    """The trace of ``source`` from this process's cache, loading it on a miss."""
    with _CACHE_LOCK:
        trace = _CACHE.get(source.key)
        if trace is not None:
            _CACHE.move_to_end(source.key)
            return trace, False
        trace = materialise(source)
        _CACHE[source.key] = trace
        while len(_CACHE) > TRACE_CACHE_SIZE:
            _CACHE.popitem(last=False)
        return trace, True


def make_record(cell: Cell, *, result: dict[str, Any] | None = None, error: str | None = None,
                wall_s: float = 0.0, loaded: bool = False,
                worker: str | None = None) -> dict[str, Any]:
    """The results-file record of one cell (keys in the order they are written)."""
    return {"cell": cell.key, "trace": cell.trace.key, "policy": cell.policy,
            "device": cell.device, "capacity": cell.capacity,
            "status": "ok" if error is None else "error", "error": error, "result": result,
            "wall_s": round(wall_s, 6), "trace_loaded": loaded, "worker": worker}


def run_cell(cell: Cell, trace: Trace | Failed | None = None) -> dict[str, Any]:
    """Replay one cell; never raises for a problem of the cell itself (it is recorded).

    ``trace``: the cell's trace when the executor ships it (Dask); None loads it through this
    process's cache.
    """
    start = time.perf_counter()
    loaded = False
    if trace is None:
        trace, loaded = _cached_trace(cell.trace)
    if isinstance(trace, Failed):
        return make_record(cell, error=trace.message, wall_s=time.perf_counter() - start,
                           loaded=loaded, worker=worker_name())
    try:
        if cell.policy == OFFLINE_NAME:
            result = offline_result(trace, cell.profile)
        else:
            result = replay(trace, cell.policy, cell.profile)
        data = result.to_json_dict()
    except Exception as err:
        return make_record(cell, error=describe_error(err), wall_s=time.perf_counter() - start,
                           loaded=loaded, worker=worker_name())
    return make_record(cell, result=data, wall_s=time.perf_counter() - start, loaded=loaded,
                       worker=worker_name())


def run_cells(cells: Sequence[Cell],
              trace: Trace | Failed | bytes | None = None) -> list[dict[str, Any]]:
    """Several cells of one trace in one task (Dask): their records, in order.

    ``trace``: the decoded trace (or its :class:`Failed`), the trace file's bytes (decoded
    here, once for all the cells), or None to load or generate it here from the cells' source.
    Each cell's problem is its own record, as in :func:`run_cell`.
    """
    if not cells:
        return []
    with roomy_malloc():
        if trace is None or isinstance(trace, bytes):
            trace = materialise(cells[0].trace, trace)
        return [run_cell(cell, trace) for cell in cells]


# glibc's mallopt parameters (<malloc.h>) and its defaults for both thresholds.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
GLIBC_DEFAULT_THRESHOLD = 128 * 1024
ROOMY_TRIM, ROOMY_MMAP = 256 << 20, 32 << 20
_MALLOC_LOCK = threading.Lock()
_MALLOC_USERS = 0


def _mallopt_env(name: str) -> int:
    try:
        return int(os.environ.get(name, GLIBC_DEFAULT_THRESHOLD))
    except ValueError:
        return GLIBC_DEFAULT_THRESHOLD


@contextlib.contextmanager
def roomy_malloc() -> Iterator[None]:
    """While a batch runs, let glibc keep freed memory instead of returning it at once.

    Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (memory goes back to
    the OS eagerly), which also fixes the mmap threshold at 128 KiB: every trace-sized array
    is then mapped and unmapped afresh, and replays cost ~5% more CPU (page faults, system
    time) than in a plain process. Only where that variable is set (so the thresholds are
    fixed already, and the values to restore are known) and on glibc, this raises both for
    the batch (nested or concurrent batches share it), then restores them and trims.
    """
    global _MALLOC_USERS
    libc = _glibc() if "MALLOC_TRIM_THRESHOLD_" in os.environ else None
    if libc is None:
        yield
        return
    with _MALLOC_LOCK:
        _MALLOC_USERS += 1
        if _MALLOC_USERS == 1:
            libc.mallopt(M_TRIM_THRESHOLD, ROOMY_TRIM)
            libc.mallopt(M_MMAP_THRESHOLD, ROOMY_MMAP)
    try:
        yield
    finally:
        with _MALLOC_LOCK:
            _MALLOC_USERS -= 1
            if _MALLOC_USERS == 0:
                libc.mallopt(M_TRIM_THRESHOLD, _mallopt_env("MALLOC_TRIM_THRESHOLD_"))
                libc.mallopt(M_MMAP_THRESHOLD, _mallopt_env("MALLOC_MMAP_THRESHOLD_"))
                libc.malloc_trim(0)


@functools.cache
def _glibc() -> Any:
    """The C library when it is glibc (it has mallopt and malloc_trim), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        _ = libc.gnu_get_libc_version   # glibc only
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


def ping() -> str:
    """A task that only proves a worker can import allocsim."""
    return worker_name()
