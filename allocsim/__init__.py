"""allocsim: a discrete-event simulator of GPU memory allocators.

The installed package is this one namespace; the repository's top-level folders are mapped
into it (pyproject.toml ``[tool.setuptools] package-dir``; docs/architecture.md says why):

- :mod:`allocsim.traces` — the ``Trace`` type, file formats, recorders, generators;
- :mod:`allocsim.policies` — the allocator models (pure state machines);
- :mod:`allocsim.sim` — the engine (``kernel``), the questions asked of it (``questions``),
  sweeps, validation on real memory, output, and the command line (``cli``).

For Python users the questions are also here, flat (:mod:`allocsim.api`; docs/python-api.md)::

    import allocsim
    trace = allocsim.load("default")                 # or any trace file
    allocsim.compare(trace, device="a100-40g").winner

:func:`load`, :func:`device`, :func:`replay`, :func:`compare`, :func:`min_capacity` and
:func:`tune` are loaded on first use: importing this package imports nothing else, so
``import allocsim.policies`` stays as light as the policies themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.2.0"

if TYPE_CHECKING:
    from allocsim.api import compare, device, load, min_capacity, replay, tune

__all__ = ["__version__", "compare", "device", "load", "min_capacity", "replay", "tune"]
# The names of the flat Python API, each loaded from allocsim.api when first asked for.
_API = frozenset(__all__) - {"__version__"}


if not TYPE_CHECKING:     # type checkers read the names above; a module __getattr__ would
    # make every name of the package look defined to them.

    def __getattr__(name: str) -> object:
        if name in _API:
            from allocsim import api
            return getattr(api, name)
        raise AttributeError(f"module 'allocsim' has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted([*globals(), *_API])
