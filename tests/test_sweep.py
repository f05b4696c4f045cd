"""Sweeps: grid expansion, validation before running, the append-only results file, resume,
failing cells, determinism, the local pool vs a Dask cluster, and traces loaded once."""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import pytest
from sweep_interrupts import ctrl_c_after_first_record

from allocsim.sim.cli.sweep import add_sweep_arguments, cmd_sweep
from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.kernel.engine import replay
from allocsim.sim.sweeps import store as store_module
from allocsim.sim.sweeps.cell import loads_in_this_process
from allocsim.sim.sweeps.grid import SweepError, expand_ranges, load_definition, parse_definition
from allocsim.sim.sweeps.run import run_sweep
from allocsim.sim.sweeps.store import latest_records, load_results
from allocsim.sim.sweeps.summary import best_policies, best_policies_text
from allocsim.traces import formats, synth

EVENTS = 3000
POLICIES = ["on-demand", "best-fit", "bfc"]


def write_sweep(folder: Path, grid: str, name: str = "t",
                output: str = "out/results.jsonl") -> Path:
    path = folder / f"{name}.toml"
    path.write_text(f'name = "{name}"\noutput = "{output}"\n[grid]\n{grid}\n')
    return path


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "traces"
    folder.mkdir()
    for kind, seed in (("training", 1), ("transformer", 2), ("transformer", 3)):
        formats.save(synth.generate(kind, seed=seed, events=EVENTS), folder / f"{kind}-{seed}.npz")
    return folder


def by_cell(path: Path) -> dict[str, dict]:
    return latest_records(load_results(path))


def deterministic(records: dict[str, dict]) -> dict[str, tuple]:
    """What must not differ between runs or executors (wall time and worker do)."""
    return {key: (r["status"], r["error"], r["result"]) for key, r in records.items()}


# -- the grammar ---------------------------------------------------------------------------

def test_expand_ranges():
    assert expand_ranges("bfc") == ["bfc"]
    assert expand_ranges("p:a=[1,2],b=[x,y]") == [
        "p:a=1,b=x", "p:a=1,b=y", "p:a=2,b=x", "p:a=2,b=y"]
    assert expand_ranges("seed=[1..3,10]") == ["seed=1", "seed=2", "seed=3", "seed=10"]
    assert expand_ranges("[16,24]GiB") == ["16GiB", "24GiB"]
    with pytest.raises(SweepError, match="empty item"):
        expand_ranges("a=[1,,2]")
    with pytest.raises(SweepError, match="bad range"):
        expand_ranges("a=[5..1]")


def test_grid_expansion(tmp_path, trace_dir):
    (trace_dir / "notes.txt").write_text("not a trace")  # a glob keeps trace extensions only
    path = write_sweep(tmp_path, """
traces = ["traces/*.npz", "synth:random?events=500&seed=[1..2]", "synth:training?seed=1,events=400"]
policies = ["bfc:fraction=[0.5,0.9],allow_growth=[true,false]", "best-fit", "bfc"]
devices = ["a100-40g", "T4-16G"]
capacities = ["[8,16]GiB"]
""")
    sweep = load_definition(path)
    assert [t.key for t in sweep.traces] == [
        "traces/training-1.npz", "traces/transformer-2.npz", "traces/transformer-3.npz",
        "synth:random?events=500&seed=1", "synth:random?events=500&seed=2",
        "synth:training?events=400&seed=1"]
    # allow_growth=true is bfc's default, so the canonical spec leaves it out.
    assert sweep.policies == ["bfc:fraction=0.5", "bfc:fraction=0.5,allow_growth=false",
                              "bfc:fraction=0.9", "bfc:fraction=0.9,allow_growth=false",
                              "best-fit", "bfc"]
    assert [d.key for d in sweep.devices] == ["a100-40g", "t4-16g"]
    assert sweep.capacities == [8 << 30, 16 << 30]
    cells = sweep.cells()
    assert len(cells) == 6 * len(sweep.policies) * 2 * 2
    assert len({c.key for c in cells}) == len(cells)
    # Trace-major: each trace's cells are adjacent (what makes per-worker caching work).
    order = [c.trace.key for c in cells]
    assert order == sorted(order, key=[t.key for t in sweep.traces].index)
    first = cells[0]
    assert first.key == f"traces/training-1.npz | {first.policy} | a100-40g | {8 << 30}"
    assert first.profile.capacity == 8 << 30
    assert sweep.output == tmp_path / "out" / "results.jsonl"


def test_duplicate_specs_collapse(tmp_path, trace_dir):
    sweep = load_definition(write_sweep(tmp_path, """
traces = ["traces/training-1.npz", "traces/*-1.npz"]
policies = ["bfc", "bfc:allow_growth=true", " bfc "]
"""))
    assert len(sweep.traces) == 1 and sweep.policies == ["bfc"]
    assert len(sweep.cells()) == 1 and sweep.cells()[0].capacity is None
    assert sweep.cells()[0].key.endswith("| bfc | a100-80g | default")


@pytest.mark.parametrize("grid, message", [
    ('traces = ["traces/*.npz"]\npolicies = ["bfc", "no-such-policy"]',
     r"grid\.policies: unknown policy 'no-such-policy'; known policies: .*bfc"),
    ('traces = ["traces/*.npz"]\npolicies = ["bfc:fraction=[0.5,lots]"]', "grid.policies"),
    ('traces = ["nothing/*.npz"]', "matches no trace file"),
    ('traces = ["traces/missing.npz"]', "no such file"),
    ('traces = ["synth:nope"]', "unknown synthetic workload"),
    ('traces = ["synth:training?layerz=3"]', "unknown parameter 'layerz'"),
    ('traces = ["traces/*.npz"]\ndevices = ["a200"]', "unknown device"),
    ('traces = ["traces/*.npz"]\ncapacities = ["lots"]', "grid.capacities"),
    ('traces = ["traces/*.npz"]\npolicy = ["bfc"]', r"grid\.policy: unknown key"),
    ('policies = ["bfc"]', r"grid\.traces: missing"),
])
def test_definition_errors_before_running(tmp_path, trace_dir, grid, message):
    path = write_sweep(tmp_path, grid)
    with pytest.raises(SweepError, match=message):
        run_sweep(path, progress=False)
    assert not (tmp_path / "out").exists()      # nothing ran, no results file


def test_unknown_top_level_key_and_bad_toml(tmp_path):
    with pytest.raises(SweepError, match="outptu: unknown key"):
        parse_definition({"outptu": "x", "grid": {"traces": ["synth:training"]}})
    bad = tmp_path / "bad.toml"
    bad.write_text("[grid\n")
    with pytest.raises(SweepError, match="not valid TOML"):
        load_definition(bad)


# -- running -------------------------------------------------------------------------------

def test_results_appended_per_cell_and_equal_to_sequential_replay(tmp_path, trace_dir, monkeypatch):
    path = write_sweep(tmp_path, f'traces = ["traces/*.npz"]\npolicies = {json.dumps(POLICIES)}\n'
                                 'capacities = ["24GiB"]')
    output = tmp_path / "out" / "results.jsonl"
    seen: list[int] = []
    append = store_module.ResultsFile.append

    def checked_append(self, record):
        append(self, record)
        # On disk (not in a buffer) right after each cell, one complete line per cell so far.
        seen.append(output.read_bytes().count(b"\n"))

    monkeypatch.setattr(store_module.ResultsFile, "append", checked_append)
    summary = run_sweep(path, workers=2, progress=False)
    assert summary.total == summary.done == 9 and summary.failed == summary.skipped == 0
    assert seen == list(range(1, 10))
    records = load_results(output)
    assert len(records) == 9
    device = resolve_device("a100-80g", "24GiB")
    for record in records:
        assert set(record) >= {"cell", "trace", "policy", "device", "capacity", "status",
                               "error", "result"}
        assert record["status"] == "ok" and record["error"] is None
        assert record["device"] == "a100-80g" and record["capacity"] == 24 << 30
        assert "timeline" not in record["result"]
        trace = formats.load(tmp_path / record["trace"])
        assert record["result"] == replay(trace, record["policy"], device).to_json_dict()


def test_resume_after_a_crash_mid_line(tmp_path, trace_dir):
    path = write_sweep(tmp_path, f'traces = ["traces/*.npz"]\npolicies = {json.dumps(POLICIES)}')
    first = run_sweep(path, workers=2, progress=False)
    output = first.results_path
    complete = by_cell(output)
    raw = output.read_bytes()
    lines = raw.splitlines(keepends=True)
    # A crash while writing the 7th line: six whole lines and half of the seventh.
    output.write_bytes(b"".join(lines[:6]) + lines[6][: len(lines[6]) // 2])
    assert len(load_results(output)) == 6            # the half line is tolerated
    again = run_sweep(path, workers=2, progress=False)
    assert again.skipped == 6 and again.done == 3 and again.failed == 0
    assert again.truncated_bytes == len(lines[6]) // 2
    text = output.read_text()
    assert text.endswith("\n") and all(json.loads(line) for line in text.splitlines())
    assert len(text.splitlines()) == 9
    assert deterministic(by_cell(output)) == deterministic(complete)
    # Nothing left: a third run does nothing.
    third = run_sweep(path, progress=False)
    assert third.skipped == 9 and third.done == 0 and len(load_results(output)) == 9


def test_failing_cell_is_recorded_and_the_others_finish(tmp_path, trace_dir):
    bad = trace_dir / "broken.npz"
    bad.write_bytes(b"this is not an npz file")
    path = write_sweep(tmp_path, f'traces = ["traces/*.npz"]\npolicies = {json.dumps(POLICIES)}')
    summary = run_sweep(path, workers=2, progress=False)
    assert summary.total == 12 and summary.done == 9 and summary.failed == 3
    records = by_cell(summary.results_path)
    errors = [r for r in records.values() if r["status"] == "error"]
    assert {r["trace"] for r in errors} == {"traces/broken.npz"}
    for record in errors:
        assert record["result"] is None
        assert record["error"].startswith("TraceError: ") and "broken.npz" in record["error"]
    assert "--retry-errors" in summary.text()
    # Errored cells are skipped on resume, retried with retry_errors (and win once ok).
    assert run_sweep(path, progress=False).done == 0
    formats.save(synth.generate("random", seed=5, events=500), bad)
    retried = run_sweep(path, workers=2, progress=False, retry_errors=True)
    assert retried.skipped == 9 and retried.done == 3 and retried.failed == 0
    assert all(r["status"] == "ok" for r in by_cell(summary.results_path).values())
    assert len(load_results(summary.results_path)) == 15   # the error lines stay, superseded


def test_local_pool_loads_each_trace_once_per_worker(tmp_path, trace_dir):
    path = write_sweep(tmp_path, 'traces = ["traces/*.npz", '
                                 '"synth:random?events=800&seed=[1..3]"]\n'
                                 f'policies = {json.dumps([*POLICIES, "preallocate"])}\n'
                                 'capacities = ["16GiB", "40GiB"]')
    summary = run_sweep(path, workers=2, progress=False)
    assert summary.done == 6 * 4 * 2
    records = load_results(summary.results_path)
    loads = collections.Counter((r["worker"], r["trace"]) for r in records if r["trace_loaded"])
    workers = {r["worker"] for r in records}
    assert len(workers) <= 2
    assert max(loads.values()) == 1                       # never twice in one worker
    assert sum(loads.values()) <= len(workers) * 6        # at most once per worker and trace
    assert sum(loads.values()) < len(records)             # so not once per cell


def test_any_executor_and_thread_safety(tmp_path, trace_dir):
    path = write_sweep(tmp_path, f'traces = ["traces/*.npz"]\npolicies = {json.dumps(POLICIES)}')
    with ThreadPoolExecutor(3) as pool:
        threaded = run_sweep(path, executor=pool, progress=False, output=tmp_path / "threads.jsonl")
    local = run_sweep(path, workers=2, progress=False)
    assert threaded.done == local.done == 9
    assert (deterministic(by_cell(tmp_path / "threads.jsonl"))
            == deterministic(by_cell(local.results_path)))


def test_the_offline_plan_runs_and_never_wins(tmp_path, trace_dir):
    path = write_sweep(tmp_path, 'traces = ["traces/training-1.npz"]\n'
                                 'policies = ["offline", "best-fit", "bfc"]')
    summary = run_sweep(path, workers=1, progress=False)
    assert summary.done == 3
    rows = best_policies(load_results(summary.results_path))
    assert len(rows) == 1 and rows[0].winner in ("best-fit", "bfc")


def test_dask_local_cluster_gives_the_local_results(tmp_path, trace_dir):
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    bad = trace_dir / "broken.npz"
    bad.write_bytes(b"garbage")
    path = write_sweep(tmp_path, 'traces = ["traces/*.npz", "synth:random?events=800&seed=[1,2]"]\n'
                                 f'policies = {json.dumps(POLICIES)}\n'
                                 'capacities = ["16GiB", "40GiB"]')
    local = run_sweep(path, workers=2, progress=False, output=tmp_path / "local.jsonl")
    assert local.done == 5 * 3 * 2 and local.failed == 3 * 2
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        address = cluster.scheduler_address.replace("tcp://", "dask://")
        remote = run_sweep(path, executor=address, progress=False, output=tmp_path / "dask.jsonl")
        loads = client.run(loads_in_this_process)
        # Resuming works the same through Dask: nothing left to do.
        assert run_sweep(path, executor=client, progress=False,
                         output=tmp_path / "dask.jsonl").done == 0
    assert (remote.done, remote.failed) == (local.done, local.failed)
    assert "dask" in remote.executor
    assert (deterministic(by_cell(tmp_path / "dask.jsonl"))
            == deterministic(by_cell(local.results_path)))
    # Each trace was decoded (or generated) once on the whole cluster, not once per cell.
    total = collections.Counter()
    for per_worker in loads.values():
        total.update(per_worker)
    assert dict(total) == dict.fromkeys({c.trace.key for c in load_definition(path).cells()}, 1)


def test_dask_missing_is_a_clear_error(tmp_path, trace_dir, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_distributed(name, *args, **kwargs):
        if name == "distributed" or name.startswith("distributed."):
            raise ModuleNotFoundError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_distributed)
    path = write_sweep(tmp_path, 'traces = ["traces/training-1.npz"]\npolicies = ["bfc"]')
    with pytest.raises(SweepError, match=r"allocsim\[dask\]"):
        run_sweep(path, executor="dask://127.0.0.1:1", progress=False)


def test_ctrl_c_stops_cleanly_and_the_rerun_resumes(tmp_path, trace_dir, monkeypatch):
    path = write_sweep(tmp_path, 'traces = ["traces/*.npz", '
                                 '"synth:random?events=3000&seed=[1..4]"]\n'
                                 f'policies = {json.dumps(POLICIES)}')
    output = tmp_path / "out" / "results.jsonl"
    append = store_module.ResultsFile.append
    monkeypatch.setattr(store_module.ResultsFile, "append", ctrl_c_after_first_record(output))
    handler = signal.getsignal(signal.SIGINT)
    summary = run_sweep(path, workers=1, progress=False)
    assert signal.getsignal(signal.SIGINT) is handler       # put back as it was
    assert summary.interrupted and summary.not_run > 0
    assert summary.done + summary.not_run == 21
    assert "run the same command again to resume" in summary.text()
    written = load_results(output)
    assert len(written) == summary.done and all(r["status"] == "ok" for r in written)
    monkeypatch.setattr(store_module.ResultsFile, "append", append)
    rest = run_sweep(path, workers=2, progress=False)
    assert rest.skipped == summary.done and rest.done == 21 - summary.done
    assert len(by_cell(output)) == 21


def test_results_file_is_locked(tmp_path):
    output = tmp_path / "r.jsonl"
    first = store_module.ResultsFile(output)
    try:
        with pytest.raises(SweepError, match="another sweep"):
            store_module.ResultsFile(output)
    finally:
        first.close()


def test_load_results_tolerates_damage(tmp_path):
    path = tmp_path / "r.jsonl"
    assert load_results(path) == []
    good = {"cell": "a | bfc | d | default", "status": "ok"}
    path.write_text(json.dumps(good) + "\nnot json\n[1,2]\n" + json.dumps(good)[:10])
    assert load_results(path) == [good]


# -- summaries and the CLI hooks ------------------------------------------------------------

def fake(trace, policy, *, completed=True, peak=100, time_s=0.001, slowdown=1.0, status="ok",
         capacity=None):
    result = {"completed": completed, "peak_reserved": peak, "alloc_time_s": time_s,
              "slowdown": slowdown}
    return {"cell": f"{trace} | {policy} | d | {capacity or 'default'}", "trace": trace,
            "policy": policy, "device": "d", "capacity": capacity, "status": status,
            "error": None if status == "ok" else "boom",
            "result": result if status == "ok" else None}


def test_best_policies_follow_the_compare_rule():
    records = [
        fake("t1", "oom", completed=False, peak=10),                   # did not complete
        fake("t1", "small", peak=50, time_s=0.002),
        fake("t1", "tie", peak=50, time_s=0.001),                      # same peak, less time
        fake("t1", "slow", peak=20, slowdown=3.0),                     # over the budget
        fake("t1", "offline", peak=5),                                 # a plan, never a winner
        fake("t1", "broken", status="error"),
        fake("t2", "oom", completed=False),
        fake("t2", "small", capacity=1 << 30, peak=7),
    ]
    rows = {(r.trace, r.capacity): r for r in best_policies(records)}
    row = rows[("t1", None)]
    assert (row.winner, row.runner_up, row.policies, row.errors) == ("tie", "small", 5, 1)
    assert rows[("t2", None)].winner is None and "out of memory" in rows[("t2", None)].reason
    assert rows[("t2", 1 << 30)].winner == "small"
    # Without a budget the slow policy's lower peak wins.
    assert {r.trace: r.winner for r in best_policies(records, max_slowdown=None)
            if r.capacity is None}["t1"] == "slow"
    # An ok line supersedes an earlier error line of the same cell.
    fixed = [*records, fake("t1", "broken", peak=1)]
    assert {r.trace: r.winner for r in best_policies(fixed) if r.capacity is None}["t1"] == "broken"
    text = best_policies_text(best_policies(records))
    assert "tie" in text and "none (no policy completes" in text


def test_cli_hooks(tmp_path, trace_dir, capsys):
    parser = argparse.ArgumentParser()
    add_sweep_arguments(parser)
    path = write_sweep(tmp_path, 'traces = ["traces/*.npz"]\npolicies = ["bfc", "best-fit"]')
    args = parser.parse_args([str(path), "--workers", "2", "--no-progress"])
    assert cmd_sweep(args) == 0
    out = capsys.readouterr().out
    assert "6 done, 0 failed" in out and "best policy" in out
    (trace_dir / "broken.npz").write_bytes(b"junk")
    assert cmd_sweep(args) == 1                       # a failed cell: exit status 1
    report = parser.parse_args([str(path), "--report"])
    assert cmd_sweep(report) == 0
    assert "8 of 8 cells recorded" in capsys.readouterr().out


class _CrashingPolicy:
    """A policy whose construction kills the worker process, as the OOM killer would. Built in
    the sweep's own process (the up-front check of every policy of the grid) it is harmless."""

    name = "crash-test"
    description = "kills its process (tests only)"
    PARAMS: ClassVar[dict[str, object]] = {}

    def __init__(self, device) -> None:
        import multiprocessing
        if multiprocessing.parent_process() is not None:  # a worker
            os._exit(1)


def test_a_dying_worker_fails_only_its_cell(tmp_path, trace_dir, monkeypatch):
    import multiprocessing

    from allocsim.policies import registry

    if multiprocessing.get_start_method() != "fork":
        pytest.skip("the test policy reaches the workers only through fork")
    monkeypatch.setitem(registry.POLICIES, "crash-test", _CrashingPolicy)
    path = write_sweep(tmp_path, 'traces = ["traces/*.npz"]\n'
                                 'policies = ["bfc", "crash-test", "best-fit"]')
    summary = run_sweep(path, workers=2, progress=False)
    records = by_cell(summary.results_path)
    assert len(records) == 9
    failed = {r["policy"] for r in records.values() if r["status"] == "error"}
    assert failed == {"crash-test"}
    assert summary.done == 6 and summary.failed == 3
    assert all("BrokenProcessPool" in r["error"]
               for r in records.values() if r["status"] == "error")
