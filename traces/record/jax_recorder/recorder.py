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
:mod:`allocsim.traces.record.jax_recorder.internals`; how the buffers and the Arrays on them are
followed, and the event rows kept: :mod:`allocsim.traces.record.jax_recorder.buffers`.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from allocsim.errors import UserInputError
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace
from allocsim.traces.record.abrupt_end import AbruptEnd, partial_reason
from allocsim.traces.record.jax_recorder import internals as jax_internals
from allocsim.traces.record.jax_recorder.buffers import BufferBook, DevicePlacement, Ref
from allocsim.traces.record.jax_recorder.runtime_records import RuntimeRecords
from allocsim.traces.record.recording_end import SavedOnce, finished, recorder_header, trace_name

__all__ = ["PROLOGUE_TAG", "RECORDER", "JaxRecorder", "active_recorder"]

RECORDER = "allocsim JaxRecorder (JAX dispatch hooks)"
PROLOGUE_TAG = "<allocated before recording>"
_ACTIVE: list[JaxRecorder] = []


def active_recorder() -> JaxRecorder | None:
    """The JAX recorder whose with-block is running, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


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
                 on_abrupt_end: Callable[[Trace, str], None] | None = None,
                 runtime_records: bool = True) -> None:
        self.claim(output)  # now: before the program runs (it may change folder)
        # On a TPU, the runtime's own records too (NAME.runtime.npz beside the output).
        self._runtime = RuntimeRecords(self.output) if runtime_records else None
        self.runtime_trace: Trace | None = None
        self.device_index = device
        self.metadata = dict(metadata or {})
        self.trace: Trace | None = None  # set by close()
        self._book = BufferBook()
        self._place = DevicePlacement(None)  # the recorded device's, from __enter__
        self._executables: dict[Any, _Executable] = {}
        self._local = threading.local()
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
        self._place = DevicePlacement(self._device)
        self._book.start(self._place)
        prologue = self._book.tag(PROLOGUE_TAG)
        for array_ in jax.live_arrays(self._device.platform):
            self._book.track(array_, prologue, view_of=True)
        self._hooks = jax_internals.Hooks(self._on_execute, self._on_inputs,
                                          self._on_device_put, self._on_assemble,
                                          self._on_delete)
        self._hooks.install()
        _ACTIVE.append(self)
        if self._runtime is not None:
            self._runtime.start(self._device.platform)
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
            if self._runtime is not None:
                self.runtime_trace = self._runtime.stop(self.peak_live_bytes())
                self.metadata["runtime_records"] = self._runtime.summary
        finally:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            self._book.stop()  # the weak references go: their callbacks never run
            self._executables.clear()
            self.close()

    # ------------------------------------------------------------------ arrays
    def _base(self, value: Any) -> Any:
        """The ArrayImpl holding ``value``'s buffer (a typed PRNG key wraps one), or None."""
        if type(value) is self._array_type:
            return value
        base = getattr(value, "_base_array", None)
        return base if type(base) is self._array_type else None

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
                return self._book.tag(name)
            return self._book.tag(inner if op == f"{name}/{inner}" else op)

        return _Executable(info=info, on_device=on_device,
                           temp_tag=self._book.tag(f"{name}/temp") if info.temp_bytes else -1,
                           output_tags=tuple(output_tag(op) for op in info.output_ops))

    def _on_execute(self, executable: Any, args: Sequence[Any],
                    call: Callable[..., Any]) -> Any:
        described = self._executables.get(executable)
        if described is None:
            described = self._executables[executable] = self._describe(executable)
        if not described.on_device:
            return call(executable, *args)
        info = described.info
        book = self._book
        temp_bid = -1
        if info.temp_bytes:
            temp_bid = book.alloc(info.temp_bytes, described.temp_tag)
        donated: list[tuple[Any, Ref]] = []
        if info.aliased_params:
            kept_args = [a for i, a in enumerate(args) if i in info.kept]
            for param in info.aliased_params:
                position = param - info.token_params
                if 0 <= position < len(kept_args):
                    arg = self._base(kept_args[position])
                    ref = self._book.tracked(arg) if arg is not None else None
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
                tag = book.tag(f"{info.name}/argument")
                for bid, size in transfers:
                    book.emit(OP_FREE, bid, size, tag)
            if temp_bid >= 0:
                book.emit(OP_FREE, temp_bid, info.temp_bytes, described.temp_tag)
        return outputs

    def _outputs(self, outputs: Sequence[Any], described: _Executable,
                 donated: list[tuple[Any, Ref]]) -> None:
        reusable: dict[int, Ref] = {}
        gone: list[Ref] = []
        for arg, ref in donated:
            if arg.is_deleted():
                gone.append(ref)
                if ref.pointer >= 0:
                    reusable[ref.pointer] = ref
        tags = described.output_tags
        offset = len(tags) - len(outputs)
        for index, value in enumerate(outputs):
            out = self._base(value)
            if out is None or self._book.tracked(out) is not None:
                continue  # a token, or an input JAX forwarded as it was
            position = index + offset
            tag = tags[position] if 0 <= position < len(tags) and offset >= 0 \
                else self._book.tag(described.info.name)
            if reusable:
                taken = reusable.pop(self._place.pointer(out), None)
                if taken is not None and self._place.device_bytes(out) == taken.size:
                    gone.remove(taken)  # the donated buffer, now the output's
                    self._book.take_over(taken, out)
                    continue
            self._book.track(out, tag)
        for ref in gone:
            self._book.release(ref)

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
            size = self._place.device_bytes(buf)
            if size and not self._views(buf, arg, size):
                bid = self._book.alloc(size, self._book.tag(f"{described.info.name}/argument"))
                transfers.append((bid, size))
        return bufs

    def _on_assemble(self, shards: Sequence[Any], call: Callable[[], Any]) -> Any:
        out = call()
        local = self._local
        # Not an execution's argument, nor device_put's own step (its outputs are tracked
        # when it returns: the array assembled here is rewrapped there and dropped).
        if not getattr(local, "inputs", 0) and not getattr(local, "putting", 0):
            base = self._base(out)
            if base is not None and self._book.tracked(base) is None:
                # Assembled from Arrays already in place, it views the one on this device.
                pointer = self._place.pointer(base)
                source = None
                for shard in shards:
                    shard_base = self._base(shard)
                    ref = self._book.tracked(shard_base) if shard_base is not None else None
                    if ref is not None and ref.pointer == pointer >= 0:
                        source = ref
                self._book.track(base, self._book.tag("device_put"), view_of=source)
        return out

    def _views(self, array_: Any, source: Any, size: int) -> bool:
        """Whether ``array_``, made from ``source``, holds the buffer ``source`` holds."""
        base = self._base(source)
        ref = self._book.tracked(base) if base is not None else None
        return ref is not None and ref.pointer >= 0 and ref.size == size \
            and self._place.pointer(array_) == ref.pointer

    def _on_device_put(self, xs: Sequence[Any], call: Callable[[], Any]) -> Any:
        inputs = []
        for x in xs:
            base = self._base(x)
            ref = self._book.tracked(base) if base is not None else None
            inputs.append((base, ref))
        local = self._local
        ys = _counting(local, "putting", call)
        tag = self._book.tag("device_put")
        for index, y in enumerate(ys):
            out = self._base(y)
            if out is None or self._book.tracked(out) is not None:
                continue
            source, ref = inputs[index] if index < len(inputs) else (None, None)
            if ref is not None and source is not None and source.is_deleted() \
                    and self._place.device_bytes(out) == ref.size:  # donated: the buffer moved
                self._book.take_over(ref, out)
                continue
            self._book.track(out, tag, view_of=ref)  # a view of its source joins its buffer
        for source, ref in inputs:
            if ref is not None and source.is_deleted():
                self._book.release(ref)
        return ys

    def _on_delete(self, array_: Any) -> None:
        ref = self._book.tracked(array_)
        if ref is not None and array_.is_deleted():
            self._book.release(ref)

    # ------------------------------------------------------------------ results
    def __len__(self) -> int:
        return len(self._book)

    def live_bytes(self) -> int:
        """Bytes the recording holds live now (every buffer, a running execution's temp
        included)."""
        rows = self._book.rows()
        sizes = rows[:, 3]
        return int(sizes[rows[:, 1] == OP_ALLOC].sum() - sizes[rows[:, 1] == OP_FREE].sum())

    def peak_live_bytes(self) -> int:
        """The most bytes the recording held live at once so far."""
        rows = self._book.rows()
        signed = np.where(rows[:, 1] == OP_ALLOC, rows[:, 3], -rows[:, 3])
        return int(np.cumsum(signed).max(initial=0))

    def _check_against_live_arrays(self) -> dict[str, Any]:
        """The recording's live bytes against ``jax.live_arrays()`` now (kept in metadata)."""
        import jax
        arrays = jax.live_arrays(self._device.platform)
        expected = 0
        # Each buffer once: the Arrays on one device pointer are one buffer (views), unless
        # the recording told them apart (XLA:CPU aliasing one numpy array's memory twice).
        groups: dict[int, dict[int, int]] = {}  # pointer -> {buffer id (-1: untracked): size}
        for array_ in arrays:
            size = self._place.device_bytes(array_)
            if not size:
                continue
            pointer = self._place.pointer(array_)
            if pointer < 0:
                expected += size
                continue
            ref = self._book.tracked(array_)
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
        rows = self._book.rows()
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
                                   tags=list(self._book.tags),
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

