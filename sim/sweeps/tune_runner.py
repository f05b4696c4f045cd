"""``allocsim tune``'s replays on the sweeps' executors: each batch of ``(spec, device)`` the
search sends (:data:`~allocsim.sim.questions.tune.search.Evaluator`) becomes sweep cells of
the trace's file, run on the local process pool or a Dask cluster (:func:`make_runner`), and
comes back as the cells' results in order.

The local pool is started for the first batch (the discrete stage, the largest) and kept for
the later ones; each worker loads the trace once (the cells carry only its path). A Dask
client is opened once and each batch is handed to a runner on it, so the file's bytes travel
once per batch. A cell that fails is a bug (tune sends only specs it built), reported with
the cell's own one-line error.

One difference from the in-process evaluator: a sweep cell replays the whole trace, so a
setting that runs out of memory reports the figures of its whole run (OOM count, peak,
time), where the in-process search stops at the first OOM. Which settings pass, their
figures, the answer and the front are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.sweeps.executors import Runner, dask_client, make_runner
from allocsim.sim.sweeps.grid import Cell, SweepError, TraceSource
from allocsim.traces.bundled import bundled_path


class SweepEvaluator:
    """Callable as an Evaluator; :meth:`close` ends the pool or the client."""

    def __init__(self, trace_path: str, executor: str, workers: int | None) -> None:
        path = str(bundled_path()) if trace_path == "default" else trace_path
        self.source = TraceSource(key=path, path=path)
        self.executor: Any = executor
        self.workers = workers
        self.runner: Runner | None = None
        self.client: Any = None
        if executor.startswith(("dask://", "tcp://", "tls://")):
            self.client = dask_client(executor)     # the sweeps' own: checked, one line
        elif executor != "local":
            raise SweepError(f"unknown executor {executor!r}: use 'local' or dask://HOST:PORT")

    def __call__(self, batch: Sequence[tuple[str, DeviceProfile]]) -> list[dict[str, Any]]:
        cells = [Cell(self.source, spec, device.label, device.capacity, device)
                 for spec, device in batch]
        if self.client is not None:
            runner = make_runner(self.client, self.workers, cells)
        else:
            if self.runner is None:
                self.runner = make_runner("local", self.workers, cells)
            runner = self.runner
        futures = [runner.submit(cell) for cell in cells]
        results = []
        for cell, future in zip(cells, futures):
            record = future.result()
            runner.finished(cell)
            if record["status"] != "ok":
                raise RuntimeError(f"tune: the replay of {cell.policy} failed in a worker: "
                                   f"{record['error']}")
            results.append(record["result"])
        if self.client is not None:
            runner.close()
        return results

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
            self.runner = None
        if self.client is not None:
            self.client.close()
            self.client = None


def sweep_evaluator(trace_path: str, executor: str, workers: int | None) -> SweepEvaluator:
    """The evaluator for ``--executor`` (``local`` or ``dask://HOST:PORT``)."""
    return SweepEvaluator(trace_path, executor, workers)
