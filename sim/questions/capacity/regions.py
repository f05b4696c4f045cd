"""BFC's regions at other capacities: what one replay shows about runs whose regions differ.

BFC (policies/bfc.py) decides from its memory_limit only in Extend; between two Extends its
decisions — best fit by (size, address), the split rule (BFCAllocator.smallest_split), merges —
are capacity-blind. :class:`RegionWatch` records a replay's Extends and, for each
region until the next Extend, the interval of ``d`` (the region ``d`` bytes larger at another
capacity) for which every decision stays the same; :meth:`RegionWatch.answer` walks a capacity
through the recorded Extends. The argument is in sim/questions/capacity/oracle.py's docstring
(the ``bfc-regions`` kind); tests/test_capacity_claims.py holds it to replays.

Why only the last chunk: regions never merge and a new region takes the highest addresses, so a
region of another size differs only in its last chunk, which is the highest-addressed chunk of
all. When it is free (size ``x``, ``x + d`` at the other capacity) a request of ``r`` bytes
keeps the same choice iff: it did not fit and still does not (``x + d < r``); or another chunk
of size ``s`` was chosen and it stays no better (``x + d ≥ s``: ties go to the lower address);
or it was chosen and stays chosen (``r ≤ x + d <`` the next best size) and split alike. Frees
merge alike. When it is in use, its size decides nothing until it is freed.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocsim.policies.base import Policy
from allocsim.policies.bfc import BFCAllocator, extend_available
from allocsim.policies.chunk_records import ADDRESS_MASK, KEY_SHIFT
from allocsim.policies.units import round_up
from allocsim.sim.kernel.device import SimulatedDevice

_NEVER = 1 << 62                  # an interval's open end


@dataclass
class _Extend:
    """One BFC Extend as a replay made it."""

    pool_before: int
    curr: int               # the doubling size Extend compared with the available bytes
    rounded: int            # the request it served
    used_before: int        # bytes the device had handed out before it
    nbytes: int | None      # the region it added; None: it failed
    refused: int            # device refusals during it (the back-off)


@dataclass
class _Window:
    """The region an Extend added, until the next Extend: ``d`` (the region this many bytes
    larger at another capacity) in [lo, hi] leaves every decision the same. ``end``: index of
    the Extend that closed it (None: the replay's end)."""

    lo: int = -_NEVER
    hi: int = _NEVER
    end: int | None = None


class RegionWatch:
    """Records a BFC replay's Extends and each region's window (module docstring). It observes
    the policy through its public hooks (policies/chunk_policy.py's ChunkObserver: every
    best-fit search and every Extend) and reads the split rule from the policy itself
    (``smallest_split``); the policy's rules are untouched."""

    def __init__(self, policy: Policy, device: SimulatedDevice) -> None:
        if not isinstance(policy, BFCAllocator):
            raise TypeError(f"a region watch follows BFC, not {type(policy).__name__}")
        self.device = device
        self.policy = policy
        self.init_curr = policy.curr_region_allocation_bytes
        self.mif = policy.max_internal_fragmentation
        self.extends: list[_Extend] = []
        self.windows: list[_Window | None] = []
        self.completed = False
        self.chunks = policy.chunks
        self._window: _Window | None = None     # the open window
        self._base = 0                          # its region's base
        self._started: tuple[int, int, int, int] | None = None   # pool, curr, used, refused
        policy.observe(self)

    # -- the hooks (ChunkObserver) -----------------------------------------------------
    def on_best_fit(self, rounded: int, key: int) -> None:
        """A search took the chunk of free-index ``key`` (out of the index, not yet handed
        out; 0: none fits): narrow the open window to the ``d`` that would have taken the same
        chunk and split it alike."""
        window = self._window
        if window is None:
            return
        kept = self.decision_interval(rounded, key)
        if kept is None:
            return
        lo, hi = kept
        if lo > window.lo:
            window.lo = lo
        if hi < window.hi:
            window.hi = hi

    def decision_interval(self, rounded: int, key: int) -> tuple[int, int] | None:
        """The ``d`` for which this one search (its request ``rounded`` and the chunk of
        free-index ``key`` it took, 0: none) takes the same chunk and splits it alike, the
        open region ``d`` bytes larger; None where its last chunk is in use (its size decides
        nothing)."""
        found = (key & ADDRESS_MASK, key >> KEY_SHIFT) if key else None
        last, x, in_use = self.chunks.last_chunk(self._base)
        if in_use:
            return None
        lo = -x                             # the last chunk never shrinks below nothing
        hi = _NEVER
        if found is None or (found[0] != last and x < rounded):
            hi = rounded - x - 1                        # it still must not fit
        elif found[0] != last:
            lo = max(lo, found[1] - x)                  # it must stay no better than the choice
        else:                                           # it was chosen and must stay chosen
            lo = max(lo, rounded - x)
            second = self.chunks.best_fit(rounded)
            if second is not None:                      # ... before the next best (lower address)
                hi = min(hi, second[1] - 1 - x)
            split_from = self.policy.smallest_split(rounded)
            if x >= split_from:                         # ... and split, or not, alike
                lo = max(lo, split_from - x)
            else:
                hi = min(hi, split_from - 1 - x)
        return lo, hi

    def on_extend_start(self, rounded: int) -> None:
        policy = self.policy
        curr = policy.curr_region_allocation_bytes
        while rounded > curr:                                       # as Extend doubles it
            curr *= 2
        self._started = (policy.pool_bytes, curr, self.device.used,
                         self.device.views[0].failed_mallocs)

    def on_extend(self, rounded: int, nbytes: int | None) -> None:
        if self._started is None:
            raise RuntimeError("an Extend ended that was not seen to start")
        pool_before, curr, used_before, refused_before = self._started
        self._started = None
        self.extends.append(_Extend(pool_before, curr, rounded, used_before, nbytes,
                                    self.device.views[0].failed_mallocs - refused_before))
        if self._window is not None:
            self._window.end = len(self.extends) - 1
        ok = nbytes is not None
        self._window = _Window() if ok else None
        self._base = next(reversed(self.chunks.regions)) if ok else 0
        self.windows.append(self._window)

    def _after_window(self, window: _Window, d: int, limit: int) -> bool | None:
        """A run the same as this one through ``window`` but for the region ``d`` bytes
        larger: at the window's end it completes as this one, or fails at the next Extend
        if its limit leaves less than the request."""
        if window.end is None:
            return self.completed
        after = self.extends[window.end]
        left = extend_available(limit, after.pool_before + d)
        return False if after.rounded > left else None

    def answer(self, capacity: int, limit: int, init_curr: int, mif: int,
               granularity: int) -> bool | None:
        """Whether a run at device capacity ``capacity`` (a policy there with ``limit``,
        ``init_curr`` and ``mif``) completes, if this replay shows it; None if it does not."""
        if mif != self.mif:
            return None
        same_init = init_curr == self.init_curr
        for index, done in enumerate(self.extends):
            available = extend_available(limit, done.pool_before)
            if done.rounded > available:
                return False                # the same run up to here, and here it fails
            if done.nbytes is None or done.refused:
                return None                 # it would go on, or back off differently
            if same_init:
                nbytes = min(done.curr, available)
            elif index == 0 and init_curr >= available:
                nbytes = available          # the doubling size cannot be the smaller
            else:
                return None
            if done.used_before + round_up(nbytes, granularity) > capacity:
                return None                 # refused there: a back-off this run did not make
            d = nbytes - done.nbytes
            if d == 0:
                continue
            window = self.windows[index]
            if window is None:
                return None
            if not window.lo <= d <= window.hi:
                return None
            return self._after_window(window, d, limit)
        return self.completed


def bfc_state(policy: Policy) -> object:
    """Everything BFC decides from (policies/bfc.py, policies/chunks.py): the chunks' sizes,
    which are in use, the regions (links, tails and the free index follow from these), the
    pool, the doubling size and the limit. Not: the statistics."""
    if not isinstance(policy, BFCAllocator):
        raise TypeError(f"bfc_state reads BFC, not {type(policy).__name__}")
    chunks = policy.chunks
    return (dict(chunks.size), frozenset(chunks.in_use), dict(chunks.regions),
            policy.pool_bytes, policy.curr_region_allocation_bytes, policy.memory_limit)
