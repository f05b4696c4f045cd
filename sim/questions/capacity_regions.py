"""BFC's regions at other capacities: what one replay shows about runs whose regions differ.

BFC (policies/bfc.py) decides from its memory_limit only in Extend; between two Extends its
decisions — best fit by (size, address), split when chunk ≥ min(2·request, request + 128 MiB),
merges — are capacity-blind. :class:`RegionWatch` records a replay's Extends and, for each
region until the next Extend, the interval of ``d`` (the region ``d`` bytes larger at another
capacity) for which every decision stays the same; :meth:`RegionWatch.answer` walks a capacity
through the recorded Extends. The argument is in sim/questions/capacity_oracle.py's docstring
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
from allocsim.policies.units import round_up
from allocsim.sim.kernel.device import SimulatedDevice

MIN_ALLOCATION = 256              # BFC's kMinAllocationSize (policies/bfc.py)
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
    """Records a BFC replay's Extends and each region's window (module docstring). Installed by
    wrapping the policy's own best-fit pop and Extend; the policy's rules are untouched."""

    def __init__(self, policy: Policy, device: SimulatedDevice) -> None:
        self.device = device
        self.policy = policy
        self.init_curr: int = policy.curr_region_allocation_bytes   # type: ignore[attr-defined]
        self.mif: int = policy.max_internal_fragmentation           # type: ignore[attr-defined]
        self.extends: list[_Extend] = []
        self.windows: list[_Window | None] = []
        self.completed = False
        chunks = policy.chunks                                      # type: ignore[attr-defined]
        self.chunks = chunks
        real_pop = policy._pop_best_fit                             # type: ignore[attr-defined]
        real_extend = policy._extend                                # type: ignore[attr-defined]
        last_chunk, best_fit = chunks.last_chunk, chunks.free_index.best_fit
        mif = self.mif
        state: list = [None, 0]      # the open window, its region's base

        def pop(rounded: int) -> tuple[int, int] | None:
            window = state[0]
            if window is None:
                return real_pop(rounded)
            last, x, in_use = last_chunk(state[1])
            found = real_pop(rounded)
            if in_use:                      # no free last chunk: its size decides nothing
                return found
            lo = -x                         # the last chunk never shrinks below nothing
            hi = window.hi
            if found is None or (found[0] != last and x < rounded):
                hi = min(hi, rounded - x - 1)           # it still must not fit
            elif found[0] != last:
                lo = max(lo, found[1] - x)              # it must stay no better than the choice
            else:                                       # it was chosen and must stay chosen
                lo = max(lo, rounded - x)
                second = best_fit(rounded)
                if second is not None:                  # ... before the next best (lower address)
                    hi = min(hi, second[1] - 1 - x)
                split_from = min(2 * rounded, rounded + mif)
                if x >= split_from:                     # ... and split, or not, alike
                    lo = max(lo, split_from - x)
                else:
                    hi = min(hi, split_from - 1 - x)
            if lo > window.lo:
                window.lo = lo
            window.hi = hi
            return found

        def extend(rounded: int) -> bool:
            pool_before = policy.pool_bytes                         # type: ignore[attr-defined]
            curr = policy.curr_region_allocation_bytes              # type: ignore[attr-defined]
            while rounded > curr:                                   # as Extend doubles it
                curr *= 2
            used_before = device.used
            refused_before = device.views[0].failed_mallocs
            ok = real_extend(rounded)
            nbytes = policy.pool_bytes - pool_before if ok else None  # type: ignore[attr-defined]
            self.extends.append(_Extend(pool_before, curr, rounded, used_before, nbytes,
                                        device.views[0].failed_mallocs - refused_before))
            if state[0] is not None:
                state[0].end = len(self.extends) - 1
            state[0] = _Window() if ok else None
            state[1] = next(reversed(chunks.regions)) if ok else 0
            self.windows.append(state[0])
            return ok

        policy._pop_best_fit = pop                                  # type: ignore[attr-defined]
        policy._extend = extend                                     # type: ignore[attr-defined]
        # BFC binds a written-out malloc that does not call the pop; the class's own does.
        vars(policy).pop("malloc", None)

    def _after_window(self, window: _Window, d: int, limit: int) -> bool | None:
        """A run the same as this one through ``window`` but for the region ``d`` bytes
        larger: at the window's end it completes as this one, or fails at the next Extend
        if its limit leaves less than the request."""
        if window.end is None:
            return self.completed
        after = self.extends[window.end]
        left = (limit - after.pool_before - d) // MIN_ALLOCATION * MIN_ALLOCATION
        return False if after.rounded > left else None

    def answer(self, capacity: int, limit: int, init_curr: int, mif: int,
               granularity: int) -> bool | None:
        """Whether a run at device capacity ``capacity`` (a policy there with ``limit``,
        ``init_curr`` and ``mif``) completes, if this replay shows it; None if it does not."""
        if mif != self.mif:
            return None
        same_init = init_curr == self.init_curr
        for index, done in enumerate(self.extends):
            available = (limit - done.pool_before) // MIN_ALLOCATION * MIN_ALLOCATION
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
    chunks = policy.chunks                                          # type: ignore[attr-defined]
    return (dict(chunks.size), frozenset(chunks.in_use), dict(chunks.regions),
            policy.pool_bytes, policy.curr_region_allocation_bytes,     # type: ignore[attr-defined]
            policy.memory_limit)                                    # type: ignore[attr-defined]
