"""A whole JAX program as the TPU runtime holds it, run here without a TPU.

``Program(target="tpu-v5e")`` is a stand-in for the chip that a Python program drives as it
drives JAX: :meth:`Program.put` places arrays from the host, :meth:`Program.call` runs any
function as ``jax.jit`` would (compiled for the target with libtpu, once per function, argument
shapes and donation: :func:`allocsim.traces.record.tpu_compile.compile_step`) and returns
:class:`Handle` s in the shape of its outputs. The trace records what the runtime's allocator
is asked, in the order the program asks it:

- an array **placed** from the host is one buffer of its tiled layout's bytes
  (:func:`allocsim.traces.tpu_layout.tpu_layout`, read off the chip);
- an executable's **generated code** is a buffer from its first call to the program's end (the
  runtime holds a loaded executable's code in HBM; a real program keeps its executables in
  JAX's caches): an initialiser, a train step, an eval step and ``jnp.zeros`` each hold theirs;
- a call's **outputs** are new buffers, each the output allocation of XLA's buffer assignment,
  except those a donated argument's buffer becomes (XLA's input-output aliasing); a donated
  argument no output takes is let go as the call starts; the output tuple's address table
  (one 512 B granule) is held for the call only (the chip's ``peak_bytes_in_use`` is 512 B above
  its ``bytes_in_use`` after each call of a step that returns a tuple:
  tests/data/tpu/exec-*.json);
- a host value given as an argument (a numpy array, a scalar) is transferred for the call and
  let go after it;
- an array is **let go when the Python program drops it**: a :class:`Handle` frees its buffer
  when its last reference goes (CPython frees at once), as JAX frees a device array. So
  ``state, loss = program.call(step, state, batch)`` in a loop holds the old state and the old
  loss through the call and drops them as the names are rebound: the live set during call
  ``k + 1`` is call ``k``'s outputs + the batch + the new outputs, as on the chip
  (../shared/reference/tpu.md, "Added 2026-12-07");
- **scratch** (XLA's temp) is not a buffer: the runtime reserves the largest scratch of the
  executables loaded (``bytes_reserved``), which the trace carries as ``xla_tpu.scratch_bytes``
  (:func:`allocsim.traces.formats.xla.tpu_scratch.runtime_scratch_bytes` of each, the
  largest).

Times are synthetic (one µs per event group, an execution as many as its schedule's positions).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocsim.errors import UserInputError
from allocsim.traces.formats.xla.runtime import RuntimeReplay
from allocsim.traces.model import Trace
from allocsim.traces.tpu_layout import tpu_layout

__all__ = ["Handle", "Program", "xla_type"]

# numpy's dtype names as XLA writes them (the element types the layout rule covers).
_XLA_TYPES = {"bool": "pred", "int8": "s8", "uint8": "u8", "int16": "s16", "uint16": "u16",
              "int32": "s32", "uint32": "u32", "float16": "f16", "bfloat16": "bf16",
              "float32": "f32", "int4": "s4", "uint4": "u4", "float8_e4m3fn": "f8e4m3fn",
              "float8_e5m2": "f8e5m2"}


def xla_type(dtype: Any) -> str:
    """XLA's name of a numpy / JAX dtype (``float32`` -> ``f32``); one line for a type the TPU
    layout rule does not cover."""
    name = getattr(dtype, "name", str(dtype))
    if name not in _XLA_TYPES:
        raise UserInputError(f"dtype {name}: its layout on a TPU was not measured (covered: "
                             f"{', '.join(sorted(_XLA_TYPES))})")
    return _XLA_TYPES[name]


def layout_bytes(shape: Sequence[int], dtype: Any) -> int:
    """HBM bytes of an array placed from the host (the runtime's tiled layout); a typed PRNG
    key (``key<fry>``) is its physical ``u32`` array, the key's shape appended."""
    impl = getattr(dtype, "_impl", None)
    if impl is not None and hasattr(impl, "key_shape"):
        shape, dtype = (*shape, *impl.key_shape), "uint32"
    return tpu_layout(f"{xla_type(dtype)}[{','.join(str(int(d)) for d in shape)}]").bytes


class Handle:
    """An array the program holds: its shape, dtype and the buffer it is on the device.

    Dropping the last reference lets the buffer go, as dropping a ``jax.Array`` does."""

    __slots__ = ("__weakref__", "_finalizer", "buffer", "deleted", "dtype", "program",
                 "shape", "size")

    def __init__(self, program: Program, buffer: int, shape: tuple[int, ...], dtype: Any,
                 size: int) -> None:
        self.program = program
        self.buffer = buffer
        self.shape = shape
        self.dtype = dtype
        self.size = size
        self.deleted = False
        self._finalizer = weakref.finalize(self, program._let_go, buffer)

    def delete(self) -> None:
        """``x.delete()``: the buffer goes now."""
        if not self.deleted:
            self.deleted = True
            self._finalizer()

    def _give_up(self) -> int:
        """The buffer leaves this handle (donated): no free when the handle goes."""
        self._finalizer.detach()
        self.deleted = True
        return self.buffer

    def __repr__(self) -> str:
        return f"Handle({xla_type(self.dtype)}{list(self.shape)}, {self.size} B)"


@dataclass
class _Loaded:
    """One executable the program has run: what it holds and how often it ran."""

    step: Any                      # tpu_compile.TpuStep
    calls: int = 0
    code_buffer: int = -1


@dataclass
class Program:
    """A JAX program run as the TPU runtime of ``target`` holds it (module docstring)."""

    target: str = "tpu-v5e"
    topology: str | None = None
    _replay: RuntimeReplay = field(default_factory=RuntimeReplay)
    _compiled: dict[Any, _Loaded] = field(default_factory=dict)
    _order: list[_Loaded] = field(default_factory=list)
    _calls: list[tuple[int, int, int]] = field(default_factory=list)  # executable, events
    _topo: Any = None

    def __post_init__(self) -> None:
        from allocsim.traces.record.tpu_compile import _jax, _topology
        _jax()
        self._topo = _topology(self.target, self.topology)

    # ------------------------------------------------------------------ buffers
    def _let_go(self, buffer: int) -> None:
        if buffer in self._replay.live:
            self._replay.release(buffer)

    def _handle(self, size: int, tag: str, shape: tuple[int, ...], dtype: Any) -> Handle:
        return Handle(self, self._replay.array(size, tag), shape, dtype, size)

    def put(self, tree: Any, tag: str = "device_put") -> Any:
        """``jax.device_put(tree)``: each leaf (a numpy array, a scalar, a
        ``jax.ShapeDtypeStruct``) becomes an array on the device."""
        import jax
        import numpy as np

        def place(leaf: Any) -> Handle:
            shape, dtype = _shape_dtype(leaf, np)
            return self._handle(layout_bytes(shape, dtype), tag, shape, dtype)

        handles = jax.tree.map(place, tree)
        self._replay.tick()
        return handles

    # ------------------------------------------------------------------ calls
    def _compile(self, fn: Callable[..., Any], args: tuple[Any, ...],
                 donate: tuple[int, ...], types: Sequence[Any] | None = None) -> _Loaded:
        import jax
        import numpy as np

        from allocsim.traces.record.tpu_compile import compile_step
        leaves, treedef = jax.tree.flatten(args)
        avals = tuple(_shape_dtype(leaf, np) for leaf in (leaves if types is None else types))
        key = (fn, treedef, tuple((s, str(d)) for s, d in avals), donate)
        loaded = self._compiled.get(key)
        if loaded is None:
            abstract = jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(s, d) for s, d in avals])
            step = compile_step(fn, abstract, donate_argnums=donate, target=self.target,
                                topology=self.topology, _topo=self._topo)
            loaded = self._compiled[key] = _Loaded(step)
            self._order.append(loaded)
        return loaded

    def call(self, fn: Callable[..., Any], *args: Any,
             donate_argnums: int | Sequence[int] = (), types: Sequence[Any] | None = None) -> Any:
        """``jax.jit(fn, donate_argnums=...)(*args)``: returns the outputs as handles, in the
        structure ``fn`` returns (module docstring for what each call holds). ``types``: the
        flat arguments' types to compile for, where they are not the handles' own (a typed
        PRNG key over the ``u32`` array an execution made)."""
        import jax
        donate = (donate_argnums,) if isinstance(donate_argnums, int) else \
            tuple(sorted(donate_argnums))
        loaded = self._compile(fn, args, donate, types)
        step = loaded.step
        replay = self._replay
        name = step.name
        first_event = len(replay.op)
        if loaded.calls == 0 and step.code_bytes:
            loaded.code_buffer = replay.array(step.code_bytes, f"{name}: generated code")
        loaded.calls += 1
        donated_leaves = {i for position, arg in enumerate(args) if position in donate
                          for i in _leaf_range(args, position)}
        leaves = jax.tree.leaves(args)
        # Arguments: a handle of this program is bound as it is; a host value is transferred.
        transfers: list[int] = []
        taken: dict[int, int] = {}        # parameter -> buffer given up by donation
        for index, leaf in enumerate(leaves):
            if isinstance(leaf, Handle):
                if leaf.program is not self:
                    raise UserInputError(f"{name}: argument {index} is another program's array")
                if leaf.deleted:
                    raise UserInputError(f"{name}: argument {index} was deleted (donated to an "
                                         "earlier call, or .delete())")
                if index in donated_leaves:
                    taken[index] = leaf._give_up()
            else:
                size = step.executable.parameters[index].size
                transfers.append(replay.array(size, f"{name}: argument {index} (from the host)"))
        kept = {leaf.donated_parameter for leaf in step.outputs
                if leaf.donated_parameter is not None}
        for parameter, buffer in taken.items():     # donated, and no output takes it
            if parameter not in kept:
                replay.release(buffer)
        out_leaves, out_tree = jax.tree.flatten(step.out_info)
        if len(out_leaves) != len(step.outputs):
            raise UserInputError(f"{name}: {len(out_leaves)} output leaves but XLA returns "
                                 f"{len(step.outputs)} arrays")
        handles: list[Handle] = []
        for position, (aval, leaf) in enumerate(zip(out_leaves, step.outputs)):
            shape, dtype = tuple(aval.shape), aval.dtype
            if leaf.donated_parameter is not None and leaf.donated_parameter in taken:
                buffer = taken.pop(leaf.donated_parameter)
                handles.append(Handle(self, buffer, shape, dtype, leaf.size))
            else:
                handles.append(self._handle(
                    leaf.size, f"{name}: output {position}: {leaf.label}", shape, dtype))
        table = replay.array(step.tuple_bytes, f"{name}: output tuple") \
            if step.tuple_bytes else -1
        replay.tick(step.executable.length)
        if table >= 0:
            replay.release(table)
        for buffer in transfers:
            replay.release(buffer)
        replay.tick()
        self._calls.append((self._order.index(loaded), first_event, len(replay.op)))
        return jax.tree.unflatten(out_tree, handles)

    # ------------------------------------------------------------------ results
    @property
    def scratch_bytes(self) -> int:
        """The largest scratch of the executables that ran (what the runtime reserves)."""
        return max((loaded.step.scratch_bytes for loaded in self._order if loaded.calls),
                   default=0)

    def executables(self) -> list[dict[str, Any]]:
        """Each executable that ran: its name, memory analysis, code, scratch and calls."""
        return [{"name": loaded.step.name, "calls": loaded.calls,
                 "code_bytes": loaded.step.code_bytes, "code_buffer": loaded.code_buffer,
                 "scratch_bytes": loaded.step.scratch_bytes,
                 "memory_analysis": loaded.step.memory}
                for loaded in self._order if loaded.calls]

    def facts(self) -> dict[str, Any]:
        """The trace's ``xla_tpu`` metadata: target, versions, executables, scratch."""
        from allocsim.traces.record.tpu_compile import TOPOLOGIES, _jax, libtpu_version
        chips = list(self._topo.devices)
        executables = self.executables()
        # ``calls``: [executable index, first event, end event) of each call, for
        # allocsim.traces.tpu_needed's view of what the runtime cannot give up.
        single = {"memory_analysis": executables[0]["memory_analysis"]} \
            if len(executables) == 1 else {}
        return {**single, "target": self.target,
                "topology": self.topology or TOPOLOGIES[self.target],
                "devices": len(chips),
                "device_kind": str(getattr(chips[0], "device_kind", "?")),
                "libtpu": libtpu_version(), "jax": _jax().__version__,
                "executables": executables,
                "calls": [list(call) for call in self._calls],
                "code_bytes": sum(e["code_bytes"] for e in executables),
                "scratch_bytes": self.scratch_bytes,
                "scratch_rule": "the largest of the loaded executables' HBM preallocated "
                                "temp, each rounded up to 16 KiB (runtime_scratch_bytes; exact "
                                "on 12 chip steps)",
                "not_modelled": "scratch (temp) is held as bytes_reserved, not allocated: it is "
                                "in scratch_bytes, not in the events"}

    def trace(self, **metadata: Any) -> Trace:
        """The trace so far; arrays the program still holds stay live at its end."""
        facts = self.facts()
        facts.update(metadata.pop("xla_tpu", {}))
        return self._replay.trace(**{"source": "tpu_program", "format": "xla-tpu-compile",
                                     "synthetic_times": True, "framework": "jax",
                                     "sizes_on_device": "tpu: XLA:TPU's buffer assignment",
                                     **metadata, "xla_tpu": facts})


def _shape_dtype(leaf: Any, np: Any) -> tuple[tuple[int, ...], Any]:
    if isinstance(leaf, Handle) or (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
        dtype = leaf.dtype
        # JAX's extended types (typed PRNG keys) are not numpy's: kept as JAX has them.
        return tuple(int(d) for d in leaf.shape), \
            dtype if hasattr(dtype, "_impl") else np.dtype(dtype)
    if isinstance(leaf, bool | int | float):
        import jax.numpy as jnp
        return (), np.dtype(jnp.asarray(leaf).dtype)
    raise UserInputError(f"an argument leaf has no shape and dtype ({type(leaf).__name__}): "
                         "give arrays, scalars or jax.ShapeDtypeStruct")


def _leaf_range(args: tuple[Any, ...], position: int) -> range:
    """The flat leaf indices of argument ``position``."""
    import jax
    start = sum(len(jax.tree.leaves(a)) for a in args[:position])
    return range(start, start + len(jax.tree.leaves(args[position])))
