"""Issue 26 item 3: the device's own share (the CUDA context and libraries).

A real GPU gives its CUDA context and libraries some hundreds of MiB before any allocator
starts (PyTorch's own test_out_of_memory_retry relies on it: two tensors of half the total
memory do not fit). The rules, as each framework's source applies them:

- XLA (openxla/xla xla/pjrt/gpu/gpu_helpers.cc, CreateBFCAllocator): ``allocator_memory =
  total_memory × memory_fraction``, the total from ``DeviceMemoryUsage`` — the fraction is of the
  whole card, context included; the BFC region is then cudaMalloc'd from what is free, backing
  off by 0.9 when refused (bfc_allocator.cc Extend).
- PyTorch (c10/cuda/CUDACachingAllocator.cpp, setMemoryFraction): ``allowed_memory_maximum =
  fraction × total`` (the device's total memory); cudaMalloc fails when the device has no more.
- The device: a cudaMalloc gets at most ``capacity − context − in use``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from allocsim.errors import UserInputError
from allocsim.policies import parse_policy
from allocsim.policies.bfc import BFCAllocator, backpedal_bytes
from allocsim.sim.cli.main import main
from allocsim.sim.kernel.device import PROFILES, DeviceProfile, SimulatedDevice
from allocsim.sim.kernel.engine import replay
from allocsim.sim.questions.capacity.minimum import min_capacity
from allocsim.traces import Trace, formats

MiB = 1 << 20
GiB = 1 << 30


def device(capacity: int, context: int) -> SimulatedDevice:
    return SimulatedDevice(DeviceProfile("t", capacity, context_bytes=context))


def test_a_cudamalloc_gets_what_the_context_leaves() -> None:
    view = device(GiB, 100 * MiB).view(0)
    assert view.reserve(GiB - 100 * MiB) is not None
    assert view.reserve(512) is None
    assert view.capacity == GiB              # what the allocators' fractions are of


def test_the_context_is_whole_granules_and_never_more_than_the_device() -> None:
    assert device(GiB, 1000).used == 1024    # 512 B granules
    assert device(GiB, 2 * GiB).used == GiB  # all of it: every cudaMalloc refused


def test_pytorch_half_and_half_does_not_fit_as_its_own_test_expects() -> None:
    """test_out_of_memory_retry: torch.empty(total/2) twice -> the second raises."""
    half = GiB // 2
    trace = Trace.from_events([(0, "alloc", 1, half), (1, "alloc", 2, half),
                               (2, "free", 1, None), (3, "free", 2, None)])
    assert not replay(trace, "pytorch", DeviceProfile("t", GiB, context_bytes=256 * MiB)).completed
    assert replay(trace, "pytorch", DeviceProfile("t", GiB, context_bytes=0)).completed


def test_xla_takes_its_fraction_of_the_total_and_backs_off_when_the_context_is_in_the_way() -> None:
    """fraction 1.0 preallocated on a 1000 MiB card with 200 MiB of context: the region of
    1000 MiB is refused, then 0.9 of it (900 MiB), then 810 MiB; 729 MiB fits."""
    view = device(1000 * MiB, 200 * MiB).view(0)
    view.log = []
    bfc = BFCAllocator(view, fraction=1.0, allow_growth=False)
    assert bfc.memory_limit == 1000 * MiB     # total × fraction: the context does not enter
    assert bfc.malloc(MiB) is not None
    asked = [c.nbytes for c in view.log]
    want = [1000 * MiB]
    while want[-1] > 800 * MiB:
        want.append(backpedal_bytes(want[-1]))
    assert asked == want
    assert [c.ok for c in view.log] == [False] * (len(want) - 1) + [True]
    assert bfc.pool_bytes == want[-1] <= 800 * MiB


def test_xla_default_fraction_does_not_see_a_small_context() -> None:
    view = device(1000 * MiB, 200 * MiB).view(0)
    bfc = BFCAllocator(view, fraction=0.75, allow_growth=False)
    assert bfc.malloc(MiB) is not None and bfc.pool_bytes == 750 * MiB


def test_pytorch_fraction_is_of_the_total() -> None:
    view = device(GiB, 100 * MiB).view(0)
    policy = parse_policy("pytorch:per_process_memory_fraction=0.5").build(view)
    assert policy.allowed_memory_maximum == GiB // 2    # type: ignore[attr-defined]


def test_min_capacity_includes_the_context() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 300 * MiB), (1, "free", 1, None)])
    base = replace(PROFILES["a100-80g"], context_bytes=0)
    with_share = replace(base, context_bytes=512 * MiB)
    spec = parse_policy("on-demand")
    without = min_capacity(trace, spec, base).min_capacity
    assert without is not None
    assert min_capacity(trace, spec, with_share).min_capacity == without + 512 * MiB


def test_every_built_in_profile_has_a_documented_context() -> None:
    for profile in PROFILES.values():
        assert 0 < profile.context_bytes < profile.capacity // 10
        # Measured only where a chip was at hand (the TPU v5e's runtime bytes).
        documented = "measured" if profile.name == "tpu-v5e" else "assumed"
        assert "context" in profile.source and documented in profile.source


def test_a_device_profile_file_reads_context_bytes(tmp_path: Path) -> None:
    assert DeviceProfile.from_dict({"name": "x", "capacity": GiB}).context_bytes == 0
    assert DeviceProfile.from_dict({"name": "x", "capacity": GiB,
                                    "context_bytes": MiB}).context_bytes == MiB
    with pytest.raises(UserInputError, match="context_bytes"):
        DeviceProfile.from_dict({"name": "x", "capacity": GiB, "context_bytes": -1})


def test_the_command_line_sets_it_and_min_capacity_moves_by_it(tmp_path: Path, capsys) -> None:
    path = tmp_path / "t.npz"
    formats.save(Trace.from_events([(0, "alloc", 1, 300 * MiB), (1, "free", 1, None)]), path)
    answers = {}
    for context in ("0", "512MiB"):
        assert main(["min-capacity", str(path), "--policies", "on-demand", "--device",
                     "a100-80g", "--context", context, "--json"]) == 0
        answers[context] = json.loads(capsys.readouterr().out)["answers"][0]["min_capacity"]
    assert answers["512MiB"] - answers["0"] == 512 * MiB
    assert answers["0"] == 300 * MiB


def test_an_explicit_capacity_comes_without_a_share_unless_one_is_given(capsys,
                                                                        tmp_path: Path) -> None:
    """--capacity is the memory the allocators may use (a 256 MiB device for a small trace
    keeps meaning that); --context adds a share; one that fills the device is one line."""
    path = tmp_path / "t.npz"
    formats.save(Trace.from_events([(0, "alloc", 1, 200 * MiB), (1, "free", 1, None)]), path)
    assert main(["compare", str(path), "--policies", "on-demand", "--capacity", "256MiB",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["completed"]
    assert main(["compare", str(path), "--policies", "on-demand", "--capacity", "256MiB",
                 "--context", "100MiB", "--json"]) == 0
    assert not json.loads(capsys.readouterr().out)["results"][0]["completed"]
    assert main(["compare", str(path), "--policies", "bfc", "--capacity", "256MiB",
                 "--context", "256MiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing is left for the allocators" in err


def test_compare_states_the_share_in_its_json_device_and_its_header(tmp_path: Path,
                                                                     capsys) -> None:
    """The share a run assumed is in results.json's device section and the text's device line
    (it was in neither: a reader could not tell the card's memory was not all the policies')."""
    path = tmp_path / "t.npz"
    formats.save(Trace.from_events([(0, "alloc", 1, 200 * MiB), (1, "free", 1, None)]), path)
    shares = {}
    for run, extra in enumerate(((), ("--context", "1GiB"), ("--capacity", "4GiB"))):
        out = tmp_path / f"run{run}"
        assert main(["compare", str(path), "--policies", "on-demand", "--device", "a100-80g",
                     *extra, "-o", str(out)]) == 0
        text = capsys.readouterr().out
        device_line = next(line for line in text.splitlines() if line.startswith("device "))
        results = json.loads((out / "results.json").read_text())
        shares[extra] = (results["device"]["context_bytes"], device_line)
    assert shares[()][0] == PROFILES["a100-80g"].context_bytes == 512 * MiB
    assert "of which 512.00MiB the CUDA context and libraries hold (assumed" in shares[()][1]
    assert shares[("--context", "1GiB")][0] == GiB
    assert "of which 1.00GiB the CUDA context" in shares[("--context", "1GiB")][1]
    assert shares[("--capacity", "4GiB")] == (0, "device a100-80g@4.00GiB: 4.00GiB")
