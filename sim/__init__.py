"""The engine and everything about a run: the simulated device, the simpy replay of one or many
traces, metrics and timelines, results, comparisons, reports and the command line.

Public API (the CLI is a thin shell over it)::

    from traces.formats import load
    from sim import replay, compare, resolve_device
    trace = load("run.csv")
    result = replay(trace, "bfc", resolve_device("a100-80g"))
    comparison = compare(trace, ["on-demand", "bfc", "preallocate"], resolve_device("a100-40g"))
"""
