"""Dask sweeps run a trace's cells as one batch task, and each cell still has its own future:
the sweep loop's exactly-once, per-cell errors and Ctrl-C behave as with one task per cell."""

from __future__ import annotations

import json
from concurrent.futures import CancelledError
from pathlib import Path

import pytest
from sweep_interrupts import ctrl_c_after_first_record

from allocsim.sim.sweeps import store as store_module
from allocsim.sim.sweeps.cell import roomy_malloc, run_cells
from allocsim.sim.sweeps.executors import DaskRunner
from allocsim.sim.sweeps.grid import load_definition
from allocsim.sim.sweeps.run import run_sweep
from allocsim.sim.sweeps.store import load_results


class FakeTask:
    def __init__(self, fn, args, fail):
        self.fn, self.args, self.fail = fn, args, fail
        self.status = "pending"
        self.callbacks = []
        self.value = None

    def run(self):
        if self.status == "cancelled":
            return
        if self.fail:
            self.status, self.value = "error", RuntimeError("KilledWorker: worker died")
        else:
            args = [a.result() if isinstance(a, FakeTask) else a for a in self.args]
            self.status, self.value = "finished", self.fn(*args)
        for callback in self.callbacks:
            callback(self)

    def result(self):
        if self.status == "error":
            raise self.value
        if self.status == "cancelled":
            raise CancelledError
        return self.value

    def add_done_callback(self, fn):
        self.callbacks.append(fn)

    def cancel(self):
        self.status = "cancelled"


class FakeClient:
    """Runs tasks when told to; a batch holding a cell named in ``killers`` 'kills its worker'."""

    def __init__(self, killers=()):
        self.tasks = []
        self.killers = set(killers)

    def scheduler_info(self):
        return {"address": "fake", "workers": {"a": {"nthreads": 1}, "b": {"nthreads": 1}}}

    def scatter(self, data, hash=True):
        return data

    def submit(self, fn, *args, pure=True):
        cells = args[0] if fn is run_cells else []
        task = FakeTask(fn, args, any(c.key in self.killers for c in cells))
        self.tasks.append(task)
        return task

    def cancel(self, tasks):
        for task in tasks:
            task.cancel()

    def run_all(self):
        while any(t.status == "pending" for t in self.tasks):
            for task in [t for t in self.tasks if t.status == "pending"]:
                task.run()


def cells_of(tmp_path: Path, grid: str):
    path = tmp_path / "s.toml"
    path.write_text(f'name = "s"\n[grid]\n{grid}\n')
    return load_definition(path).cells()


GRID = ('traces = ["synth:random?events=500&seed=[1..8]"]\n'
        'policies = ["on-demand", "best-fit", "bfc", "preallocate"]')


def test_one_task_per_trace_and_a_future_per_cell(tmp_path):
    cells = cells_of(tmp_path, GRID)
    client = FakeClient()
    runner = DaskRunner(client, False, cells)
    futures = [runner.submit(cell) for cell in cells]
    assert len(client.tasks) == 8 and all(t.fn is run_cells for t in client.tasks)
    client.run_all()
    records = [f.result() for f in futures]
    assert [r["cell"] for r in records] == [c.key for c in cells]
    assert all(r["status"] == "ok" for r in records)


def test_a_cell_that_kills_its_worker_fails_only_itself(tmp_path):
    cells = cells_of(tmp_path, GRID)
    killer = cells[1]
    client = FakeClient(killers=[killer.key])
    runner = DaskRunner(client, False, cells)
    futures = [runner.submit(cell) for cell in cells]
    client.run_all()
    # The batch failed; its cells were retried one task each; only the culprit fails.
    for cell, future in zip(cells, futures):
        if cell is killer:
            with pytest.raises(RuntimeError, match="KilledWorker"):
                future.result()
        else:
            assert future.result()["status"] == "ok"
    assert len(client.tasks) == 8 + 4


def test_cancelling_every_cell_of_a_batch_cancels_its_task(tmp_path):
    cells = cells_of(tmp_path, GRID)
    client = FakeClient()
    runner = DaskRunner(client, False, cells)
    futures = [runner.submit(cell) for cell in cells[:6]]   # the 2nd batch half handed out
    for future in futures:
        assert future.cancel()
    assert [t.status for t in client.tasks] == ["cancelled", "cancelled"]
    runner.close()


def test_large_traces_are_split_and_decoded_once(tmp_path):
    grid = ('traces = ["synth:random?events=500&seed=1"]\n'
            'policies = ["on-demand", "best-fit", "bfc", "preallocate"]\n'
            'capacities = ["8GiB", "16GiB", "40GiB"]')
    cells = cells_of(tmp_path, grid)    # 12 cells of one trace, 2 threads: split
    client = FakeClient()
    runner = DaskRunner(client, False, cells)
    futures = [runner.submit(cell) for cell in cells]
    kinds = [t.fn.__name__ for t in client.tasks]
    assert kinds.count("materialise") == 1 and kinds.count("run_cells") > 1
    client.run_all()
    assert all(f.result()["status"] == "ok" for f in futures)


def test_roomy_malloc_nests_and_restores(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    with roomy_malloc(), roomy_malloc():
        pass


def test_ctrl_c_on_dask_and_the_rerun_resumes(tmp_path):
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    path = tmp_path / "t.toml"
    path.write_text('name = "t"\noutput = "out/results.jsonl"\n[grid]\n'
                    'traces = ["synth:random?events=3000&seed=[1..6]"]\n'
                    f'policies = {json.dumps(["on-demand", "best-fit", "bfc"])}\n')
    output = tmp_path / "out" / "results.jsonl"
    append = store_module.ResultsFile.append
    append_then_ctrl_c = ctrl_c_after_first_record(output)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        store_module.ResultsFile.append = append_then_ctrl_c
        try:
            summary = run_sweep(path, executor=client, progress=False)
        finally:
            store_module.ResultsFile.append = append
        assert summary.interrupted and summary.done + summary.not_run == 18
        written = load_results(output)
        assert len(written) == summary.done
        rest = run_sweep(path, executor=client, progress=False)
    assert rest.skipped == summary.done and rest.done == 18 - summary.done
    keys = [r["cell"] for r in load_results(output)]
    assert len(keys) == len(set(keys)) == 18
