"""Benchmark: a sweep on the local process pool vs the same sweep on a Dask cluster.

    python -m benchmarks.sweep [--traces 20] [--events 100000] [--workers N] [--repeat 1]

Writes ``--traces`` synthetic traces of about ``--events`` events (half ``transformer``, half
``training``, seeds 1, 2, ...) as .npz files into a temporary directory, then runs the sweep
``traces/*.npz`` × (on-demand, preallocate, best-fit, bfc) on a100-80g:

1. on the local process pool (``--workers`` processes, default one per usable core; the
   pool's start-up is inside the timing, as it is for a user);
2. on a Dask ``LocalCluster`` on loopback with the same number of single-threaded worker
   processes (the cluster's start-up is timed apart: the issue's case is an *existing*
   cluster); traces travel by scatter as they would to remote machines.

Prints the wall seconds of each (the best of ``--repeat`` runs, alternating the two), the Dask
overhead in percent, the CPU seconds of all processes involved (less sensitive than wall time
to other load on a shared machine), and checks the two results files hold identical results.
Targets (issue: sweeps): the local sweep under 60 s on the 2-core CI machine, Dask within 20%
of it.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_POLICIES = ("on-demand", "preallocate", "best-fit", "bfc")


def make_traces(folder: Path, count: int, events: int) -> list[Path]:
    from allocsim.traces import formats, synth

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        kind = ("transformer", "training")[index % 2]
        seed = index // 2 + 1
        path = folder / f"{kind}-{seed:03d}.npz"
        formats.save(synth.generate(kind, seed=seed, events=events), path)
        paths.append(path)
    return paths


def cpu_seconds() -> float:
    """CPU time of this process, its reaped children (a finished local pool) and its live
    descendants (a LocalCluster's nannies and workers): the work a sweep costs, which other
    load on the machine does not change the way it changes wall time."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    try:
        import psutil
    except ModuleNotFoundError:
        return total
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def results_by_cell(path: Path) -> dict[str, tuple]:
    from allocsim.sim.sweeps.store import latest_records, load_results

    return {key: (r["status"], r["error"], r["result"])
            for key, r in latest_records(load_results(path)).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=20)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the best counts")
    parser.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
    parser.add_argument("--no-dask", action="store_true", help="only the local pool")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args(argv)

    from allocsim.sim.sweeps.executors import usable_cores
    from allocsim.sim.sweeps.run import run_sweep

    workers = args.workers or usable_cores()
    figures: dict[str, object] = {"traces": args.traces, "events": args.events,
                                  "policies": args.policies, "workers": workers}
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as temp:
        root = Path(temp)
        start = time.perf_counter()
        make_traces(root / "traces", args.traces, args.events)
        print(f"generated {args.traces} traces of ~{args.events:,} events in "
              f"{time.perf_counter() - start:.1f} s")
        definition = root / "bench.toml"
        definition.write_text('name = "bench"\n[grid]\ntraces = ["traces/*.npz"]\n'
                              f"policies = {json.dumps(args.policies)}\n"
                              'devices = ["a100-80g"]\n')
        cells = args.traces * len(args.policies)

        def run(executor: object, label: str, attempt: int) -> tuple[float, float, Path]:
            output = root / f"{label}-{attempt}.jsonl"
            cpu_before = cpu_seconds()
            start = time.perf_counter()
            summary = run_sweep(definition, executor=executor, workers=workers,
                                progress=False, output=output)
            wall = time.perf_counter() - start
            cpu = cpu_seconds() - cpu_before
            assert summary.done == cells and not summary.failed, summary.text()
            print(f"  {label} run {attempt + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU "
                  f"({summary.executor})")
            return wall, cpu, output

        client = cluster = None
        if not args.no_dask:
            try:
                from distributed import Client, LocalCluster
            except ModuleNotFoundError:
                print("dask: not installed (pip install 'dask[distributed]'); skipped")
            else:
                start = time.perf_counter()
                cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                       host="127.0.0.1", dashboard_address=None)
                client = Client(cluster)
                started = time.perf_counter() - start
                figures["dask_start_s"] = round(started, 2)
                print(f"dask LocalCluster: {workers} workers started in {started:.1f} s")
        local_times: list[float] = []
        dask_times: list[float] = []
        local_cpu: list[float] = []
        dask_cpu: list[float] = []
        try:
            # Alternate the two so a change in the machine's load hits both alike.
            for attempt in range(args.repeat):
                wall, cpu, local_out = run(None, "local", attempt)
                local_times.append(wall)
                local_cpu.append(cpu)
                if client is not None:
                    wall, cpu, dask_out = run(client, "dask", attempt)
                    dask_times.append(wall)
                    dask_cpu.append(cpu)
        finally:
            if client is not None:
                client.close()
            if cluster is not None:
                cluster.close()
        local_s = min(local_times)
        records = [json.loads(line) for line in local_out.read_text().splitlines()]
        cpu_s = sum(r["wall_s"] for r in records)
        figures.update(cells=cells, local_s=round(local_s, 2), cell_cpu_s=round(cpu_s, 2),
                       local_cpu_s=round(min(local_cpu), 2))
        print(f"local pool: {cells} cells in {local_s:.2f} s "
              f"({cells / local_s:.1f} cells/s; {cpu_s:.1f} s of cell time in the last run), "
              f"{min(local_cpu):.2f} s CPU in all processes")
        if dask_times:
            dask_s = min(dask_times)
            same = results_by_cell(local_out) == results_by_cell(dask_out)
            overhead = (dask_s / local_s - 1) * 100
            cpu_overhead = (min(dask_cpu) / min(local_cpu) - 1) * 100
            figures.update(dask_s=round(dask_s, 2), dask_overhead_pct=round(overhead, 1),
                           dask_cpu_s=round(min(dask_cpu), 2),
                           dask_cpu_overhead_pct=round(cpu_overhead, 1), identical=same)
            print(f"dask: {cells} cells in {dask_s:.2f} s; overhead over the local pool "
                  f"{overhead:+.1f}% wall (best against best), {cpu_overhead:+.1f}% CPU "
                  f"({min(dask_cpu):.2f} s); results identical: {same}")
            if not same:
                print("ERROR: the Dask results differ from the local ones", file=sys.stderr)
                return 1
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
