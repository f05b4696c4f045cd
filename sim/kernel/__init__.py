"""The kernel: the simulated device (:mod:`~allocsim.sim.kernel.device`), the replay engine
(:mod:`~allocsim.sim.kernel.engine`: one process without simpy, several under simpy) and the
results every run produces (:mod:`~allocsim.sim.kernel.results`). Imports only policies and
traces."""
