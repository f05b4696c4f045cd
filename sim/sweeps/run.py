"""Running a sweep: the cells not yet in the results file, on an executor, one line each.

:func:`run_sweep` expands a definition (:mod:`allocsim.sim.sweeps.grid`) into cells, opens
the results file (:mod:`allocsim.sim.sweeps.store`; cells already there are skipped), keeps a
few cells in flight on the chosen executor (:mod:`allocsim.sim.sweeps.executors`), appends each
finished cell's record, and returns a :class:`SweepSummary`.

SIGTERM (raised as :class:`allocsim.interrupts.Terminated` where the command line installed
its handler) abandons the running cells at once, as a second Ctrl-C does.

Ctrl-C: the first stops submitting, cancels cells not yet started and waits for the running
ones (their lines are written; on Dask, whose executor cannot tell running from queued, all
are cancelled at once); a second abandons them. Either way :func:`run_sweep` returns a
:class:`SweepSummary` with ``interrupted`` set whose :meth:`~SweepSummary.text` says how to
resume (run the same command again).
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from allocsim.printable import printable
from allocsim.sim.sweeps.cell import describe_error, make_record
from allocsim.sim.sweeps.executors import Runner, make_runner
from allocsim.sim.sweeps.grid import Cell, SweepDefinition, load_definition
from allocsim.sim.sweeps.progress import Progress
from allocsim.sim.sweeps.store import ResultsFile

__all__ = ["SweepSummary", "run_sweep"]

BROKEN_POOL_ERROR = ("BrokenProcessPool: the worker process running this cell (alone) died: "
                     "killed for memory? a crash?")

RESUME_HINT = "run the same command again to resume (finished cells are skipped)"


class _StopRequest:
    """The first Ctrl-C asks to stop (checked by the loop); the second raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.requested = False
        self.previous: Any = None
        self.installed = False

    def __enter__(self) -> _StopRequest:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
            self.installed = True
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        if self.installed:
            signal.signal(signal.SIGINT, self.previous)


@dataclass
class SweepSummary:
    """What a :func:`run_sweep` call did."""

    name: str
    results_path: Path
    total: int                  # cells in the grid
    skipped: int                # already in the results file (ok, or errored without retry)
    done: int = 0               # finished ok in this run
    failed: int = 0             # recorded an error in this run
    not_run: int = 0            # left for a later run (interrupted)
    interrupted: bool = False
    interrupt_signal: int = signal.SIGINT   # what interrupted it (SIGTERM: Terminated)
    elapsed_s: float = 0.0
    executor: str = ""
    truncated_bytes: int = 0    # half-written line cut from the results file at start
    failures: list[str] = field(default_factory=list)   # "cell: error" of this run's failures

    @property
    def exit_status(self) -> int:
        """What ``allocsim sweep`` exits with once interrupted: 128 + the signal (130, 143)."""
        return 128 + int(self.interrupt_signal)

    @property
    def complete(self) -> bool:
        """Every cell of the grid has a line in the results file."""
        return not self.interrupted and self.not_run == 0

    def text(self) -> str:
        """A few lines for the terminal: counts, where the results are, how to resume."""
        lines = [f"sweep {self.name}: {self.total:,} cells; {self.done:,} done, "
                 f"{self.failed:,} failed, {self.skipped:,} skipped (already in the results "
                 f"file) in {self.elapsed_s:.1f} s" + (f" on {self.executor}" if self.executor
                                                       else "")]
        added = self.done + self.failed
        if added:    # the results line as every command's: ``wrote PATH``, escaped
            lines.append(f"wrote {printable(str(self.results_path))}: {added:,} cell"
                         f"{'s' if added != 1 else ''} added")
        else:
            lines.append(f"results: {printable(str(self.results_path))} (nothing added)")
        if self.truncated_bytes:
            lines.append(f"note: cut a half-written last line ({self.truncated_bytes} bytes) "
                         "left by an earlier crash")
        for failure in self.failures[:5]:
            lines.append(f"  failed: {failure}")
        if len(self.failures) > 5:
            lines.append(f"  ... and {len(self.failures) - 5} more (status \"error\" in the "
                         "results file)")
        if self.interrupted:
            lines.append(f"interrupted ({signal.Signals(self.interrupt_signal).name}): "
                         f"{self.not_run:,} cells not run; {RESUME_HINT}")
        elif self.failed:
            lines.append("errored cells are skipped on the next run; rerun them with "
                         "--retry-errors")
        return "\n".join(lines)


def run_sweep(definition: str | os.PathLike[str] | SweepDefinition, *,
              executor: str | Executor | Any | None = None, workers: int | None = None,
              progress: bool = True, retry_errors: bool = False,
              output: str | os.PathLike[str] | None = None) -> SweepSummary:
    """Run every cell of the sweep not already in its results file.

    ``executor``: None / ``"local"`` (a process pool of ``workers`` processes, default one per
    usable core), ``"dask://HOST:PORT"``, a ``distributed.Client`` or any
    ``concurrent.futures.Executor``. ``output`` overrides the definition's results file.
    Definition errors raise :class:`~allocsim.sim.sweeps.grid.SweepError` before anything
    runs, and so does a results file that is not one (left untouched) or that another sweep is
    writing; failing cells do not raise (they are recorded). Ctrl-C returns a summary with
    ``interrupted`` set.
    """
    sweep = definition if isinstance(definition, SweepDefinition) else load_definition(definition)
    cells = sweep.cells()
    path = Path(output) if output is not None else sweep.output
    started = time.monotonic()
    results = ResultsFile(path)
    try:
        previous = results.previous
        todo = [cell for cell in cells
                if not _finished(previous.get(cell.key), retry_errors)]
        summary = SweepSummary(name=sweep.name, results_path=path, total=len(cells),
                               skipped=len(cells) - len(todo),
                               truncated_bytes=results.truncated)
        if todo:
            _run_cells(todo, results, summary, executor, workers, progress, sweep.name)
    finally:
        results.close()
    summary.elapsed_s = time.monotonic() - started
    return summary


def _finished(record: Mapping[str, Any] | None, retry_errors: bool) -> bool:
    if record is None:
        return False
    return record.get("status") == "ok" or not retry_errors


def _run_cells(todo: list[Cell], results: ResultsFile, summary: SweepSummary,
               executor: Any, workers: int | None, progress: bool, name: str) -> None:
    # Local workers close their copy of the results file's descriptor: its lock is ours alone.
    runner = make_runner(executor, workers, todo, private=[results.identity()])
    summary.executor = runner.description
    bar = Progress(len(todo), name, progress)
    if runner.many_threads:
        bar.note("note: some Dask workers have several threads; the simulator holds the GIL, "
                 "so start workers with --nthreads 1 --nworkers <cores> for full speed")
    queue = collections.deque(todo)
    inflight: dict[Future[dict[str, Any]], Cell] = {}
    suspects: collections.deque[Cell] = collections.deque()   # in flight when a worker died
    alone: Future[dict[str, Any]] | None = None    # a suspect running by itself
    stopping = False
    aborted = False
    try:
        with _StopRequest() as stop:
            while queue or inflight or (suspects and not stopping):
                if stop.requested and not stopping:
                    stopping = True
                    summary.not_run += len(queue) + len(suspects)
                    queue.clear()
                    suspects.clear()
                    for future in inflight:
                        future.cancel()   # only cells not yet started can be cancelled
                    running = sum(not f.cancelled() for f in inflight)
                    bar.note(f"stopping: waiting for {running} cell"
                             f"{'s' if running != 1 else ''} already handed to workers "
                             "(Ctrl-C again to abandon them)")
                if suspects and not stopping:
                    # After a worker died, the cells that were in flight run one at a time:
                    # a cell that kills its worker while alone is the culprit.
                    if not inflight:
                        cell = suspects.popleft()
                        alone = runner.submit(cell)
                        inflight[alone] = cell
                else:
                    while queue and len(inflight) < runner.slots:
                        cell = queue.popleft()
                        inflight[runner.submit(cell)] = cell
                # A timeout so a Ctrl-C (which only sets a flag) is acted on promptly.
                done, _ = wait(list(inflight), timeout=0.25, return_when=FIRST_COMPLETED)
                for future in done:
                    cell = inflight.pop(future)
                    if future.cancelled():
                        summary.not_run += 1
                        continue
                    record = _outcome(future, cell, runner)
                    if record is None:
                        # A worker died: every cell in flight on that pool fails, not only the
                        # culprit, so they are retried one at a time.
                        if stopping:
                            summary.not_run += 1
                            continue
                        if future is not alone:
                            suspects.append(cell)
                            continue
                        record = make_record(cell, error=BROKEN_POOL_ERROR)
                    results.append(record)
                    runner.finished(cell)
                    if record["status"] == "ok":
                        summary.done += 1
                    else:
                        summary.failed += 1
                        summary.failures.append(f"{record['cell']}: {record['error']}")
                    bar.advance(record["status"] == "ok")
            summary.interrupted = stopping
    except KeyboardInterrupt as interrupt:
        # The second Ctrl-C (or the first, outside the main thread), or SIGTERM (Terminated,
        # allocsim.interrupts: the process is asked to end now): abandon what is running.
        aborted = True
        summary.interrupted = True
        summary.interrupt_signal = int(getattr(interrupt, "signum", signal.SIGINT))
        summary.not_run += len(queue) + len(inflight) + len(suspects)
        runner.abort()
    finally:
        bar.close()
        if not aborted:
            runner.close()


def _outcome(future: Future[dict[str, Any]], cell: Cell,
             runner: Runner) -> dict[str, Any] | None:
    """The cell's record, an error record when the executor failed it, or None when a local
    worker process died (which fails every cell in flight, not only the culprit)."""
    try:
        return future.result()
    except BrokenProcessPool:
        runner.handle_broken(future)
        return None
    except Exception as err:
        return make_record(cell, error=describe_error(err))
