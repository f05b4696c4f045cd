"""What CUDA would choose on a target GPU where the meta device chooses otherwise.

A program recorded on the ``meta`` device (:mod:`allocsim.traces.record.torch.meta`) runs
the meta kernels, which allocate each op's outputs exactly as CUDA would, but two choices CUDA
makes by the device are not the meta device's to make. This module holds the facts about the
target cards and the rules of those two choices, each followed from PyTorch's sources:

- **scaled-dot-product attention** (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``,
  ``select_sdp_backend``): the meta device always takes the *math* path (it materialises the
  ``B x H x Lq x Lk`` attention weights); CUDA tries flash attention, then memory-efficient
  attention, then math, and takes the first whose checks pass. :func:`choose_sdpa_backend`
  runs those checks: flash needs no ``attn_mask``, 4-D dense inputs with the last stride 1,
  equal head dims <= 256, fp16/bf16 (sm80+), sm80..sm121, no causal mask with
  ``Lq != Lk``, and on sm86/sm89 no gradients with head dim > 192; memory-efficient needs
  sm50+, fp16/bf16/fp32 (fp16/fp32 below sm80), equal q/k head dims divisible by the GEMM
  alignment (8 for 16-bit, 4 for fp32 on sm80+), storage offsets aligned. cuDNN attention,
  which PyTorch puts first on sm90/sm100 only with a runtime cuDNN newer than 9.15.0
  (``check_prefer_cudnn_attention``), is not chosen unless asked (``prefer_cudnn``):
  which cuDNN a user's wheel loads is not known here.
- **the cuBLAS workspace** (``aten/src/ATen/cuda/CublasHandlePool.cpp``,
  ``parseChosenWorkspaceSize`` / ``getNewWorkspace``): the first cuBLAS call of a handle on a
  stream takes a workspace from the caching allocator and keeps it (until ``empty_cache``);
  handles are per thread, and CUDA's backward pass runs on the autograd engine's device
  thread, so a training step takes two per stream (the recorder's ``after_op``): 32 MiB
  on sm90 (``:4096:8``), else 8 MiB + 128 KiB (``:4096:2:16:8``); ``CUBLAS_WORKSPACE_CONFIG``
  (``:SIZE_KiB:COUNT`` pairs) overrides both. The meta device runs no cuBLAS.

The target names are the simulator's device names (``allocsim devices``); their compute
capabilities are the cards' (NVIDIA CUDA GPUs list).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from allocsim.errors import UserInputError

__all__ = ["SDPA_BACKENDS", "TARGETS", "Target", "choose_sdpa_backend", "cublas_workspace_bytes",
           "resolve_target"]


@dataclass(frozen=True)
class Target:
    """A GPU the recording stands for: its name, card, compute capability and memory."""

    name: str
    card: str
    capability: tuple[int, int]
    total_memory: int  # bytes, as torch.cuda.get_device_properties reports it


def _mib(n: int) -> int:
    return n << 20


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("a100-40g", "NVIDIA A100-SXM4-40GB", (8, 0), _mib(40960)),
    Target("a100-80g", "NVIDIA A100-SXM4-80GB", (8, 0), _mib(81920)),
    Target("h100-80g", "NVIDIA H100 80GB HBM3", (9, 0), _mib(81559)),
    Target("h200-141g", "NVIDIA H200", (9, 0), _mib(143771)),
    Target("rtx4090-24g", "NVIDIA GeForce RTX 4090", (8, 9), _mib(24564)),
    Target("t4-16g", "Tesla T4", (7, 5), _mib(15360)),
)}
DEFAULT_TARGET = "a100-80g"
SDPA_BACKENDS = ("flash", "efficient", "math", "cudnn")


def resolve_target(name: str | None) -> Target:
    """The target called ``name`` (default a100-80g); an unknown name is a one-line error."""
    key = (name or DEFAULT_TARGET).lower()
    if key not in TARGETS:
        raise UserInputError(f"unknown target {name!r}; known targets: {', '.join(TARGETS)}")
    return TARGETS[key]


def cublas_workspace_bytes(target: Target, config: str | None = None) -> int:
    """Bytes of the cuBLAS workspace one stream takes on ``target`` (``parseChosenWorkspaceSize``:
    ``CUBLAS_WORKSPACE_CONFIG`` when set, from the environment by default)."""
    if config is None:
        config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    default = 4096 * 8 * 1024 if target.capability == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8
    if not config:
        return default
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    if not pairs:
        return default  # PyTorch warns and takes the default
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def _dense_last_stride_ok(*tensors: Any) -> bool:
    return all(t.stride(-1) == 1 or t.size(-1) == 1 for t in tensors)


def choose_sdpa_backend(target: Target, query: Any, key: Any, value: Any, *,
                        attn_mask: Any, is_causal: bool,
                        enabled: dict[str, bool], prefer_cudnn: bool = False) -> str:
    """The backend ``select_sdp_backend`` takes on ``target`` for these inputs: ``"flash"``,
    ``"efficient"``, ``"cudnn"`` or ``"math"`` (``enabled``: the ``torch.backends.cuda``
    switches; ``"error"`` when none passes, as PyTorch raises "No available kernel")."""
    import torch

    major, minor = target.capability
    order = ["cudnn", "flash", "efficient", "math"] if prefer_cudnn else \
        ["flash", "efficient", "math"]
    four_d = query.dim() == 4 and key.dim() == 4 and value.dim() == 4
    dtype = query.dtype
    half = dtype in (torch.float16, torch.bfloat16)
    d_q, d_k, d_v = query.size(-1), key.size(-1), value.size(-1)
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (query, key, value))
    nonzero = all(t.size(-2) > 0 for t in (query, key, value)) if four_d else False

    def flash() -> bool:
        if not (enabled["flash"] and four_d and attn_mask is None):
            return False
        if not (d_q == d_k == d_v and d_q <= 256):
            return False
        if not ((8, 0) <= (major, minor) <= (12, 1)):
            return False
        if (major, minor) in ((8, 6), (8, 9), (12, 0)) and needs_grad and d_q > 192:
            return False
        if is_causal and query.size(-2) != key.size(-2):
            return False
        ok_dtypes = (torch.float16, torch.bfloat16) if major >= 8 else (torch.float16,)
        return dtype in ok_dtypes and nonzero and _dense_last_stride_ok(query, key, value)

    def efficient() -> bool:
        if not (enabled["efficient"] and four_d and major >= 5):
            return False
        alignment = (8 if half else 4) if major >= 8 else (8 if half and major >= 7 else 1)
        if not (d_q == d_k and d_q % alignment == 0 and d_v % alignment == 0 and d_q > 0):
            return False
        if major >= 8:
            width = alignment * query.element_size()
            if any(t.storage_offset() * t.element_size() % width for t in (query, key, value)
                   if t.numel()):
                return False
        ok_dtypes = (torch.float16, torch.float32, torch.bfloat16) if major >= 8 else \
            (torch.float16, torch.float32)
        return (dtype in ok_dtypes and nonzero
                and all(t.stride(-1) == 1 for t in (query, key, value)))

    def cudnn() -> bool:
        return (enabled["cudnn"] and four_d and half and (8, 0) <= (major, minor) <= (12, 1)
                and nonzero and _dense_last_stride_ok(query, key, value))

    checks = {"flash": flash, "efficient": efficient, "cudnn": cudnn,
              "math": lambda: enabled["math"]}
    for backend in order:
        if checks[backend]():
            return backend
    return "error"


def choose_sdpa_backend_cpu(query: Any, key: Any, value: Any, *, attn_mask: Any,
                            dropout_p: float, enabled: dict[str, bool]) -> str:
    """The backend PyTorch's CPU path takes (``sdp_utils_cpp.cpp``, ``use_flash_attention_cpp``,
    order flash then math): ``"flash_cpu"`` for 4-D dense inputs of fp32/fp64/bf16/fp16 with
    equal head dims, no dropout, nonzero sequence lengths and last strides 1; else ``"math"``.
    A meta recording that follows it equals a CPU recording of the same program."""
    import torch

    if not enabled["flash"] or dropout_p > 0.0:
        return "math"
    if not (query.dim() == 4 and key.dim() == 4 and value.dim() == 4):
        return "math"
    if not query.size(-1) == key.size(-1) == value.size(-1):
        return "math"
    if any(t.size(-2) == 0 for t in (query, key, value)):
        return "math"
    if any(t.stride(-1) != 1 for t in (query, key, value)):
        return "math"
    if query.size(0) != key.size(0) or key.size(1) != value.size(1) or \
            query.size(1) % key.size(1):
        return "math"
    if query.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        return "math"
    return "flash_cpu"
