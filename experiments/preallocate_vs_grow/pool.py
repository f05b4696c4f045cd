"""Measure a population's members in a process pool, with progress (issue 40: the three
populations took over an hour in one process).

:func:`measure_all` returns the rows in the order of the tasks it was given, whatever order the
workers finish in: each row is a pure function of its task
(:func:`experiments.preallocate_vs_grow.member.measure_member`), so population.json is byte
for byte the same with one worker or twelve (tests/test_population_pool.py). Tasks are handed
out largest first (by the size of the member's file, or its generator's place in the list) so
that the longest members do not start last and leave the other workers idle at the end.
Workers end with their parent and ignore Ctrl-C, which is the coordinator's to handle (as the
sweep pool's do: :mod:`allocsim.sim.sweeps.executors`); a worker that dies takes the pool with
it, and the tasks still pending run again in a fresh one (:func:`in_pool`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from allocsim.sim.sweeps.executors import die_with_parent
from experiments.preallocate_vs_grow.member import MemberTask, measure_member
from experiments.runner.execute import ROOT


def _init_worker(parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(parent_pid)


def _size_hint(task: MemberTask) -> int:
    """A rough cost to order the work by: a file member's size on disk (compiled jobs and
    recordings are the largest members), a generated one zero (they are small)."""
    path = task.source.path
    return (ROOT / path).stat().st_size if path else 0


RETRIES = 2   # fresh pools for the tasks still pending when a worker dies


def in_pool(function: Callable[[Any], Any], tasks: Sequence[Any], workers: int,
            order: Sequence[int], done: Callable[[int, Any], None]) -> None:
    """``function(tasks[i])`` for every i in ``workers`` processes, submitted in ``order``;
    ``done(i, result)`` as each finishes. A worker that dies (killed for memory, a crash in
    the native core) breaks the pool: the tasks still pending run again in a fresh pool, up
    to :data:`RETRIES` times — a result is a pure function of its task, so a retried task
    gives what it would have — and then the error stands."""
    pending = list(order)
    for attempt in range(RETRIES + 1):
        pool = ProcessPoolExecutor(max_workers=workers, initializer=_init_worker,
                                   initargs=(os.getpid(),))
        try:
            futures = {pool.submit(function, tasks[i]): i for i in pending}
            for future in as_completed(futures):
                done(futures[future], future.result())
                pending.remove(futures[future])
        except BrokenProcessPool:
            pool.shutdown(wait=False, cancel_futures=True)
            if attempt == RETRIES:
                raise
            continue
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            for process in dict(getattr(pool, "_processes", None) or {}).values():
                process.terminate()
            raise
        pool.shutdown(wait=True)
        return


def measure_all(tasks: Sequence[MemberTask], workers: int,
                say: Callable[..., None], names: Sequence[str] | None = None
                ) -> list[dict[str, Any]]:
    """The row of each task, in the tasks' order; ``workers`` processes (1: this process),
    a progress line per member finished (``say``)."""
    names = list(names or [t.source.member for t in tasks])
    started = time.monotonic()
    finished = 0
    rows: list[dict[str, Any] | None] = [None] * len(tasks)

    def done(index: int, result: tuple[dict[str, Any], float]) -> None:
        nonlocal finished
        finished += 1
        rows[index], took = result
        say(f"[population] {finished}/{len(tasks)} {names[index]} ({took:.1f} s; "
            f"{time.monotonic() - started:.0f} s elapsed)")

    if workers <= 1:
        for index, task in enumerate(tasks):
            done(index, _timed(task))
    else:
        in_pool(_timed, tasks, workers,
                sorted(range(len(tasks)), key=lambda i: -_size_hint(tasks[i])), done)
    return [row for row in rows if row is not None]


def _timed(task: MemberTask) -> tuple[dict[str, Any], float]:
    begun = time.monotonic()
    row = measure_member(task)
    return row, time.monotonic() - begun
