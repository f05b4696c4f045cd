"""Sweeps: traces × policies × devices × capacities from a TOML grid, run on local cores or
Dask, written to a resumable results file.

What it is for: questions a single ``allocsim compare`` cannot answer in one go — "which
``max_split_size_mb`` is best across these 300 recorded jobs, on a 24 GiB and a 40 GiB card?"
A sweep is a TOML file naming the grid; it expands into *cells* (one trace, one policy, one
device, one capacity) that run on local cores or on a Dask cluster, each appending one JSON
line to a results file when it finishes, so an interrupted sweep resumes where it stopped and
a failing cell is recorded instead of stopping the others.

One concept per module, each importing only those above it in this list:

- :mod:`~allocsim.sim.sweeps.grid` — the sweep file, its ranges, the cells
  (:func:`~allocsim.sim.sweeps.grid.load_definition`,
  :func:`~allocsim.sim.sweeps.grid.parse_definition`,
  :func:`~allocsim.sim.sweeps.grid.expand_ranges`, :class:`~allocsim.sim.sweeps.grid.SweepError`);
- :mod:`~allocsim.sim.sweeps.store` — the results file: append + fsync, resume, the lock
  (:func:`~allocsim.sim.sweeps.store.load_results`,
  :func:`~allocsim.sim.sweeps.store.latest_records`);
- :mod:`~allocsim.sim.sweeps.cell` — running one cell in a worker
  (:func:`~allocsim.sim.sweeps.cell.loads_in_this_process`);
- :mod:`~allocsim.sim.sweeps.executors` — the local process pool and Dask, and the local
  workers' life (they end with their parent);
- :mod:`~allocsim.sim.sweeps.progress` — the progress line on stderr;
- :mod:`~allocsim.sim.sweeps.run` — :func:`~allocsim.sim.sweeps.run.run_sweep`, Ctrl-C;
- :mod:`~allocsim.sim.sweeps.summary` — the winner per trace × device × capacity
  (:func:`~allocsim.sim.sweeps.summary.best_policies`,
  :func:`~allocsim.sim.sweeps.summary.best_policies_text`).

The ``allocsim sweep`` command (its arguments and handler) is :mod:`allocsim.sim.cli.sweep`.
"""
