"""Recording allocation traces from running Python programs.

- :func:`cupy` — ``with allocsim.traces.record.cupy("run.npz"):`` records every CuPy memory-pool
  request and release in the block (a :class:`~allocsim.traces.record.cupy_hook.TraceRecorderHook`
  installed as a CuPy memory hook) and saves the trace at exit;
- :func:`run_script` — runs a Python script under that recorder (``allocsim record -o out.npz
  -- python train.py args``);
- :func:`record_torch` — runs a function under ``torch.profiler`` with ``profile_memory=True``
  and converts its ``[memory]`` events (:mod:`allocsim.traces.record.torch.profiler`);
- :func:`jax` — ``with allocsim.traces.record.jax("run.npz"):`` records the device buffers a
  JAX program holds (arrays, each execution's temp buffer, donation) and saves the trace at
  exit (:mod:`allocsim.traces.record.jax_recorder.recorder`; ``allocsim record --framework jax``).

Importing this package imports neither CuPy, torch nor JAX: each is imported when first
needed, so the package works (and is tested) on machines without them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers only; importing would pull in CuPy
    from allocsim.traces.model import Trace
    from allocsim.traces.record.cupy_hook import TraceRecorderHook
    from allocsim.traces.record.jax_recorder.recorder import JaxRecorder

__all__ = ["TraceRecorderHook", "cupy", "jax", "record_torch", "run_script"]


def cupy(path: str | os.PathLike[str] | None, *, log: str | os.PathLike[str] | None = None,
         **options: Any) -> TraceRecorderHook:
    """A recorder to use as ``with allocsim.traces.record.cupy(path):``; it saves ``path`` at exit.

    ``log`` also writes the raw hook calls as a CuPy JSON-lines log; ``options`` go to
    :class:`~allocsim.traces.record.cupy_hook.TraceRecorderHook`.
    """
    from allocsim.traces.record.cupy_hook import TraceRecorderHook
    return TraceRecorderHook(path, log=log, **options)


def jax(path: str | os.PathLike[str] | None, *, device: int = 0,
        metadata: dict[str, Any] | None = None) -> JaxRecorder:
    """A recorder to use as ``with allocsim.traces.record.jax(path):``; it saves ``path`` at
    exit. ``device``: index into ``jax.devices()`` of the device recorded (default 0);
    ``metadata`` is added to the trace's. See
    :class:`allocsim.traces.record.jax_recorder.recorder.JaxRecorder`."""
    from allocsim.traces.record.jax_recorder.recorder import JaxRecorder
    return JaxRecorder(path, device=device, metadata=metadata)


def run_script(argv: list[str], output: str | os.PathLike[str], **options: Any) -> Trace:
    """Run ``argv`` (``[python] script.py args...`` or ``[python] -m module args...``) under
    the CuPy recorder and save the trace to ``output``. See
    :func:`allocsim.traces.record.cupy_hook.run_script`."""
    from allocsim.traces.record.cupy_hook import run_script as run
    return run(argv, output, **options)


def record_torch(fn: Callable[..., Any], *args: Any, output: str | os.PathLike[str] | None,
                 device: str = "cpu", **kwargs: Any) -> Trace:
    """Run ``fn(*args, **kwargs)`` under the PyTorch profiler; see
    :func:`allocsim.traces.record.torch.profiler.record_torch`."""
    from allocsim.traces.record.torch.profiler import record_torch as record
    return record(fn, *args, output=output, device=device, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "TraceRecorderHook":  # imported lazily: the module looks for CuPy
        from allocsim.traces.record.cupy_hook import TraceRecorderHook
        return TraceRecorderHook
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
