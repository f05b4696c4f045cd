"""The JAX recorder's one contact with JAX internals (tested against jax 0.10.x).

No public JAX API reports when a device buffer is created, so
:mod:`allocsim.traces.record.jax_recorder.recorder` needs hooks inside JAX's dispatch. They are all
here, so that a JAX upgrade breaks one module, and :func:`check_version` refuses a version
they were not tested against in one line.

What is patched while a recorder runs, and why:

- ``pxla.ExecuteReplicated.__call__``: every execution of a compiled XLA program from Python
  — a jitted function, an eager op (``dispatch.apply_primitive`` jits the primitive), an
  ahead-of-time ``Compiled`` call — ends there, with the inputs and the output arrays in hand.
- ``pjit._get_fastpath_data`` and ``pxla.MeshExecutableFastpathData`` return None: after its
  first call a jitted function normally runs from C++ (jaxlib's ``PjitFunction``) without
  entering Python, so no hook could see its outputs. With no fast-path data every call takes
  the Python path above; the C++ caches are cleared when recording starts and ends, so
  entries made before recording take the Python path during it and the fast path after it.
  Compiled executables live in Python caches that are not cleared: nothing is recompiled.
- ``dispatch._batched_device_put_impl``: ``jax.device_put`` and the ``device_put`` primitive
  (numpy to device, device to device) create arrays there without an XLA program;
  ``pxla.batched_device_put``: arrays assembled from host data or per-device buffers
  (``jax.make_array_from_callback``, ``device_put_sharded``/``_replicated``, PRNG keys).
- ``pxla.InputsHandler.__call__``: an execution's arguments are put on the device there; a
  host value (numpy array, Python scalar) or a resharded array becomes a buffer that lives
  for the execution only.
- ``ArrayImpl.delete``: an explicit ``x.delete()`` frees the buffer while the object lives.

Facts read off a compiled executable (``LoadedExecutable``): ``get_compiled_memory_stats()``
(temp bytes, alias bytes) and its optimized HLO text — the ``input_output_alias`` of the
module header (which parameters a donated buffer may be reused for) and the ``op_name``
metadata of the instructions the entry computation's ROOT returns (JAX-level op names).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from allocsim.errors import UserInputError

__all__ = ["TESTED", "ExecutableInfo", "Hooks", "TargetHooks", "check_version",
           "executable_info", "jax_version"]

TESTED = "0.10"  # the major.minor these hooks were written and tested against

# on_execute(executable, args, call) -> outputs ; call(executable, *args) runs it.
ExecuteHook = Callable[[Any, Sequence[Any], Callable[..., Any]], Any]
# on_inputs(args, call) -> device arguments ; call() puts the arguments on the device.
InputsHook = Callable[[Sequence[Any], Callable[[], Any]], Any]
# on_device_put(xs, call) -> outputs ; call() runs the real transfer.
DevicePutHook = Callable[[Sequence[Any], Callable[[], Any]], Any]
# on_assemble(shards, call) -> one array ; call() builds it from ``shards`` (host data or
# single-device Arrays, one per device).
AssembleHook = Callable[[Sequence[Any], Callable[[], Any]], Any]
DeleteHook = Callable[[Any], None]


def jax_version() -> str:
    """The installed JAX's version; raises :class:`UserInputError` if JAX is missing."""
    try:
        import jax
    except ImportError:
        raise UserInputError("record: JAX is not installed (pip install jax); the JAX "
                             "recorder hooks JAX's dispatch") from None
    return str(jax.__version__)


def check_version(version: str | None = None) -> None:
    """Refuse, in one line, a JAX whose internals these hooks were not tested against."""
    version = jax_version() if version is None else version
    major_minor = ".".join(version.split(".")[:2])
    if major_minor != TESTED:
        raise UserInputError(f"jax {major_minor} is not supported by the recorder "
                             f"(tested: {TESTED}.x)")


Patch = tuple[Any, str, Any]    # (owner, attribute, the value put there)


class _Patches:
    """A set of patches put in place together and taken out in reverse order."""

    def __init__(self) -> None:
        self._saved: list[Patch] = []

    def _apply(self, patches: Sequence[Patch]) -> None:
        if self._saved:
            raise RuntimeError("JAX recording hooks are already installed")
        for owner, name, value in patches:
            self._saved.append((owner, name, owner.__dict__[name]))
            setattr(owner, name, value)
        clear_fastpath_caches()

    def uninstall(self) -> None:
        while self._saved:
            owner, name, value = self._saved.pop()
            setattr(owner, name, value)
        clear_fastpath_caches()


def _shared_patches(on_device_put: DevicePutHook, on_delete: DeleteHook) -> list[Patch]:
    """The patches both recorders need: the fast path off (every call of a jitted function
    takes the Python path), ``jax.device_put`` and ``ArrayImpl.delete``."""
    from jax._src import dispatch, pjit
    from jax._src.interpreters import pxla
    from jax._src.lib import xla_client
    device_put = dispatch._batched_device_put_impl
    delete = xla_client.ArrayImpl.delete

    def recorded_device_put(*xs: Any, **params: Any) -> Any:
        return on_device_put(xs, lambda: device_put(*xs, **params))

    def recorded_delete(array: Any) -> None:
        delete(array)
        on_delete(array)

    def no_fastpath(*args: Any, **kwargs: Any) -> None:
        return None

    return [(pjit, "_get_fastpath_data", no_fastpath),
            (pxla, "MeshExecutableFastpathData", no_fastpath),
            (dispatch, "_batched_device_put_impl", recorded_device_put),
            (xla_client.ArrayImpl, "delete", recorded_delete)]


class Hooks(_Patches):
    """The patches above; :meth:`install` once, :meth:`uninstall` restores JAX as it was."""

    def __init__(self, on_execute: ExecuteHook, on_inputs: InputsHook,
                 on_device_put: DevicePutHook, on_assemble: AssembleHook,
                 on_delete: DeleteHook) -> None:
        super().__init__()
        self.on_execute = on_execute
        self.on_inputs = on_inputs
        self.on_device_put = on_device_put
        self.on_assemble = on_assemble
        self.on_delete = on_delete

    def install(self) -> None:
        from jax._src.interpreters import pxla

        on_execute, on_inputs, on_assemble = self.on_execute, self.on_inputs, self.on_assemble
        execute = pxla.ExecuteReplicated.__call__
        inputs = pxla.InputsHandler.__call__
        assemble = pxla.batched_device_put

        def recorded_execute(executable: Any, *args: Any) -> Any:
            return on_execute(executable, args, execute)

        def recorded_inputs(handler: Any, args: Any) -> Any:
            return on_inputs(args, lambda: inputs(handler, args))

        def recorded_assemble(*args: Any, **kwargs: Any) -> Any:
            shards = args[2] if len(args) > 2 else kwargs.get("xs", ())
            return on_assemble(shards, lambda: assemble(*args, **kwargs))

        self._apply([(pxla.ExecuteReplicated, "__call__", recorded_execute),
                     (pxla.InputsHandler, "__call__", recorded_inputs),
                     (pxla, "batched_device_put", recorded_assemble),
                     *_shared_patches(self.on_device_put, self.on_delete)])


class TargetHooks(_Patches):
    """The patches ``record --target`` needs (:mod:`allocsim.traces.record.jax_recorder.target`):

    - ``pjit._pjit_call_impl_python``: every execution of a jitted function or an eager op
      (JAX jits each eager primitive) comes there with its jaxpr, donated inputs and name;
      ``on_call(args, jaxpr, donated_invars, name, call)`` runs it with ``call()``;
    - the fast path off, ``jax.device_put`` and ``ArrayImpl.delete``, as for :class:`Hooks`."""

    def __init__(self, on_call: Callable[..., Any], on_device_put: DevicePutHook,
                 on_delete: DeleteHook) -> None:
        super().__init__()
        self.on_call = on_call
        self.on_device_put = on_device_put
        self.on_delete = on_delete

    def install(self) -> None:
        from jax._src import pjit

        on_call = self.on_call
        impl = pjit._pjit_call_impl_python

        def recorded_impl(*args: Any, **params: Any) -> Any:
            return on_call(args, params["jaxpr"], params["donated_invars"], params["name"],
                           lambda: impl(*args, **params))

        self._apply([(pjit, "_pjit_call_impl_python", recorded_impl),
                     *_shared_patches(self.on_device_put, self.on_delete)])


def clear_fastpath_caches() -> None:
    """Forget jaxlib's C++ dispatch entries (not the compiled executables, which live in
    Python caches): the next call of each jitted function goes through Python once."""
    from jax._src import pjit
    from jax._src.lib import _jax

    pjit._cpp_pjit_cache_fun_only.clear()
    pjit._cpp_pjit_cache_explicit_attributes.clear()
    _jax.PjitFunctionCache.clear_all()


# ====================================================================== executables
@dataclass(frozen=True)
class ExecutableInfo:
    """What the recorder needs to know about one compiled program."""

    name: str                      # e.g. "jit(update)", "jit(add)" for an eager add
    temp_bytes: int                # memory_analysis().temp_size_in_bytes
    alias_bytes: int               # memory_analysis().alias_size_in_bytes
    kept: frozenset[int]           # which call arguments the program takes
    aliased_params: tuple[int, ...]  # parameters a donated buffer may be reused by
    token_params: int              # leading token parameters (ordered effects)
    output_ops: tuple[str, ...]    # op_name of each output of the entry computation


_HEADER_ALIAS = re.compile(r"input_output_alias=\{(.*?)\s\}")
_ALIAS_PARAM = re.compile(r"\{[\d,\s]*\}:\s*\((\d+),")
_ENTRY = re.compile(r"^ENTRY .*$", re.MULTILINE)
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%(\S+)\s*=\s*(.*)$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TUPLE_OPERANDS = re.compile(r"\btuple\((.*?)\)")


def executable_info(executable: Any) -> ExecutableInfo:
    """Facts about a ``pxla.ExecuteReplicated`` (its loaded executable and HLO)."""
    loaded = executable.xla_executable
    try:
        stats = loaded.get_compiled_memory_stats()
        temp, alias = int(stats.temp_size_in_bytes), int(stats.alias_size_in_bytes)
    except Exception:  # a backend without memory statistics
        temp = alias = 0
    try:
        text = loaded.hlo_modules()[0].to_string()
    except Exception:
        text = ""
    header = text.split("\n", 1)[0]
    aliased: tuple[int, ...] = ()
    match = _HEADER_ALIAS.search(header)
    if match:
        aliased = tuple(sorted({int(p) for p in _ALIAS_PARAM.findall(match.group(1))}))
    tokens = len(executable.ordered_effects) if executable.ordered_effects else 0
    return ExecutableInfo(name=str(executable.name), temp_bytes=temp, alias_bytes=alias,
                          kept=frozenset(executable.kept_var_idx), aliased_params=aliased,
                          token_params=tokens, output_ops=_output_ops(text))


def _output_ops(text: str) -> tuple[str, ...]:
    """The op_name of each value the entry computation returns ('' where it has none)."""
    entry = _ENTRY.search(text)
    if entry is None:
        return ()
    ops: dict[str, str] = {}
    root_name, root_rest = "", ""
    for line in text[entry.end():].split("\n"):
        if line.startswith("}"):
            break
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        name = m.group(2)
        op = _OP_NAME.search(m.group(3))
        ops[name] = op.group(1) if op else ""
        if m.group(1):
            root_name, root_rest = name, m.group(3)
    if not root_name:
        return ()
    tup = _TUPLE_OPERANDS.search(root_rest.split(", metadata=")[0])
    if tup is None or not root_rest.lstrip().startswith("("):
        return (ops.get(root_name, ""),)
    operands = [o.strip().lstrip("%") for o in tup.group(1).split(",") if o.strip()]
    return tuple(ops.get(o, "") for o in operands)
