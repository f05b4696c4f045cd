"""The GPU facts and helpers the GPU backends and calibration share.

Reaching a GPU (:func:`require_gpu` through CuPy, :func:`require_torch`), saying what it is
(:func:`gpu_facts`, :func:`torch_facts`: its name and the versions a report records; the
built-in profile of its kind, :func:`profile_for_gpu`) and how its memory is seen
(:func:`free_memory_profile`, :func:`probe_granularity`). CuPy and torch are imported only
inside these functions: importing this module never needs them.
"""

from __future__ import annotations

import platform
import re
import subprocess
from typing import Any

import numpy as np

from allocsim.sim.kernel.device import DeviceProfile, resolve_device
from allocsim.sim.validation.errors import NoGPUError, ValidatorError, one_line

MiB = 1 << 20
GiB = 1 << 30


def require_gpu(command: str = "allocsim validate",
                hint: str = " except with --backend host") -> Any:
    """CuPy, once it has been seen to reach a CUDA device; else NoGPUError (one line)."""
    try:
        import cupy
    except Exception as err:   # ImportError, or a broken CUDA install failing at import
        why = ("cupy is not installed" if isinstance(err, ImportError)
               else f"cupy failed to import: {one_line(err)}")
        raise NoGPUError(f"no CUDA GPU visible ({why}): {command} needs one{hint}") from None
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as err:
        raise NoGPUError(f"no CUDA GPU visible (cupy {getattr(cupy, '__version__', '?')}: "
                         f"{one_line(err)}): {command} needs one{hint}") from None
    if count < 1:
        raise NoGPUError(f"no CUDA GPU visible (cupy {getattr(cupy, '__version__', '?')} sees "
                         f"0 devices): {command} needs one{hint}")
    return cupy


def require_torch() -> Any:
    """torch, once it has been seen to reach a CUDA device; else a one-line error."""
    try:
        import torch
    except ImportError:
        raise ValidatorError("backend torch needs PyTorch with CUDA (torch is not installed)"
                             ) from None
    if not torch.cuda.is_available():
        raise NoGPUError(f"no CUDA GPU visible (torch {torch.__version__}: "
                         f"torch.cuda.is_available() is false): allocsim validate needs one "
                         f"except with --backend host")
    return torch


def cuda_version(number: int) -> str:
    return f"{number // 1000}.{number % 1000 // 10}"


def gpu_facts(cp: Any) -> tuple[str, dict[str, str]]:
    """The name of CuPy's current GPU and the versions a report records."""
    rt = cp.cuda.runtime
    device_id = int(rt.getDevice())
    name = rt.getDeviceProperties(device_id)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    versions = {"cupy": cp.__version__, "cuda_runtime": cuda_version(rt.runtimeGetVersion()),
                "cuda_driver_api": cuda_version(rt.driverGetVersion())}
    driver = nvidia_driver_version()
    if driver:
        versions["nvidia_driver"] = driver
    versions.update({"numpy": np.__version__, "python": platform.python_version()})
    return name, versions


def nvidia_driver_version() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it, or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return out.strip().splitlines()[0] if out.strip() else None
    except Exception:
        return None


def probe_granularity(rt: Any) -> int | None:
    """How cudaMemGetInfo moves for one cudaMalloc of 2 MiB + 1 byte, less the 2 MiB asked:
    the quantum in which the device's real usage is seen. None if it did not move."""
    rt.deviceSynchronize()
    before = int(rt.memGetInfo()[0])
    ptr = rt.malloc(2 * MiB + 1)
    after = int(rt.memGetInfo()[0])
    rt.free(ptr)
    moved = before - after
    if moved <= 0:
        return None
    return moved - 2 * MiB if moved > 2 * MiB + 1 else moved


_PROFILE_BY_GPU_NAME = (("h200", "h200-141g"), ("h100", "h100-80g"), ("a100", "a100-80g"),
                        ("4090", "rtx4090-24g"), ("t4", "t4-16g"))


def profile_for_gpu(name: str, total: int) -> DeviceProfile | None:
    """The built-in profile of the GPU called ``name`` (an A100 with under 60 GB is the 40 GB
    one), or None: so that a report does not say a100-80g when an H200 ran it."""
    lowered = name.lower()
    for needle, profile_name in _PROFILE_BY_GPU_NAME:
        if re.search(rf"\b{needle}\b", lowered):
            if profile_name == "a100-80g" and total < 60 * GiB:
                profile_name = "a100-40g"
            return resolve_device(profile_name)
    return None


def free_memory_profile(cp: Any, profile: DeviceProfile) -> DeviceProfile:
    """The simulated device for a GPU run without --capacity: ``profile`` with the memory
    free on CuPy's GPU right now (so both sides can run out at the same point)."""
    free = int(cp.cuda.runtime.memGetInfo()[0])
    return profile.device_with(free // profile.granularity * profile.granularity)


def default_gpu_profile(cp: Any) -> DeviceProfile | None:
    """The built-in profile of the GPU CuPy (``cp``; None: torch) sees, or None if there is
    none for its kind or it cannot be asked."""
    try:
        if cp is not None:
            rt = cp.cuda.runtime
            name = rt.getDeviceProperties(int(rt.getDevice()))["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
            return profile_for_gpu(name, int(rt.memGetInfo()[1]))
        import torch
        return profile_for_gpu(torch.cuda.get_device_name(),
                               int(torch.cuda.mem_get_info()[1]))
    except Exception:
        return None


def torch_free_memory_profile(profile: DeviceProfile) -> DeviceProfile:
    """:func:`free_memory_profile` for torch's current GPU."""
    torch = require_torch()
    free = int(torch.cuda.mem_get_info()[0])
    return profile.device_with(free // profile.granularity * profile.granularity)


def torch_facts(torch: Any) -> tuple[str, dict[str, str]]:
    """The name of torch's current GPU and the versions a report records."""
    name = torch.cuda.get_device_name(torch.cuda.current_device())
    versions = {"torch": torch.__version__, "torch_cuda": str(torch.version.cuda),
                "numpy": np.__version__, "python": platform.python_version()}
    driver = nvidia_driver_version()
    if driver:
        versions["nvidia_driver"] = driver
    return name, versions
