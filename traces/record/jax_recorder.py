"""Record the device buffers a JAX program holds over time, as an allocation trace.

``with allocsim.traces.record.jax("run.npz"): ...`` (or ``allocsim record --framework jax -o
run.npz -- python train.py``) records, on the device the program runs on (default: JAX's first
device; the CPU on a machine without an accelerator):

- every array placed or created — ``jax.device_put``, eager ops, the outputs of jitted
  functions — one buffer of the array's ``nbytes`` (its shard's bytes on the recorded device
  when it is sharded over several), allocated when the array appears;
- every execution's temp buffer, ``memory_analysis().temp_size_in_bytes`` of that executable,
  allocated before the execution and freed after it;
- arguments given from the host (numpy arrays, Python scalars), transferred for the call and
  freed after it;
- donation: a donated argument is released at the call; an output whose buffer is the donated
  one (same device pointer: XLA's input-output aliasing) takes that buffer over and allocates
  nothing, a donated buffer no output reuses is freed;
- an array is freed when the program drops it (a weak reference's callback) or deletes it.

Buffers, not Array objects, are counted: two Arrays can hold one device buffer (``jax.device_put``
to the device an array is already on commits it without a copy; ``x.addressable_data(0)``,
``device_put_sharded`` of arrays already in place). An array whose buffer on the recorded
device (its shard there, when it spans several) has the device pointer of a tracked buffer
joins it and allocates nothing; the buffer is freed when its last Array goes, or at once when
one of them is deleted or donated (JAX deletes the shared buffer under all of them). A
pointer whose Arrays are all deleted is stale (a deletion the hooks did not see) and is freed
before a new buffer takes its address.

Arrays alive when recording starts (``jax.live_arrays()``) open the trace, tagged
``<allocated before recording>``. Tags name the executable and, where the optimized HLO says,
the op that produced the output (``jit(update)/sub``, ``jit(update)/temp``); an eager op is
tagged with its primitive (``add``). Times are ``time.perf_counter_ns()`` from the start of
recording, taken when Python dispatches (JAX runs asynchronously: the order is the program's,
the times are dispatch times). How the hooks reach inside JAX:
:mod:`allocsim.traces.record.jax_internals`.

Events are kept as one ``array('q')`` of ``(time, op, buffer id, size, tag)`` rows, appended
in one call each, so a weak-reference callback that fires in the middle of a hook (CPython
runs them whenever an array's last reference goes) cannot tear a row.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
import warnings
import weakref
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from allocsim.errors import UserInputError
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace
from allocsim.traces.record import jax_internals
from allocsim.traces.record.abrupt_end import AbruptEnd, partial_reason
from allocsim.traces.record.recording_end import SavedOnce, finished, recorder_header, trace_name

__all__ = ["PROLOGUE_TAG", "RECORDER", "JaxRecorder", "active_recorder"]

RECORDER = "allocsim JaxRecorder (JAX dispatch hooks)"
PROLOGUE_TAG = "<allocated before recording>"
_FIELDS = 5  # time, op, buffer id, size, tag
_ACTIVE: list[JaxRecorder] = []


def active_recorder() -> JaxRecorder | None:
    """The JAX recorder whose with-block is running, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


class _Ref(weakref.ref):
    """A tracked array: the buffer id and size its free will carry, and the device pointer
    of that buffer on the recorded device (-1: unknown; the buffer is then its own)."""

    __slots__ = ("bid", "key", "pointer", "size", "tag")
    bid: int
    key: int
    pointer: int
    size: int
    tag: int


@dataclass
class _Executable:
    info: jax_internals.ExecutableInfo
    on_device: bool
    temp_tag: int                  # -1: no temp buffer
    output_tags: tuple[int, ...]


class JaxRecorder(SavedOnce):
    """Records a JAX program's device buffers while its with-block runs; saves on exit.

    ``output``: the trace file written on exit (format from the extension; None: keep in
    memory, see :attr:`trace`); ``device``: index into ``jax.devices()`` of the device to
    record (default 0); ``metadata``: added to the trace's. One recorder records at a time.

    The trace is written however the block ends: normally, by an exception (Ctrl-C
    included), by ``os._exit`` or by SIGTERM under its default action
    (:mod:`~allocsim.traces.record.abrupt_end`; not by SIGKILL). A trace of a block that did
    not end normally says why in its metadata, ``partial``. ``on_abrupt_end(trace, reason)``
    is called after saving on ``os._exit`` or SIGTERM, just before the process ends.
    """

    def __init__(self, output: str | os.PathLike[str] | None = None, *, device: int = 0,
                 metadata: dict[str, Any] | None = None,
                 on_abrupt_end: Callable[[Trace, str], None] | None = None) -> None:
        self.output = None if output is None else os.fspath(output)
        self.device_index = device
        self.metadata = dict(metadata or {})
        self.trace: Trace | None = None  # set by close()
        self._events = array("q")
        self._tags: list[str] = []
        self._tag_ids: dict[str, int] = {}
        self._live: dict[int, _Ref] = {}
        self._holders: dict[int, list[_Ref]] = {}  # device pointer -> the Arrays on it
        self._executables: dict[Any, _Executable] = {}
        self._placement: dict[Any, tuple[int, int]] = {}  # sharding -> (mode, shard index)
        self._ids = itertools.count()
        self._local = threading.local()
        self._t0 = time.perf_counter_ns()
        self._hooks: jax_internals.Hooks | None = None
        self._device: Any = None
        self._array_type: type | None = None
        self._versions: dict[str, Any] = {}
        self._end_check: dict[str, Any] = {}
        self._closed = False
        self._on_abrupt_end = on_abrupt_end
        self._abrupt: AbruptEnd | None = None

    # ------------------------------------------------------------------ with-block
    def __enter__(self) -> JaxRecorder:
        jax_internals.check_version()
        import jax
        import jaxlib
        from jax._src.lib import xla_client

        if _ACTIVE:
            raise UserInputError("a JAX recorder is already recording; nest none")
        devices = jax.devices()
        if not 0 <= self.device_index < len(devices):
            raise UserInputError(f"device {self.device_index} does not exist (jax.devices() "
                                 f"has {len(devices)})")
        self._device = devices[self.device_index]
        self._array_type = xla_client.ArrayImpl
        self._versions = {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
        self._t0 = time.perf_counter_ns()
        prologue = self._tag(PROLOGUE_TAG)
        for array_ in jax.live_arrays(self._device.platform):
            self._track(array_, prologue, view_of=True)
        self._hooks = jax_internals.Hooks(self._on_execute, self._on_inputs,
                                          self._on_device_put, self._on_assemble,
                                          self._on_delete)
        self._hooks.install()
        _ACTIVE.append(self)
        if self.output is not None:
            self._abrupt = AbruptEnd(self._end_abruptly)
            self._abrupt.install()
        return self

    def _end_abruptly(self, reason: str) -> None:
        """``os._exit`` or SIGTERM: the block will not be left; save what it recorded."""
        self.metadata["partial"] = reason
        self.__exit__(None, None, None)
        if self._on_abrupt_end is not None and self.trace is not None:
            self._on_abrupt_end(self.trace, reason)

    def __exit__(self, *exc_info: Any) -> None:
        error = exc_info[1] if len(exc_info) > 1 else None
        if error is not None and "partial" not in self.metadata:
            reason = partial_reason(error)
            if reason is not None:
                self.metadata["partial"] = reason
        try:
            if self._abrupt is not None:
                self._abrupt.uninstall()
                self._abrupt = None
            if self._hooks is not None:
                self._hooks.uninstall()
                self._hooks = None
            self._end_check = self._check_against_live_arrays()
        finally:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            self._live.clear()  # the weak references go: their callbacks never run
            self._executables.clear()
            self.close()

    # ------------------------------------------------------------------ bookkeeping
    def _tag(self, name: str) -> int:
        tag = self._tag_ids.get(name)
        if tag is None:
            tag = self._tag_ids[name] = len(self._tags)
            self._tags.append(name)
        return tag

    def _emit(self, op: int, bid: int, size: int, tag: int) -> None:
        self._events.extend((time.perf_counter_ns() - self._t0, op, bid, size, tag))

    def _dead(self, ref: _Ref) -> None:
        """Weak-reference callback: the program dropped a tracked array."""
        holders = self._holders.get(ref.pointer) if ref.pointer >= 0 else None
        if holders is not None and any(r is ref for r in holders):
            self._forget([ref])
            holders[:] = [r for r in holders if r is not ref]
            if any(_holds(r) for r in holders):
                return  # another Array still holds the buffer
            self._forget(holders)
            del self._holders[ref.pointer]
        elif self._live.get(ref.key) is ref:
            del self._live[ref.key]
        else:
            return  # released already (deleted, donated): freed then
        self._emit(OP_FREE, ref.bid, ref.size, ref.tag)

    def _placement_of(self, sharding: Any) -> tuple[int, int]:
        """``(mode, index)``: mode 0 the array has nothing on the recorded device, 1 it lives
        there alone, 2 it has a shard there, ``addressable_data(index)``."""
        placement = self._placement.get(sharding)
        if placement is None:
            devices = sharding.device_set
            if self._device not in devices:
                placement = (0, -1)
            elif len(devices) == 1:
                placement = (1, 0)
            else:
                order = list(sharding._addressable_device_assignment)
                placement = (2, order.index(self._device))
            self._placement[sharding] = placement
        return placement

    def _device_bytes(self, array_: Any) -> int | None:
        """Bytes ``array_`` holds on the recorded device (None: it holds none there)."""
        mode = self._placement_of(array_.sharding)[0]
        if mode == 1:
            return int(array_.nbytes)
        if mode == 0:
            return None
        shard = array_.sharding.shard_shape(array_.shape)
        return math.prod(shard) * array_.dtype.itemsize

    def _pointer_here(self, array_: Any) -> int:
        """The device pointer of ``array_``'s buffer on the recorded device (-1: none known:
        deleted, or a backend without pointers)."""
        try:
            mode, index = self._placement_of(array_.sharding)
            if mode == 1:
                return int(array_.unsafe_buffer_pointer())
            if mode == 2:
                shard = array_.addressable_data(index)
                return int(shard.unsafe_buffer_pointer())
        except Exception:  # deleted under us, or no pointers on this backend
            pass
        return -1

    def _base(self, value: Any) -> Any:
        """The ArrayImpl holding ``value``'s buffer (a typed PRNG key wraps one), or None."""
        if type(value) is self._array_type:
            return value
        base = getattr(value, "_base_array", None)
        return base if type(base) is self._array_type else None

    def _tracked(self, array_: Any) -> _Ref | None:
        ref = self._live.get(id(array_))
        return ref if ref is not None and ref() is array_ else None

    def _held(self, pointer: int, size: int) -> _Ref | None:
        """A live, undeleted Array holding the tracked buffer of ``size`` bytes at
        ``pointer``, or None."""
        holders = self._holders.get(pointer) if pointer >= 0 else None
        if holders:
            for ref in holders:
                if _holds(ref):
                    return ref if ref.size == size else None
        return None

    def _track(self, array_: Any, tag: int, bid: int | None = None,
               size: int | None = None, view_of: _Ref | bool | None = None) -> None:
        """Start following ``array_``; emits its alloc unless it takes over buffer ``bid``
        or views a tracked buffer: that of ``view_of`` (the Array it was made from) when it
        has its device pointer, any tracked buffer with its pointer when ``view_of`` is
        True (the arrays alive when recording starts, whose origin is unknown)."""
        if size is None:
            try:
                if array_.is_deleted():
                    return
                size = self._device_bytes(array_)
            except Exception:  # an array JAX cannot describe (deleted under us)
                return
            if size is None:
                return
        ref = _Ref(array_, self._dead)
        ref.key, ref.size, ref.tag = id(array_), size, tag
        ref.pointer = pointer = self._pointer_here(array_)
        if bid is None:
            if view_of is True:
                source = self._held(pointer, size)
            elif isinstance(view_of, _Ref) and view_of.pointer == pointer:
                source = self._held(pointer, size)
            else:
                source = None
            if source is not None:  # a second Array on a buffer already counted
                ref.bid, ref.tag = source.bid, source.tag
                self._holders[pointer].append(ref)
                self._live[ref.key] = ref
                return
            ref.bid = next(self._ids)
            self._emit(OP_ALLOC, ref.bid, size, tag)
        else:
            ref.bid = bid
        self._live[ref.key] = ref
        if pointer < 0:
            return
        holders = self._holders.get(pointer)
        if holders and any(_holds(r) for r in holders):
            # Another buffer at this address, alive: XLA:CPU aliases a numpy array's memory
            # (device_put of one numpy array twice); on a GPU these are two buffers.
            ref.pointer = -1
            return
        if holders:  # all deleted, unseen by the hooks: that buffer went before this one
            first = holders[0]
            self._forget(holders)
            self._emit(OP_FREE, first.bid, first.size, first.tag)
        self._holders[pointer] = [ref]

    def _forget(self, refs: list[_Ref]) -> None:
        for ref in refs:
            if self._live.get(ref.key) is ref:
                del self._live[ref.key]

    def _release(self, ref: _Ref) -> None:
        """A tracked array's buffer went (deleted, donated): free it now, for every Array on
        it (JAX deletes a shared buffer under all of its Arrays)."""
        holders = self._holders.get(ref.pointer) if ref.pointer >= 0 else None
        if holders is not None and any(r is ref for r in holders):
            self._forget(holders)
            del self._holders[ref.pointer]
        elif self._live.get(ref.key) is ref:
            del self._live[ref.key]
        else:
            return  # freed already (a stale pointer found, or a view released first)
        self._emit(OP_FREE, ref.bid, ref.size, ref.tag)

    def _take_over(self, donated: _Ref, array_: Any) -> None:
        """``array_`` holds the buffer of ``donated`` (donation: XLA's input-output alias,
        or a donating device_put): it keeps that buffer's id, nothing is allocated."""
        holders = self._holders.pop(donated.pointer, None) if donated.pointer >= 0 else None
        self._forget(holders if holders is not None else [donated])
        self._track(array_, donated.tag, bid=donated.bid, size=donated.size)

    # ------------------------------------------------------------------ executions
    def _describe(self, executable: Any) -> _Executable:
        info = jax_internals.executable_info(executable)
        try:
            on_device = self._device in executable.xla_executable.local_devices()
        except Exception:
            on_device = True
        name = info.name
        inner = name[4:-1] if name.startswith("jit(") and name.endswith(")") else name

        def output_tag(op: str) -> int:
            if not op:
                return self._tag(name)
            return self._tag(inner if op == f"{name}/{inner}" else op)

        return _Executable(info=info, on_device=on_device,
                           temp_tag=self._tag(f"{name}/temp") if info.temp_bytes else -1,
                           output_tags=tuple(output_tag(op) for op in info.output_ops))

    def _on_execute(self, executable: Any, args: Sequence[Any],
                    call: Callable[..., Any]) -> Any:
        described = self._executables.get(executable)
        if described is None:
            described = self._executables[executable] = self._describe(executable)
        if not described.on_device:
            return call(executable, *args)
        info = described.info
        emit = self._emit
        temp_bid = -1
        if info.temp_bytes:
            temp_bid = next(self._ids)
            emit(OP_ALLOC, temp_bid, info.temp_bytes, described.temp_tag)
        donated: list[tuple[Any, _Ref]] = []
        if info.aliased_params:
            kept_args = [a for i, a in enumerate(args) if i in info.kept]
            for param in info.aliased_params:
                position = param - info.token_params
                if 0 <= position < len(kept_args):
                    arg = self._base(kept_args[position])
                    ref = self._tracked(arg) if arg is not None else None
                    if ref is not None:
                        donated.append((arg, ref))
        local = self._local
        transfers: list[tuple[int, int]] = []
        stack = getattr(local, "transfers", None)
        if stack is None:
            stack = local.transfers = []
        stack.append((transfers, described))
        try:
            try:
                outputs = call(executable, *args)
            finally:
                stack.pop()
            self._outputs(outputs, described, donated)
        finally:
            if transfers:
                tag = self._tag(f"{info.name}/argument")
                for bid, size in transfers:
                    emit(OP_FREE, bid, size, tag)
            if temp_bid >= 0:
                emit(OP_FREE, temp_bid, info.temp_bytes, described.temp_tag)
        return outputs

    def _outputs(self, outputs: Sequence[Any], described: _Executable,
                 donated: list[tuple[Any, _Ref]]) -> None:
        reusable: dict[int, _Ref] = {}
        gone: list[_Ref] = []
        for arg, ref in donated:
            if arg.is_deleted():
                gone.append(ref)
                if ref.pointer >= 0:
                    reusable[ref.pointer] = ref
        tags = described.output_tags
        offset = len(tags) - len(outputs)
        for index, value in enumerate(outputs):
            out = self._base(value)
            if out is None or self._tracked(out) is not None:
                continue  # a token, or an input JAX forwarded as it was
            position = index + offset
            tag = tags[position] if 0 <= position < len(tags) and offset >= 0 \
                else self._tag(described.info.name)
            if reusable:
                taken = reusable.pop(self._pointer_here(out), None)
                if taken is not None and self._device_bytes(out) == taken.size:
                    gone.remove(taken)  # the donated buffer, now the output's
                    self._take_over(taken, out)
                    continue
            self._track(out, tag)
        for ref in gone:
            self._release(ref)

    # ------------------------------------------------------------------ transfers, deletes
    def _on_inputs(self, args: Sequence[Any], call: Callable[[], Any]) -> Any:
        """An execution's arguments go to the device: a host value or a resharded array
        becomes a buffer held for that execution (freed after its outputs appear)."""
        local = self._local
        bufs = _counting(local, "inputs", call)
        stack = getattr(local, "transfers", None)
        if not stack:
            return bufs
        transfers, described = stack[-1]
        for arg, buf in zip(args, bufs):
            if buf is arg or type(buf) is not self._array_type:
                continue
            size = self._device_bytes(buf)
            if size and not self._views(buf, arg, size):
                bid = next(self._ids)
                self._emit(OP_ALLOC, bid, size, self._tag(f"{described.info.name}/argument"))
                transfers.append((bid, size))
        return bufs

    def _on_assemble(self, shards: Sequence[Any], call: Callable[[], Any]) -> Any:
        out = call()
        local = self._local
        # Not an execution's argument, nor device_put's own step (its outputs are tracked
        # when it returns: the array assembled here is rewrapped there and dropped).
        if not getattr(local, "inputs", 0) and not getattr(local, "putting", 0):
            base = self._base(out)
            if base is not None and self._tracked(base) is None:
                # Assembled from Arrays already in place, it views the one on this device.
                pointer = self._pointer_here(base)
                source = None
                for shard in shards:
                    shard_base = self._base(shard)
                    ref = self._tracked(shard_base) if shard_base is not None else None
                    if ref is not None and ref.pointer == pointer >= 0:
                        source = ref
                self._track(base, self._tag("device_put"), view_of=source)
        return out

    def _views(self, array_: Any, source: Any, size: int) -> bool:
        """Whether ``array_``, made from ``source``, holds the buffer ``source`` holds."""
        base = self._base(source)
        ref = self._tracked(base) if base is not None else None
        return ref is not None and ref.pointer >= 0 and ref.size == size \
            and self._pointer_here(array_) == ref.pointer

    def _on_device_put(self, xs: Sequence[Any], call: Callable[[], Any]) -> Any:
        inputs = []
        for x in xs:
            base = self._base(x)
            ref = self._tracked(base) if base is not None else None
            inputs.append((base, ref))
        local = self._local
        ys = _counting(local, "putting", call)
        tag = self._tag("device_put")
        for index, y in enumerate(ys):
            out = self._base(y)
            if out is None or self._tracked(out) is not None:
                continue
            source, ref = inputs[index] if index < len(inputs) else (None, None)
            if ref is not None and source is not None and source.is_deleted() \
                    and self._device_bytes(out) == ref.size:  # donated: the buffer moved
                self._take_over(ref, out)
                continue
            self._track(out, tag, view_of=ref)  # a view of its source joins its buffer
        for source, ref in inputs:
            if ref is not None and source.is_deleted():
                self._release(ref)
        return ys

    def _on_delete(self, array_: Any) -> None:
        ref = self._tracked(array_)
        if ref is not None and array_.is_deleted():
            self._release(ref)

    # ------------------------------------------------------------------ results
    def __len__(self) -> int:
        return len(self._events) // _FIELDS

    def _rows(self) -> np.ndarray:
        return np.array(self._events, dtype=np.int64).reshape(-1, _FIELDS)

    def live_bytes(self) -> int:
        """Bytes the recording holds live now (every buffer, a running execution's temp
        included)."""
        rows = self._rows()
        sizes = rows[:, 3]
        return int(sizes[rows[:, 1] == OP_ALLOC].sum() - sizes[rows[:, 1] == OP_FREE].sum())

    def _check_against_live_arrays(self) -> dict[str, Any]:
        """The recording's live bytes against ``jax.live_arrays()`` now (kept in metadata)."""
        import jax
        arrays = jax.live_arrays(self._device.platform)
        expected = 0
        # Each buffer once: the Arrays on one device pointer are one buffer (views), unless
        # the recording told them apart (XLA:CPU aliasing one numpy array's memory twice).
        groups: dict[int, dict[int, int]] = {}  # pointer -> {buffer id (-1: untracked): size}
        for array_ in arrays:
            size = self._device_bytes(array_)
            if not size:
                continue
            pointer = self._pointer_here(array_)
            if pointer < 0:
                expected += size
                continue
            ref = self._tracked(array_)
            groups.setdefault(pointer, {})[ref.bid if ref is not None else -1] = size
        for buffers in groups.values():
            tracked = [size for bid, size in buffers.items() if bid >= 0]
            expected += sum(tracked) if tracked else buffers[-1]
        recorded = self.live_bytes()
        if recorded != expected:
            warnings.warn(f"JAX recording ends with {recorded:,} live bytes but "
                          f"jax.live_arrays() holds {expected:,}", RuntimeWarning,
                          stacklevel=3)
        return {"recorded_live_bytes": recorded, "live_arrays_bytes": expected,
                "match": recorded == expected}

    def build_trace(self) -> Trace:
        """The trace of the buffers so far (validated leniently, times never backwards)."""
        rows = self._rows()
        device = self._device
        meta: dict[str, Any] = {
            **recorder_header(RECORDER, **self._versions),
            "device": str(device) if device is not None else None,
            "platform": getattr(device, "platform", None),
            "device_kind": getattr(device, "device_kind", None),
            "temp_sizes": "memory_analysis().temp_size_in_bytes of each executable (XLA's "
                          f"buffer assignment for {getattr(device, 'platform', '?')})"}
        if self._end_check:
            meta["end_check"] = self._end_check
        meta.update(self.metadata)
        trace = Trace.from_columns(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3], tag=rows[:, 4],
                                   tags=list(self._tags),
                                   name=trace_name(self.output, "jax-recording"),
                                   source=self.output or "<jax recorder>", **meta)
        return finished(trace)


def _counting(local: threading.local, counter: str, call: Callable[[], Any]) -> Any:
    """``call()`` with this thread's ``counter`` raised while it runs (how a hook tells
    the calls it makes itself from the program's)."""
    setattr(local, counter, getattr(local, counter, 0) + 1)
    try:
        return call()
    finally:
        setattr(local, counter, getattr(local, counter) - 1)


def _holds(ref: _Ref) -> bool:
    """Whether the Array ``ref`` follows is alive and not deleted."""
    array_ = ref()
    if array_ is None:
        return False
    try:
        return not array_.is_deleted()
    except Exception:
        return False
