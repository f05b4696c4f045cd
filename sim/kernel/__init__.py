"""The kernel: the simulated device, the replay engine (one process without simpy, several under simpy) and the results every run produces. Imports only policies and traces."""
