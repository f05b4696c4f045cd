"""PyTorch's PYTORCH_CUDA_ALLOC_CONF as the caching allocator's model reads it
(c10/core/AllocatorConfig.cpp, c10/cuda/CUDAAllocatorConfig.cpp), and the policy registry's
pytorch settings. The allocator's rules are tests/test_pytorch_caching.py's."""

from __future__ import annotations

import pytest
from policy_checks import small_device

from allocsim.policies import PolicySpecError, parse_policy
from allocsim.policies.pytorch.caching import parse_alloc_conf
from allocsim.policies.registry import alloc_conf_spec
from allocsim.sim.kernel.device import SimulatedDevice

MiB = 1 << 20


# -- PYTORCH_CUDA_ALLOC_CONF and the registry ----------------------------------------------
def test_alloc_conf_strings_become_registry_parameters() -> None:
    conf = parse_alloc_conf(
        "max_split_size_mb:128,expandable_segments:True,roundup_power2_divisions:[256:1,>:4]")
    assert conf == {"max_split_size_mb": "128", "expandable_segments": "true",
                    "roundup_power2_divisions": "[256:1;>:4]"}
    spec = parse_policy("pytorch:" + ",".join(f"{k}={v}" for k, v in conf.items()))
    policy = spec.build(SimulatedDevice(small_device()).view(0))
    assert policy.max_split_size == 128 * MiB and policy.expandable
    assert policy.divisions == [1] * 9 + [4] * 7
    assert parse_alloc_conf("PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6, "
                            "pinned_num_register_threads:8,backend:native") == {
        "garbage_collection_threshold": "0.6"}


@pytest.mark.parametrize("text", [
    "max_split_size_mbs:128", "max_split_size_mb:10", "expandable_segments:true",
    "backend:cudaMallocAsync", "garbage_collection_threshold:1.5", "roundup_power2_divisions:3",
    "max_split_size_mb", "max_split_size_mb:128;expandable_segments:True"])
def test_bad_alloc_conf_strings_raise_one_line(text: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_alloc_conf(text)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text", [
    "release_lock_on_cudamalloc:none", "pinned_use_cuda_host_register:none",
    "pinned_num_register_threads:none", "pinned_num_register_threads:1024",
    "pinned_num_register_threads:6", "pinned_reserve_segment_size_mb:0",
    "pinned_use_background_threads:true", "graph_capture_record_stream_reuse:1",
    "per_process_memory_fraction:1.5", "per_process_memory_fraction:-0.1",
    "per_process_memory_fraction:half",
    "throw_on_cudamalloc_oom:True", "expandable_segments_reserve:0.5",
    "expandable_segments_reserve_by_class:[capture:0.25]"])
def test_alloc_conf_values_pytorch_rejects_or_the_model_cannot_follow_are_refused(
        text: str) -> None:
    """The host-side keys are checked as CUDAAllocatorConfig.cpp checks them (toBool; a power of
    two no larger than 128 register threads; a positive reserve); a fraction outside [0, 1]; keys
    that change device memory in ways the model does not follow are refused by name."""
    with pytest.raises(ValueError) as err:
        parse_alloc_conf(text)
    assert "\n" not in str(err.value)
    key = text.split(":")[0]
    assert key in str(err.value)


def test_per_process_memory_fraction_in_the_conf_sets_the_policy_limit() -> None:
    """parsePerProcessMemoryFraction takes [0, 1]; setMemoryFraction keeps no limit at 1.0."""
    assert parse_alloc_conf("per_process_memory_fraction:0.5,pinned_num_register_threads:128,"
                            "pinned_free_catch_all:True") == {
        "per_process_memory_fraction": "0.5"}
    assert parse_alloc_conf("per_process_memory_fraction:1.0") == {}
    spec = parse_policy("pytorch:per_process_memory_fraction=0.5")
    policy = spec.build(SimulatedDevice(small_device()).view(0))
    assert policy.set_fraction and policy.allowed_memory_maximum == small_device().capacity // 2


def test_the_registry_builds_it_and_reports_bad_values() -> None:
    policy = parse_policy("pytorch:roundup_power2_divisions=[256:1;>:4],max_split_size_mb=64")
    assert policy.name == "pytorch"
    with pytest.raises(PolicySpecError):
        parse_policy("pytorch:max_split_size_mb=8").build(SimulatedDevice(small_device()).view(0))


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_fraction_of_zero_is_taken_as_pytorch_takes_it_every_allocation_fails(
        monkeypatch, native: str) -> None:
    """parsePerProcessMemoryFraction takes [0.0, 1.0]; setMemoryFraction(0.0) sets
    allowed_memory_maximum to 0 bytes, so alloc_block refuses every segment (issue 36, item
    18: refused before). Unset stays the whole device."""
    from allocsim.sim.kernel.engine import replay
    from allocsim.traces.model import Trace
    monkeypatch.setenv("ALLOCSIM_NATIVE", native)
    spec = alloc_conf_spec("per_process_memory_fraction:0.0")
    assert str(spec) == "pytorch:per_process_memory_fraction=0.0"
    policy = spec.build(SimulatedDevice(small_device()).view(0))
    assert policy.set_fraction and policy.allowed_memory_maximum == 0
    trace = Trace.from_events([(0, "alloc", 1, 512), (1, "free", 1, 512)])
    result = replay(trace, spec, small_device())
    assert not result.completed and result.ooms == 1 and result.peak_reserved == 0
    unset = parse_policy("pytorch").build(SimulatedDevice(small_device()).view(0))
    assert not unset.set_fraction
    assert replay(trace, parse_policy("pytorch"), small_device()).completed
