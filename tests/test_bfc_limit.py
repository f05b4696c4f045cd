"""BFC's Extend against its memory limit and the device's refusals (issue 16, item 12).

The rule, openxla/xla xla/tsl/framework/bfc_allocator.cc, BFCAllocator::Extend:
available = floor256(memory_limit_ − pool_bytes); fail if rounded > available; double
curr_region_allocation_bytes_ until it holds rounded; bytes = min(curr, available); on a
refusal back off ``bytes = RoundedBytes(bytes * kBackpedalFactor)`` (``static constexpr float
kBackpedalFactor = 0.9``: single precision) until accepted or below rounded. Current tsl backs
off on every refused Extend (no started_backpedal_, which TensorFlow's older copy had).
"""

from __future__ import annotations

from allocsim.policies.bfc import BFCAllocator, backpedal_bytes
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice

MiB = 1 << 20
GiB = 1 << 30


def test_backpedal_is_computed_in_single_precision() -> None:
    # 80 GiB + 256 → float 80 GiB (spacing 8192 at 2^36); × 0.9f = 77309409280 exactly, rounded
    # to float 77309411328 (= 72 GiB, spacing 8192), truncated; already a multiple of 256.
    # Double arithmetic would give round256(int(85899346176 × 0.9)) = 77309411584.
    assert backpedal_bytes(80 * GiB + 256) == 72 * GiB
    # Below 2^24 the float is exact: 8752384 × 0.9f = 7877145.39… → float 7877145.5 →
    # 7877145 → round256 7877376.
    assert backpedal_bytes(8752384) == 7877376


def test_extend_backs_off_in_single_precision_on_the_device() -> None:
    # Limit 80 GiB + 256, no growth: one region of round256(limit) at the first allocation.
    # A 72 GiB device refuses it; the float back-off asks for exactly 72 GiB, which fits.
    view = SimulatedDevice(DeviceProfile("t", 72 * GiB)).view(0)
    view.log = []
    bfc = BFCAllocator(view, memory_limit=80 * GiB + 256, allow_growth=False)
    assert bfc.malloc(MiB) is not None
    assert [(c.nbytes, c.ok) for c in view.log] == [(80 * GiB + 256, False), (72 * GiB, True)]
    assert bfc.pool_bytes == 72 * GiB


def test_every_refused_extend_backs_off() -> None:
    # A 16 MiB device (granularity 512), another process holding 8 MiB; BFC limit 16 MiB, no
    # growth, so curr = 16 MiB. First Extend: 16 MiB refused, back off 16777216 → 15099648 →
    # … → 8024832, which fits in the 8 MiB left; curr doubles to 32 MiB (it did not grow).
    device = SimulatedDevice(DeviceProfile("t", 16 * MiB))
    other, view = device.view(1), device.view(0)
    held = other.reserve(8 * MiB)
    assert held is not None
    view.log = []
    bfc = BFCAllocator(view, memory_limit=16 * MiB, allow_growth=False)
    assert bfc.malloc(MiB) is not None
    assert [c.nbytes for c in view.log if c.ok] == [8024832]
    assert len(view.log) == 8 and bfc.curr_region_allocation_bytes == 32 * MiB
    other.release(held)
    view.log = []
    # 7 MiB does not fit the 6976256 left: Extend with available = floor256(16 MiB − 8024832)
    # = 8752384; bytes = min(32 MiB, 8752384) = 8752384, which the device rounds to 8752640 >
    # the 8752128 free (16 MiB − round512(8024832)): refused. The second Extend backs off
    # again (no started_backpedal_ in tsl): 7877376 ≥ 7 MiB, accepted.
    assert bfc.malloc(7 * MiB) is not None
    assert [(c.nbytes, c.ok) for c in view.log] == [(8752384, False), (7877376, True)]
    assert bfc.pool_bytes == 8024832 + 7877376 and bfc.num_ooms == 0


def test_limit_of_whole_granules_takes_the_whole_limit() -> None:
    # Control: capacity 1 GiB (whole 512 B granules), fraction 1: one region of 1 GiB.
    view = SimulatedDevice(DeviceProfile("t", GiB)).view(0)
    bfc = BFCAllocator(view, fraction=1.0, allow_growth=False)
    assert bfc.malloc(GiB) is not None
    assert view.failed_mallocs == 0 and bfc.pool_bytes == GiB


def test_capacity_not_whole_granules_takes_the_whole_limit() -> None:
    # Fixed in the device (sim/kernel/device.py): its capacity is whole granules, so BFC's
    # fraction × capacity counts only memory a reserve can take.
    # Capacity 1 GiB + 256 (granularity 512), fraction 1, no growth: Extend asks for
    # floor256(1 GiB + 256) = 1 GiB + 256, which fits the memory; the device rounds it to
    # 1 GiB + 512 > capacity and refuses; the back-off (966368000) is below the 1 GiB asked,
    # so a 1 GiB allocation OOMs. A real device is whole pages, and cudaMalloc of any size that
    # fits in free memory succeeds: 1 GiB must be served, without a refused call.
    view = SimulatedDevice(DeviceProfile("t", GiB + 256)).view(0)
    bfc = BFCAllocator(view, fraction=1.0, allow_growth=False)
    assert bfc.malloc(GiB) is not None
    assert view.failed_mallocs == 0 and bfc.pool_bytes >= GiB
