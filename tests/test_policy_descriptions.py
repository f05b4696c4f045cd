"""A policy describes itself (issue 38.2): its settings (``PARAMS``, read off its constructor),
its capacity claim and its twin in the native core (``native = NativeTwin(family, header)``
and the numbers :meth:`Policy.native_config` hands over) are declared in its own class, and
nothing else names it: the bridge (sim/kernel/native.py) asks the policy, the core dispatches
from its table of families (native/src/module.cpp). A new policy is its module, its native
header (optional: the Python model is the specification) and its tests.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import native_cases as cases
import pytest
from twin_files import NATIVE_SOURCES, twin_file

from allocsim.policies import POLICIES, parse_policy
from allocsim.policies.base import NativeTwin, native_twin_of
from allocsim.policies.on_demand import OnDemandAllocator
from allocsim.sim.kernel import native
from allocsim.sim.kernel.device import SimulatedDevice, resolve_device
from allocsim.sim.kernel.engine import replay

ROOT = Path(__file__).resolve().parent.parent
TWINS = {name: twin for name, cls in POLICIES.items()
         if (twin := native_twin_of(cls)) is not None}


def module_file(cls: type) -> str:
    """The policy's module as a path from the repository's root (policies/X.py)."""
    return Path(inspect.getfile(cls)).resolve().relative_to(ROOT).as_posix()


@pytest.mark.parametrize("name", sorted(TWINS))
def test_a_twin_is_the_header_that_mirrors_the_policys_module(name: str) -> None:
    header = NATIVE_SOURCES + TWINS[name].header
    assert (ROOT / header).is_file(), f"{name}: no {header}"
    assert header == twin_file(module_file(POLICIES[name])), (
        f"{name}: its module {module_file(POLICIES[name])} is mirrored by "
        f"{twin_file(module_file(POLICIES[name]))}, not {header}")


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_policy_is_native_exactly_when_its_class_declares_a_twin(name: str) -> None:
    assert native.is_native(parse_policy(name)) == (name in TWINS)


@pytest.mark.parametrize("name", sorted(TWINS))
def test_the_numbers_the_core_takes_are_the_policys_own(name: str) -> None:
    policy = parse_policy(name).build(SimulatedDevice(resolve_device(None)).view(0))
    config = policy.native_config()
    assert config is not None and config["family"] == TWINS[name].family


def test_the_core_has_exactly_the_families_the_policies_declare() -> None:
    cases.need_core()
    core = native.core()
    assert set(core.FAMILIES) == {twin.family for twin in TWINS.values()}


def test_every_native_policy_is_in_the_differential_cases() -> None:
    """tests/native_cases.py is where a native policy's settings are replayed by both twins."""
    covered = {spec.partition(":")[0] for spec in cases.NATIVE_SPECS}
    assert set(TWINS) <= covered, f"not in NATIVE_SPECS: {sorted(set(TWINS) - covered)}"


class OwnOnDemand(OnDemandAllocator):
    """A user's own policy, written in one module: OnDemand's rules, declared here with the
    twin that has them."""

    name = "own-on-demand"
    capacity_use = "limit-fatal"
    description = "cudaMalloc per request, declared in a module of its own"
    native = NativeTwin("on-demand", "on_demand.hpp", "every setting (its own class)")


def test_a_new_policy_is_its_module(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Registered and nothing else: the spec parses, the core replays it with the same answer
    as the Python model, and ``allocsim policies`` lists it among what the core replays."""
    monkeypatch.setitem(POLICIES, OwnOnDemand.name, OwnOnDemand)
    spec = parse_policy(OwnOnDemand.name)
    assert native.is_native(spec)
    assert native.native_settings()[OwnOnDemand.name] == "every setting (its own class)"
    from allocsim.sim.cli import main
    assert main(["policies"]) == 0
    assert f"    {OwnOnDemand.name:12s} every setting (its own class)" in capsys.readouterr().out
    cases.need_core()
    _, trace = next(cases.traces())
    device = resolve_device(None)
    ran = native.native_replay(trace, spec, device, stop_on_oom=False, progress=None,
                               timeline_points=64, step=1 << 18)
    assert ran is not None
    monkeypatch.setenv("ALLOCSIM_NATIVE", "0")
    python = replay(trace, spec, device)
    assert (python.peak_reserved, python.device_mallocs, python.policy_stats) == (
        ran.peak_reserved, ran.device_mallocs, ran.policy_stats)
