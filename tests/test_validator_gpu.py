"""The validator on a real GPU (issue 5's Goal), on every bundled trace:

- CuPy's MemoryPool identical to the ``cupy`` model after every event (reserved and in use);
- PyTorch's caching allocator identical to the ``pytorch`` model after every event;
- the ``policy`` backend (the policy object on real memory) with zero pattern corruptions;
- on-demand's reserved bytes within the measured granularity of the device's real usage.

Marked ``gpu``: skipped in the normal suite; ``python -m pytest -m gpu`` runs them, and they
skip unless CuPy sees a CUDA device. Models not yet registered (cupy, cuda-async, pytorch) are
skipped, not failed. With ``ALLOCSIM_VALIDATION_OUT=DIR`` every report is also written there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from policy_checks import OverlapBFC, SameAddressBFC

from allocsim.policies import POLICIES, parse_policy
from allocsim.sim.validation.calibrate import calibrate
from allocsim.sim.validation.report import ValidationReport
from allocsim.sim.validation.validator import validate
from allocsim.traces import Trace, formats
from allocsim.traces.bundled import bundled_path

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
try:
    _DEVICES = int(cp.cuda.runtime.getDeviceCount())
except Exception:
    _DEVICES = 0
if _DEVICES < 1:
    pytest.skip("CuPy sees no CUDA device", allow_module_level=True)

MiB = 1 << 20
BUNDLED = sorted(bundled_path().parent.glob("*.npz"))
POLICY_SPECS = ("on-demand", "preallocate", "best-fit", "bfc", "pytorch",
                "pytorch:expandable_segments=true")


@pytest.fixture(scope="module", params=BUNDLED, ids=lambda p: p.stem)
def trace(request) -> Trace:
    return formats.load(request.param)


def needs_model(spec: str) -> None:
    try:
        parse_policy(spec)
    except ValueError:
        pytest.skip(f"policy {spec!r} is not registered yet")


def keep(report: ValidationReport) -> ValidationReport:
    out = os.environ.get("ALLOCSIM_VALIDATION_OUT")
    if out:
        report.write(Path(out) / "pytest")
    return report


def test_cupy_pool_is_identical_to_the_cupy_model(trace: Trace) -> None:
    needs_model("cupy")
    report = keep(validate(trace, None, "cupy-pool"))
    assert report.reserved_error.mismatched_events == 0, report.verdict()
    assert report.used_error is not None and report.used_error.mismatched_events == 0
    oom = report.metric("first OOM event")
    assert oom.simulated == oom.measured
    assert report.passed, report.verdict()


def test_cupy_pool_runs_out_at_the_same_event(trace: Trace) -> None:
    needs_model("cupy")
    capacity = max(64 * MiB, trace.peak_live()[0] // 2)
    report = keep(validate(trace, None, "cupy-pool", capacity=capacity))
    oom = report.metric("first OOM event")
    assert oom.simulated is not None and oom.simulated == oom.measured, report.verdict()
    assert report.passed, report.verdict()


def _torch_with_cuda() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    return torch


def test_torch_is_identical_to_the_pytorch_model(trace: Trace) -> None:
    _torch_with_cuda()
    needs_model("pytorch")
    report = keep(validate(trace, None, "torch"))
    assert report.reserved_error.mismatched_events == 0, report.verdict()
    assert report.used_error is not None and report.used_error.mismatched_events == 0
    assert report.passed, report.verdict()


def test_torch_runs_out_at_the_same_event(trace: Trace) -> None:
    _torch_with_cuda()
    needs_model("pytorch")
    capacity = max(64 * MiB, trace.peak_live()[0] // 2)
    report = keep(validate(trace, None, "torch", capacity=capacity))
    oom = report.metric("first OOM event")
    assert oom.simulated is not None and oom.simulated == oom.measured, report.verdict()


@pytest.mark.parametrize("spec", POLICY_SPECS)
def test_policy_backend_has_zero_corruptions(trace: Trace, spec: str) -> None:
    needs_model(spec)
    report = keep(validate(trace, spec, "policy"))
    assert report.blocks_checked > 0
    assert report.corruptions == 0, report.first_corruption
    oom = report.metric("first OOM event")
    assert oom.simulated == oom.measured
    assert report.passed, report.verdict()


@pytest.mark.parametrize("broken", [OverlapBFC, SameAddressBFC], ids=lambda c: c.name)
def test_policy_backend_catches_a_broken_policy_on_real_memory(trace: Trace, monkeypatch,
                                                               broken: type) -> None:
    # Safe on a real device: the validator never writes outside memory the policy holds.
    monkeypatch.setitem(POLICIES, broken.name, broken)
    report = validate(trace, broken.name, "policy")
    assert report.corruptions > 0 and not report.passed


def test_on_demand_is_within_the_measured_granularity(trace: Trace) -> None:
    # The simulated device must round like the real one: calibrate it first.
    profile = calibrate(sizes=(4096, MiB, 64 * MiB), repeats=3).profile
    report = keep(validate(trace, None, "cupy-raw", profile))
    check = next(c for c in report.checks if c.name == "reserved within granularity")
    assert check.ok, (check.detail, report.reserved_error)


def test_cupy_async_against_the_cuda_async_model(trace: Trace) -> None:
    needs_model("cuda-async")
    report = keep(validate(trace, None, "cupy-async"))
    oom = report.metric("first OOM event")
    assert oom.simulated == oom.measured, report.verdict()
    assert report.metric("device calls").measured > 0


def test_calibrate_measures_this_gpu(tmp_path) -> None:
    calibration = calibrate(sizes=(512, 64 << 10, MiB, 16 * MiB, 256 * MiB), repeats=3,
                            output=tmp_path / "gpu.json")
    profile = calibration.profile
    assert profile.capacity == int(cp.cuda.runtime.memGetInfo()[1])
    assert profile.granularity >= 512 and profile.granularity & (profile.granularity - 1) == 0
    assert profile.costs.malloc_base_s > 0 and profile.costs.free_base_s >= 0
    from allocsim.sim.kernel.device import resolve_device
    assert resolve_device(profile_file=tmp_path / "gpu.json") == profile
