"""What a BFC allocator held when a profile began mid-run, rebuilt from the profile's records.

What it is for
    A TensorFlow profile started mid-run (:mod:`allocsim.traces.formats.xla.xplane`) begins with
    regions and chunks already there. BFC's best fit breaks ties by address and splits and
    merges by neighbour, so :func:`~allocsim.sim.questions.fidelity.bfc.bfc_fidelity` can only
    follow the real allocator from the first record if its model starts from that state. This
    module proposes the states the records allow (:func:`start_states`); the fidelity replays
    each from its first record and keeps the one that matches most.

What the records show (xla/tsl/framework/bfc_allocator.cc, ``AddTraceMe``, ``GetFragmentation``)
    - ``fragmentation`` = (pool − in_use − largest_free) / (pool − in_use) with ``pool`` the
      regions' total (``stats_.pool_bytes``): with in_use recorded and the largest free chunk a
      multiple of 256 that stays put over most calls, only one pool size makes every record's
      largest free chunk a whole number of 256-byte units (:func:`pool_bytes_from_records`;
      the stat has six significant digits, so this pins the pool for pools up to ~64 MiB
      against a 256-byte grid and is said to fail above that).
    - Region sizes follow ``Extend``: ``curr_region_allocation_bytes_`` starts at
      round256(min(limit, 2 MiB)) with allow_growth; a region is ``curr`` doubled until it
      holds the request, and ``curr`` doubles after a region that needed no doubling. The
      sequences of sizes that add up to the pool are :func:`region_sequences`.
    - Every recorded chunk (address, allocation_bytes) lies in a region; a region holds the
      address range of its recorded chunks (a far gap parts regions). Each chunk address is
      base + a multiple of 256. A gap wider than the biggest region parts two regions; regions
      side by side (the host's allocator may put them 4 KiB apart) are parted at the widest
      gaps first (:func:`_groupings`).
    - Live at the start: the buffers freed in the recording but not allocated in it (address
      and chunk from their free records), and buffers never freed in it: ``in_use`` before
      the first record minus the former, their bytes only. Those lie where no recorded chunk
      ever lies (no chunk can be handed out over a live one): the gaps between recorded
      chunks inside the regions. Every other byte was free, in chunks coalesced as BFC keeps
      them.

What cannot be known, and is searched
    Where in a gap the never-freed bytes lie when the gaps hold more than they (the rest is
    free memory never handed out in the recording), a region's base when its recorded chunks
    do not span it, the place of a region no record touches. :func:`start_states` proposes
    each arrangement (whole gaps free, or one gap's free part at its low or high end); the
    replay decides. A region Extend makes during the recording may be taken as there from the
    start: wholly free until its first chunk and placed where the records show it, it changes
    no decision, and the records cannot tell the two apart.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

__all__ = ["StartState", "pool_bytes_from_records", "region_sequences", "start_states"]

UNIT = 256                     # BFC's kMinAllocationSize: chunk sizes and offsets
MAX_STATES = 4000              # arrangements tried at most (each is one replay)
MAX_POOLS = 32                 # pool sizes the stat may leave open, each tried (the replay decides)
# Candidates (groupings, region orders, bases, free arrangements) looked at, at most: a count,
# not a time, so the search gives up after the same work on any machine (a crafted profile's
# 300 spans leave ~C(300, 8) groupings to look at).
MAX_CANDIDATES = 200_000

_T = TypeVar("_T")


class _Budget:
    """What is left of the search's :data:`MAX_CANDIDATES`: every loop of the search draws its
    candidates through :meth:`take`, which stops them all once the budget is spent."""

    def __init__(self) -> None:
        self.left = MAX_CANDIDATES
        self.gave_up = False

    def take(self, candidates: Iterable[_T]) -> Iterator[_T]:
        for candidate in itertools.islice(candidates, max(self.left, 0)):   # none drawn past
            self.left -= 1
            yield candidate
        self.gave_up = self.gave_up or self.left <= 0


@dataclass
class StartState:
    """One arrangement of what the allocator held before the first record."""

    regions: list[tuple[int, int]]             # (base, size), in the order Extend made them
    live: list[tuple[int, int, int]]           # (address, chunk, requested) live at the start
    curr_region_allocation_bytes: int
    prologue_address: dict[int, int]           # trace buffer id -> its chunk's address
    guesses: list[str] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)  # (address, bytes) no record covers
    known_live: int = 0                        # leading ``live`` entries known from free records


def pool_bytes_from_records(refs: list[dict[str, Any]], step: int, limit: int,
                            records: int = 64) -> tuple[list[int], str]:
    """The pool sizes the first record may have had (multiples of ``step``, at most
    ``limit``, smallest first, at most :data:`MAX_POOLS`): those that make the largest free
    chunk, ``(1 − fragmentation)·(pool − in_use)``, a multiple of 256 — within what the stat's
    six digits allow — on the records from the first up to two that tell sizes apart (a
    fragmentation above 0). None (and why) when the stat cannot tell pools apart: at a pool −
    in_use of ~64 MiB its rounding reaches a quarter of a chunk unit."""
    if step >= limit:               # no growth: the one region is the whole limit
        return [limit], ""
    usable = [(float(r["fragmentation"]), int(r["in_use"])) for r in refs[:records]]
    if not usable or any(math.isnan(f) for f, _ in usable[:1]):
        return [], "the records carry no fragmentation stat"
    cut = next((k for k, (f, _) in enumerate(usable) if math.isnan(f)), len(usable))
    frag = np.array([f for f, _ in usable[:cut]])
    used = np.array([u for _, u in usable[:cut]], dtype=np.float64)
    if not np.any(frag > 0):
        return [], "every record's fragmentation stat is 0 (it tells no pool size apart)"
    top = min(limit, 1 << 30)
    pools = np.arange(-(-int(used[0]) // step) * step, top + 1, step, dtype=np.float64)
    if not len(pools):
        return [], "no pool size fits the bytes in use"
    free = pools[:, None] - used[None, :]
    largest = (1.0 - frag)[None, :] * free
    error = np.abs(largest - np.round(largest / UNIT) * UNIT)
    tolerance = 2.0 + 1e-6 * np.abs(free)
    ok = (error <= tolerance) & (free >= 0) & (tolerance < UNIT / 4)
    run = np.where(ok.all(axis=1), ok.shape[1], np.argmin(ok, axis=1))
    informative = np.cumsum(frag > 0)       # records in a run that can tell pools apart
    telling = np.where(run > 0, informative[np.maximum(run - 1, 0)], 0)
    # The pool at the first record holds until the first Extend; a later (larger) pool may
    # fit the early records too, by the stat's rounding. Every size that fits the first two
    # records that can tell sizes apart is a candidate; the replay decides between them.
    need = min(2, int(informative[-1]))
    fits = np.flatnonzero(telling >= need)
    if not len(fits):
        return [], ("the fragmentation stat does not pin the pool size (no size of up to "
                    f"{top:,} B fits the first records)")
    if len(fits) > MAX_POOLS:
        return [], (f"the fragmentation stat does not pin the pool size ({len(fits)} sizes "
                    "fit the first records)")
    return [int(pools[i]) for i in fits], ""


def region_sequences(pool: int, first: int, limit: int, most: int = 12) -> list[list[int]]:
    """Every sequence of region sizes Extend can make that adds up to ``pool`` (no garbage
    collection): from ``curr = first``, each region is ``curr·2^j`` (j > 0: a request that
    needed doubling, curr stays there; j = 0: curr doubles after it)."""
    out: list[list[int]] = []

    def walk(curr: int, left: int, sizes: list[int]) -> None:
        if left == 0:
            out.append(list(sizes))
            return
        if len(sizes) >= most or len(out) > 64:
            return
        size, doubled = curr, False
        while size <= left and size <= limit:
            walk(size if doubled else size * 2, left - size, [*sizes, size])
            size, doubled = size * 2, True
    walk(first, pool, [])
    return out


def _spans(chunks: list[tuple[int, int]]) -> list[list[int]]:
    """The address ranges covered by recorded chunks, merged where they touch or overlap."""
    spans: list[list[int]] = []
    for address, size in sorted(chunks):
        if spans and address <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], address + size)
        else:
            spans.append([address, address + size])
    return spans


def _groupings(spans: list[list[int]], regions: int, biggest: int, budget: _Budget
               ) -> Iterator[list[list[list[int]]]]:
    """Ways to part the spans, in address order, into at most ``regions`` groups, one region
    each: a cut falls between two spans (a chunk never crosses a region's end) and no group
    is wider than ``biggest``. A gap wider than ``biggest`` is always cut; the other cuts are
    tried fewest first, the widest gaps first (adjacent regions, 4 KiB apart where the host's
    allocator put them side by side, come after far ones)."""
    gaps = [spans[k + 1][0] - spans[k][1] for k in range(len(spans) - 1)]
    forced = [k for k, g in enumerate(gaps) if g >= biggest]
    optional = sorted((k for k, g in enumerate(gaps) if g < biggest), key=lambda k: -gaps[k])
    for extra in range(max(regions - len(forced) - 1, -1) + 1):
        for chosen in budget.take(itertools.combinations(optional, extra)):
            cuts = sorted(forced + list(chosen))
            groups, at = [], 0
            for cut in cuts:
                groups.append(spans[at:cut + 1])
                at = cut + 1
            groups.append(spans[at:])
            if all(g[-1][1] - g[0][0] <= biggest for g in groups):
                yield groups


def _bases(low: int, high: int, size: int) -> list[int]:
    """Candidate bases of a region of ``size`` holding [low, high): its recorded chunks at its
    start, at its end, and a few 256-byte steps from each."""
    first = high - size
    if first > low:
        return []
    steps = (low - first) // UNIT
    near = [low - k * UNIT for k in range(min(steps, 4) + 1)]
    far = [low - k * UNIT for k in range(max(steps - 4, 0), steps + 1)]
    return sorted(set(near + far), reverse=True)


def _free_arrangements(gaps: list[tuple[int, int]], edges: list[int], extra: int,
                       budget: _Budget) -> Iterator[tuple[list[tuple[int, int]], str]]:
    """Ways to leave ``extra`` bytes of the ``gaps`` free (the rest live): some of the gaps at
    a region's ends (``edges``, indices into ``gaps``) wholly free, and what is left of
    ``extra`` either as further whole gaps or as the low or high end of one gap. Yields the
    live ranges and a word on the guess; fewest free pieces first."""
    if extra == 0:
        yield list(gaps), ""
        return
    edge_sets = itertools.chain.from_iterable(itertools.combinations(edges, n)
                                              for n in range(len(edges) + 1))
    for chosen in budget.take(edge_sets):
        left = extra - sum(gaps[i][1] for i in chosen)
        if left < 0:
            continue
        said = [f"the gap at {gaps[i][0]:#x} ({gaps[i][1]:,} B) free" for i in chosen]
        rest = [k for k in range(len(gaps)) if k not in chosen]
        if left == 0:
            yield [gaps[k] for k in rest], "; ".join(said)
            continue
        for k in rest:
            start, size = gaps[k]
            if size == left:
                yield [gaps[j] for j in rest if j != k], "; ".join(
                    [*said, f"the gap at {start:#x} ({size:,} B) free"])
            elif size > left:
                others = [gaps[j] for j in rest if j != k]
                yield [*others, (start + left, size - left)], "; ".join(
                    [*said, f"{left:,} B free at the low end of the gap at {start:#x}"])
                yield [*others, (start, size - left)], "; ".join(
                    [*said, f"{left:,} B free at the high end of the gap at {start:#x}"])


def _next_curr(sizes: list[int], first: int) -> int:
    """curr_region_allocation_bytes_ after Extend made regions of ``sizes``."""
    curr = first
    for size in sizes:
        curr = size if size > curr else curr * 2
    return curr


def start_states(refs: list[dict[str, Any]], prologue: dict[int, int], start_in_use: int,
                 limit: int, first_region: int) -> tuple[list[StartState], str]:
    """The arrangements of regions and live chunks the records allow (module docstring), and,
    when there is none, why. ``prologue``: trace buffer id -> index in ``refs`` of the free
    of a buffer allocated before the first record; ``first_region``: Extend's first curr."""
    pools, why = pool_bytes_from_records(refs, first_region, limit)
    if not pools:
        return [], why
    sequences = [seq for pool in pools for seq in region_sequences(pool, first_region, limit)]
    if not sequences:
        return [], (f"no sequence of regions BFC's doubling makes adds up to a pool the "
                    f"fragmentation stat allows ({', '.join(f'{p:,}' for p in pools)} B)")
    live_known = {int(refs[i]["addr"]): (int(refs[i]["chunk"]), int(refs[i]["requested"]))
                  for i in prologue.values()}
    address_of = {buffer: int(refs[i]["addr"]) for buffer, i in prologue.items()}
    never_freed = start_in_use - sum(c for c, _ in live_known.values())
    if never_freed < 0:
        return [], "the buffers freed before their allocation hold more than was in use"
    recorded = [(int(r["addr"]), int(r["chunk"])) for r in refs]
    spans = _spans(recorded)
    states: list[StartState] = []
    budget = _Budget()
    for sizes, clusters in ((seq, groups) for seq in sequences
                            for groups in _groupings(spans, len(seq), max(seq), budget)):
        for order in budget.take(itertools.permutations(range(len(sizes)), len(clusters))):
            fitting = [(c, sizes[i]) for c, i in zip(clusters, order)
                       if c[-1][1] - c[0][0] <= sizes[i]]
            if len(fitting) < len(clusters):
                continue
            unseen = [sizes[i] for i in range(len(sizes)) if i not in order]
            base_options = [_bases(c[0][0], c[-1][1], size) for c, size in fitting]
            for bases in budget.take(itertools.product(*base_options)):
                gaps: list[tuple[int, int]] = []
                edges: list[int] = []
                for base, (cluster, size) in zip(bases, fitting):
                    edge = base
                    if cluster[0][0] > base:
                        edges.append(len(gaps))
                    for low, high in cluster:
                        if low > edge:
                            gaps.append((edge, low - edge))
                        edge = high
                    if base + size > edge:
                        edges.append(len(gaps))
                        gaps.append((edge, base + size - edge))
                extra = sum(g for _, g in gaps) - never_freed
                if extra < 0:
                    continue
                top = max(b + s for b, (_, s) in zip(bases, fitting))
                placed = {order[k]: (bases[k], fitting[k][1]) for k in range(len(fitting))}
                spare = -(-(top + (1 << 30)) // (1 << 30)) * (1 << 30)
                for i in range(len(sizes)):      # a region no record touches: above them all
                    if i not in placed:
                        placed[i] = (spare, sizes[i])
                        spare += -(-sizes[i] // (1 << 30)) * (1 << 30) + (1 << 30)
                regions = [placed[i] for i in range(len(sizes))]
                for live_ranges, guess in _free_arrangements(gaps, edges, extra, budget):
                    live = [(a, c, q) for a, (c, q) in live_known.items()]
                    live += [(a, n, n) for a, n in live_ranges if n > 0]
                    notes = [f"regions {'+'.join(str(s) for s in sizes)} B"]
                    if unseen:
                        notes.append(f"{len(unseen)} region(s) no record touches, placed "
                                     "above the recorded ones")
                    if guess:
                        notes.append(guess)
                    states.append(StartState(regions, live, _next_curr(sizes, first_region),
                                             address_of, notes, gaps, len(live_known)))
                    if len(states) >= MAX_STATES:
                        return states, ""
    if budget.gave_up:
        return states, (f"the start-state search gave up after {MAX_CANDIDATES:,} candidates "
                        f"(groupings, region orders, bases, free gaps) with {len(states):,} "
                        "arrangement(s) found: the records leave too many open")
    if not states:
        return [], (f"no arrangement of regions {sequences[0]} (pool {sum(sequences[0]):,} B) "
                    "holds the "
                    f"recorded chunks and the {never_freed:,} B never freed in the recording")
    return states, ""
