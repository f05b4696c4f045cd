"""The ``torch.cuda`` a program sees while it is recorded on the meta device.

Programs ask ``torch.cuda`` before they use it (``"cuda" if torch.cuda.is_available() else
"cpu"``, ``torch.cuda.get_device_properties(0).total_memory``, ``torch.autocast("cuda")``,
which disables itself when CUDA is not available) and call it on the way
(``synchronize``, ``manual_seed``, streams, ``max_memory_allocated``). On a machine without a
GPU — or with a CPU build of torch — those answers would send the program down its CPU path or
fail. :class:`FakeCuda` replaces these functions on the ``torch.cuda`` module for the duration
of a recording (and on the submodules that define them: ``torch.cuda.memory``, ``.random``,
``.graphs``, ``.streams``) and puts every one back after:

- availability and the device: one device, index 0, the target's name, capability and total
  memory (:class:`~allocsim.traces.record.torch.meta_targets.Target`);
- no-ops: ``synchronize``, the random-number state (``get_rng_state`` gives 16 zero
  bytes, ``set_rng_state`` ignores), ``torch.cuda.device(i)``, ``manual_seed(_all)``,
  ``seed(_all)``, ``empty_cache``, ``set_device``, ``init``;
- memory statistics from the recording itself: ``memory_allocated`` / ``max_memory_allocated``
  are the live and peak bytes recorded so far (the bytes the program's tensors hold, as
  PyTorch counts them); ``memory_reserved`` / ``max_memory_reserved`` are the same numbers (the
  caching allocator's reserve is the simulator's to answer, not the recorder's),
  ``reset_peak_memory_stats`` resets the peak, ``memory_stats`` has those four counters and
  ``memory_summary`` says them;
- streams: :class:`FakeStream` objects with small ids (the default stream is 0), a current
  stream per recording, ``torch.cuda.stream(s)`` / ``set_stream`` to change it, events that
  do nothing (the meta device runs nothing asynchronously); no stream is ever capturing a
  CUDA graph.

``torch.accelerator``, the device-generic face of the same GPU, answers from these functions
(:mod:`~allocsim.traces.record.torch.meta_accelerator`).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from allocsim.traces.record.torch.meta_targets import Target

__all__ = ["FakeCuda", "FakeDeviceProperties", "FakeEvent", "FakeStream"]

# torch.cuda's submodules whose functions torch.cuda re-exports (and programs call by them)
_SUBMODULES = ("memory", "random", "graphs", "streams")


@dataclass(frozen=True)
class FakeDeviceProperties:
    """What ``torch.cuda.get_device_properties`` says about the target."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int = 0
    is_integrated: bool = False


class FakeStream:
    """A CUDA stream of the recording: a small id (0 is the default stream)."""

    def __init__(self, device: Any = None, priority: int = 0, *, stream_id: int | None = None,
                 **_: Any) -> None:
        self.stream_id = _STREAM_IDS.next() if stream_id is None else stream_id
        self.priority = priority

    def wait_stream(self, stream: Any) -> None:
        """Nothing to wait for: the meta device runs nothing."""

    def wait_event(self, event: Any) -> None:
        """Nothing to wait for."""

    def record_event(self, event: Any = None) -> FakeEvent:
        return event if isinstance(event, FakeEvent) else FakeEvent()

    def synchronize(self) -> None:
        """Nothing runs, so nothing to finish."""

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        """Never: CUDA graphs are not recorded (the optimizers ask before each step)."""
        return False

    @property
    def device(self) -> Any:
        import torch
        return torch.device("cuda", 0)

    device_index = 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeStream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(("allocsim-stream", self.stream_id))

    def __repr__(self) -> str:
        return f"<allocsim FakeStream {self.stream_id} (recording on meta)>"


class _StreamIds:
    """Ids for new streams, restarted by each recording (the default stream is 0)."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def next(self) -> int:
        return next(self._ids)

    def restart(self) -> None:
        self._ids = itertools.count(1)


_STREAM_IDS = _StreamIds()


class FakeEvent:
    """A CUDA event that records nothing and is always complete."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: Any) -> float:
        return 0.0


class _DeviceContext:
    """``torch.cuda.device(i)``: there is one device, so entering it changes nothing."""

    def __init__(self, device: Any = None) -> None:
        self.idx = 0

    def __enter__(self) -> _DeviceContext:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class FakeCuda:
    """Replaces ``torch.cuda``'s functions while installed (``with FakeCuda(...):``).

    ``live`` and ``peak`` are callables giving the recording's live and peak bytes;
    ``reset_peak`` resets the peak.
    """

    def __init__(self, target: Target, live: Callable[[], int], peak: Callable[[], int],
                 reset_peak: Callable[[], None]) -> None:
        self.target = target
        self.current = FakeStream(stream_id=0)
        self._live, self._peak, self._reset_peak = live, peak, reset_peak
        self._saved: list[tuple[Any, str, Any]] = []
        self._missing: list[str] = []

    # ------------------------------------------------------------------ the functions
    def _functions(self) -> dict[str, Any]:
        target = self.target
        props = FakeDeviceProperties(target.card, *target.capability, target.total_memory)
        default = FakeStream(stream_id=0)

        def current_stream(device: Any = None) -> FakeStream:
            return self.current

        def set_stream(stream: Any) -> None:
            if isinstance(stream, FakeStream):
                self.current = stream

        @contextlib.contextmanager
        def stream(s: Any) -> Iterator[None]:
            saved = self.current
            if isinstance(s, FakeStream):
                self.current = s
            try:
                yield
            finally:
                self.current = saved

        def nothing(*args: Any, **kwargs: Any) -> None:
            return None

        def zero(*args: Any, **kwargs: Any) -> int:
            return 0

        functions = self._table(target, props, default, current_stream, set_stream, stream,
                                nothing, zero)
        # A function object of its own per name: torch._dynamo, imported lazily while a
        # recording runs, refuses one object under two names of torch.cuda.
        return {name: _own(value) for name, value in functions.items()}

    def _table(self, target: Target, props: FakeDeviceProperties, default: FakeStream,
               current_stream: Any, set_stream: Any, stream: Any, nothing: Any,
               zero: Any) -> dict[str, Any]:
        def rng_state(device: Any = None) -> Any:
            import torch
            return torch.zeros(16, dtype=torch.uint8)

        return {
            "is_available": lambda: True,
            "device": _DeviceContext,
            "get_rng_state": rng_state,
            "get_rng_state_all": lambda: [rng_state()],
            "set_rng_state": nothing,
            "set_rng_state_all": nothing,
            "is_initialized": lambda: True,
            "init": nothing,
            "_lazy_init": nothing,
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "set_device": nothing,
            "get_device_name": lambda device=None: target.card,
            "get_device_capability": lambda device=None: target.capability,
            "get_device_properties": lambda device=None: props,
            "get_arch_list": lambda: [f"sm_{target.capability[0]}{target.capability[1]}"],
            "is_bf16_supported": lambda including_emulation=True: target.capability >= (8, 0),
            "synchronize": nothing,
            "manual_seed": nothing,
            "manual_seed_all": nothing,
            "seed": nothing,
            "seed_all": nothing,
            "initial_seed": zero,
            "empty_cache": nothing,
            "ipc_collect": nothing,
            "memory_allocated": lambda device=None: self._live(),
            "max_memory_allocated": lambda device=None: self._peak(),
            "memory_reserved": lambda device=None: self._live(),
            "max_memory_reserved": lambda device=None: self._peak(),
            "reset_peak_memory_stats": lambda device=None: self._reset_peak(),
            "reset_max_memory_allocated": lambda device=None: self._reset_peak(),
            "memory_stats": lambda device=None: self._memory_stats(),
            "memory_summary": lambda device=None, abbreviated=False: self._memory_summary(),
            "mem_get_info": lambda device=None: (target.total_memory - self._live(),
                                                 target.total_memory),
            "Stream": FakeStream,
            "Event": FakeEvent,
            "current_stream": current_stream,
            "default_stream": lambda device=None: default,
            "set_stream": set_stream,
            "stream": stream,
            "is_current_stream_capturing": lambda: False,
        }

    def _memory_stats(self) -> collections.OrderedDict[str, int]:
        """The byte counters of ``memory_stats()`` that the recording knows (reserved is
        allocated, as ``memory_reserved`` says)."""
        live, peak = self._live(), self._peak()
        return collections.OrderedDict([
            ("allocated_bytes.all.current", live), ("allocated_bytes.all.peak", peak),
            ("reserved_bytes.all.current", live), ("reserved_bytes.all.peak", peak)])

    def _memory_summary(self) -> str:
        """``memory_summary()``: the counters the recording has, and where they come from."""
        return (f"allocsim recording on the meta device for {self.target.name} "
                f"({self.target.card}): allocated {self._live()} bytes now, peak "
                f"{self._peak()} bytes (the program's tensors; the caching allocator's "
                "reserve is allocsim's to simulate)\n")

    def install(self) -> None:
        """Replace the functions on ``torch.cuda`` (adding those a build lacks) and, under the
        same names, on its submodules that define them (``torch.cuda.memory.mem_get_info``,
        ``torch.cuda.random.manual_seed``, ...: the objects ``torch.cuda`` re-exports)."""
        import torch.cuda
        _STREAM_IDS.restart()
        submodules = [getattr(torch.cuda, sub, None) for sub in _SUBMODULES]
        for name, value in self._functions().items():
            if hasattr(torch.cuda, name):
                self._saved.append((torch.cuda, name, getattr(torch.cuda, name)))
            else:
                self._missing.append(name)
            setattr(torch.cuda, name, value)
            for module in submodules:
                if module is not None and name in vars(module):
                    self._saved.append((module, name, getattr(module, name)))
                    setattr(module, name, value)

    def uninstall(self) -> None:
        import torch.cuda
        while self._saved:
            module, name, value = self._saved.pop()
            setattr(module, name, value)
        for name in self._missing:
            if hasattr(torch.cuda, name):
                delattr(torch.cuda, name)
        self._missing.clear()


def _own(value: Any) -> Any:
    """``value``, or a plain function of its own wrapping it when it is a function."""
    if isinstance(value, type) or not callable(value):
        return value

    def function(*args: Any, **kwargs: Any) -> Any:
        return value(*args, **kwargs)

    function.__name__ = getattr(value, "__name__", "function")
    function.__doc__ = getattr(value, "__doc__", None)
    return function
