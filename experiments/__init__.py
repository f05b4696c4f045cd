"""Experiments that answer questions about allocators with numbers and figures, and the
benchmarks that hold allocsim to its speed targets (``python -m experiments.bench_replay``)."""
