"""Record a function's allocations with the PyTorch profiler and save them as an allocsim trace.

Follows ``shared/reference/trace-formats.md`` ("PyTorch profiler chrome trace"): the function
runs under ``torch.profiler.profile(activities=[CPU(, CUDA)], profile_memory=True,
record_shapes=False, with_stack=False)``; the profiler's chrome trace is exported to a
temporary file and read by :mod:`allocsim.traces.formats.torch_profiler` (ops as tags, a
prologue for buffers allocated before profiling began), validated leniently and saved with
:func:`allocsim.traces.formats.save`. Works with CPU-only PyTorch. torch is imported only when
:func:`record_torch` runs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from allocsim.errors import UserInputError
from allocsim.traces.formats import save
from allocsim.traces.formats.torch_profiler import read_torch_profiler
from allocsim.traces.model import Trace
from allocsim.traces.validate import validate_recording

__all__ = ["RECORDER", "record_torch"]

RECORDER = "allocsim record_torch (torch.profiler, profile_memory=True)"


def record_torch(fn: Callable[..., Any], *args: Any, output: str | os.PathLike[str] | None,
                 device: str = "cpu", metadata: dict[str, Any] | None = None,
                 **kwargs: Any) -> Trace:
    """Run ``fn(*args, **kwargs)`` under the PyTorch profiler and return its allocation trace.

    ``device``: ``"cpu"`` records CPU allocations; ``"cuda"`` (the busiest CUDA device) or
    ``"cuda:N"`` records CUDA ones (the profiler then also traces CUDA activity). ``output``:
    where to save the trace (format from the extension), or None. ``metadata`` is added to
    the trace's (which names the recorder, the torch version and the function). Only what
    ``fn`` allocates or frees while it runs is recorded: tensors made before it and still
    alive after it are invisible, and frees of tensors made before it open prologue buffers.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    wanted = device.strip().lower()
    if wanted != "cpu" and not wanted.startswith("cuda"):
        raise UserInputError(f"device {device!r} is not 'cpu', 'cuda' or 'cuda:N'")
    activities = [ProfilerActivity.CPU]
    if wanted.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, profile_memory=True, record_shapes=False,
                 with_stack=False) as prof:
        fn(*args, **kwargs)
    with tempfile.TemporaryDirectory(prefix="allocsim-torch-") as folder:
        exported = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(exported))
        data = exported.read_bytes()

    function = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    name = Path(output).name.split(".")[0] if output is not None else fn.__name__
    trace = read_torch_profiler(data, f"<torch.profiler: {function}>", name,
                                device_index=wanted)
    trace.metadata.pop("profiler_trace_name", None)  # the temporary file's name: noise
    trace.metadata.update(recorder=RECORDER, torch=torch.__version__, function=function)
    trace.metadata["source"] = os.fspath(output) if output is not None else "memory"
    trace.metadata.update(metadata or {})
    trace, _ = validate_recording(trace)
    if output is not None:
        save(trace, output)
    return trace
