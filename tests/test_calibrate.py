"""allocsim calibrate's measurement with fake device calls (no GPU): the costs, granularity
and capacity it recovers, and the packing curves of small allocations.
"""

from __future__ import annotations

import json
import sys

import pytest

from allocsim.sim.kernel.device import DeviceProfile, resolve_device
from allocsim.sim.kernel.engine import replay
from allocsim.sim.validation.calibrate import (
    DeviceCalls,
    fit_linear,
    granularity_from_footprints,
    measure_packing,
    measure_profile,
)
from allocsim.sim.validation.errors import NoGPUError
from allocsim.traces import synth

MiB = 1 << 20
GiB = 1 << 30


# -- calibrate with fake device calls --------------------------------------------------


class FakeGPU:
    """Calls whose cost is exactly base + slope × GiB and whose memory moves in granules."""

    def __init__(self, total: int = 80 * GiB, granularity: int = 2 * MiB,
                 malloc: tuple[float, float] = (40e-6, 120e-6),
                 free: tuple[float, float] = (12e-6, 3e-6)) -> None:
        self.total, self.used, self.granularity = total, 0, granularity
        self.malloc_cost, self.free_cost = malloc, free
        self.now_ns = 0
        self.live: dict[int, int] = {}
        self.next = 1

    def clock(self) -> int:
        return self.now_ns

    def _spend(self, cost: tuple[float, float], size: int) -> None:
        self.now_ns += round((cost[0] + cost[1] * size / GiB) * 1e9)

    def malloc(self, size: int) -> int:
        taken = -(-size // self.granularity) * self.granularity
        if self.used + taken > self.total:
            raise MemoryError("fake out of memory")
        self._spend(self.malloc_cost, size)
        self.used += taken
        handle, self.next = self.next, self.next + 1
        self.live[handle] = (size, taken)
        return handle

    def free(self, handle: int) -> None:
        size, taken = self.live.pop(handle)
        self._spend(self.free_cost, size)
        self.used -= taken

    def mem_info(self) -> tuple[int, int]:
        return self.total - self.used, self.total

    def calls(self) -> DeviceCalls:
        return DeviceCalls(malloc=self.malloc, free=self.free, mem_info=self.mem_info,
                           clock_ns=self.clock, name="Fake GPU 80GB",
                           versions={"cuda_runtime": "12.4"})


def test_calibration_recovers_the_fakes_costs_and_granularity(tmp_path) -> None:
    fake = FakeGPU()
    calibration = measure_profile(fake.calls(), repeats=3, date="2026-01-01T00:00:00+00:00")
    profile = calibration.profile
    costs = profile.costs
    assert costs.malloc_base_s == pytest.approx(40e-6, rel=1e-3)
    assert costs.malloc_per_gib_s == pytest.approx(120e-6, rel=1e-3)
    assert costs.free_base_s == pytest.approx(12e-6, rel=1e-3)
    assert costs.free_per_gib_s == pytest.approx(3e-6, rel=1e-2)
    assert profile.granularity == 2 * MiB and profile.capacity == 80 * GiB
    assert "Fake GPU 80GB" in profile.source and "2026-01-01" in profile.source
    assert "calibrated" in costs.source and "least-squares" in costs.source
    assert not fake.live                                  # everything freed
    # The file is a device profile: DeviceProfile.from_dict and --device-profile read it.
    path = calibration.write(tmp_path / "gpu.json")
    again = DeviceProfile.from_dict(json.loads(path.read_text()))
    assert again == profile
    assert resolve_device(profile_file=path, capacity="1GiB").costs == profile.costs
    result = replay(synth.generate("training", steps=1, layers=1), "on-demand",
                    resolve_device(profile_file=path))
    assert result.device_mallocs > 0 and result.alloc_time_s > 0


def test_calibration_granularity_follows_the_device() -> None:
    for granularity in (512, 64 << 10, 2 * MiB):
        fake = FakeGPU(granularity=granularity)
        assert measure_profile(fake.calls(), sizes=(MiB,), repeats=1).profile.granularity \
            == granularity
    assert granularity_from_footprints({1: 2 * MiB, 512: 0}) is None   # small probes only
    assert granularity_from_footprints({2 * MiB + 1: 4 * MiB}) == 2 * MiB


def test_calibration_skips_sizes_that_do_not_fit() -> None:
    fake = FakeGPU(total=256 * MiB)
    calibration = measure_profile(fake.calls(), sizes=(MiB, 16 * MiB, GiB), repeats=2)
    assert [s.size for s in calibration.latencies] == [MiB, 16 * MiB]
    assert "skipped" in calibration.profile.costs.source


def test_fit_linear_is_least_squares() -> None:
    assert fit_linear([0, GiB, 2 * GiB], [1.0, 3.0, 5.0]) == pytest.approx((1.0, 2.0))
    base, slope = fit_linear([0, GiB, 2 * GiB], [1.0, 3.5, 5.0])
    assert (base, slope) == pytest.approx((1.0 + 0.5 / 3, 2.0))
    assert fit_linear([MiB], [4e-5]) == (4e-5, 0.0)


def test_calibrate_without_a_gpu_says_so(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(NoGPUError, match=r"allocsim calibrate needs one$"):
        from allocsim.sim.validation.calibrate import calibrate
        calibrate()


def test_packing_curves_show_how_small_allocations_share_pages() -> None:
    # A driver that packs allocations under 1 MiB into 2 MiB pages (4 KiB slots here) and gives
    # a page back when its last allocation goes; larger ones take whole 2 MiB granules.
    state = {"used": 0, "pages": {}, "next": 1}

    def malloc(size: int) -> tuple:
        if size < MiB:
            slot = -(-size // 4096) * 4096
            page = next((p for p, free in state["pages"].items() if free >= slot), None)
            if page is None:
                page, state["next"] = state["next"], state["next"] + 1
                state["pages"][page] = 2 * MiB
                state["used"] += 2 * MiB
            state["pages"][page] -= slot
            return ("small", page, slot)
        taken = -(-size // (2 * MiB)) * 2 * MiB
        state["used"] += taken
        return ("large", None, taken)

    def free(handle: tuple) -> None:
        kind, page, taken = handle
        if kind == "large":
            state["used"] -= taken
            return
        state["pages"][page] += taken
        if state["pages"][page] == 2 * MiB:
            del state["pages"][page]
            state["used"] -= 2 * MiB

    calls = DeviceCalls(malloc=malloc, free=free,
                        mem_info=lambda: (80 * GiB - state["used"], 80 * GiB))
    curves = measure_packing(calls, sizes=(512, 64 << 10, MiB), count=64)
    small = curves[512].as_dict()          # 64 × 4 KiB slots fit one page
    assert small["pages_taken"] == 1 and small["page_sizes"] == [2 * MiB]
    assert small["after_malloc"][0] == small["after_malloc"][-1] == 2 * MiB
    assert small["after_free"][-1] == small["left_after_freeing_all"] == 0
    assert curves[64 << 10].as_dict()["pages_taken"] == 2     # 32 per page
    large = curves[MiB].as_dict()                               # one granule each
    assert large["pages_taken"] == 64 and large["after_malloc"][-1] == 128 * MiB
    assert measure_packing(calls, sizes=(GiB,), count=64) == {}   # would not fit: left out
