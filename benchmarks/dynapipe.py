"""DynaPipe's PyTorch-allocator simulator, timed on allocsim's traces (issue 39, part 3).

DynaPipe (awslabs/optimizing-multitask-training-through-dynamic-pipelines) ships a Python
simulator of PyTorch's caching allocator, ``dynapipe/memory_opt/allocation_simulator.py``
(``TorchCachingAllocatorSimulator``: a SortedList per pool, ``malloc(size, stream)`` returns a
block, ``free(block)``). It is not on PyPI (PyPI's ``dynapipe`` is another project) and none
of its code is in this repository: give the benchmark that one file, from a checkout of the
repository (measured at commit 705cf383e83e47a4b936619c230c681585835380), with
``--dynapipe PATH``. It needs ``sortedcontainers`` (in the ``test`` extra).

It is timed as allocsim's replays are (CPU time, best of the repeats), fed the same trace's
events from Python lists made beforehand (not timed), on a device it never fills. Its rules
are a simplification of PyTorch's (no small pool: its kSmallSize is 0; no power-of-two
rounding), so its peak is printed beside allocsim's pytorch peak: the work is alike, not the
same, and the ratio is a speed ratio only.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from allocsim.traces.model import Trace

SIMULATOR = "TorchCachingAllocatorSimulator"
SOURCE = ("awslabs/optimizing-multitask-training-through-dynamic-pipelines, "
          "dynapipe/memory_opt/allocation_simulator.py")
NEVER_FULL_MB = 1e12            # its device size in MB: no replay here comes near it


def load_simulator(path: str | Path) -> ModuleType:
    """DynaPipe's simulator module from ``path``; SystemExit with one line where it is not."""
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"{file}: no such file (--dynapipe takes {SOURCE})")
    name = "_dynapipe_allocation_simulator"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{file}: not a Python module (--dynapipe takes {SOURCE})")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module          # its dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
    except ImportError as error:
        raise SystemExit(f"{file}: cannot import it ({error}); it needs sortedcontainers"
                         ) from None
    if not hasattr(module, SIMULATOR):
        raise SystemExit(f"{file}: has no {SIMULATOR} (--dynapipe takes {SOURCE})")
    return module


def dynapipe_runner(trace: Trace, module: ModuleType) -> Callable[[], Any]:
    """One run of DynaPipe's simulator over ``trace``'s events (each alloc a ``malloc(size,
    stream)``, each free a ``free`` of the block it returned); it returns the simulator."""
    from allocsim.traces.model import OP_ALLOC

    ops, ids = trace.op.tolist(), trace.id.tolist()
    sizes, streams = trace.matched_sizes().tolist(), trace.stream.tolist()
    simulator_class = getattr(module, SIMULATOR)

    def run() -> Any:
        simulator = simulator_class(NEVER_FULL_MB)
        malloc, free = simulator.malloc, simulator.free
        live: dict[int, Any] = {}
        for op, buffer, size, stream in zip(ops, ids, sizes, streams):
            if op == OP_ALLOC:
                live[buffer] = malloc(size, stream)
            else:
                free(live.pop(buffer))
        return simulator

    return run


def peak_reserved(simulator: Any) -> int:
    """The simulator's peak of bytes taken from its device (its segments)."""
    return int(simulator.peak_backend_allocated_bytes)
