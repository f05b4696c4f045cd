"""Experiments that answer questions about allocators with numbers and figures (the
benchmarks that hold allocsim to its speed targets are in ``benchmarks/``)."""
