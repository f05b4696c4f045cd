"""Turn a policy spec string into a policy: ``"bfc:allow_growth=false,fraction=0.9"``.

A spec is ``NAME`` or ``NAME:key=value,key=value``. Values are typed by the policy's declared
:class:`~policies.base.Param` (sizes accept ``512MiB``; bools ``true/false/1/0/yes/no``).
Unknown names or parameters raise :class:`PolicySpecError` with one line listing what exists.
A parsed :class:`PolicySpec` is a value (hashable, printable back to a canonical string) and
builds a fresh policy for each run with :meth:`PolicySpec.build`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.base import DeviceMemory, Param, Policy
from policies.best_fit import BestFitAllocator
from policies.bfc import BFCAllocator, PreallocateAllocator
from policies.on_demand import OnDemandAllocator
from policies.units import format_size, parse_size

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (OnDemandAllocator, PreallocateAllocator, BestFitAllocator, BFCAllocator)
}
DEFAULT_POLICIES = ("on-demand", "preallocate", "best-fit", "bfc")


class PolicySpecError(ValueError):
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
            return int(text)
        if param.kind == "float":
            return float(text)
        return text
    except ValueError as err:
        raise PolicySpecError(f"policy {policy!r}: bad value {text!r} for {key} ({param.kind}): "
                              f"{err}") from None


def _show(param: Param, value: Any) -> str:
    if param.kind == "bool":
        return "true" if value else "false"
    if param.kind == "size" and value and value % (1 << 20) == 0:
        return format_size(value, 0) if value % (1 << 30) else f"{value >> 30}GiB"
    return str(value)


@dataclass(frozen=True)
class PolicySpec:
    """A policy name with its parameters (only those that differ from the defaults)."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def policy_class(self) -> type[Policy]:
        return POLICIES[self.name]

    def build(self, device: DeviceMemory) -> Policy:
        """A fresh policy drawing from ``device``."""
        try:
            return self.policy_class(device, **dict(self.params))
        except ValueError as err:
            raise PolicySpecError(f"policy {str(self)!r}: {err}") from None

    def __str__(self) -> str:
        if not self.params:
            return self.name
        declared = self.policy_class.PARAMS
        return self.name + ":" + ",".join(f"{k}={_show(declared[k], v)}" for k, v in self.params)


def parse_policy(spec: str | PolicySpec) -> PolicySpec:
    """Parse ``"NAME[:key=value,...]"``. Raises PolicySpecError with one clear line."""
    if isinstance(spec, PolicySpec):
        return spec
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if name not in POLICIES:
        raise PolicySpecError(f"unknown policy {name!r}; known policies: {', '.join(POLICIES)}")
    declared = POLICIES[name].PARAMS
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, equals, text = item.partition("=")
        key = key.strip()
        if not equals:
            raise PolicySpecError(f"policy {name!r}: expected key=value, got {item!r}")
        if key not in declared:
            known = ", ".join(declared) or "none"
            raise PolicySpecError(f"policy {name!r} has no parameter {key!r}; its parameters: {known}")
        values[key] = _coerce(name, key, declared[key], text)
    kept = tuple((k, values[k]) for k in declared if k in values and values[k] != declared[k].default)
    return PolicySpec(name, kept)


def describe_policies() -> str:
    """A readable list of policies and their parameters (for ``allocsim policies``)."""
    lines = []
    for name, cls in POLICIES.items():
        lines.append(f"{name:12s} {cls.description}")
        for key, param in cls.PARAMS.items():
            lines.append(f"    {key}={_show(param, param.default)}  ({param.kind}) {param.help}")
    return "\n".join(lines)
