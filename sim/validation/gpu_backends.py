"""The GPU backends of the validator: a trace replayed on a real GPU, measured after every event.

- ``policy``: the policy object drives a :class:`~allocsim.sim.validation.cuda_device.CupyDevice`
  (cudaMalloc, CUDA virtual memory), pattern-checked, cudaMemGetInfo after every event;
- ``cupy-pool``: CuPy's MemoryPool, ``used_bytes()``/``total_bytes()`` after every event;
- ``cupy-raw``: cudaMalloc/cudaFree per buffer;
- ``cupy-async``: CuPy's MemoryAsyncPool (cudaMallocAsync);
- ``torch``: ``torch.cuda.caching_allocator_alloc``/``_delete``, ``memory_reserved()`` and
  ``memory_allocated()`` after every event.

Each returns what it measured (:class:`~allocsim.sim.validation.measured.Measured`); what it is
compared with is :data:`~allocsim.sim.validation.backends.BACKENDS`'s. CuPy and torch are
imported only when a backend runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from allocsim.policies import PolicySpec
from allocsim.policies.settings.pytorch import ALLOC_CONF_VARIABLES
from allocsim.policies.units import round_up
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.validation.cuda_device import CUDA_ERROR_MEMORY_ALLOCATION, CupyDevice
from allocsim.sim.validation.errors import ValidatorError, one_line
from allocsim.sim.validation.gpu import (
    free_memory_profile,
    gpu_facts,
    probe_granularity,
    require_gpu,
    require_torch,
    torch_facts,
)
from allocsim.sim.validation.measured import CallLog, Measured, inferred_calls
from allocsim.sim.validation.replay import drive, replay_allocator
from allocsim.traces.model import Trace


def _stream_map(streams: Iterable[int], make: Callable[[], Any], default: Any) -> dict[int, Any]:
    """Trace stream ids -> real streams: the lowest on the default stream, others new."""
    ordered = sorted(set(streams))
    return {s: (default if index == 0 else make()) for index, s in enumerate(ordered)}


def run_policy(trace: Trace, spec: PolicySpec, profile: DeviceProfile,
               patterns: bool, capacity_given: bool) -> tuple[Measured, DeviceProfile]:
    """``policy``: the policy object of ``spec`` drives a CupyDevice. Without
    ``capacity_given`` the simulated device gets the memory free once the pattern kernels are
    in place: the profile used is returned with what was measured."""
    cp = require_gpu()
    device_name, versions = gpu_facts(cp)
    granularity = probe_granularity(cp.cuda.runtime)
    device = CupyDevice(cp, profile)
    try:
        if not capacity_given:
            # What is free once the pattern kernels and their counter are in place.
            profile = free_memory_profile(cp, profile)
            device.capacity = profile.capacity
        device.start()
        measured = drive(trace, spec, device, patterns=patterns)
    finally:
        device.close()
    measured.device_name, measured.versions = device_name, versions
    measured.granularity = granularity
    measured.notes.append("measured reserved = drop of cudaMemGetInfo's free bytes since the "
                          "start (the whole device: other processes' use shows up too)")
    if len(trace.streams()) > 1:
        measured.notes.append("the policy object sees the trace's stream ids; no real streams "
                              "are used by this backend")
    return measured, profile


def run_cupy_pool(trace: Trace, profile: DeviceProfile, capacity: int | None) -> Measured:
    """``cupy-pool``: CuPy's MemoryPool (limited to ``capacity`` if given), its device calls
    counted and timed through a PythonFunctionAllocator where this CuPy has one."""
    cp = require_gpu()
    rt = cp.cuda.runtime
    device_name, versions = gpu_facts(cp)
    log = CallLog()
    state = {"event": -1}

    # CuPy's pool calls its allocator for every device malloc and frees through the memory
    # object it returned: wrapping both counts and times every real cudaMalloc/cudaFree.
    def device_malloc(size: int, device_id: int) -> int:
        start = time.perf_counter_ns()
        try:
            ptr = int(rt.malloc(size))
        except rt.CUDARuntimeError:
            log.add(state["event"], "malloc", size, False, time.perf_counter_ns() - start)
            raise
        log.add(state["event"], "malloc", size, True, time.perf_counter_ns() - start)
        return ptr

    def device_free(ptr: int, device_id: int) -> None:
        start = time.perf_counter_ns()
        rt.free(ptr)
        log.add(state["event"], "free", 0, True, time.perf_counter_ns() - start)

    allocator = getattr(cp.cuda.memory, "PythonFunctionAllocator", None)
    notes = []
    if allocator is not None:
        pool = cp.cuda.MemoryPool(allocator(device_malloc, device_free).malloc)
        exact_calls = True
    else:
        pool = cp.cuda.MemoryPool()
        exact_calls = False
        notes.append("this CuPy has no PythonFunctionAllocator: device calls inferred from "
                     "changes of total_bytes(), untimed")
    if capacity is not None:
        pool.set_limit(size=capacity)
    streams = _stream_map(trace.streams(), lambda: cp.cuda.Stream(non_blocking=True),
                          cp.cuda.Stream.null)
    oom_error = cp.cuda.memory.OutOfMemoryError

    def alloc(size: int, stream: int) -> Any:
        with streams[stream]:
            try:
                return pool.malloc(size)
            except oom_error:
                return None

    measured = replay_allocator(trace, alloc, lambda handle: None,
                                reserved=pool.total_bytes, used=pool.used_bytes,
                                device_used=_mem_used(rt), state=state)
    pool.free_all_blocks()
    measured.calls = log.before(len(trace)) if exact_calls else inferred_calls(measured.reserved)
    measured.calls_exact = exact_calls
    measured.device_name, measured.versions = device_name, versions
    measured.notes += [*notes, "measured reserved = MemoryPool.total_bytes(), in use = "
                               "used_bytes(); device_used = cudaMemGetInfo"]
    return measured


def run_cupy_raw(trace: Trace, profile: DeviceProfile) -> Measured:
    """``cupy-raw``: one cudaMalloc/cudaFree per buffer, the profile's capacity enforced by
    the simulated device's rule."""
    cp = require_gpu()
    rt = cp.cuda.runtime
    device_name, versions = gpu_facts(cp)
    granularity = probe_granularity(rt)
    log = CallLog()
    state = {"event": -1, "held": 0}

    def alloc(size: int, stream: int) -> Any:
        start = time.perf_counter_ns()
        taken = round_up(size, profile.granularity)
        # CuPy with no pool has no limit: the profile's capacity is enforced here, by the
        # simulated device's rule, so a --capacity below the GPU's memory OOMs alike.
        if state["held"] + taken > profile.capacity:
            log.add(state["event"], "malloc", size, False, time.perf_counter_ns() - start)
            return None
        try:
            ptr = int(rt.malloc(size))
        except rt.CUDARuntimeError as err:
            if err.status != CUDA_ERROR_MEMORY_ALLOCATION:
                raise
            log.add(state["event"], "malloc", size, False, time.perf_counter_ns() - start)
            return None
        log.add(state["event"], "malloc", size, True, time.perf_counter_ns() - start)
        state["held"] += taken
        return (ptr, taken)

    def free(handle: Any) -> None:
        ptr, taken = handle
        start = time.perf_counter_ns()
        rt.free(ptr)
        log.add(state["event"], "free", taken, True, time.perf_counter_ns() - start)
        state["held"] -= taken

    used = _mem_used(rt)
    measured = replay_allocator(trace, alloc, free, reserved=used, used=None, device_used=None,
                                state=state)
    measured.calls = log.before(len(trace))
    measured.device_name, measured.versions = device_name, versions
    measured.granularity = granularity
    measured.notes.append("measured reserved = drop of cudaMemGetInfo's free bytes since the "
                          "start (the whole device: other processes' use shows up too)")
    return measured


def run_cupy_async(trace: Trace, profile: DeviceProfile, spec: PolicySpec) -> Measured:
    """``cupy-async``: CuPy's MemoryAsyncPool, synchronised as the ``cuda-async`` model
    ``spec`` says."""
    cp = require_gpu()
    rt = cp.cuda.runtime
    device_name, versions = gpu_facts(cp)
    try:
        pool = cp.cuda.MemoryAsyncPool()
    except Exception as err:
        raise ValidatorError(f"backend cupy-async: MemoryAsyncPool unavailable "
                             f"({one_line(err)})") from None
    pool.free_all_blocks()
    streams = _stream_map(trace.streams(), lambda: cp.cuda.Stream(non_blocking=True),
                          cp.cuda.Stream.null)
    oom_error = cp.cuda.memory.OutOfMemoryError
    state = {"event": -1}

    def alloc(size: int, stream: int) -> Any:
        with streams[stream]:
            try:
                return pool.malloc(size)
            except oom_error:
                return None

    # The cuda-async model says when the program synchronises (a trace records none):
    # sync=free (its default) after every free, sync=none never. The replay does the same.
    sync_after_free = dict(spec.resolved().params).get("sync", "free") == "free"
    measured = replay_allocator(trace, alloc, lambda handle: None, reserved=pool.total_bytes,
                                used=pool.used_bytes, device_used=_mem_used(rt), state=state,
                                after_free=rt.deviceSynchronize if sync_after_free else None)
    pool.free_all_blocks()
    measured.calls = inferred_calls(measured.reserved)
    measured.calls_exact = False
    measured.device_name, measured.versions = device_name, versions
    measured.notes += [
        "measured reserved = the pool's cudaMemPoolAttrReservedMemCurrent (total_bytes()), in "
        "use = UsedMemCurrent; the driver's pool is opaque, so device calls are inferred from "
        "changes of reserved and are untimed",
        ("the device is synchronised after every free (the model's sync=free), so the pool "
         "applies its release threshold then" if sync_after_free else
         "no synchronisation between events (the model's sync=none): memory freed "
         "asynchronously goes back only at the driver's own synchronisation points"),
        "MemoryAsyncPool's set_limit is a release threshold, not a limit: --capacity is not "
        "enforced on the real pool"]
    return measured


def run_torch(trace: Trace, profile: DeviceProfile, capacity: int | None) -> Measured:
    """``torch``: PyTorch's CUDA caching allocator (capped at ``capacity`` by
    set_per_process_memory_fraction if given), read through memory_reserved/allocated."""
    torch = require_torch()
    device = torch.cuda.current_device()
    name, versions = torch_facts(torch)
    conf = torch_alloc_conf()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    base_reserved = torch.cuda.memory_reserved(device)
    base_allocated = torch.cuda.memory_allocated(device)
    total = torch.cuda.mem_get_info(device)[1]
    if capacity is not None:
        # allowed = (size_t)(fraction × total): the half byte keeps truncation at capacity.
        torch.cuda.set_per_process_memory_fraction(min(1.0, (capacity + 0.5) / total), device)
    streams = _stream_map(trace.streams(), lambda: torch.cuda.Stream(device),
                          torch.cuda.current_stream(device))
    oom_error = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    state = {"event": -1}

    def alloc(size: int, stream: int) -> Any:
        try:
            return torch.cuda.caching_allocator_alloc(size, device, streams[stream])
        except oom_error:
            return None

    def free(ptr: Any) -> None:
        torch.cuda.caching_allocator_delete(ptr)

    stats_before = torch.cuda.memory_stats(device)
    stats_after: dict[str, Any] = {}
    try:
        measured = replay_allocator(
            trace, alloc, free,
            reserved=lambda: torch.cuda.memory_reserved(device) - base_reserved,
            used=lambda: torch.cuda.memory_allocated(device) - base_allocated,
            device_used=lambda: total - torch.cuda.mem_get_info(device)[0], state=state,
            timed=True,
            before_cleanup=lambda: stats_after.update(torch.cuda.memory_stats(device)))
    finally:
        if capacity is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()
    calls = measured.calls
    if "num_device_alloc" in stats_after:
        # Real counts from the allocator's own stats; the time is that of the events that
        # made them (an upper bound: it includes the allocator's bookkeeping).
        count = (stats_after["num_device_alloc"] - stats_before.get("num_device_alloc", 0)
                 + stats_after["num_device_free"] - stats_before.get("num_device_free", 0))
        inferred = inferred_calls(measured.reserved)
        measured.notes.append(f"device calls from memory_stats(): {count:,} "
                              f"(num_device_alloc + num_device_free)")
        if len(inferred) != count:
            measured.notes.append(f"{len(inferred):,} events moved memory_reserved()")
        measured.call_count = int(count)
    measured.calls = calls
    measured.calls_exact = False
    measured.device_name, measured.versions = name, versions
    measured.notes.append("measured reserved = torch.cuda.memory_reserved(), in use = "
                          "memory_allocated(); device-call time = wall time of the events "
                          "that changed memory_reserved() (an upper bound)")
    if conf:
        measured.notes.append(f"{conf[0]}={conf[1]}: the real allocator's settings (the "
                              f"pytorch model was given the same unless --policy said otherwise)")
    return measured


def _mem_used(rt: Any) -> Callable[[], int]:
    """Device bytes in use since now, from cudaMemGetInfo."""
    rt.deviceSynchronize()
    baseline = int(rt.memGetInfo()[0])
    return lambda: baseline - int(rt.memGetInfo()[0])


def torch_alloc_conf() -> tuple[str, str] | None:
    """The allocator settings PyTorch reads from this process's environment: (variable, value)
    of PYTORCH_ALLOC_CONF, else of the older PYTORCH_CUDA_ALLOC_CONF, else None."""
    for variable in ALLOC_CONF_VARIABLES:
        value = os.environ.get(variable, "").strip()
        if value:
            return variable, value
    return None

