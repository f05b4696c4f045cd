"""Record a PyTorch program's CUDA allocations at full size, with no GPU and no memory.

``with allocsim.traces.record.torch.meta.record_cuda("run.npz", target="rtx4090-24g"):`` (or
``allocsim record --framework pytorch --target rtx4090-24g -o run.npz -- python train.py``) runs
an ordinary PyTorch program that puts its model and data on ``"cuda"``; every tensor meant for
``"cuda"`` is made on the ``meta`` device instead — real shapes, dtypes and strides, no data —
so a 1.3B-parameter training step runs on a laptop in seconds, and every storage the program's
CUDA tensors would hold is recorded, in program order:

- an *allocation* when an op's output has a storage not seen before: its
  ``untyped_storage().nbytes()`` (what PyTorch asks the caching allocator for), the current
  stream (:mod:`~allocsim.traces.record.torch.meta_cuda`) and a tag naming the module (a path
  such as ``GPT.blocks.3.attn.c_attn``, from global module hooks), the autograd node in the
  backward pass (``backward:MmBackward0``) or the optimizer step, and the ATen op
  (``aten.mm``); zero-byte storages are not recorded (the caching allocator is not called);
- a *free* when that storage goes (a weak reference's callback: the last tensor, view or saved
  activation holding it was released), with the size it was allocated with; a storage
  resized in place is freed and allocated again at its new size.

How "cuda" becomes meta (:class:`_Redirect`, a ``TorchFunctionMode``): a ``device=`` that
names CUDA, ``Tensor.to("cuda")``, ``.cuda()`` and ``Module.to/.cuda`` go to the backing device;
``tensor.device`` and ``tensor.is_cuda`` answer ``cuda:0`` / True for recorded tensors, so code
that builds tensors "on the input's device" or picks a CUDA path by the device (the optimizers'
``foreach`` default, ``torch.autocast(x.device.type)``) takes the path it takes on a GPU;
``torch.autocast("cuda")`` casts as CUDA's autocast does
(:mod:`~allocsim.traces.record.torch.meta_autocast`);
``torch.cuda`` and ``torch.accelerator`` answer as a GPU of the target would
(:class:`FakeCuda`, :class:`FakeAccelerator`), on the CPU build and on the CUDA build without a
driver alike. Where CUDA chooses
another kernel than the meta device (scaled-dot-product attention, the cuBLAS workspace) the
recording follows CUDA's choice for the target
(:mod:`~allocsim.traces.record.torch.meta_targets`); what is not modelled is listed in the
trace's ``metadata["not_modelled"]`` (``allocsim info`` shows it).

Reading values (``loss.item()``, ``if (x > 0).any():``, ``float(t)``, ``t.tolist()``,
``t.cpu()``, ``f"{loss:.3f}"``): the meta device has none. ``values="error"`` (default) stops
the program with one line naming its file and line; ``values="placeholder"`` answers zeros
(``0``, ``0.0``, ``False``, zero arrays/tensors on the host), so a data-dependent branch takes
the branch zero takes — say so when reading the result. Printing a tensor works either way
(``tensor(..., device='meta', size=(8, 1024))``).

``backing="cpu"`` runs the same redirection onto the CPU with real kernels and values: the
recording is then of CPU storages the program's "cuda" tensors hold, which is how the tests
hold the meta recording to a run that computes (:mod:`tests.test_torch_meta`).

Memory: the recorder keeps one weak reference per live storage and ``6 x 8`` bytes per event,
never a tensor's data.

Why meta and not fake CUDA tensors: on the CPU build, a ``FakeTensor`` whose device is CUDA
constructs, but the first op that needs a device guard aborts the process ("PyTorch is not
linked with support for cuda devices"). On a CUDA build with no driver (tried: torch
2.14.1+cu130, ``experiments/probe_fake_cuda.py``) forward ops make fake ``cuda:0`` tensors,
but ``backward()`` fails in the autograd engine ("hasPrimaryContext expects a valid device
index"), streams and the device's properties need the driver, ``autocast("cuda")`` turns
itself off and SDPA takes the math kernel. Meta tensors need no device.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
import weakref
from array import array
from typing import Any

import numpy as np

from allocsim.errors import UserInputError
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace
from allocsim.traces.record.recording_end import SavedOnce, finished, recorder_header, trace_name
from allocsim.traces.record.torch.meta_accelerator import FakeAccelerator
from allocsim.traces.record.torch.meta_cuda import FakeCuda
from allocsim.traces.record.torch.meta_targets import (
    Target,
    choose_sdpa_backend,
    choose_sdpa_backend_cpu,
    cublas_workspace_bytes,
    resolve_target,
)

__all__ = ["RECORDER", "TorchMetaRecorder", "ValueReadError", "record_cuda"]

RECORDER = "allocsim TorchMetaRecorder (meta device, TorchDispatchMode)"
_FIELDS = 6  # time, op, storage id, size, stream, tag
_CUBLAS_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot",
                         "vdot", "_addmm_activation"})
NOT_MODELLED = (
    "kernel-internal scratch that CUDA kernels allocate through the caching allocator and the "
    "meta kernels do not (cuDNN convolution workspaces, flash/efficient attention backward "
    "accumulators, sort and topk temporaries, NCCL buffers)",
    "cuBLASLt's own workspace (recent PyTorch shares the cuBLAS workspace with it when it fits)",
    "autocast's fp32_append_dtype overloads of norm (left to PyTorch's kernel, which casts "
    "nothing on meta)",
    "Tensor.record_stream: a storage's free is recorded when its last tensor goes, not when "
    "the streams that used it are done",
    "torch.compile and CUDA graphs (private memory pools)",
    "an output whose kernel makes it a view of a larger temporary: F.mse_loss with a "
    "reduction returns, on the CPU, a scalar whose storage is the whole unreduced buffer; its "
    "meta kernel allocates the scalar alone",
)


class ValueReadError(UserInputError):
    """The program read a value of a tensor that has none (recording on the meta device)."""


def _caller_line() -> str:
    """``file:line`` of the innermost frame that is neither torch's nor allocsim's."""
    frame = sys._getframe(1)
    torch_dir = os.sep + "torch" + os.sep
    here = os.path.dirname(os.path.abspath(__file__))
    while frame is not None:
        name = frame.f_code.co_filename
        if torch_dir not in name and not name.startswith(here) and "<frozen" not in name:
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>"


class _Ref(weakref.ref):
    """A recorded storage: what its free will carry."""

    __slots__ = ("bid", "key", "size", "stream", "tag")
    bid: int
    key: int
    size: int
    stream: int
    tag: int


class TorchMetaRecorder(SavedOnce):
    """Records the CUDA storages of the PyTorch program its with-block runs (module docstring).

    ``output``: trace file written on exit (None: keep in memory, see :attr:`trace`);
    ``target``: the GPU the recording stands for (``allocsim devices`` names; default
    a100-80g); ``backing``: ``"meta"`` (default) or ``"cpu"``; ``values``: ``"error"`` or
    ``"placeholder"``; ``kernels``: whose kernel choices a meta recording follows where they
    differ by device — ``"target"`` (default: CUDA's on the target: SDPA backend, cuBLAS
    workspace) or ``"cpu"`` (the CPU's SDPA choice and no workspace: the recording a CPU run
    of the program gives, for holding one to the other); ``prefer_cudnn``: put cuDNN
    attention first, as PyTorch does on sm90/sm100 with cuDNN > 9.15.0; ``metadata``: added
    to the trace's.
    """

    def __init__(self, output: str | os.PathLike[str] | None = None, *,
                 target: str | None = None, backing: str = "meta", values: str = "error",
                 kernels: str = "target", prefer_cudnn: bool = False,
                 metadata: dict[str, Any] | None = None) -> None:
        if backing not in ("meta", "cpu"):
            raise UserInputError(f"backing must be 'meta' or 'cpu', got {backing!r}")
        if values not in ("error", "placeholder"):
            raise UserInputError(f"values must be 'error' or 'placeholder', got {values!r}")
        self.claim(output)  # now: before the program runs (it may change folder)
        self.target: Target = resolve_target(target)
        self.backing = backing
        self.values = values
        if kernels not in ("target", "cpu"):
            raise UserInputError(f"kernels must be 'target' or 'cpu', got {kernels!r}")
        self.kernels = kernels
        # CUDA's choices are made on meta only: a CPU backing runs the CPU's own kernels.
        self.cuda_choices = backing == "meta" and kernels == "target"
        self.prefer_cudnn = prefer_cudnn
        self.metadata = dict(metadata or {})
        self.trace: Trace | None = None
        self._events = array("q")
        self._tags: list[str] = []
        self._tag_ids: dict[str, int] = {}
        self._live: dict[int, _Ref] = {}
        self._ids = itertools.count()
        self._live_bytes = 0
        self._peak_bytes = 0
        self._scope: list[str] = []
        self._module_names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._workspaces: set[tuple[str, int]] = set()
        self._sdpa_choices: dict[str, int] = {}
        self._autocast: Any = None
        self._paused = 0
        self._redirecting = 0
        self._t0 = time.perf_counter_ns()
        self._installed: list[Any] = []
        self._closed = False
        self.fake_cuda = FakeCuda(self.target, lambda: self._live_bytes,
                                  lambda: self._peak_bytes, self._reset_peak)
        self.fake_accelerator = FakeAccelerator()

    # ------------------------------------------------------------------ with-block
    def __enter__(self) -> TorchMetaRecorder:
        import torch
        import torch.nn.functional as functional
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        from allocsim.traces.record.torch.meta_modes import Record, Redirect

        self._torch = torch
        self._backing_device = torch.device(self.backing)
        self._t0 = time.perf_counter_ns()
        self.fake_cuda.install()
        self._installed.append(self.fake_cuda.uninstall)
        self.fake_accelerator.install()
        self._installed.append(self.fake_accelerator.uninstall)
        self._installed.append(_pin_as_is(torch))
        original_sdpa = functional.scaled_dot_product_attention
        if self.backing == "meta":
            functional.scaled_dot_product_attention = self._sdpa(original_sdpa)
            self._installed.append(
                lambda: setattr(functional, "scaled_dot_product_attention", original_sdpa))
        for handle in (nn_module.register_module_forward_pre_hook(self._enter_module),
                       nn_module.register_module_forward_hook(self._leave_module,
                                                              always_call=True),
                       optim.register_optimizer_step_pre_hook(self._enter_optimizer),
                       optim.register_optimizer_step_post_hook(self._leave_optimizer)):
            self._installed.append(handle.remove)
        if self.backing == "meta":
            from allocsim.traces.record.torch.meta_autocast import MetaAutocast
            self._autocast = MetaAutocast("cuda" if self.kernels == "target" else "cpu",
                                          self.is_device)
            self._autocast.install()
            self._installed.append(self._autocast.uninstall)
        redirect, record = Redirect(self), Record(self)
        redirect.__enter__()
        self._installed.append(lambda: redirect.__exit__(None, None, None))
        record.__enter__()
        self._installed.append(lambda: record.__exit__(None, None, None))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
        self.close()

    def stop(self) -> None:
        """Stop recording (modes, hooks and torch.cuda put back); idempotent."""
        while self._installed:
            undo = self._installed.pop()
            undo()
        self._live.clear()  # the weak references go: their callbacks never run

    # ------------------------------------------------------------------ bookkeeping
    def _tag(self, name: str) -> int:
        tag = self._tag_ids.get(name)
        if tag is None:
            tag = self._tag_ids[name] = len(self._tags)
            self._tags.append(name)
        return tag

    def _emit(self, op: int, bid: int, size: int, stream: int, tag: int) -> None:
        self._events.extend((time.perf_counter_ns() - self._t0, op, bid, size, stream, tag))
        if op == OP_ALLOC:
            self._live_bytes += size
            if self._live_bytes > self._peak_bytes:
                self._peak_bytes = self._live_bytes
        else:
            self._live_bytes -= size

    def _reset_peak(self) -> None:
        self._peak_bytes = self._live_bytes

    def _dead(self, ref: _Ref) -> None:
        """Weak-reference callback: the storage's last holder went."""
        if self._live.get(ref.key) is ref:
            del self._live[ref.key]
        self._emit(OP_FREE, ref.bid, ref.size, ref.stream, ref.tag)

    def scope(self) -> str:
        """Where the program is: a module path, the optimizer, the backward pass, or 'main'."""
        if self._scope:
            return self._scope[-1]
        node = self._torch._C._current_autograd_node()
        if node is not None:
            return f"backward:{node.name()}"
        return "main"

    def is_device(self, tensor: Any) -> bool:
        """Whether ``tensor`` is one of the program's "cuda" tensors."""
        if self.backing == "meta":
            return bool(tensor.is_meta)
        try:
            return tensor.untyped_storage()._cdata in self._live
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
            return False

    def track(self, storage: Any, op: str, stream: int) -> None:
        """Record ``storage`` (an op's output) unless it is already recorded."""
        key = storage._cdata
        ref = self._live.get(key)
        size = storage.nbytes()
        if ref is not None:
            if ref.size == size:
                return
            del self._live[key]  # resized in place: the old block goes, a new one comes
            self._emit(OP_FREE, ref.bid, ref.size, ref.stream, ref.tag)
        if size == 0:
            return
        tag = self._tag(f"{self.scope()}:{op}")
        ref = _Ref(storage, self._dead)
        ref.key, ref.size, ref.stream, ref.tag = key, size, stream, tag
        ref.bid = next(self._ids)
        self._live[key] = ref
        self._emit(OP_ALLOC, ref.bid, size, stream, tag)

    def after_op(self, op: str) -> None:
        """CUDA's own allocations after an op: the cuBLAS workspace of a stream's first GEMM."""
        if not self.cuda_choices or op not in _CUBLAS_OPS:
            return
        # The workspace map is keyed by (cuBLAS handle, stream), and a handle belongs to a
        # thread: CUDA's backward pass runs on the autograd engine's device thread, whose
        # handle takes a workspace of its own.
        stream = self.fake_cuda.current.stream_id
        thread = "autograd thread" if self._torch._C._current_autograd_node() is not None \
            else "main thread"
        if (thread, stream) in self._workspaces:
            return
        self._workspaces.add((thread, stream))
        size = cublas_workspace_bytes(self.target)
        self._emit(OP_ALLOC, next(self._ids), size, stream,
                   self._tag(f"cuBLAS workspace ({thread}, stream {stream}, kept until "
                             "empty_cache)"))

    # ------------------------------------------------------------------ module scopes
    def _enter_module(self, module: Any, args: Any) -> None:
        name = self._module_names.get(module)
        if name is None:
            root = type(module).__name__
            for sub_name, sub in module.named_modules():
                self._module_names.setdefault(sub, f"{root}.{sub_name}" if sub_name else root)
            name = self._module_names[module]
        self._scope.append(name)

    def _leave_module(self, module: Any, args: Any, output: Any) -> None:
        if self._scope:
            self._scope.pop()

    def _enter_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._scope.append(f"optimizer:{type(optimizer).__name__}.step")

    def _leave_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._scope:
            self._scope.pop()

    # ------------------------------------------------------------------ values
    def read_value(self, method: str, tensor: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
        """What ``tensor.<method>()`` gives when the tensor has no values (meta)."""
        torch = self._torch
        if self.values == "error":
            raise ValueReadError(
                f"{_caller_line()}: Tensor.{method}() reads the values of a 'cuda' tensor "
                f"(shape {tuple(tensor.shape)}, {str(tensor.dtype).replace('torch.', '')}); "
                "the meta recording computes none: record with values='placeholder' "
                "(--placeholder-values) to read zeros, or remove the read")
        zeros = np.zeros(tuple(tensor.shape), dtype=_numpy_dtype(tensor.dtype))
        if method == "numpy" or method == "__array__":
            return zeros
        if method == "tolist":
            return zeros.tolist()
        if method == "to_host":
            return torch.zeros(tuple(tensor.shape), dtype=tensor.dtype)
        zero = zeros.reshape(-1)[0].item() if zeros.size else 0
        if method == "__format__":
            return format(zero, args[0] if args else "")
        converters = {"__bool__": bool, "__int__": int, "__index__": int, "__float__": float,
                      "__complex__": complex}
        return converters[method](zero) if method in converters else zero

    # ------------------------------------------------------------------ SDPA
    def _sdpa(self, original: Any) -> Any:
        """``F.scaled_dot_product_attention`` taking the kernel CUDA takes on the target."""
        torch = self._torch
        aten = torch.ops.aten
        backends = torch.backends.cuda

        def scaled_dot_product_attention(query: Any, key: Any, value: Any,
                                         attn_mask: Any = None, dropout_p: float = 0.0,
                                         is_causal: bool = False, scale: float | None = None,
                                         enable_gqa: bool = False) -> Any:
            enabled = {"flash": backends.flash_sdp_enabled(),
                       "efficient": backends.mem_efficient_sdp_enabled(),
                       "math": backends.math_sdp_enabled(),
                       "cudnn": backends.cudnn_sdp_enabled()}
            autocast_type = "cuda" if self.cuda_choices else "cpu"
            if self._autocast is not None and torch.is_autocast_enabled(autocast_type):
                # scaled_dot_product_attention is on autocast's lower-precision list: the
                # inputs are cast before the backend is chosen
                lower = torch.get_autocast_dtype(autocast_type)
                query, key, value, attn_mask = (
                    self._autocast._cast(t, lower, lower) if t is not None else None
                    for t in (query, key, value, attn_mask))
            same_heads = query.dim() == 4 and query.size(1) == key.size(1) == value.size(1)
            backend = "math"
            on_device = all(self.is_device(t) for t in (query, key, value))
            if on_device and not self.cuda_choices:
                backend = choose_sdpa_backend_cpu(query, key, value, attn_mask=attn_mask,
                                                  dropout_p=dropout_p, enabled=enabled)
            elif on_device and (same_heads or not enable_gqa):
                backend = choose_sdpa_backend(self.target, query, key, value,
                                              attn_mask=attn_mask, is_causal=is_causal,
                                              enabled=enabled, prefer_cudnn=self.prefer_cudnn)
            self._sdpa_choices[backend] = self._sdpa_choices.get(backend, 0) + 1
            needs_grad = torch.is_grad_enabled() and any(
                t.requires_grad for t in (query, key, value))
            if backend == "flash_cpu":
                return aten._scaled_dot_product_flash_attention_for_cpu(
                    query, key, value, dropout_p, is_causal, attn_mask=attn_mask,
                    scale=scale)[0]
            if backend == "flash":
                return aten._scaled_dot_product_flash_attention(
                    query, key, value, dropout_p, is_causal, False, scale=scale)[0]
            if backend == "efficient":
                return aten._scaled_dot_product_efficient_attention(
                    query, key, value, attn_mask, needs_grad, dropout_p, is_causal,
                    scale=scale)[0]
            if backend == "cudnn":
                return aten._scaled_dot_product_cudnn_attention(
                    query, key, value, attn_mask, needs_grad, dropout_p, is_causal, False,
                    scale=scale)[0]
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

        return scaled_dot_product_attention

    # ------------------------------------------------------------------ results
    def __len__(self) -> int:
        return len(self._events) // _FIELDS

    @property
    def live_bytes(self) -> int:
        return self._live_bytes

    @property
    def peak_bytes(self) -> int:
        return self._peak_bytes

    def build_trace(self) -> Trace:
        """The trace so far (:func:`~allocsim.traces.record.recording_end.finished`)."""
        import torch
        rows = np.array(self._events, dtype=np.int64).reshape(-1, _FIELDS)
        target = self.target
        meta: dict[str, Any] = {
            **recorder_header(RECORDER, torch=torch.__version__),
            "framework": "pytorch", "backing": self.backing,
            "target": target.name, "target_card": target.card,
            "target_capability": f"sm_{target.capability[0]}{target.capability[1]}",
            "sizes": "untyped_storage().nbytes() of each new output storage (the caching "
                     "allocator's request); frees when the storage's last holder goes",
            "values": self.values,
            "kernels": self.kernels if self.backing == "meta" else "cpu (real CPU kernels)",
        }
        if self._sdpa_choices:
            meta["sdpa_backends"] = dict(self._sdpa_choices)
        if self.cuda_choices:
            meta["cublas_workspace_bytes"] = cublas_workspace_bytes(target)
            meta["cublas_workspaces"] = len(self._workspaces)
            meta["sdpa_prefer_cudnn"] = self.prefer_cudnn
        if self._autocast is not None and self._autocast.casts:
            meta["autocast_casts"] = self._autocast.casts
        meta["not_modelled"] = list(NOT_MODELLED)
        meta["peak_live_bytes"] = self._peak_bytes
        meta.update(self.metadata)
        return finished(Trace.from_columns(
            rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3], stream=rows[:, 4], tag=rows[:, 5],
            tags=list(self._tags), name=trace_name(self.output, "torch-meta"),
            source=self.output or "<torch meta recorder>", **meta))


def _pin_as_is(torch: Any) -> Any:
    """Make ``Tensor.pin_memory()`` return the tensor itself, in every thread; return the undo.

    Pinned memory is the CUDA host allocator's, not the device's, and pinning needs an
    accelerator (the CPU build has none) and a driver (the CUDA build here has none). The
    redirect mode answers it in the program's thread, but a DataLoader with workers pins in a
    thread of its own, which torch's modes do not reach (they are per thread).
    """
    tensor = torch.Tensor
    own = "pin_memory" in vars(tensor)
    original = vars(tensor).get("pin_memory")

    def pin_memory(self: Any, device: Any = None) -> Any:
        return self

    tensor.pin_memory = pin_memory

    def undo() -> None:
        if own:
            tensor.pin_memory = original
        else:
            del tensor.pin_memory

    return undo


def _numpy_dtype(dtype: Any) -> Any:
    import torch
    if dtype == torch.bool:
        return np.bool_
    if dtype.is_complex:
        return np.complex128
    if dtype.is_floating_point:
        return np.float64
    return np.int64


def record_cuda(output: str | os.PathLike[str] | None = None, **options: Any
                ) -> TorchMetaRecorder:
    """A recorder to use as ``with record_cuda("run.npz", target="a100-40g"): ...``; see
    :class:`TorchMetaRecorder` for the options."""
    return TorchMetaRecorder(output, **options)
