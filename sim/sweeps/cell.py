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
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from allocsim.sim.kernel.engine import replay
from allocsim.sim.questions.offline import OFFLINE_NAME, offline_result
from allocsim.sim.sweeps.grid import Cell, TraceSource
from allocsim.traces.model import Trace

__all__ = ["Failed", "loads_in_this_process", "make_record", "materialise", "run_cell"]

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


def ping() -> str:
    """A task that only proves a worker can import allocsim."""
    return worker_name()
