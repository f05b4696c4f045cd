"""The limits under which a policy's decisions so far would have gone the same way.

Some policies compare a limit of their own against what they hold (BFC's memory_limit in
Extend and DeallocateFreeRegions): with ``fraction`` the limit is a share of the device's
capacity, so two runs at nearby capacities hold different limits. :class:`LimitWindow` is
what min-capacity needs to share such runs: a policy notes each decision its limit decides,
and the window ``[lo, hi]`` is every limit under which all of them come out the same. A run
under a limit inside the window is, up to this point, the very same run; min-capacity
resumes such a run from a saved state of this one instead of from event 0
(sim/questions/shared_runs.py). The native core keeps the twin, rule for rule by
name (native/src/limit_window.hpp); tests/test_shared_runs.py holds them together.

A window only shrinks, so the window of a run's first k events contains that of its first
k + 1. Noting is O(1) and decides nothing: the policy's rules are untouched.
"""

from __future__ import annotations

NO_LOWER = -(1 << 62)           # a window with no decision below it
NO_UPPER = 1 << 62              # ... above it


class LimitWindow:
    """``[lo, hi]``: the limits under which every decision noted so far goes the same way."""

    __slots__ = ("hi", "lo")

    def __init__(self) -> None:
        self.lo = NO_LOWER
        self.hi = NO_UPPER

    def at_least(self, threshold: int, holds: bool) -> None:
        """A decision that read ``limit >= threshold`` and found it ``holds`` (or not)."""
        if holds:
            if threshold > self.lo:
                self.lo = threshold
        elif threshold - 1 < self.hi:
            self.hi = threshold - 1

    def within(self, lo: int, hi: int) -> None:
        """A decision that used the limit's value itself, which is the same for every limit
        in ``[lo, hi]`` (a region of what the limit leaves, rounded down)."""
        if lo > self.lo:
            self.lo = lo
        if hi < self.hi:
            self.hi = hi

    def as_tuple(self) -> tuple[int, int]:
        return self.lo, self.hi
