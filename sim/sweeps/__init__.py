"""Sweeps: traces × policies × devices × capacities from a TOML grid, run on local cores or Dask, written to a resumable results file."""
