"""An independent referee for policies: drives one directly and recounts everything it claims.

It never reads the policy's internals to decide correctness: live blocks are what malloc
returned, memory held is what the device says the process holds. Beside that outside view it
runs the policy's own ``check()`` (its invariants, written next to the code that keeps them)
after every malloc and free it makes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from allocsim.policies import PolicySpec, parse_policy
from allocsim.policies.bfc import BFCAllocator
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice


def small_device(capacity: int = 1 << 30, granularity: int = 512) -> DeviceProfile:
    return DeviceProfile("test", capacity, granularity=granularity)


@dataclass
class Referee:
    spec: PolicySpec
    profile: DeviceProfile
    live: dict[int, tuple[int, int]] = field(default_factory=dict)   # id -> (address, size)
    ooms: int = 0

    def __post_init__(self) -> None:
        self.device = SimulatedDevice(self.profile)
        self.view = self.device.view(0)
        self.policy = self.spec.build(self.view)

    @classmethod
    def of(cls, spec: str, profile: DeviceProfile | None = None) -> Referee:
        return cls(parse_policy(spec), profile or small_device())

    def malloc(self, ident: int, size: int, stream: int = 0) -> int | None:
        address = self.policy.malloc(size, stream)
        if address is None:
            self.ooms += 1
        else:
            self.live[ident] = (address, size)
        self.policy.check()
        return address

    def free(self, ident: int) -> None:
        address, _ = self.live.pop(ident)
        self.policy.free(address)
        self.policy.check()

    def empty_cache(self) -> None:
        self.policy.empty_cache()
        self.policy.check()

    def check(self) -> None:
        """Every invariant a policy must keep, checked from the outside."""
        spans = sorted(self.live.values())
        for (a, sa), (b, _) in pairwise(spans):
            assert a + sa <= b, f"live blocks overlap: {a:#x}+{sa} > {b:#x}"
        holdings = self.view.holdings()
        for address, size in spans:
            assert any(base <= address and address + size <= base + n for base, n in holdings), \
                f"block {address:#x}+{size} lies outside memory held from the device"
        requested = sum(size for _, size in spans)
        assert self.view.reserved >= requested
        assert self.view.reserved == sum(n for _, n in holdings)
        blocks = list(self.policy.blocks())
        stats = self.policy.stats()
        in_use_blocks = [(a, s) for a, s, used in blocks if used]
        assert stats.bytes_in_use == sum(s for _, s in in_use_blocks) == self.policy.bytes_in_use
        assert stats.bytes_requested == requested
        assert sorted(a for a, _ in in_use_blocks) == sorted(a for a, _ in spans)
        for (_, size), (_, block) in zip(sorted(spans), sorted(in_use_blocks)):
            assert block >= size, "a block is smaller than its request"
        assert stats.num_allocs - stats.num_frees == len(spans)
        if self.spec.name != "on-demand":
            # The chunks tile exactly the memory held: no gaps, no overlaps, no strays.
            assert stats.pool_bytes <= self.view.reserved
            assert sum(s for _, s, _ in blocks) == stats.pool_bytes
            ordered = sorted((a, s) for a, s, _ in blocks)
            for (a, sa), (b, _) in pairwise(ordered):
                assert a + sa <= b
            for address, size in ordered:
                assert any(base <= address and address + size <= base + n for base, n in holdings)
            free_sizes = [s for _, s, used in blocks if not used]
            largest = max(free_sizes, default=0)
            assert stats.largest_free_block == largest

    def check_fully_coalesced(self) -> None:
        """After every free: no two neighbouring free blocks anywhere."""
        assert not self.live
        blocks = sorted(self.policy.blocks())
        assert all(not used for _, _, used in blocks)
        for (a, sa, _), (b, _, _) in pairwise(blocks):
            assert a + sa != b or self._different_regions(a, b), \
                f"free blocks {a:#x} and {b:#x} not merged"

    def _different_regions(self, a: int, b: int) -> bool:
        holdings = self.view.holdings()

        def region(x: int) -> int:
            return next(base for base, n in holdings if base <= x < base + n)

        return region(a) != region(b)


# -- shared random-workload drivers (every policy's invariant tests use these) ----------------
def workload_actions():
    """A hypothesis strategy: (alloc?, size, which live buffer to free) steps."""
    from hypothesis import strategies as st
    sizes = st.one_of(st.integers(1, 4096), st.integers(4096, 1 << 20),
                      st.integers(1 << 20, 24 << 20))
    return st.lists(st.tuples(st.booleans(), sizes, st.integers(0, 10**6)),
                    min_size=1, max_size=120)


def play_both(fast: Any, slow: Any, actions: Any) -> Iterator[int]:
    """Play ``actions`` ((is_alloc, size, pick) triples, as :func:`workload_actions` draws
    them) on two allocators that must decide alike — a fast path and its general path —
    asserting after every malloc that they handed out the same address; yields each step's
    index after it ran, for the caller's comparison of the two states."""
    live: list[tuple[int, int]] = []
    for step, (is_alloc, size, pick) in enumerate(actions):
        if is_alloc or not live:
            a, b = fast.malloc(size, 0), slow.malloc(size, 0)
            assert a == b
            if a is not None:
                live.append((a, b))
        else:
            a, b = live.pop(pick % len(live))
            fast.free(a)
            slow.free(b)
        yield step


def play(referee: Referee, actions) -> None:
    """Run the steps, check every invariant after each, free everything, check coalescing."""
    next_id = 0
    for is_alloc, size, pick in actions:
        if is_alloc or not referee.live:
            referee.malloc(next_id, size)
            next_id += 1
        else:
            referee.free(sorted(referee.live)[pick % len(referee.live)])
        referee.check()
    for ident in sorted(referee.live):
        referee.free(ident)
        referee.check()
    referee.check_fully_coalesced()


def exhaust(referee: Referee, count: int = 40, size: int = 3 << 20) -> None:
    """Allocate until the device is exhausted (checking as it goes), then free everything."""
    for ident in range(count):
        referee.malloc(ident, size)
        referee.check()
    assert referee.ooms > 0
    assert referee.view.reserved <= referee.profile.capacity
    for ident in sorted(referee.live):
        referee.free(ident)
    referee.check_fully_coalesced()


# -- deliberately broken policies (the validator must catch them) -----------------------------
class SameAddressBFC(BFCAllocator):
    """BFC underneath, but every block is reported at the first address it ever gave."""

    name = "broken-same-address"

    def __init__(self, device: Any, **params: Any) -> None:
        super().__init__(device, **params)
        self.first: int | None = None
        self.real: list[int] = []

    def malloc(self, size: int, stream: int = 0) -> int | None:
        address = super().malloc(size, stream)
        if address is None:
            return None
        self.real.append(address)
        if self.first is None:
            self.first = address
        return self.first

    def free(self, address: int) -> None:
        super().free(self.real.pop())


class OverlapBFC(BFCAllocator):
    """BFC underneath, but every second block is reported 256 bytes below where BFC put it,
    into the tail of the block under it (shifting every block alike would overlap nothing)."""

    name = "broken-overlap"

    def __init__(self, device: Any, **params: Any) -> None:
        super().__init__(device, **params)
        self.count = 0
        self.real: dict[int, list[int]] = {}

    def malloc(self, size: int, stream: int = 0) -> int | None:
        address = super().malloc(size, stream)
        if address is None:
            return None
        self.count += 1
        shown = address - 256 if self.count % 2 == 0 else address
        self.real.setdefault(shown, []).append(address)
        return shown

    def free(self, address: int) -> None:
        reals = self.real[address]
        super().free(reals.pop())
        if not reals:
            del self.real[address]


def build(cls: type, capacity: int = 1 << 30, **params: Any) -> tuple[Any, Any]:
    """A policy of class ``cls`` on a fresh device of ``capacity``: ``(policy, device view)``."""
    view = SimulatedDevice(DeviceProfile("t", capacity, granularity=512)).view(0)
    return cls(view, **params), view


def free_blocks(policy: Any) -> list[tuple[int, int]]:
    """``(address, size)`` of every free block the policy reports."""
    return [(address, size) for address, size, used in policy.blocks() if not used]
