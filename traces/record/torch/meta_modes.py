"""The two torch modes behind :class:`~allocsim.traces.record.torch.meta.TorchMetaRecorder`.

- :class:`Redirect`, a ``TorchFunctionMode``, sees each torch call as the program makes it
  (before PyTorch parses a device, which on a machine without CUDA would fail at
  ``torch.cuda._lazy_init``): CUDA devices become the backing device, ``.device`` /
  ``.is_cuda`` of a recorded tensor answer CUDA, and value reads go to the recorder's policy.
- :class:`Record`, a ``TorchDispatchMode``, sees every ATen op below autograd — the forward
  ops, the backward pass, the optimizer's ``_foreach`` ops — and hands each new output storage
  to the recorder.

This module imports torch: it is imported only when a recording starts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["Record", "Redirect"]

_Tensor = torch.Tensor
_DEVICE_GETTER = _Tensor.device
_IS_CUDA_GETTER = _Tensor.is_cuda
_VALUE_METHODS = {getattr(_Tensor, name): name for name in (
    "item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "numpy",
    "__array__", "__format__")}
_TO, _CUDA, _CPU = _Tensor.to, _Tensor.cuda, _Tensor.cpu
_PIN, _RECORD_STREAM = _Tensor.pin_memory, _Tensor.record_stream


def _device_kind(device: Any) -> str | None:
    """``"cuda"``, ``"cpu"``, another device type, or None when ``device`` names none."""
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):
        try:
            return torch.device(device).type
        except RuntimeError:
            return None
    if isinstance(device, int) and not isinstance(device, bool):
        return "cuda"  # .to(0) / .cuda(0): a CUDA ordinal
    return None


class Redirect(TorchFunctionMode):
    """Sends the program's CUDA tensors to the recorder's backing device (module docstring)."""

    def __init__(self, recorder: Any) -> None:
        super().__init__()
        self.recorder = recorder
        self.backing = torch.device(recorder.backing)

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        rec = self.recorder
        descriptor = getattr(func, "__self__", None)
        if descriptor is _DEVICE_GETTER:
            tensor = args[0]
            if isinstance(tensor, _Tensor) and rec.is_device(tensor):
                return torch.device("cuda", 0)
            return func(*args, **kwargs)
        if descriptor is _IS_CUDA_GETTER:
            tensor = args[0]
            return (isinstance(tensor, _Tensor) and rec.is_device(tensor)) or func(*args)
        method = _VALUE_METHODS.get(func)
        if method is not None:
            tensor = args[0]
            printing = method == "__format__" and (tensor.dim() or not (args[1:] and args[1]))
            if rec.backing == "meta" and isinstance(tensor, _Tensor) and tensor.is_meta \
                    and not printing:  # f"{t}" prints the tensor; f"{loss:.3f}" reads it
                return rec.read_value(method, tensor, args[1:], kwargs)
            return func(*args, **kwargs)
        if func is _TO:
            return self._to(func, args, kwargs)
        if func is _CUDA:
            return self._move(args[0], non_blocking=bool(kwargs.get("non_blocking", False)))
        if func is _CPU:
            return self._to_host(args[0], func, args, kwargs)
        if func is _PIN or func is _RECORD_STREAM:
            return args[0] if func is _PIN else None
        device = kwargs.get("device")
        if device is not None and _device_kind(device) == "cuda":
            kwargs = dict(kwargs, device=self.backing)
            rec._redirecting += 1
            try:
                return func(*args, **kwargs)
            finally:
                rec._redirecting -= 1
        return func(*args, **kwargs)

    def _move(self, tensor: Any, **options: Any) -> Any:
        """``tensor`` onto the backing device, as a host-to-device copy allocates on CUDA."""
        rec = self.recorder
        copy = rec.backing == "cpu" and not rec.is_device(tensor)
        rec._redirecting += 1
        try:
            return tensor.to(self.backing, copy=copy, **options)
        finally:
            rec._redirecting -= 1

    def _to(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        tensor, rest = args[0], list(args[1:])
        device = None
        if rest and _device_kind(rest[0]) is not None:
            device = rest.pop(0)
        elif "device" in kwargs:
            device = kwargs["device"]
        kind = _device_kind(device) if device is not None else None
        if kind == "cuda":
            options = {k: v for k, v in kwargs.items() if k != "device"}
            if rest:  # .to(device, dtype, non_blocking, copy)
                for name, value in zip(("dtype", "non_blocking", "copy"), rest):
                    options[name] = value
            rec = self.recorder
            if rec.backing == "cpu" and not rec.is_device(tensor):
                options["copy"] = True
            rec._redirecting += 1
            try:
                return func(tensor, self.backing, **options)
            finally:
                rec._redirecting -= 1
        if kind == "cpu" and isinstance(tensor, _Tensor) and self.recorder.is_device(tensor):
            return self._to_host(tensor, func, args, kwargs)
        return func(*args, **kwargs)

    def _to_host(self, tensor: Any, func: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        """A device tensor copied to the host: no device allocation."""
        rec = self.recorder
        if not rec.is_device(tensor):
            return func(*args, **kwargs)
        if rec.backing == "meta":
            return rec.read_value("to_host", tensor, (), {})
        rec._paused += 1  # the CPU copy is the host's, not the device's
        try:
            dtype = kwargs.get("dtype")
            if dtype is None and len(args) > 2 and isinstance(args[2], torch.dtype):
                dtype = args[2]
            host = tensor.detach().clone()
            return host if dtype is None else host.to(dtype)
        finally:
            rec._paused -= 1


class Record(TorchDispatchMode):
    """Hands every new output storage of the program's device tensors to the recorder."""

    def __init__(self, recorder: Any) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        rec = self.recorder
        if rec._paused:
            return out
        op = func._overloadpacket.__name__
        name = f"aten.{op}"
        stream = rec.fake_cuda.current.stream_id
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, _Tensor)]
        if rec.backing == "meta":
            on_device = [t for t in outputs if t.is_meta]
            for t in on_device:
                rec.track(t.untyped_storage(), name, stream)
            if not on_device:
                return out  # a host op: CUDA's own allocations (cuBLAS) are not its
        else:
            # On the CPU, a storage is the device's when the op works on device tensors or
            # the program asked for "cuda" (a factory, a host-to-device copy).
            inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, _Tensor)]
            if rec._redirecting or any(rec.is_device(t) for t in inputs):
                for t in outputs:
                    if t.is_cpu and not t.is_sparse:
                        rec.track(t.untyped_storage(), name, stream)
        rec.after_op(op)
        return out
