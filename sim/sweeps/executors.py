"""The executors: where cells run — a local process pool (default), a Dask cluster, or any
:class:`concurrent.futures.Executor` — behind one small :class:`Runner` interface.

Executors and how traces travel
===============================

- **local** (default): a :class:`~concurrent.futures.ProcessPoolExecutor` with one process per
  usable core. A cell carries only its trace's *source* (path or synth spec); each worker
  process loads (or regenerates) a trace the first time it runs one of its cells and keeps the
  last few in a per-process cache. Cells are submitted trace by trace and each worker takes
  cells in submission order, so a worker never returns to a trace it has left: each trace is
  loaded at most once per worker process, never once per cell (counted by the ``trace_loaded``
  field; ``tests/test_sweep.py`` checks it). A worker process that dies (killed for memory,
  say) fails every cell in flight on the pool, not only its own: the pool is restarted, those
  cells are retried one at a time, and a cell that kills its worker while running alone
  records the error.
- **dask://HOST:PORT** (``tcp://`` works too, or pass a ``distributed.Client``): an existing
  Dask cluster. Workers need allocsim installed but not the trace files: the coordinator
  reads each file's bytes once and ``scatter``\\s them. The cells of a trace run as one *batch*,
  a single task (:func:`~allocsim.sim.sweeps.cell.run_cells`) that decodes the bytes (or runs
  the generator, for ``synth:``) on the worker holding them and replays every cell there: one
  task per trace instead of one per cell plus one per trace, and no decoded trace moved
  between workers (scheduler, client and worker event loops cost CPU per task). Batches are
  capped so a sweep makes at least :data:`BATCHES_PER_THREAD` per worker thread; a trace
  with more cells than a batch holds is split: one task decodes it and its batches take its
  future (Dask ships the decoded trace to each worker that needs it once). Each trace is thus
  decoded once per sweep (counted per worker process by
  :func:`~allocsim.sim.sweeps.cell.loads_in_this_process`; the tests check the sum). Each cell
  still gets its own :class:`~concurrent.futures.Future`, resolved from its batch's records,
  so the sweep loop sees cells as before: a cell's error is its own record; a batch whose task
  fails (a worker died) is retried one cell per task, so only the culprit records the error;
  cancelling every cell handed out of a batch cancels its task. The coordinator drops a
  trace's futures when its last cell is done, so cluster memory holds only the traces in
  flight. The simulator is pure Python and holds the GIL, so start workers with one thread
  each (``dask worker ADDRESS --nworkers N --nthreads 1``): the threads of one worker process
  take turns, they do not add speed. (Dask's nanny starts workers with
  ``MALLOC_TRIM_THRESHOLD_=65536``, which costs replays ~5% CPU; a batch relaxes glibc's
  thresholds while it runs: :func:`~allocsim.sim.sweeps.cell.roomy_malloc`.)
- any other :class:`concurrent.futures.Executor` object: like local (per-process cache).

Local workers end with their parent
===================================

A local worker must not outlive the sweep that started it: killed with SIGKILL, the
coordinator cannot shut its pool down, and workers left behind would keep computing for
nobody. Each worker therefore (1) asks Linux to SIGKILL it when its parent dies
(``prctl(PR_SET_PDEATHSIG)``), checking afterwards that the parent did not die before the
request; elsewhere a watchdog thread polls ``os.getppid()``; and before each cell it checks
its parent again; (2) closes, first thing, its forked copy of the coordinator's results-file
descriptor (named by device and inode, so nothing else is ever closed), so the results
file's lock belongs to the coordinator alone and the kernel releases it the moment the
coordinator dies (:mod:`allocsim.sim.sweeps.store`). Ctrl-C is the coordinator's to handle:
workers ignore SIGINT (see :mod:`allocsim.sim.sweeps.run`).
"""

from __future__ import annotations

import collections
import ctypes
import functools
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from allocsim.sim.sweeps.cell import Failed, describe_error, materialise, ping, run_cell, run_cells
from allocsim.sim.sweeps.dask_probe import check_scheduler
from allocsim.sim.sweeps.grid import Cell, SweepError, TraceSource
from allocsim.traces.formats.limits import read_input
from allocsim.traces.model import TraceError

__all__ = ["FileIdentity", "Runner", "dask_client", "make_runner", "usable_cores"]

FileIdentity = tuple[int, int, int]   # (fd, st_dev, st_ino) of a descriptor workers must close
PR_SET_PDEATHSIG = 1                  # <linux/prctl.h>
PARENT_POLL_S = 0.5                   # the watchdog's period where prctl is not available
BATCHES_PER_THREAD = 4                # Dask: cells are batched, at least this many per thread


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    counter = getattr(os, "process_cpu_count", None)  # 3.13+: honours the affinity mask
    if counter is not None:
        return int(counter() or 1)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


# ---------------------------------------------------------------------------------------
# A local worker's life: started by the pool's initializer, ended with its parent
# ---------------------------------------------------------------------------------------

_PARENT_PID: int | None = None        # set in a local worker by its initializer


def _init_local_worker(parent_pid: int, private: tuple[FileIdentity, ...]) -> None:
    # Ctrl-C in a terminal reaches the whole process group; the coordinator decides what
    # happens (finish running cells, then stop), so workers must not die mid-cell on it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked worker inherits the coordinator's SIGTERM handler (allocsim.interrupts), which
    # would report a group SIGTERM as the cell's exception; a worker just ends on it, as before.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    close_inherited(private)
    die_with_parent(parent_pid)


def close_inherited(private: Sequence[FileIdentity]) -> None:
    """Close this process's copies of the coordinator's descriptors named in ``private``.

    A forked child holds them (same number, same open file); a spawned one does not, and the
    number may then be some other file of its own: only a descriptor on the same device and
    inode is closed.
    """
    for fd, device, inode in private:
        try:
            stat = os.fstat(fd)
        except OSError:
            continue
        if (stat.st_dev, stat.st_ino) == (device, inode):
            os.close(fd)


def _set_parent_death_signal() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; False where that is unknown."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent_pid: int, *, use_prctl: bool = True,
                    interval_s: float = PARENT_POLL_S) -> None:
    """End this process (``os._exit``) when ``parent_pid``, its parent now, dies.

    On Linux the kernel does it (``PR_SET_PDEATHSIG``; it fires when the parent *thread* that
    forked this process ends — the pool forks its workers from the thread that submits cells,
    which outlives the pool). Elsewhere, or with ``use_prctl=False``, a daemon thread polls
    ``os.getppid()`` every ``interval_s`` (an orphan is adopted by another process).
    """
    global _PARENT_PID
    _PARENT_PID = parent_pid
    if use_prctl and _set_parent_death_signal():
        # The parent may have died between the fork and the request: then no signal comes.
        _exit_if_orphaned()
        return
    _exit_if_orphaned()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            _exit_if_orphaned()

    threading.Thread(target=watch, name="allocsim-parent-watch", daemon=True).start()


def _exit_if_orphaned() -> None:
    if _PARENT_PID is not None and os.getppid() != _PARENT_PID:
        os._exit(1)


def _run_local_cell(cell: Cell) -> dict[str, Any]:
    """:func:`~allocsim.sim.sweeps.cell.run_cell` in a local worker, which first makes sure
    the sweep that queued the cell is still alive (the portable check between cells)."""
    _exit_if_orphaned()
    return run_cell(cell)


# ---------------------------------------------------------------------------------------
# Runners
# ---------------------------------------------------------------------------------------

class Runner:
    """Submits cells to some executor; ``slots`` is how many to keep in flight."""

    slots: int = 1
    description: str = ""
    many_threads: bool = False   # Dask workers with several threads (worth a note)

    def submit(self, cell: Cell) -> Future[dict[str, Any]]:
        """Start ``cell``; its future's result is the cell's record (each runner's own)."""
        raise NotImplementedError

    def finished(self, cell: Cell) -> None:
        """Called once per cell that will not be submitted again."""

    def handle_broken(self, future: Future[dict[str, Any]]) -> None:
        """``future`` failed because a worker died (local pool only): start a fresh pool for
        the cells still to run."""

    def abort(self) -> None:
        """Abandon everything in flight, quickly."""

    def close(self) -> None:
        """Release resources after a normal finish."""


class PoolRunner(Runner):
    """A local process pool (owned) or a caller's Executor; traces load in the workers."""

    def __init__(self, workers: int, executor: Executor | None = None,
                 private: Sequence[FileIdentity] = ()) -> None:
        self.workers = workers
        self.private = tuple(private)
        self.owned = executor is None
        self.executor = executor or self._new_pool()
        # Futures of the current pool: when a pool breaks, every future in flight on it fails;
        # only the first may replace the pool, not the later ones (the new pool is fine).
        self.current: weakref.WeakSet[Future[dict[str, Any]]] = weakref.WeakSet()
        # Two per worker: a worker finishing a cell finds the next one already queued.
        self.slots = max(2, 2 * workers)
        kind = "process pool" if self.owned else type(self.executor).__name__
        self.description = f"{kind}, {workers} worker{'s' if workers != 1 else ''}"

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.workers, initializer=_init_local_worker,
                                   initargs=(os.getpid(), self.private))

    def submit(self, cell: Cell) -> Future[dict[str, Any]]:
        task = _run_local_cell if self.owned else run_cell
        try:
            future = self.executor.submit(task, cell)
        except BrokenProcessPool:
            # The pool broke before any of its futures told us; its futures in flight will
            # fail and be retried as suspects.
            if not self.owned:
                raise
            self._restart()
            future = self.executor.submit(task, cell)
        self.current.add(future)
        return future

    def handle_broken(self, future: Future[dict[str, Any]]) -> None:
        if self.owned and future in self.current:
            self._restart()

    def _restart(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.executor = self._new_pool()
        self.current = weakref.WeakSet()

    def abort(self) -> None:
        if isinstance(self.executor, ProcessPoolExecutor) and self.owned:
            # The documented API cannot stop a running task; terminating the workers can.
            processes = dict(getattr(self.executor, "_processes", None) or {})
            self.executor.shutdown(wait=False, cancel_futures=True)
            for process in processes.values():
                process.terminate()
        else:
            self.executor.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        if self.owned:
            self.executor.shutdown(wait=True)


class _Batch:
    """Cells of one trace run as one Dask task; each cell has its own concurrent Future."""

    def __init__(self, cells: Sequence[Cell]) -> None:
        self.cells = list(cells)
        self.futures: list[Future[dict[str, Any]]] = [Future() for _ in self.cells]
        self.handed: set[int] = set()     # indexes of the futures given to the sweep loop
        self.task: Any = None             # the Dask future, while it runs


def _resolve(future: Future[dict[str, Any]], record: dict[str, Any] | None = None,
             error: BaseException | None = None) -> None:
    """Give a cell's future its record (or error), unless the sweep loop cancelled it."""
    try:
        if not future.set_running_or_notify_cancel():
            return
    except RuntimeError:      # already resolved: nothing to do
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(record)  # type: ignore[arg-type]


class DaskRunner(Runner):
    """A Dask cluster: the cells of a trace run together, in one task per batch."""

    def __init__(self, client: Any, owned: bool, cells: Sequence[Cell]) -> None:
        self.client = client
        self.owned = owned
        info = client.scheduler_info()
        workers = info.get("workers", {})
        threads = sum(w.get("nthreads", 1) for w in workers.values()) or 1
        per_trace: dict[str, list[Cell]] = {}
        for cell in cells:
            per_trace.setdefault(cell.trace.key, []).append(cell)
        # Batches small enough that every thread gets several (the last ones balance the
        # load), and never larger than a trace's cells: most traces are one batch, one task
        # that decodes the trace where it runs.
        size = max(1, -(-len(cells) // (BATCHES_PER_THREAD * threads)))
        self.batches: dict[str, list[_Batch]] = {
            key: [_Batch(group[i:i + size]) for i in range(0, len(group), size)]
            for key, group in per_trace.items()}
        self.waiting: dict[str, tuple[_Batch, int]] = {}   # cell key -> its submitted batch
        # Enough cells in flight for a batch per thread and one more queued behind them.
        largest = max((len(b.cells) for bs in self.batches.values() for b in bs), default=1)
        self.slots = (threads + 1) * largest
        self.remaining = collections.Counter({k: len(v) for k, v in per_trace.items()})
        self.payloads: dict[str, Any] = {}   # trace key -> what its batches take as the trace
        self.lock = threading.Lock()
        self.closing = False
        self.description = (f"dask {info.get('address', '')}, {len(workers)} workers, "
                            f"{threads} threads")
        self.many_threads = any(w.get("nthreads", 1) > 1 for w in workers.values())

    def check_workers(self) -> None:
        """Fail early and clearly when the workers cannot import allocsim."""
        try:
            self.client.submit(ping, pure=False).result(timeout=60)
        except Exception as err:
            if self.owned:
                self.client.close()
            raise SweepError(f"the Dask workers cannot run allocsim tasks "
                             f"({describe_error(err)}); install allocsim on every worker"
                             ) from None

    def _payload(self, source: TraceSource, split: bool) -> Any:
        """What a batch of ``source``'s cells takes as its trace: None (a generator spec: the
        task generates it), the file's scattered bytes (the task decodes them), a
        :class:`Failed`, or — for a trace split over several batches — the future of one task
        that decodes it, so it is decoded once and moved to each worker that needs it once."""
        payload = self.payloads.get(source.key)
        if payload is not None or source.key in self.payloads:
            return payload
        if source.path is not None:
            try:
                data = read_input(source.path)
            except TraceError as err:  # not a regular file, too large, cannot read
                payload = Failed(f"TraceError: {err}")
            else:
                # Scatter the raw bytes once (no hashing of megabytes).
                payload = self.client.scatter(data, hash=False)
        if split and not isinstance(payload, Failed):
            args = (source,) if payload is None else (source, payload)
            payload = self.client.submit(materialise, *args, pure=False)
        self.payloads[source.key] = payload
        return payload

    def submit(self, cell: Cell) -> Future[dict[str, Any]]:
        with self.lock:
            waiting = self.waiting.pop(cell.key, None)
        if waiting is None:
            batches = self.batches.get(cell.trace.key, [])
            batch = next((b for b in batches if b.task is None and
                          any(c.key == cell.key for c in b.cells)), None)
            if batch is None:
                # Not one of the cells this runner was made for (or already handed out):
                # a batch of its own.
                batch = _Batch([cell])
                batches.append(batch)
            self._start(batch, len(batches) > 1)
            index = next(i for i, c in enumerate(batch.cells) if c.key == cell.key)
            with self.lock:
                for i, other in enumerate(batch.cells):
                    if i != index:
                        self.waiting[other.key] = (batch, i)
            waiting = (batch, index)
        batch, index = waiting
        batch.handed.add(index)
        future = batch.futures[index]
        future.add_done_callback(functools.partial(self._cell_done, batch))
        return future

    def _start(self, batch: _Batch, split: bool) -> None:
        payload = self._payload(batch.cells[0].trace, split)
        task = self.client.submit(run_cells, batch.cells, payload, pure=False)
        batch.task = task
        task.add_done_callback(lambda t, b=batch: self._deliver(b, t))

    def _deliver(self, batch: _Batch, task: Any) -> None:
        """A batch's task ended (Dask's callback thread): resolve its cells' futures."""
        status = task.status
        records: list[dict[str, Any]] | None = None
        error: Exception = SweepError(f"Dask dropped the task ({status})")
        try:
            records = task.result()
        except Exception as err:   # the task failed (a worker died?), or its result is lost
            error = err
        except BaseException:      # cancelled (Dask's CancelledError may be a BaseException)
            pass
        batch.task = None     # drop our reference: Dask forgets the result
        if records is not None:
            for future, record in zip(batch.futures, records):
                _resolve(future, record)
            return
        if len(batch.cells) > 1 and status == "error" and not self.closing:
            # A worker died (or the task failed outside the cells): retry each cell alone,
            # so a cell that kills its worker fails only itself.
            for cell, future in zip(batch.cells, batch.futures):
                if future.done():
                    continue
                single = _Batch([cell])
                single.futures = [future]
                try:
                    self._start(single, True)
                except Exception as err:
                    _resolve(future, error=err)
            return
        for future in batch.futures:
            _resolve(future, error=error)

    def _cell_done(self, batch: _Batch, future: Future[dict[str, Any]]) -> None:
        """A cell's future is done; when it was cancelled (the sweep is stopping) and so is
        every other cell handed out of its batch, the batch's task is cancelled too."""
        if not future.cancelled():
            return
        task = batch.task
        if task is not None and all(batch.futures[i].cancelled() for i in batch.handed):
            batch.task = None
            task.cancel()

    def finished(self, cell: Cell) -> None:
        key = cell.trace.key
        self.remaining[key] -= 1
        if self.remaining[key] <= 0:
            # Dropping our reference lets Dask forget the trace once its last cell is done.
            self.payloads.pop(key, None)

    def _forget(self) -> None:
        self.closing = True
        tasks = [b.task for bs in self.batches.values() for b in bs if b.task is not None]
        if tasks:
            self.client.cancel(tasks)
        self.batches.clear()
        self.payloads.clear()
        self.waiting.clear()

    def abort(self) -> None:
        self._forget()
        if self.owned:
            self.client.close()

    def close(self) -> None:
        self._forget()
        if self.owned:
            self.client.close()


# Seconds to reach a Dask scheduler and hear its greeting, then for the client to connect.
DASK_CONNECT_TIMEOUT_S = 30.0


def dask_client(address: str) -> Any:
    """A client of the Dask scheduler at ``address`` (dask://, tcp:// or tls://HOST:PORT), or
    one-line :class:`SweepError`: distributed missing, a bad address, nothing there, or
    something there that is not a scheduler (:mod:`~allocsim.sim.sweeps.dask_probe`)."""
    try:
        from distributed import Client
    except ModuleNotFoundError:
        raise SweepError("--executor dask://... needs Dask's distributed package, an optional "
                         "extra: pip install 'allocsim[dask]'") from None
    target = "tcp://" + address[len("dask://"):] if address.startswith("dask://") else address
    check_scheduler(address, target, DASK_CONNECT_TIMEOUT_S)  # silent or foreign: one line
    try:
        return Client(target, timeout=f"{DASK_CONNECT_TIMEOUT_S}s")
    except Exception as err:    # what the scheduler said made no sense to distributed
        raise SweepError(f"cannot connect to the Dask scheduler at {target}: "
                         f"{describe_error(err)}") from None


def make_runner(executor: str | Executor | Any | None, workers: int | None,
                cells: Sequence[Cell], private: Sequence[FileIdentity] = ()) -> Runner:
    """The runner for ``executor`` (see :func:`allocsim.sim.sweeps.run.run_sweep`).

    ``private``: descriptors of the coordinator that local pool workers close on start (the
    results file: its lock must die with the coordinator).
    """
    if executor is None or executor == "local":
        count = workers or usable_cores()
        return PoolRunner(max(1, min(count, len(cells))), private=private)
    if isinstance(executor, str):
        if executor.startswith(("dask://", "tcp://", "tls://")):
            runner = DaskRunner(dask_client(executor), True, cells)
            runner.check_workers()
            return runner
        raise SweepError(f"unknown executor {executor!r}: use 'local' or dask://HOST:PORT")
    if isinstance(executor, Executor):
        return PoolRunner(workers or usable_cores(), executor)
    distributed = sys.modules.get("distributed")  # a Client object means it is imported
    if distributed is not None and isinstance(executor, distributed.Client):
        runner = DaskRunner(executor, False, cells)
        runner.check_workers()
        return runner
    raise SweepError(f"unknown executor {executor!r}")
