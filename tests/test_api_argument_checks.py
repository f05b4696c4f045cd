"""The flat Python API checks each argument where it is given (issue 56, item 14).

``allocsim.load / device / replay / compare / min_capacity / tune`` refuse an argument of the
wrong type with a ``TypeError`` and one out of range with a ``ValueError`` (the
``UserInputError`` the command line prints); either is one line that starts with the
argument's name. Before these checks a number as a policy was an ``AttributeError``, a float
as a number of bytes a C++ ``std::bad_cast``, a granularity of 0 a ``ZeroDivisionError``, and
``max_slowdown=nan`` or a capacity of −1 ran. What was accepted before still is.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

import allocsim
from allocsim.errors import UserInputError
from allocsim.policies import PolicySpec, parse_policy
from allocsim.sim.kernel.device_profile import CostModel, DeviceProfile, resolve_device
from allocsim.traces.model import Trace

GiB = 1 << 30


@pytest.fixture(scope="module")
def trace() -> Trace:
    return allocsim.load("default")


def a_card(**fields: object) -> DeviceProfile:
    """The a100-40g profile with ``fields`` replaced, as a user might build one."""
    return dataclasses.replace(resolve_device("a100-40g"), **fields)  # type: ignore[arg-type]


def one_line_naming(err: pytest.ExceptionInfo[BaseException], name: str) -> str:
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{name}: "), message
    return message


# A number or None given as a policy, a device or a framework: AttributeError before.

@pytest.mark.parametrize("policy", [3, None, 1.5])
def test_a_number_or_none_as_a_policy_is_a_type_error_naming_policy(trace: Trace,
                                                                    policy: object) -> None:
    with pytest.raises(TypeError) as err:
        allocsim.replay(trace, policy, "a100-40g")  # type: ignore[arg-type]
    one_line_naming(err, "policy")
    with pytest.raises(TypeError) as err:
        allocsim.min_capacity(trace, policy, "a100-40g")  # type: ignore[arg-type]
    one_line_naming(err, "policy")


def test_a_number_among_compares_policies_is_a_type_error_naming_its_place(trace: Trace) -> None:
    with pytest.raises(TypeError) as err:
        allocsim.compare(trace, ["bfc", 3], "a100-40g")  # type: ignore[list-item]
    one_line_naming(err, "policies[1]")


@pytest.mark.parametrize("policies", ["bfc", 3, PolicySpec("bfc")])
def test_compares_policies_must_be_a_list_not_one_spec_or_a_number(trace: Trace,
                                                                   policies: object) -> None:
    # A string was read a letter at a time before: "unknown policy 'b'".
    with pytest.raises(TypeError) as err:
        allocsim.compare(trace, policies, "a100-40g")  # type: ignore[arg-type]
    one_line_naming(err, "policies")


@pytest.mark.parametrize("given", [3, 1.5, ["a100-40g"]])
def test_a_number_as_a_device_is_a_type_error_naming_device(trace: Trace, given: object) -> None:
    for call in (lambda: allocsim.replay(trace, "bfc", given),  # type: ignore[arg-type]
                 lambda: allocsim.compare(trace, ["bfc"], given),  # type: ignore[arg-type]
                 lambda: allocsim.min_capacity(trace, "bfc", given),  # type: ignore[arg-type]
                 lambda: allocsim.tune(trace, "pytorch", given)):  # type: ignore[arg-type]
        with pytest.raises(TypeError) as err:
            call()
        one_line_naming(err, "device")


def test_a_number_as_a_devices_name_is_a_type_error_naming_name() -> None:
    with pytest.raises(TypeError) as err:
        allocsim.device(40)  # type: ignore[arg-type]
    one_line_naming(err, "name")


@pytest.mark.parametrize("framework", [3, None])
def test_a_number_or_none_as_a_framework_is_a_type_error_naming_framework(
        trace: Trace, framework: object) -> None:
    with pytest.raises(TypeError) as err:
        allocsim.tune(trace, framework, "a100-40g")  # type: ignore[arg-type]
    one_line_naming(err, "framework")


def test_tunes_current_setting_and_seed_are_checked(trace: Trace) -> None:
    with pytest.raises(TypeError) as err:
        allocsim.tune(trace, "pytorch", "a100-40g", current=3)  # type: ignore[arg-type]
    one_line_naming(err, "current")
    with pytest.raises(TypeError) as err:
        allocsim.tune(trace, "pytorch", "a100-40g", seed=1.5)  # type: ignore[arg-type]
    one_line_naming(err, "seed")


def test_a_trace_or_path_of_the_wrong_type_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError) as err:
        allocsim.load(3)  # type: ignore[arg-type]
    one_line_naming(err, "path")
    with pytest.raises(TypeError) as err:
        allocsim.replay(None, "bfc")  # type: ignore[arg-type]
    one_line_naming(err, "trace")


def test_stop_on_oom_and_strict_are_true_or_false(trace: Trace) -> None:
    with pytest.raises(TypeError) as err:
        allocsim.replay(trace, "bfc", "a100-40g", stop_on_oom="yes")  # type: ignore[arg-type]
    one_line_naming(err, "stop_on_oom")
    with pytest.raises(TypeError) as err:
        allocsim.load("default", strict="yes")  # type: ignore[arg-type]
    one_line_naming(err, "strict")


# A float as a number of bytes: std::bad_cast before.

@pytest.mark.parametrize("resolution", [1.5, 1048576.0, True])
def test_a_float_or_a_bool_as_resolution_is_a_type_error_naming_resolution(
        trace: Trace, resolution: object) -> None:
    with pytest.raises(TypeError) as err:
        allocsim.min_capacity(trace, "bfc", "a100-40g",
                              resolution=resolution)  # type: ignore[arg-type]
    one_line_naming(err, "resolution")


@pytest.mark.parametrize("resolution", [0, -1, 1 << 70])
def test_a_resolution_out_of_range_is_a_value_error_naming_resolution(
        trace: Trace, resolution: int) -> None:
    with pytest.raises(ValueError) as err:
        allocsim.min_capacity(trace, "bfc", "a100-40g", resolution=resolution)
    one_line_naming(err, "resolution")


def test_a_float_as_a_profiles_capacity_is_a_type_error_naming_it(trace: Trace) -> None:
    with pytest.raises(TypeError) as err:
        allocsim.replay(trace, "bfc", a_card(capacity=1.5))
    one_line_naming(err, "device.capacity")


@pytest.mark.parametrize("capacity", [1.5, math.inf, math.nan])
def test_a_fraction_of_a_byte_as_devices_capacity_is_a_value_error_naming_capacity(
        capacity: float) -> None:
    # inf was an OverflowError before; 1.5 a message that did not say which argument.
    with pytest.raises(ValueError) as err:
        allocsim.device("a100-40g", capacity=capacity)  # type: ignore[arg-type]
    one_line_naming(err, "capacity")


def test_true_as_devices_capacity_is_a_type_error_naming_capacity() -> None:
    with pytest.raises(TypeError) as err:
        allocsim.device("a100-40g", capacity=True)
    one_line_naming(err, "capacity")


def test_text_that_is_no_size_as_devices_capacity_names_capacity() -> None:
    with pytest.raises(UserInputError) as err:
        allocsim.device("a100-40g", capacity="24 gigs")
    one_line_naming(err, "capacity")


# A granularity of 0: ZeroDivisionError before.

@pytest.mark.parametrize("field", ["granularity", "map_granularity"])
@pytest.mark.parametrize("value", [0, -512, 2 * GiB])
def test_a_profiles_granularity_out_of_range_is_a_value_error_naming_it(
        trace: Trace, field: str, value: int) -> None:
    with pytest.raises(ValueError) as err:
        allocsim.replay(trace, "bfc", a_card(**{field: value}))
    one_line_naming(err, f"device.{field}")


def test_a_float_granularity_is_a_type_error_naming_it(trace: Trace) -> None:
    with pytest.raises(TypeError) as err:
        allocsim.min_capacity(trace, "bfc", a_card(granularity=512.0))
    one_line_naming(err, "device.granularity")


# A capacity of −1, a share that fills the device, a negative or NaN cost: run before.

@pytest.mark.parametrize("capacity", [-1, 0, 1 << 70])
def test_a_profiles_capacity_out_of_range_is_a_value_error_naming_it(trace: Trace,
                                                                     capacity: int) -> None:
    with pytest.raises(ValueError) as err:
        allocsim.replay(trace, "bfc", a_card(capacity=capacity, context_bytes=0))
    one_line_naming(err, "device.capacity")


def test_devices_capacity_minus_one_is_a_value_error_naming_capacity() -> None:
    with pytest.raises(ValueError) as err:
        allocsim.device("a100-40g", capacity=-1)
    one_line_naming(err, "capacity")


@pytest.mark.parametrize("context", [-1, 40 * GiB])
def test_a_profiles_own_share_must_leave_the_allocators_something(trace: Trace,
                                                                  context: int) -> None:
    with pytest.raises(ValueError) as err:
        allocsim.replay(trace, "bfc", a_card(capacity=40 * GiB, context_bytes=context))
    one_line_naming(err, "device.context_bytes")


@pytest.mark.parametrize("seconds", [-1e-6, math.nan, math.inf])
def test_a_profiles_call_cost_must_be_seconds_from_zero(trace: Trace, seconds: float) -> None:
    with pytest.raises(ValueError) as err:
        allocsim.replay(trace, "bfc", a_card(costs=CostModel(malloc_base_s=seconds)))
    one_line_naming(err, "device.costs.malloc_base_s")


@pytest.mark.parametrize("budget", [math.nan, 0.5, -1])
def test_a_max_slowdown_that_is_nan_or_below_one_is_a_value_error_naming_it(
        trace: Trace, budget: float) -> None:
    with pytest.raises(ValueError) as err:
        allocsim.tune(trace, "pytorch", "a100-40g", max_slowdown=budget)
    one_line_naming(err, "max_slowdown")
    with pytest.raises(ValueError) as err:
        allocsim.compare(trace, ["bfc"], "a100-40g", max_slowdown=budget)
    one_line_naming(err, "max_slowdown")


@pytest.mark.parametrize("budget", ["1.1", True])
def test_a_max_slowdown_that_is_no_number_is_a_type_error_naming_it(trace: Trace,
                                                                    budget: object) -> None:
    with pytest.raises(TypeError) as err:
        allocsim.compare(trace, ["bfc"], "a100-40g", max_slowdown=budget)  # type: ignore[arg-type]
    one_line_naming(err, "max_slowdown")


def test_a_long_or_multiline_value_is_shown_on_one_short_line(trace: Trace) -> None:
    with pytest.raises(TypeError) as err:
        allocsim.replay(trace, np.zeros((40, 40)), "a100-40g")  # type: ignore[arg-type]
    assert len(one_line_naming(err, "policy")) < 200


# What was accepted before is accepted unchanged.

def test_a_policy_spec_a_profile_and_numpy_sizes_are_taken_as_before(trace: Trace) -> None:
    card = resolve_device("a100-40g")
    by_name = allocsim.replay(trace, "bfc:allow_growth=false", "a100-40g").to_json_dict()
    by_objects = allocsim.replay(trace, parse_policy("bfc:allow_growth=false"), card)
    assert by_objects.to_json_dict() == by_name
    resized = allocsim.device("a100-40g", capacity=np.int64(24 * GiB))
    assert resized == allocsim.device("a100-40g", capacity="24GiB")
    assert resized == allocsim.device("a100-40g", capacity=float(24 * GiB))
    assert (allocsim.replay(trace, "bfc", a_card(capacity=np.int64(24 * GiB), context_bytes=0))
            .to_json_dict() == allocsim.replay(trace, "bfc", resized).to_json_dict())
    assert (allocsim.min_capacity(trace, "bfc", card, resolution=np.int64(1 << 20)).to_json_dict()
            == allocsim.min_capacity(trace, "bfc", "a100-40g").to_json_dict())


def test_a_device_smaller_than_its_granularity_is_still_a_device(trace: Trace) -> None:
    # device(capacity=256) has always been taken (every policy runs out of memory on it).
    tiny = allocsim.device("a100-40g", capacity=256)
    assert not allocsim.replay(trace, "bfc", tiny).completed


def test_compare_takes_any_sequence_of_policies_and_inf_is_no_budget(trace: Trace) -> None:
    listed = allocsim.compare(trace, ["bfc", "best-fit"], "a100-40g", max_slowdown=None)
    as_tuple = allocsim.compare(trace, ("bfc", PolicySpec("best-fit")), "a100-40g",
                                max_slowdown=math.inf)
    assert as_tuple.to_json_dict() == listed.to_json_dict()


def test_a_path_object_is_a_profile_file(tmp_path: Path) -> None:
    profile = tmp_path / "card.json"
    profile.write_text('{"name": "card", "capacity": 17179869184}')
    assert allocsim.device(profile_file=profile).capacity == 16 * GiB
