"""Hand-worked cases for preallocate, best-fit and on-demand, and the policy registry."""

from __future__ import annotations

import pytest
from policy_checks import Referee, small_device

from allocsim.policies import PolicySpecError, describe_policies, parse_policy
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice

MiB = 1 << 20
GiB = 1 << 30


# -- preallocate -------------------------------------------------------------------------
def test_preallocate_takes_three_quarters_of_the_device_as_one_region_at_the_first_alloc() -> None:
    referee = Referee.of("preallocate", small_device(capacity=GiB))
    assert referee.view.reserved == 0
    referee.malloc(0, 1000)
    assert referee.view.holdings()[0][1] == 768 * MiB and len(referee.view.holdings()) == 1
    referee.malloc(1, 700 * MiB)
    assert referee.malloc(2, 100 * MiB) is None          # full: OOM, and it never grows
    assert referee.view.mallocs == 1 and referee.view.failed_mallocs == 0
    referee.check()


def test_preallocate_fraction_is_a_parameter() -> None:
    referee = Referee.of("preallocate:fraction=0.5", small_device(capacity=GiB))
    referee.malloc(0, 1)
    assert referee.view.reserved == 512 * MiB


def test_preallocate_backs_off_when_another_process_holds_the_memory() -> None:
    device = SimulatedDevice(DeviceProfile("d", GiB, granularity=256))
    assert device.view(1).reserve(768 * MiB) is not None       # the first JAX process
    policy = parse_policy("preallocate").build(device.view(0))
    assert policy.malloc(1) is not None
    assert device.view(0).reserved <= 256 * MiB                 # it got what back-off found
    assert device.view(0).failed_mallocs > 0


# -- best-fit ----------------------------------------------------------------------------
def test_best_fit_grows_by_whole_pages_counting_the_free_tail() -> None:
    referee = Referee.of("best-fit")
    referee.malloc(0, 100)                       # maps one 2 MiB page
    assert referee.view.reserved == 2 * MiB
    referee.malloc(1, 3 * MiB)                   # tail has 2 MiB − 256 free; needs one more page
    assert referee.view.reserved == 4 * MiB
    assert referee.view.mallocs == 2
    referee.check()


def test_best_fit_picks_the_smallest_hole_at_the_lowest_address() -> None:
    referee = Referee.of("best-fit")
    for ident, size in enumerate([4096, 256, 8192, 256, 4096, 256]):
        referee.malloc(ident, size)
    holes = {ident: referee.live[ident][0] for ident in (0, 2, 4)}
    for ident in (0, 2, 4):
        referee.free(ident)
    assert referee.malloc(10, 4000) == holes[0]
    assert referee.malloc(11, 5000) == holes[2]
    referee.check()


def test_best_fit_trim_unmaps_free_pages_at_the_top() -> None:
    referee = Referee.of("best-fit:trim=true")
    referee.malloc(0, 100)
    referee.malloc(1, 5 * MiB)
    assert referee.view.reserved == 6 * MiB
    referee.free(1)
    assert referee.view.reserved == 2 * MiB and referee.view.frees == 1
    referee.free(0)
    assert referee.view.reserved == 0
    referee.check()


# -- on-demand ---------------------------------------------------------------------------
def test_on_demand_makes_one_device_call_per_malloc_and_per_free() -> None:
    referee = Referee.of("on-demand")
    for ident in range(5):
        referee.malloc(ident, 1000)
    for ident in range(5):
        referee.free(ident)
    assert referee.view.mallocs == 5 and referee.view.frees == 5 and referee.view.reserved == 0


def test_on_demand_reserved_is_live_bytes_rounded_to_the_device_granularity() -> None:
    referee = Referee.of("on-demand", small_device(granularity=512))
    referee.malloc(0, 1000)
    referee.malloc(1, 1)
    assert referee.view.reserved == 1024 + 512


# -- registry ----------------------------------------------------------------------------
def test_spec_strings_parse_with_types_and_print_back_canonically() -> None:
    spec = parse_policy("bfc:allow_growth=false,fraction=0.9")
    assert spec.name == "bfc" and dict(spec.params) == {"allow_growth": False, "fraction": 0.9}
    assert str(spec) == "bfc:fraction=0.9,allow_growth=false"
    assert parse_policy(str(spec)) == spec
    assert dict(parse_policy("bfc:memory_limit=512MiB").params) == {"memory_limit": 512 * MiB}
    assert str(parse_policy("bfc:allow_growth=true")) == "bfc"      # defaults are dropped


@pytest.mark.parametrize("limit, printed", [
    (1597 * MiB, "1597MiB"), (2048 * MiB, "2GiB"), (1536 * MiB, "1536MiB"),
    (3 * 1024 * MiB, "3GiB"), (1 * MiB + 256, str(1 * MiB + 256)), (4097, "4097"),
    (80 * 1024 * MiB + MiB, "81921MiB")])
def test_a_printed_spec_holds_its_sizes_exactly_and_parses_back_to_the_same_spec(
        limit: int, printed: str) -> None:
    # str() used to round sizes to whole units (1597MiB printed as "2GiB"), so a spec copied
    # from a report ran with another limit.
    spec = parse_policy(f"bfc:memory_limit={limit}")
    assert str(spec) == f"bfc:memory_limit={printed}"
    assert parse_policy(str(spec)) == spec
    assert dict(parse_policy(str(spec)).params)["memory_limit"] == limit


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown policy 'nope'; known policies: on-demand, preallocate, best-fit, bfc"),
    ("bfc:colour=red", "policy 'bfc' has no parameter 'colour'; its parameters: memory_limit, "
                       "fraction, allow_growth, garbage_collection, fragmentation_fraction"),
    ("bfc:allow_growth=maybe", "bad value 'maybe' for allow_growth"),
    ("bfc:memory_limit=lots", "bad value 'lots' for memory_limit"),
    ("bfc:fraction", "expected key=value"),
])
def test_bad_specs_say_what_exists_in_one_line(spec: str, message: str) -> None:
    with pytest.raises(PolicySpecError) as caught:
        parse_policy(spec)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_bad_parameter_values_are_caught_when_built() -> None:
    with pytest.raises(PolicySpecError, match="fraction must be in"):
        parse_policy("bfc:fraction=1.5").build(SimulatedDevice(small_device()).view(0))


def test_every_policy_is_described() -> None:
    text = describe_policies()
    for name in ("on-demand", "preallocate", "best-fit", "bfc"):
        assert name in text


# -- presets -----------------------------------------------------------------------------
@pytest.mark.parametrize("preset, stands_for", [
    ("jax", "preallocate"),
    ("jax:fraction=0.5", "preallocate:fraction=0.5"),
    ("jax:preallocate=false", "bfc:fraction=0.75"),
    ("jax:allocator=platform", "on-demand"),
    # XLA's CreateCudaAsyncAllocator: preallocate reserves fraction × total up front and keeps
    # it; without preallocation the release threshold is 0 (issue 16a)
    ("jax:allocator=cuda_async", "cuda-async:fraction=0.75,preallocate=true"),
    ("jax:preallocate=false,allocator=cuda_async", "cuda-async"),
])
def test_jax_presets_map_onto_the_policies_jax_builds(preset: str, stands_for: str) -> None:
    spec = parse_policy(preset)
    assert str(spec) == preset and str(spec.resolved()) == stands_for
    policy = spec.build(SimulatedDevice(small_device()).view(0))
    assert type(policy) is parse_policy(stands_for).policy_class


def test_jax_without_preallocation_still_caps_memory_at_the_fraction() -> None:
    referee = Referee(parse_policy("jax:preallocate=false"), small_device(capacity=GiB))
    assert referee.malloc(0, 700 * MiB) is not None
    assert referee.malloc(1, 100 * MiB) is None       # 768 MiB limit: 700 + 100 does not fit
    assert referee.view.reserved == 768 * MiB           # growth stopped at the limit


def test_a_bad_preset_value_is_one_line() -> None:
    with pytest.raises(PolicySpecError, match="allocator must be bfc, platform or cuda_async"):
        parse_policy("jax:allocator=tpu")
