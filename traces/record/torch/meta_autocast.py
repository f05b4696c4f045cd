"""``torch.autocast`` for tensors on the meta device, as PyTorch's autocast kernels do it.

Autocast lives in dispatch keys (``AutocastCUDA``, ``AutocastCPU``) above autograd: when a
region is enabled, a listed op's floating-point tensor arguments are cast first, so autograd
records the casts (``ToCopyBackward0``), saves the cast copies for the backward pass and keeps
the fp32 gradient of a weight. A meta tensor carries neither key and is not "eligible"
(``is_autocast_eligible`` asks ``is_cuda()``), so on the meta device autocast casts nothing.
:class:`MetaAutocast` makes it: for the recording it includes the key in every dispatch (the
thread's included set; the key still only runs inside an enabled region, whose exclusion
``set_autocast_enabled`` lifts) and registers, for each listed op, a Python kernel on that key
that does what ``WrapFunction_`` does for the op's policy, with the recorder's "device
tensor" test as eligibility. Followed from ``aten/src/ATen/autocast_mode.{h,cpp}``:

Casts are made last argument first (the order GCC evaluates ``WrapFunction_``'s argument pack,
which is the order the real casts allocate in).

- ``lower_precision_fp``: every eligible tensor argument (lists too) cast to the region's dtype
  (``cached_cast``: a float32 leaf that requires grad and is not a view is cast once per region
  and the cast kept until the outermost region exits — ``torch.clear_autocast_cache``);
- ``fp32``: eligible arguments cast to float32;
- ``fp32_set_opt_dtype``: when the first argument is eligible and no ``dtype`` is given, the op
  runs with ``dtype=torch.float32``;
- ``promote``: eligible arguments cast to the widest type among them and the region's dtype.

``CUDA_TABLE`` is CUDA's lists (``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_PROMOTE``); ``CPU_TABLE`` is the CPU's
(``TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)``: its lower-precision and promote lists whole,
the ops of its fp32 list a training step meets), used to hold the mechanism to real CPU
autocast in the tests. ``norm``'s ``fp32_append_dtype`` overloads are left to PyTorch's own
kernel (which, for a meta tensor, casts nothing).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["CPU_TABLE", "CUDA_TABLE", "MetaAutocast"]

Table = tuple[tuple[str, str, str], ...]  # (op, overload, policy)


def _ops(policy: str, names: str) -> Table:
    rows = []
    for entry in names.split():
        op, _, overload = entry.partition(".")
        rows.append((op, overload or "default", policy))
    return tuple(rows)


CUDA_TABLE: Table = (
    _ops("lower_precision_fp", """_convolution.deprecated _convolution conv1d conv2d conv3d
        conv_tbc conv_transpose1d conv_transpose2d.input conv_transpose3d.input convolution
        prelu addmm addmv addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm
        chain_matmul linalg_multi_dot _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell
        gru_cell rnn_tanh_cell rnn_relu_cell _scaled_dot_product_flash_attention
        scaled_dot_product_attention cudnn_convolution cudnn_convolution_transpose""")
    + _ops("fp32", """acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt
        sinh tan pow.Tensor_Scalar pow.Tensor_Tensor pow.Scalar softplus layer_norm
        native_layer_norm group_norm frobenius_norm.dim nuclear_norm nuclear_norm.dim
        cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d
        hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss
        margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss
        multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp
        upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d
        _upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d
        upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d
        upsample_bicubic2d _upsample_bicubic2d_aa""")
    + _ops("fp32_set_opt_dtype", """prod prod.dim_int softmax.int log_softmax.int cumprod
        cumsum linalg_vector_norm linalg_matrix_norm linalg_matrix_norm.str_ord sum
        sum.dim_IntList""")
    + _ops("promote", """addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put
        tensordot scatter_add"""))

CPU_TABLE: Table = (
    _ops("lower_precision_fp", """conv1d conv1d.padding conv2d conv2d.padding conv3d
        conv3d.padding bmm mm linalg_vecdot baddbmm addmm _addmm_activation addbmm linear
        _convolution.deprecated matmul conv_tbc mkldnn_rnn_layer conv_transpose1d
        conv_transpose2d.input conv_transpose3d.input prelu scaled_dot_product_attention
        _native_multi_head_attention""")
    + _ops("fp32", """avg_pool3d binary_cross_entropy grid_sampler polar prod prod.dim_int
        cdist max_pool3d adaptive_avg_pool3d mse_loss cosine_embedding_loss nll_loss
        nll_loss2d hinge_embedding_loss poisson_nll_loss smooth_l1_loss cross_entropy_loss
        l1_loss huber_loss margin_ranking_loss soft_margin_loss triplet_margin_loss
        multi_margin_loss kl_div multilabel_margin_loss binary_cross_entropy_with_logits""")
    + _ops("promote", "stack cat index_copy"))


class MetaAutocast:
    """Autocast kernels for the recorder's device tensors on one autocast key while installed.

    ``device_type``: ``"cuda"`` (key ``AutocastCUDA``, :data:`CUDA_TABLE`) or ``"cpu"``
    (``AutocastCPU``, :data:`CPU_TABLE`); ``is_device``: the recorder's test of a tensor.
    """

    def __init__(self, device_type: str, is_device: Callable[[Any], bool]) -> None:
        self.device_type = device_type
        self.key = (torch._C.DispatchKey.AutocastCUDA if device_type == "cuda"
                    else torch._C.DispatchKey.AutocastCPU)
        self.table = CUDA_TABLE if device_type == "cuda" else CPU_TABLE
        self.is_device = is_device
        self.casts = 0
        self._cache: dict[int, tuple[weakref.ref[Any], Any]] = {}
        self._library: Any = None
        self._was_included = False
        self._saved_clear: Any = None

    # ------------------------------------------------------------------ install
    def install(self) -> None:
        self._library = torch.library.Library("aten", "IMPL")
        key_name = "AutocastCUDA" if self.device_type == "cuda" else "AutocastCPU"
        with warnings.catch_warnings():  # "Overriding a previously registered kernel"
            warnings.simplefilter("ignore")
            for op, overload, policy in self.table:
                packet = getattr(torch.ops.aten, op, None)
                target = getattr(packet, overload, None) if packet is not None else None
                if target is None:
                    continue
                name = op if overload == "default" else f"{op}.{overload}"
                self._library.impl(name, self._kernel(target, policy), key_name)
        self._was_included = torch._C._dispatch_tls_is_dispatch_key_included(self.key)
        torch._C._dispatch_tls_set_dispatch_key_included(self.key, True)
        self._saved_clear = torch.clear_autocast_cache
        saved = self._saved_clear

        def clear_autocast_cache() -> None:
            self._cache.clear()
            saved()

        torch.clear_autocast_cache = clear_autocast_cache

    def uninstall(self) -> None:
        torch._C._dispatch_tls_set_dispatch_key_included(self.key, self._was_included)
        if self._saved_clear is not None:
            torch.clear_autocast_cache = self._saved_clear
            self._saved_clear = None
        if self._library is not None:
            self._library._destroy()
            self._library = None
        self._cache.clear()

    # ------------------------------------------------------------------ the policies
    def _eligible(self, value: Any) -> bool:
        return (isinstance(value, torch.Tensor) and value.is_floating_point()
                and value.dtype != torch.float64 and self.is_device(value))

    def _cast(self, value: Any, to_type: Any, lower: Any) -> Any:
        """``cached_cast``: ``value`` (a tensor, or a list of them) as ``to_type``."""
        if isinstance(value, (list, tuple)):
            return type(value)(self._cast(v, to_type, lower) for v in value)
        if not self._eligible(value) or value.dtype == to_type:
            return value
        cacheable = (to_type == lower and value.dtype == torch.float32 and value.requires_grad
                     and value.is_leaf and not value._is_view()
                     and torch.is_autocast_cache_enabled())
        if cacheable:
            hit = self._cache.get(id(value))
            if hit is not None and hit[0]() is value:
                return hit[1]
        self.casts += 1
        cast = value.to(to_type)
        if cacheable:
            self._cache[id(value)] = (weakref.ref(value), cast)
        return cast

    def _kernel(self, op: Any, policy: str) -> Callable[..., Any]:
        key_set = torch._C.DispatchKeySet(self.key)
        device_type = self.device_type
        dtype_index = next((i for i, a in enumerate(op._schema.arguments)
                            if a.name == "dtype"), None)

        def kernel(*args: Any, **kwargs: Any) -> Any:
            lower = torch.get_autocast_dtype(device_type)
            with torch._C._ExcludeDispatchKeyGuard(key_set):
                if policy == "fp32_set_opt_dtype":
                    first = args[0] if args else None
                    given = kwargs.get("dtype") if dtype_index is None or \
                        len(args) <= dtype_index else args[dtype_index]
                    if self._eligible(first) and given is None:
                        if dtype_index is not None and len(args) > dtype_index:
                            args = (*args[:dtype_index], torch.float32,
                                    *args[dtype_index + 1:])
                        else:
                            kwargs = dict(kwargs, dtype=torch.float32)
                    return op(*args, **kwargs)
                if policy == "lower_precision_fp":
                    to_type = lower
                elif policy == "fp32":
                    to_type = torch.float32
                else:  # promote
                    to_type = lower
                    for value in (*args, *kwargs.values()):
                        for t in value if isinstance(value, (list, tuple)) else (value,):
                            if self._eligible(t):
                                to_type = torch.promote_types(to_type, t.dtype)
                # Last argument first: WrapFunction_ casts in a pack expansion of the call's
                # arguments, which GCC (PyTorch's Linux wheels) evaluates right to left; the
                # casts' allocations come in that order.
                cast_kwargs = {k: self._cast(kwargs[k], to_type, lower)
                               for k in reversed(list(kwargs))}
                cast_args = [self._cast(a, to_type, lower) for a in reversed(args)]
                return op(*reversed(cast_args), **cast_kwargs)

        return kernel
