"""Record a JAX program for a TPU it does not run on (``allocsim record --framework jax
--target tpu-v5e``).

The user's unchanged script runs here, on the CPU, for real. Every XLA program it executes —
a jitted function, an eager op (JAX runs each eager primitive as a small jitted program), an
initialiser, an eval step — is compiled again, from the same jaxpr, for the target TPU with
libtpu (:class:`~allocsim.traces.record.tpu_program.Program`, which keeps what the TPU runtime
would hold: each array in the target's tiled layout, each executable's code from its first
run, the largest loaded scratch, donation). The CPU run decides *when*: an array the script
places (``jax.device_put``) or an execution's output is a buffer on the target for exactly as
long as the script holds the CPU array (a weak reference's callback), and deleted or donated
arrays go when JAX deletes them. So the loop is the script's own, as Python runs it.

What it assumes, and where it stops:

- the script runs at full size on this machine's CPU and memory: a job too large for the host
  cannot be recorded this way (compile its steps with ``compile_for`` or drive ``Program`` with
  ``jax.ShapeDtypeStruct`` arguments instead, which allocate nothing);
- one device: the program's arrays are replicated on one chip of the target (a sharded
  program is compiled as one device's);
- what the CPU run does not tell the TPU: XLA:TPU may need no copy where XLA:CPU made one, or
  the reverse; values the script reads back (``float(loss)``) cost nothing on either;
- an array made by a path these hooks do not see (not ``device_put``, not an execution) is
  taken as a host value when a program reads it: transferred for the call. The trace's
  ``target_recording.unseen_arguments`` counts them.

How the hooks reach JAX: :mod:`allocsim.traces.record.jax_recorder.internals`
(:class:`~allocsim.traces.record.jax_recorder.internals.TargetHooks`).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from allocsim.errors import UserInputError
from allocsim.traces.model import Trace
from allocsim.traces.record.jax_recorder import internals as jax_internals
from allocsim.traces.record.recording_end import SavedOnce, finished, recorder_header, trace_name

__all__ = ["RECORDER", "TargetRecorder"]

RECORDER = "allocsim JAX target recorder (CPU run, each program compiled for the target)"


class TargetRecorder(SavedOnce):
    """Records, while its with-block runs, what the target TPU's runtime would hold for the
    JAX program the block runs on the CPU (module docstring); saves on exit."""

    def __init__(self, output: str | os.PathLike[str] | None, target: str, *,
                 metadata: dict[str, Any] | None = None) -> None:
        from allocsim.traces.record.tpu_compile import TOPOLOGIES
        from allocsim.traces.record.tpu_program import Program
        if target not in TOPOLOGIES:
            raise UserInputError(f"record: --target {target!r} is not a TPU this recorder "
                                 f"compiles for ({', '.join(TOPOLOGIES)})")
        self.claim(output)
        self.target = target
        self.metadata = dict(metadata or {})
        self.trace: Trace | None = None
        self._closed = False
        self.program = Program(target)
        self._handles: dict[int, Any] = {}        # id(CPU array) -> its Handle on the target
        self._functions: dict[int, tuple[Any, Callable[..., Any]]] = {}
        self._hooks: jax_internals.TargetHooks | None = None
        self._local = threading.local()
        self._unseen = 0
        self._calls = 0
        self._versions: dict[str, str] = {}

    # ------------------------------------------------------------------ with-block
    def __enter__(self) -> TargetRecorder:
        jax_internals.check_version()
        import jax
        self._versions = {"jax": jax.__version__}
        for array_ in jax.live_arrays():
            self._track(array_, self.program.put(jax.ShapeDtypeStruct(array_.shape,
                                                                      array_.dtype),
                                                 tag="<allocated before recording>"))
        self._hooks = jax_internals.TargetHooks(self._on_call, self._on_device_put,
                                                self._on_delete)
        self._hooks.install()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            if self._hooks is not None:
                self._hooks.uninstall()
                self._hooks = None
        finally:
            self.close()

    # ------------------------------------------------------------------ arrays
    def _track(self, array_: Any, handle: Any) -> None:
        key = id(array_)
        self._handles[key] = handle
        try:
            weakref.finalize(array_, self._handles.pop, key, None)
        except TypeError:     # not weakly referenceable: held to the end
            pass

    def _handle_of(self, value: Any) -> Any:
        # A typed PRNG key wraps the array an execution made (its _base_array).
        value = getattr(value, "_base_array", value)
        handle = self._handles.get(id(value))
        if handle is not None and not handle.deleted:
            return handle
        return None

    def _busy(self) -> bool:
        return bool(getattr(self._local, "busy", False))

    def _function(self, jaxpr: Any, name: str) -> Callable[..., Any]:
        entry = self._functions.get(id(jaxpr))
        if entry is None:
            from jax._src import core

            def program(*args: Any) -> Any:
                return core.jaxpr_as_fun(jaxpr)(*args)
            program.__name__ = str(name)
            entry = self._functions[id(jaxpr)] = (jaxpr, program)
        return entry[1]

    # ------------------------------------------------------------------ hooks
    def _on_call(self, args: Sequence[Any], jaxpr: Any, donated: Sequence[bool], name: str,
                 call: Callable[[], Any]) -> Any:
        result = call()
        if self._busy():
            return result
        import jax
        self._local.busy = True
        try:
            out_flat = result[0]
            bound = []
            for value, aval in zip(args, jaxpr.in_avals):
                handle = self._handle_of(value)
                if handle is None:
                    if isinstance(value, jax.Array):
                        self._unseen += 1
                    handle = jax.ShapeDtypeStruct(aval.shape, aval.dtype)   # from the host
                bound.append(handle)
            donate = tuple(i for i, d in enumerate(donated) if d and
                           not isinstance(bound[i], jax.ShapeDtypeStruct))
            types = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in jaxpr.in_avals]
            outputs = self.program.call(self._function(jaxpr, name), *bound,
                                        donate_argnums=donate, types=types)
            self._calls += 1
            for array_, handle in zip(out_flat, jax.tree.leaves(outputs)):
                self._track(array_, handle)
        finally:
            self._local.busy = False
        return result

    def _on_device_put(self, xs: Sequence[Any], call: Callable[[], Any]) -> Any:
        ys = call()
        if self._busy():
            return ys
        import jax
        self._local.busy = True
        try:
            for x, y in zip(xs, ys):
                if y is x or self._handle_of(y) is not None:
                    continue
                source = self._handle_of(x)
                if source is not None and not (hasattr(x, "is_deleted") and x.is_deleted()):
                    self._track(y, source)      # the same buffer, another Array
                    continue
                if hasattr(y, "shape") and hasattr(y, "dtype"):
                    self._track(y, self.program.put(jax.ShapeDtypeStruct(y.shape, y.dtype)))
        finally:
            self._local.busy = False
        return ys

    def _on_delete(self, array_: Any) -> None:
        handle = self._handles.pop(id(array_), None)
        if handle is not None:
            handle.delete()

    # ------------------------------------------------------------------ results
    def build_trace(self) -> Trace:
        facts = {"target": self.target, "calls": self._calls,
                 "unseen_arguments": self._unseen,
                 "assumes": "the script's CPU run decides when each array lives; every XLA "
                            "program it runs is compiled from the same jaxpr for the target"}
        trace = self.program.trace(**{**recorder_header(RECORDER, **self._versions),
                                      "name": trace_name(self.output, "jax-recording"),
                                      "source": self.output or "<jax target recorder>",
                                      "target": self.target, "target_recording": facts,
                                      **self.metadata})
        return finished(trace)
