"""Turn a policy spec string into a policy: ``"bfc:allow_growth=false,fraction=0.9"``.

A spec is ``NAME`` or ``NAME:key=value,key=value``. Values are typed by the policy's declared
:class:`~allocsim.policies.base.Param` (sizes accept ``512MiB``; bools ``true/false/1/0/yes/no``).
Unknown names or parameters raise :class:`PolicySpecError` with one line listing what exists.
A parsed :class:`PolicySpec` is a value (hashable, printable back to a canonical string) and
builds a fresh policy for each run with :meth:`PolicySpec.build`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from allocsim.ascii_numbers import decimal_number, whole_number
from allocsim.errors import UserInputError
from allocsim.policies.base import DeviceMemory, Param, Policy
from allocsim.policies.best_fit import BestFitAllocator
from allocsim.policies.bfc import BFCAllocator, PreallocateAllocator
from allocsim.policies.buddy import BuddyAllocator
from allocsim.policies.cuda_async import CudaAsyncAllocator
from allocsim.policies.cupy_pool import CuPyPoolAllocator
from allocsim.policies.on_demand import OnDemandAllocator
from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.policies.tpu import TpuRuntimeAllocator
from allocsim.policies.units import parse_size

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (OnDemandAllocator, PreallocateAllocator, BestFitAllocator, BFCAllocator,
                PyTorchCachingAllocator, CuPyPoolAllocator, CudaAsyncAllocator, BuddyAllocator,
                TpuRuntimeAllocator)
}
DEFAULT_POLICIES = ("on-demand", "preallocate", "best-fit", "bfc", "pytorch")

# Presets: names users know from their framework's settings, each mapping onto a policy above.
# A preset keeps its own name in reports ("jax:preallocate=false") and builds the policy it
# stands for, so it costs nothing on the hot path.
JAX_PARAMS = {
    "preallocate": Param("bool", True, "XLA_PYTHON_CLIENT_PREALLOCATE (default true)"),
    "fraction": Param("float", 0.75, "XLA_CLIENT_MEM_FRACTION / XLA_PYTHON_CLIENT_MEM_FRACTION"),
    "allocator": Param("str", "bfc", "XLA_PYTHON_CLIENT_ALLOCATOR: bfc | platform | cuda_async"),
}


def _jax_policy(params: dict[str, Any]) -> PolicySpec:
    """JAX on GPU (jaxlib/xla_client.py, xla/pjrt/gpu/gpu_helpers.cc; allocators.md §2):
    BFC with allow_growth = not preallocate and memory_limit = fraction × total memory;
    platform = no caching; cuda_async = the stream-ordered pool as XLA's
    CreateCudaAsyncAllocator (xla/pjrt/gpu/se_gpu_pjrt_client.cc) builds it: with preallocate
    (JAX's default) it reserves fraction × total up front and keeps that much at a sync
    (reserve_memory, reserve_memory_size = allocator_memory); without, nothing is reserved and
    the release threshold is 0."""
    allocator = params.get("allocator", "bfc")
    fraction = params.get("fraction", 0.75)
    if allocator in ("bfc", "default"):
        if params.get("preallocate", True):
            return parse_policy(f"preallocate:fraction={fraction}")
        return parse_policy(f"bfc:fraction={fraction}")
    if allocator == "platform":
        return parse_policy("on-demand")
    if allocator == "cuda_async":
        if params.get("preallocate", True):
            return parse_policy(f"cuda-async:fraction={fraction},preallocate=true")
        return parse_policy("cuda-async")
    raise PolicySpecError(f"preset 'jax': allocator must be bfc, platform or cuda_async, "
                          f"got {allocator!r}")


PRESETS: dict[str, tuple[dict[str, Param], Any, str]] = {
    "jax": (JAX_PARAMS, _jax_policy,
            "JAX's settings: jax (preallocate 75%), jax:preallocate=false, "
            "jax:allocator=platform, jax:allocator=cuda_async, jax:fraction=0.5"),
}


class PolicySpecError(UserInputError):
    """A policy spec names something that does not exist or has a bad value."""


def register(cls: type[Policy]) -> type[Policy]:
    """Add a policy class to the registry (usable as a class decorator)."""
    POLICIES[cls.name] = cls
    return cls


def _coerce(policy: str, key: str, param: Param, text: str) -> Any:
    try:
        if param.kind == "size":
            return parse_size(text)
        if param.kind == "bool":
            lowered = text.strip().lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if param.kind == "int":
            return whole_number(text.strip(), signed=True)
        if param.kind == "float":
            return decimal_number(text.strip())
        return text
    except ValueError as err:
        raise PolicySpecError(f"policy {policy!r}: bad value {text!r} for {key} ({param.kind}): "
                              f"{err}") from None


def _show(param: Param, value: Any) -> str:
    if value is None:
        return "unset"
    if param.kind == "bool":
        return "true" if value else "false"
    if param.kind == "size" and value and value % (1 << 20) == 0:
        # Exact, so that a printed spec parses back to the same spec (1597MiB is not "2GiB").
        return f"{value >> 30}GiB" if value % (1 << 30) == 0 else f"{value >> 20}MiB"
    return str(value)


@dataclass(frozen=True)
class PolicySpec:
    """A policy name with its parameters (only those that differ from the defaults)."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def policy_class(self) -> type[Policy]:
        return self.resolved().policy_class if self.name in PRESETS else POLICIES[self.name]

    def resolved(self) -> PolicySpec:
        """The policy a preset stands for (itself for a plain policy)."""
        if self.name in PRESETS:
            return PRESETS[self.name][1](dict(self.params))
        return self

    def build(self, device: DeviceMemory) -> Policy:
        """A fresh policy drawing from ``device``."""
        if self.name in PRESETS:
            return self.resolved().build(device)
        try:
            return self.policy_class(device, **dict(self.params))
        except ValueError as err:
            raise PolicySpecError(f"policy {str(self)!r}: {err}") from None

    def __str__(self) -> str:
        if not self.params:
            return self.name
        declared = _declared(self.name)
        return self.name + ":" + ",".join(f"{k}={_show(declared[k], v)}" for k, v in self.params)


def _split_params(text: str) -> list[str]:
    """Split ``a=1,b=[256:1,>:4]`` on the commas outside brackets (PyTorch's list syntax)."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(0, depth - 1)
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def alloc_conf_spec(text: str) -> PolicySpec:
    """The ``pytorch`` policy for a PYTORCH_CUDA_ALLOC_CONF string given as-is (its settings
    value's spec; the async backend, another allocator, is refused)."""
    from allocsim.policies.pytorch.settings import ASYNC_BACKEND_REFUSED
    from allocsim.policies.settings.pytorch import NATIVE, PyTorchSettings
    try:
        settings = PyTorchSettings.from_alloc_conf(text)
    except ValueError as err:
        raise PolicySpecError(str(err)) from None
    if settings.backend != NATIVE:
        raise PolicySpecError(ASYNC_BACKEND_REFUSED)
    return parse_policy(settings.spec())


def _declared(name: str) -> dict[str, Param]:
    return PRESETS[name][0] if name in PRESETS else POLICIES[name].PARAMS


def parse_policy(spec: str | PolicySpec) -> PolicySpec:
    """Parse ``"NAME[:key=value,...]"``. Raises PolicySpecError with one clear line."""
    if isinstance(spec, PolicySpec):
        return spec
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if name not in POLICIES and name not in PRESETS:
        known = ", ".join(list(POLICIES) + list(PRESETS))
        raise PolicySpecError(f"unknown policy {name!r}; known policies: {known}")
    declared = _declared(name)
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in _split_params(rest))):
        key, equals, text = item.partition("=")
        key = key.strip()
        if not equals:
            raise PolicySpecError(f"policy {name!r}: expected key=value, got {item!r}")
        if key not in declared:
            known = ", ".join(declared) or "none"
            raise PolicySpecError(f"policy {name!r} has no parameter {key!r}; "
                                  f"its parameters: {known}")
        if key in values:  # which one was meant? Neither is dropped silently.
            raise PolicySpecError(f"policy {name!r}: parameter {key!r} is given twice")
        values[key] = _coerce(name, key, declared[key], text)
    kept = tuple((k, values[k]) for k in declared
                 if k in values and values[k] != declared[k].default)
    spec = PolicySpec(name, kept)
    if name in PRESETS:
        spec.resolved()  # a preset's bad value fails here, with the preset's name
    return spec


def describe_policies() -> str:
    """A readable list of policies and their parameters (for ``allocsim policies``)."""
    lines = []
    for name, cls in POLICIES.items():
        lines.append(f"{name:12s} {cls.description}")
        for key, param in cls.PARAMS.items():
            lines.append(f"    {key}={_show(param, param.default)}  ({param.kind}) {param.help}")
    for name, (params, _, description) in PRESETS.items():
        lines.append(f"{name:12s} preset — {description}")
        for key, param in params.items():
            lines.append(f"    {key}={_show(param, param.default)}  ({param.kind}) {param.help}")
    return "\n".join(lines)
