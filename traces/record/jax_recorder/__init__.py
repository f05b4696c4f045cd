"""Recording JAX programs: the device buffers a program holds over time (``recorder``, with
its buffer bookkeeping in ``buffers`` and every contact with JAX internals in ``internals``;
``script`` runs a script under it). This package imports nothing itself (not even jax):
import the module you need."""
