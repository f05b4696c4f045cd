"""The questions asked of the kernel: compare and the winner rule, the offline plan, minimum
capacity (``capacity/``), sharing one device, explaining an OOM, fidelity to a recording
(``fidelity/``), the setting to paste (``tune/``), CI baselines. Each is a function returning a
result object; none parses arguments or prints (their commands are in :mod:`allocsim.sim.cli`)."""
