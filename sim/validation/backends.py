"""The validator's backends: each a way of replaying a trace for real, and the policy model its
measurements are compared with (:data:`BACKENDS`). How each runs:
:mod:`allocsim.sim.validation.host_device` (``host``),
:mod:`allocsim.sim.validation.tensorflow_backend` (``tensorflow``, on the CPU),
:mod:`allocsim.sim.validation.jax_backend` (``jax``, on a TPU),
:mod:`allocsim.sim.validation.gpu_backends` (the others)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    """One way of replaying a trace for real, and what it is compared with."""

    name: str
    description: str
    model: str | None      # the policy spec it is compared against; None = the user's policy
    exact: bool            # reserved bytes must agree byte for byte after every event
    gpu: bool


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("host", "the policy object on host memory (numpy buffers), pattern-checked",
            None, True, False),
    Backend("policy", "the policy object on a GPU through CuPy: cudaMalloc / CUDA virtual "
            "memory, pattern-checked, cudaMemGetInfo after every event", None, False, True),
    Backend("cupy-pool", "CuPy's MemoryPool vs the cupy model", "cupy", True, True),
    Backend("cupy-raw", "cudaMalloc/cudaFree per buffer (CuPy, no pool) vs on-demand",
            "on-demand", False, True),
    # MemoryAsyncPool.__init__ calls set_limit(), which with no CUPY_GPU_MEMORY_LIMIT sets the
    # release threshold to UINT64_MAX: the pool never shrinks (cupy/cuda/memory.pyx).
    Backend("cupy-async", "CuPy's MemoryAsyncPool (cudaMallocAsync) vs cuda-async with "
            "CuPy's never-release threshold", "cuda-async:release_threshold=8EiB", False, True),
    Backend("torch", "PyTorch's CUDA caching allocator vs the pytorch model", "pytorch", True,
            True),
    Backend("tensorflow", "TensorFlow's BFC allocator on the CPU (TF_CPU_ALLOCATOR_USE_BFC, "
            "a child process, its profile) vs the bfc model, call by call", "bfc", True, False),
    Backend("jax", "the TPU runtime through JAX (u8[n] arrays, a child process, its profile) "
            "vs the tpu model, record by record", "tpu", True, False),
)}
DEFAULT_BACKEND = "policy"
