"""The ``torch.accelerator`` a program sees while it is recorded: the target GPU, as CUDA.

``torch.accelerator`` is PyTorch's device-generic face of the same GPU that ``torch.cuda``
serves; programs pick their device with it (``torch.accelerator.current_accelerator().type if
torch.accelerator.is_available() else "cpu"``, PyTorch's tutorials), and PyTorch calls it
itself: every optimizer's ``step()`` asks ``torch.accelerator.current_stream().is_capturing()``
when the current accelerator is CUDA. Its functions go to ``torch._C`` directly, not through
``torch.cuda``, so :class:`~allocsim.traces.record.torch.meta_cuda.FakeCuda` alone does not
answer them, and what they answer depends on the build:

- the CPU build has no accelerator: ``is_available()`` is False, so a program following the
  tutorials runs on the CPU and records nothing;
- the CUDA build on a machine without a driver (what ``pip install torch`` gives) has one that
  cannot start: ``current_stream()`` and ``current_device_index()`` raise "CUDA driver version is
  insufficient" (the optimizer's step, issue 37).

:class:`FakeAccelerator` replaces, for the duration of a recording, each function of
``torch.accelerator`` (and of its ``memory`` and ``random`` submodules) that the installed
torch has with the answer of the fake ``torch.cuda``, looked up when called: one device, the
target, CUDA; its streams; the recording's memory statistics. Names a release lacks are left
absent (a program calling one fails as it would on a GPU). ``Graph`` is left alone: CUDA graphs
are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["FakeAccelerator"]

# torch.accelerator's name -> the torch.cuda function that answers it (the fake, once installed)
_SAME_AS_CUDA = {
    "is_available": "is_available",
    "device_count": "device_count",
    "current_device_index": "current_device",
    "current_device_idx": "current_device",
    "set_device_index": "set_device",
    "set_device_idx": "set_device",
    "device_index": "device",
    "current_stream": "current_stream",
    "set_stream": "set_stream",
    "synchronize": "synchronize",
    "empty_cache": "empty_cache",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "memory_stats": "memory_stats",
    "get_memory_info": "mem_get_info",
    "initial_seed": "initial_seed",
    "get_rng_state": "get_rng_state",
    "get_rng_state_all": "get_rng_state_all",
}
_SUBMODULES = ("memory", "random")


def _current_accelerator(check_available: bool = False) -> Any:
    import torch
    return torch.device("cuda")


def _device_capability(device: Any = None) -> dict[str, Any]:
    """CUDA's answer: every dtype can be allocated (PyTorch's default device capability)."""
    import torch
    dtypes = {value for value in vars(torch).values() if isinstance(value, torch.dtype)}
    return {"supported_dtypes": dtypes}


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


_OWN: dict[str, Callable[..., Any]] = {
    "current_accelerator": _current_accelerator,
    "get_device_capability": _device_capability,
    "empty_host_cache": _nothing,
    "reset_accumulated_memory_stats": _nothing,
}


def _through_cuda(name: str) -> Any:
    """A function (or, for a class such as ``device``, a callable) that calls ``torch.cuda``'s
    ``name`` as it is when called."""

    def function(*args: Any, **kwargs: Any) -> Any:
        import torch.cuda
        return getattr(torch.cuda, name)(*args, **kwargs)

    function.__name__ = name
    return function


class FakeAccelerator:
    """Replaces ``torch.accelerator``'s functions while installed (module docstring); the
    answers come from ``torch.cuda``, which :class:`FakeCuda` must replace first."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    @staticmethod
    def _replacement(name: str) -> Any:
        if name in _OWN:
            return _OWN[name]
        if name in _SAME_AS_CUDA:
            return _through_cuda(_SAME_AS_CUDA[name])
        return None

    def install(self) -> None:
        import torch
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is None:
            return
        modules = [accelerator, *(getattr(accelerator, sub, None) for sub in _SUBMODULES)]
        for module in modules:
            if module is None:
                continue
            for name in list(vars(module)):
                replacement = self._replacement(name)
                if replacement is not None:
                    self._saved.append((module, name, getattr(module, name)))
                    setattr(module, name, replacement)

    def uninstall(self) -> None:
        while self._saved:
            module, name, value = self._saved.pop()
            setattr(module, name, value)

