"""Stand-ins for ``cupy`` and ``torch`` on a machine without a GPU, for the validator's tests.

Device memory is host buffers at fake device addresses (any access outside memory handed out
raises), the pattern "kernels" are numpy, and the pools cache nothing. They check the
validator's own logic (bookkeeping, capacity rule, pattern safety, clean-up), NOT that real
CuPy/CUDA behave as assumed: that is what tests/test_validator_gpu.py does on a GPU.

Every public name a fake offers exists in the real library with the same parameter names:
tests/test_gpu_api.py checks them against tests/data/gpu_api.json, a record of real CuPy and
PyTorch made by ``python tests/gpu_api.py`` — so code that runs on the fakes calls only API the
real libraries have.
"""

from __future__ import annotations

import ctypes
import types
from typing import Any

import numpy as np
from sortedcontainers import SortedDict

import allocsim.sim.validation.cuda_device as cuda_device_module
from allocsim.sim.validation.patterns import count_pattern_errors, fill_pattern

MiB = 1 << 20
GiB = 1 << 30


def _round(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class FakeCudaRuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(f"cudaError {status}")


class FakeDeviceMemory:
    """Host buffers at fake device addresses; memory counted in 2 MiB granules like a GPU's
    cudaMemGetInfo."""

    def __init__(self, total: int = 8 * GiB, granularity: int = 2 * MiB) -> None:
        self.total, self.granularity = total, granularity
        self.spans: SortedDict = SortedDict()
        self.next = 0x7000_0000_0000
        self.used = 0

    def add(self, nbytes: int, at: int | None = None) -> int:
        taken = _round(max(nbytes, 1), self.granularity)
        if self.used + taken > self.total:
            raise FakeCudaRuntimeError(2)
        if at is None:
            at, self.next = self.next, self.next + taken + self.granularity
        self.spans[at] = np.zeros(nbytes, dtype=np.uint8)
        self.used += taken
        return at

    def remove(self, ptr: int) -> None:
        buffer = self.spans.pop(ptr)      # KeyError: a free of something never allocated
        self.used -= _round(max(len(buffer), 1), self.granularity)

    def views(self, ptr: int, nbytes: int) -> list[np.ndarray]:
        out, cursor, end = [], ptr, ptr + nbytes
        while cursor < end:
            index = self.spans.bisect_right(cursor) - 1
            start, buffer = self.spans.peekitem(index) if index >= 0 else (0, np.zeros(0))
            if not start <= cursor < start + len(buffer):
                raise AssertionError(f"illegal device access at 0x{cursor:x}")
            take = min(end, start + len(buffer)) - cursor
            out.append(buffer[cursor - start:cursor - start + take])
            cursor += take
        return out


class FakeCupy:
    __version__ = "13.9.9-fake"
    _test_only = ("mem",)        # the fake's own handles, not CuPy API

    def __init__(self, total: int = 8 * GiB) -> None:
        mem = self.mem = FakeDeviceMemory(total)

        class Runtime:
            memcpyDeviceToHost = 2
            CUDARuntimeError = FakeCudaRuntimeError

            def getDeviceCount(self) -> int: return 1
            def getDevice(self) -> int: return 0
            def getDeviceProperties(self, device: int) -> dict: return {"name": b"Fake GPU"}
            def runtimeGetVersion(self) -> int: return 12040
            def driverGetVersion(self) -> int: return 12060
            def deviceSynchronize(self) -> None: pass
            def memGetInfo(self) -> tuple[int, int]: return mem.total - mem.used, mem.total
            def malloc(self, size: int) -> int: return mem.add(size)
            def free(self, ptr: int) -> None: mem.remove(ptr)

            def memset(self, ptr: int, value: int, size: int) -> None:
                for view in mem.views(ptr, size):
                    view[:] = value

            def memcpy(self, dst: int, src: int, size: int, kind: int) -> None:
                data = b"".join(v.tobytes() for v in mem.views(src, size))
                ctypes.memmove(dst, data, size)

        runtime = Runtime()

        class Kernel:
            def __init__(self, name: str) -> None:
                self.name = name

            def __call__(self, grid: tuple, block: tuple, args: tuple) -> None:
                ptr, n, key = int(args[0]), int(args[1]), int(args[2])
                phase, bad = 0, 0
                for view in mem.views(ptr, n):
                    if self.name == "allocsim_fill":
                        fill_pattern(view, key, phase)
                    else:
                        bad += count_pattern_errors(view, key, phase)
                    phase += len(view)
                if self.name == "allocsim_check":
                    counter = mem.views(int(args[3]), 8)[0].view("<u8")
                    counter[0] += bad

        class RawModule:
            def __init__(self, code: str) -> None:
                assert "allocsim_fill" in code and "allocsim_check" in code

            def get_function(self, name: str) -> Kernel:
                return Kernel(name)

        class OutOfMemoryError(MemoryError):
            pass

        class Pointer:
            def __init__(self, ptr: int, on_free) -> None:
                self.ptr, self._on_free = ptr, on_free

            def __del__(self) -> None:
                self._on_free(self.ptr)

        class PythonFunctionAllocator:
            def __init__(self, malloc_func, free_func) -> None:
                self.malloc_func, self.free_func = malloc_func, free_func

            def malloc(self, size: int) -> Pointer:
                return Pointer(self.malloc_func(size, 0), lambda p: self.free_func(p, 0))

        class Pooled:
            def __init__(self, inner: Pointer, size: int, pool: MemoryPool) -> None:
                self.inner, self.size, self.pool, self.ptr = inner, size, pool, inner.ptr

            def __del__(self) -> None:
                self.pool.used -= self.size
                self.pool.total -= self.size

        class MemoryPool:
            """No caching at all (so it matches on-demand with 512-byte rounding)."""

            def __init__(self, allocator=None) -> None:
                self.allocator = allocator or (lambda n: Pointer(runtime.malloc(n),
                                                                  runtime.free))
                self.limit = self.used = self.total = 0

            def set_limit(self, size: int | None = None, fraction: float | None = None) -> None:
                assert fraction is None, "the validator sets limits in bytes"
                self.limit = size or 0

            def malloc(self, size: int) -> Pooled:
                rounded = _round(size, 512)
                if self.limit and self.total + rounded > self.limit:
                    raise OutOfMemoryError(size)
                try:
                    inner = self.allocator(rounded)
                except FakeCudaRuntimeError:
                    raise OutOfMemoryError(size) from None
                self.used += rounded
                self.total += rounded
                return Pooled(inner, rounded, self)

            def used_bytes(self) -> int: return self.used
            def total_bytes(self) -> int: return self.total
            def free_all_blocks(self, stream=None) -> None: pass

        class MemoryAsyncPool(MemoryPool):
            def __init__(self, pool_handles: str = "current") -> None:
                super().__init__()

        class Stream:
            null: Stream

            def __init__(self, null: bool = False, non_blocking: bool = False) -> None:
                pass

            def __enter__(self) -> Stream: return self
            def __exit__(self, *exc: Any) -> None: pass

        Stream.null = Stream()
        memory = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError,
                                       PythonFunctionAllocator=PythonFunctionAllocator)
        self.cuda = types.SimpleNamespace(runtime=runtime, memory=memory, MemoryPool=MemoryPool,
                                          MemoryAsyncPool=MemoryAsyncPool, Stream=Stream)
        self.RawModule = RawModule


class FakeVMM:
    """CudaVMM on the fake's memory: address ranges are numbers, pages are buffers."""

    granularity = 2 * MiB

    def __init__(self, mem: FakeDeviceMemory) -> None:
        self.mem, self.next = mem, 0x7800_0000_0000
        self.ranges: dict[int, int] = {}

    def reserve(self, nbytes: int) -> int:
        ptr, self.next = self.next, self.next + nbytes + self.granularity
        self.ranges[ptr] = nbytes
        return ptr

    def free_range(self, ptr: int, nbytes: int) -> None:
        assert self.ranges.pop(ptr) == nbytes

    def create_and_map(self, ptr: int, nbytes: int) -> int | None:
        assert any(b <= ptr and ptr + nbytes <= b + n for b, n in self.ranges.items())
        try:
            return self.mem.add(nbytes, at=ptr)
        except FakeCudaRuntimeError:
            return None

    def unmap_and_release(self, ptr: int, nbytes: int, handle: int) -> None:
        assert handle == ptr
        self.mem.remove(ptr)


class FakeTorch:
    """``torch`` with a ``torch.cuda`` whose caching allocator caches nothing: every
    caching_allocator_alloc is one device allocation of the size rounded to 512 bytes, so the
    on-demand model (on 512-aligned sizes) describes it byte for byte."""

    __version__ = "2.9.9-fake"
    _test_only = ("mem", "state")

    def __init__(self, total: int = 8 * GiB) -> None:
        mem = self.mem = FakeDeviceMemory(total)
        state = self.state = {"reserved": 0, "allocs": 0, "frees": 0, "fraction": 1.0}
        sizes: dict[int, int] = {}
        OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {})

        def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
            rounded = _round(size, 512)
            if state["reserved"] + rounded > state["fraction"] * mem.total:
                raise OutOfMemoryError("fake")
            ptr = mem.add(rounded)
            sizes[ptr] = rounded
            state["reserved"] += rounded
            state["allocs"] += 1
            return ptr

        def caching_allocator_delete(mem_ptr: int) -> None:
            state["reserved"] -= sizes.pop(mem_ptr)
            state["frees"] += 1
            mem.remove(mem_ptr)

        def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
            state["fraction"] = fraction

        def mem_get_info(device: Any = None) -> tuple[int, int]:
            return mem.total - mem.used, mem.total

        def memory_stats(device: Any = None) -> dict[str, int]:
            return {"num_device_alloc": state["allocs"], "num_device_free": state["frees"]}

        def reserved(device: Any = None) -> int:
            return state["reserved"]

        def nothing(device: Any = None) -> None:
            return None

        self.cuda = types.SimpleNamespace(
            is_available=lambda: True, current_device=lambda: 0,
            get_device_name=lambda device=None: "Fake GPU", synchronize=nothing,
            empty_cache=lambda: None, reset_peak_memory_stats=nothing,
            reset_accumulated_memory_stats=nothing,
            memory_reserved=reserved, memory_allocated=reserved, mem_get_info=mem_get_info,
            set_per_process_memory_fraction=set_per_process_memory_fraction,
            current_stream=lambda device=None: "s0", Stream=lambda device=None: "s1",
            OutOfMemoryError=OutOfMemoryError,
            caching_allocator_alloc=caching_allocator_alloc,
            caching_allocator_delete=caching_allocator_delete, memory_stats=memory_stats)
        self.version = types.SimpleNamespace(cuda="12.4")


def install_fake_gpu(monkeypatch) -> FakeCupy:
    """``cupy`` is the fake from here on (and the VMM calls go to the fake's memory)."""
    fake = FakeCupy()
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake)
    monkeypatch.setattr(cuda_device_module, "CudaVMM", lambda device_id: FakeVMM(fake.mem))
    return fake
