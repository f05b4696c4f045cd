"""The engine and everything asked of it, in rooms that import only downwards:

- :mod:`~allocsim.sim.kernel` — the simulated device, the replay engine, results: what every
  run needs;
- :mod:`~allocsim.sim.questions` — compare, min-capacity, share, explain-oom, fidelity,
  baseline/check: functions over the kernel that return result objects (no argparse);
- :mod:`~allocsim.sim.output` — tables, JSON, figures, the HTML report, snapshot export;
- :mod:`~allocsim.sim.sweeps` — the grid grammar, executors and the resumable results store;
- :mod:`~allocsim.sim.validation` — replays on real memory: backends, byte patterns, the host
  and CUDA devices, calibration;
- :mod:`~allocsim.sim.cli` — every command's parser beside its handler.

Public API (the CLI is a thin shell over it)::

    from allocsim.traces.formats import load
    from allocsim.sim.kernel.device import resolve_device
    from allocsim.sim.kernel.engine import replay
    from allocsim.sim.questions.compare import compare
    trace = load("run.csv")
    result = replay(trace, "bfc", resolve_device("a100-80g"))
    comparison = compare(trace, ["on-demand", "bfc", "preallocate"], resolve_device("a100-40g"))
"""
