"""allocsim: a discrete-event simulator of GPU memory allocators.

The installed package is this one namespace; the repository's top-level folders are mapped
into it (pyproject.toml ``[tool.setuptools] package-dir``; docs/architecture.md says why):

- :mod:`allocsim.traces` — the ``Trace`` type, file formats, recorders, generators;
- :mod:`allocsim.policies` — the allocator models (pure state machines);
- :mod:`allocsim.sim` — the engine (``kernel``), the questions asked of it (``questions``),
  sweeps, validation on real memory, output, and the command line (``cli``).

Importing this package imports nothing else, so ``import allocsim.policies`` stays as light
as the policies themselves.
"""

__version__ = "0.2.0"
