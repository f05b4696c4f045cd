"""The GPU side of the validator: a policy object driving real CUDA memory through CuPy.

:class:`CupyDevice` implements the policies' ``DeviceMemory`` on a GPU — ``reserve`` is
cudaMalloc, ``map``/``unmap`` are CUDA virtual memory through ``libcuda`` with ctypes
(:class:`CudaVMM`) — and writes and checks every live block's pattern with two small CUDA
kernels. CuPy is imported only when one is built: importing this module never needs it.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from allocsim.policies import format_size
from allocsim.policies.units import round_up
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.validation.errors import ValidatorError, one_line
from allocsim.sim.validation.measured import CallLog
from allocsim.sim.validation.patterns import PATTERN_KEYS
from allocsim.sim.validation.spans import Spans

# cudaErrorMemoryAllocation, the status of a cudaMalloc that found no memory. CuPy's runtime
# module gives the enum no Python name (checked on CuPy 14.2.0: ``cupy.cuda.runtime`` has no
# ``errorMemoryAllocation``; memory.pyx compares against the cimported C enum).
CUDA_ERROR_MEMORY_ALLOCATION = 2

_PATTERN_KERNELS = r"""
extern "C" __global__ void allocsim_fill(unsigned long long ptr, unsigned long long n,
                                         unsigned int key) {
    unsigned char* p = (unsigned char*)ptr;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned int b = (unsigned int)(i & 3);
        p[i] = (unsigned char)((b << 6) | ((key >> (6 * b)) & 63));
    }
}
extern "C" __global__ void allocsim_check(unsigned long long ptr, unsigned long long n,
                                          unsigned int key, unsigned long long* bad) {
    const unsigned char* p = (const unsigned char*)ptr;
    unsigned long long mine = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned int b = (unsigned int)(i & 3);
        if (p[i] != (unsigned char)((b << 6) | ((key >> (6 * b)) & 63))) mine++;
    }
    if (mine) atomicAdd(bad, mine);
}
"""


class _GpuPatterns:
    """The pattern written and checked on device memory by two CUDA kernels (the pattern of
    :func:`~allocsim.sim.validation.patterns.fill_pattern`, counted per byte). Compiled, and its
    counter allocated, before the replay's baseline is taken so neither shows up in the
    measurements."""

    THREADS = 256
    MAX_BLOCKS = 4096

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        module = cp.RawModule(code=_PATTERN_KERNELS)
        self._fill = module.get_function("allocsim_fill")
        self._check = module.get_function("allocsim_check")
        self._bad = cp.cuda.runtime.malloc(8)
        self._host = np.zeros(1, dtype=np.uint64)
        self.fill(self._bad, 8, 1)          # forces the module to load now
        cp.cuda.runtime.deviceSynchronize()

    def _grid(self, n: int) -> tuple[int]:
        return (max(1, min(self.MAX_BLOCKS, -(-n // self.THREADS))),)

    def fill(self, ptr: int, n: int, key: int) -> None:
        self._fill(self._grid(n), (self.THREADS,),
                   (np.uint64(ptr), np.uint64(n), np.uint32(key % PATTERN_KEYS)))

    def check(self, ptr: int, n: int, key: int) -> int:
        rt = self.cp.cuda.runtime
        rt.memset(self._bad, 0, 8)
        self._check(self._grid(n), (self.THREADS,),
                    (np.uint64(ptr), np.uint64(n), np.uint32(key % PATTERN_KEYS),
                     np.uint64(self._bad)))
        # A synchronous copy on the legacy stream: waits for the kernel.
        rt.memcpy(self._host.ctypes.data, self._bad, 8, getattr(rt, "memcpyDeviceToHost", 2))
        return int(self._host[0])

    def close(self) -> None:
        if self._bad:
            self.cp.cuda.runtime.free(self._bad)
            self._bad = 0


class _CUmemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _CUmemAllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _CUmemAllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", _CUmemLocation), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", _CUmemAllocFlags)]


class _CUmemAccessDesc(ctypes.Structure):
    _fields_ = [("location", _CUmemLocation), ("flags", ctypes.c_int)]


_u64, _size_t = ctypes.c_uint64, ctypes.c_size_t

# The driver calls CudaVMM makes, as cuda.h declares them (CUdeviceptr and
# CUmemGenericAllocationHandle are 64-bit; enums are C ints). tests/test_cuda_abi.py compiles
# against cuda.h, where one is installed, to check these and the structs above.
DRIVER_SIGNATURES: dict[str, list[Any]] = {
    "cuMemGetAllocationGranularity": [ctypes.POINTER(_size_t),
                                      ctypes.POINTER(_CUmemAllocationProp), ctypes.c_int],
    "cuMemAddressReserve": [ctypes.POINTER(_u64), _size_t, _size_t, _u64, ctypes.c_ulonglong],
    "cuMemAddressFree": [_u64, _size_t],
    "cuMemCreate": [ctypes.POINTER(_u64), _size_t, ctypes.POINTER(_CUmemAllocationProp),
                    ctypes.c_ulonglong],
    "cuMemRelease": [_u64],
    "cuMemMap": [_u64, _size_t, _size_t, _u64, ctypes.c_ulonglong],
    "cuMemUnmap": [_u64, _size_t],
    "cuMemSetAccess": [_u64, _size_t, ctypes.POINTER(_CUmemAccessDesc), _size_t],
}


class CudaVMM:
    """The CUDA virtual-memory driver calls, through ``libcuda`` with ctypes (CuPy does not
    wrap them): cuMemAddressReserve/Free, cuMemCreate/Release, cuMemMap/Unmap, cuMemSetAccess.
    Pinned device memory, no shareable handle, read-write access for the device itself."""

    CU_MEM_ALLOCATION_TYPE_PINNED = 1
    CU_MEM_LOCATION_TYPE_DEVICE = 1
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
    CUDA_ERROR_OUT_OF_MEMORY = 2

    def __init__(self, device_id: int) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as err:
            raise ValidatorError(f"backend policy does not support VMM policies here: cannot "
                                 f"load libcuda ({one_line(err)})") from None
        for name, argtypes in DRIVER_SIGNATURES.items():
            try:
                function = getattr(self.lib, name)
            except AttributeError:
                raise ValidatorError(f"backend policy does not support VMM policies here: the "
                                     f"driver has no {name}") from None
            function.argtypes = argtypes
            function.restype = ctypes.c_int
        location = _CUmemLocation(self.CU_MEM_LOCATION_TYPE_DEVICE, device_id)
        self.prop = _CUmemAllocationProp()
        self.prop.type = self.CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.requestedHandleTypes = 0
        self.prop.location = location
        self.access = _CUmemAccessDesc(location, self.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        granularity = ctypes.c_size_t(0)
        self._ok("cuMemGetAllocationGranularity",
                 self.lib.cuMemGetAllocationGranularity(ctypes.byref(granularity),
                                                        ctypes.byref(self.prop), 0))
        self.granularity = int(granularity.value)

    def _ok(self, name: str, status: int) -> None:
        if status != 0:
            raise ValidatorError(f"backend policy: CUDA driver call {name} failed "
                                 f"(CUresult {status})")

    def reserve(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64(0)
        self._ok("cuMemAddressReserve",
                 self.lib.cuMemAddressReserve(ctypes.byref(ptr), nbytes, 0, 0, 0))
        return int(ptr.value)

    def free_range(self, ptr: int, nbytes: int) -> None:
        self._ok("cuMemAddressFree", self.lib.cuMemAddressFree(ptr, nbytes))

    def create_and_map(self, ptr: int, nbytes: int) -> int | None:
        """Physical memory of ``nbytes`` mapped at ``ptr``: its handle, or None if out of
        memory."""
        handle = ctypes.c_uint64(0)
        status = self.lib.cuMemCreate(ctypes.byref(handle), nbytes, ctypes.byref(self.prop), 0)
        if status == self.CUDA_ERROR_OUT_OF_MEMORY:
            return None
        self._ok("cuMemCreate", status)
        self._ok("cuMemMap", self.lib.cuMemMap(ptr, nbytes, 0, handle.value, 0))
        self._ok("cuMemSetAccess",
                 self.lib.cuMemSetAccess(ptr, nbytes, ctypes.byref(self.access), 1))
        return int(handle.value)

    def unmap_and_release(self, ptr: int, nbytes: int, handle: int) -> None:
        self._ok("cuMemUnmap", self.lib.cuMemUnmap(ptr, nbytes))
        self._ok("cuMemRelease", self.lib.cuMemRelease(handle))


class CupyDevice:
    """The policies' ``DeviceMemory`` on a real GPU, for the ``policy`` backend.

    ``reserve`` is cudaMalloc (``cupy.cuda.runtime.malloc``), ``release`` cudaFree; the
    virtual-memory calls go to :class:`CudaVMM`, one physical handle per page of
    ``map_granularity`` so that any page-aligned piece can be unmapped later (cuMemUnmap takes
    whole mappings only). The profile's capacity is enforced the way the simulated device
    enforces it (granularity-rounded bytes held), so OOMs come at the same rule; a real
    out-of-memory is an OOM too. Measured reserved = the drop in cudaMemGetInfo's free bytes
    since :meth:`start`.
    """

    def __init__(self, cp: Any, profile: DeviceProfile,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.cp = cp
        self.rt = cp.cuda.runtime
        self.profile = profile
        self.capacity = profile.capacity
        self.map_granularity = profile.map_granularity
        self.granularity = profile.granularity
        self._clock = clock
        self.device_id = int(cp.cuda.runtime.getDevice())
        self.patterns = _GpuPatterns(cp)
        self._vmm: CudaVMM | None = None
        self.ranges = Spans()     # cudaMalloc'd: ptr -> (requested bytes, None)
        self.pages = Spans()      # mapped: page address -> (page bytes, handle)
        self.vranges = Spans()    # cuMemAddressReserve'd: ptr -> (bytes, None)
        self.held = 0              # granularity-rounded bytes, for the capacity rule
        self.calls = 0
        self.log = CallLog()
        self.event = -1
        self.problems: list[str] = []
        self.baseline_free = 0

    def start(self) -> None:
        self.rt.deviceSynchronize()
        self.baseline_free = int(self.rt.memGetInfo()[0])

    def _called(self, kind: str, nbytes: int, ok: bool, start_ns: int) -> None:
        self.calls += 1
        self.log.add(self.event, kind, nbytes, ok, self._clock() - start_ns)

    def _vmm_api(self) -> CudaVMM:
        if self._vmm is None:
            self._vmm = CudaVMM(self.device_id)
            if self.map_granularity % self._vmm.granularity:
                raise ValidatorError(
                    f"backend policy: the profile's map granularity "
                    f"{format_size(self.map_granularity)} is not a multiple of the device's "
                    f"{format_size(self._vmm.granularity)}")
        return self._vmm

    # -- cudaMalloc / cudaFree -------------------------------------------------------
    def reserve(self, nbytes: int) -> int | None:
        start = self._clock()
        taken = round_up(nbytes, self.granularity)
        if self.held + taken > self.capacity:
            self._called("malloc", nbytes, False, start)
            return None
        try:
            ptr = int(self.rt.malloc(nbytes))
        except self.rt.CUDARuntimeError as err:
            if err.status != CUDA_ERROR_MEMORY_ALLOCATION:
                raise
            self._called("malloc", nbytes, False, start)
            return None
        self._called("malloc", nbytes, True, start)
        self.ranges.add(ptr, nbytes, None)
        self.held += taken
        return ptr

    def release(self, base: int) -> None:
        start = self._clock()
        held = self.ranges.pop(base)
        if held is None:
            self.problems.append(f"release of 0x{base:x}, which is not a cudaMalloc'd base")
            self._called("free", 0, False, start)
            return
        self.rt.free(base)
        self._called("free", held[0], True, start)
        self.held -= round_up(held[0], self.granularity)

    # -- virtual memory --------------------------------------------------------------
    def address_range(self, nbytes: int) -> int:
        vmm = self._vmm_api()
        size = round_up(max(nbytes, 1), max(vmm.granularity, self.map_granularity))
        ptr = vmm.reserve(size)
        self.vranges.add(ptr, size, None)
        return ptr

    def map(self, address: int, nbytes: int) -> bool:
        if nbytes % self.map_granularity:
            # The policy's bug, not the user's: DeviceMemory.map takes whole pages.
            raise RuntimeError(f"map of {nbytes} bytes is not a multiple of the mapping "
                               f"granularity {self.map_granularity}")
        vmm = self._vmm_api()
        start = self._clock()
        if self.held + nbytes > self.capacity:
            self._called("map", nbytes, False, start)
            return False
        if self.vranges.pieces(address, nbytes, span_across=False) is None:
            # The driver would refuse (or worse): never map outside a reservation.
            self.problems.append(f"map of {format_size(nbytes)} at 0x{address:x} outside any "
                                 f"reserved address range (refused)")
            self._called("map", nbytes, False, start)
            return False
        done: list[int] = []
        for page in range(address, address + nbytes, self.map_granularity):
            if self.pages.containing(page) is not None:
                self.problems.append(f"page 0x{page:x} mapped twice (refused)")
                continue
            handle = vmm.create_and_map(page, self.map_granularity)
            if handle is None:      # really out of memory: undo this call's pages
                for mapped in done:
                    _, old = self.pages.pop(mapped)  # type: ignore[misc]
                    vmm.unmap_and_release(mapped, self.map_granularity, old)
                self._called("map", nbytes, False, start)
                return False
            self.pages.add(page, self.map_granularity, handle)
            done.append(page)
        self.held += len(done) * self.map_granularity
        self._called("map", nbytes, True, start)
        return True

    def unmap(self, address: int, nbytes: int) -> None:
        vmm = self._vmm_api()
        start = self._clock()
        for page in range(address, address + nbytes, self.map_granularity):
            held = self.pages.pop(page)
            if held is None:
                self.problems.append(f"unmap of page 0x{page:x}, which is not mapped")
                continue
            vmm.unmap_and_release(page, self.map_granularity, held[1])
            self.held -= self.map_granularity
        self._called("unmap", nbytes, True, start)

    # -- what the validator asks -----------------------------------------------------
    def _covered(self, address: int, size: int) -> bool:
        return (self.ranges.pieces(address, size, span_across=False) is not None
                or self.pages.pieces(address, size, span_across=True) is not None)

    def fill(self, address: int, size: int, key: int) -> bool:
        # Never write where this device holds nothing: a bad placement must not corrupt
        # another process's memory or crash the context.
        if not self._covered(address, size):
            return False
        self.patterns.fill(address, size, key)
        return True

    def check(self, address: int, size: int, key: int) -> int:
        if not self._covered(address, size):
            return -1
        return self.patterns.check(address, size, key)

    def measured_reserved(self) -> int:
        return self.baseline_free - int(self.rt.memGetInfo()[0])

    def close(self) -> None:
        """Give back everything still held (a broken policy may leave memory behind)."""
        self.rt.deviceSynchronize()
        for ptr, _ in self.ranges.items():
            self.rt.free(ptr)
        self.ranges = Spans()
        if self._vmm is not None:
            for page, (length, handle) in self.pages.items():
                self._vmm.unmap_and_release(page, length, handle)
            for ptr, (length, _) in self.vranges.items():
                self._vmm.free_range(ptr, length)
        self.pages = Spans()
        self.vranges = Spans()
        self.patterns.close()
