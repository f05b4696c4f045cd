"""Allocator models: pure state machines over malloc/free that draw memory from a device.

Imports neither ``sim`` nor ``traces`` (DESIGN.md): the same policy object runs in the simulator
and, behind a CuPy-backed device, on a real GPU. Make one from a spec string with
:func:`parse_policy` and build it against a device with :meth:`PolicySpec.build`.
"""

from allocsim.policies.base import DeviceMemory, Param, Policy, PolicyStats
from allocsim.policies.registry import (
                               DEFAULT_POLICIES,
                               POLICIES,
                               PolicySpec,
                               PolicySpecError,
                               describe_policies,
                               parse_policy,
                               register,
)
from allocsim.policies.units import format_size, parse_size

__all__ = [
                               "DEFAULT_POLICIES",
                               "POLICIES",
                               "DeviceMemory",
                               "Param",
                               "Policy",
                               "PolicySpec",
                               "PolicySpecError",
                               "PolicyStats",
                               "describe_policies",
                               "format_size",
                               "parse_policy",
                               "parse_size",
                               "register",
]
