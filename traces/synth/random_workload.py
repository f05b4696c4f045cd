"""Synthetic random workload: sizes and lifetimes drawn from distributions, no program structure.

What it models: the classic allocator-benchmark workload (Wilson et al.'s "random" traces):
allocations arrive as a Poisson stream, each with a size from a chosen distribution and an
exponentially distributed lifetime, so the number of live buffers hovers around a target.
Optionally part of the live set is *resident*: allocated at the start and never freed, the way
a program's long-lived state sits under its churn.

Why: it is the null model. Real GPU workloads are far more regular (see the training and
kvcache generators); a random trace shows what an allocator does when no such regularity
exists, and sweeping its distributions isolates one effect at a time (size spread, lifetime).

How the targets fit together (Little's law): in steady state a buffer whose mean lifetime is
``mean_lifetime`` events is one of ``mean_lifetime / 2`` live churning buffers, because half the
events are allocations. So ``live`` = resident + ``mean_lifetime / 2``; by default
``mean_lifetime`` is ``2 * live`` (no resident set). The churn starts already in steady state:
``mean_lifetime / 2`` buffers are allocated in a burst at the start, with exponential residual
lifetimes (memorylessness makes that exactly the stationary state). Buffers still live at the
end are left live.
"""

from __future__ import annotations

import numpy as np

from allocsim.errors import UserInputError
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace
from allocsim.traces.synth._common import (
    TagTable,
    assemble,
    checks_done,
    choice,
    positive,
    within_event_limit,
)

SIZE_DISTRIBUTIONS = ("lognormal", "uniform", "powers")
MEAN_ALLOC_GAP_NS = 20_000.0  # one allocation every 20 us on average
BURST_GAP_NS = 2_000.0  # the initial burst allocates back to back

SIZE_PARAMS = ("min_size", "max_size", "align")  # accept "64MiB" as well as 67108864

HELP = {
    "events": "events in the trace",
    "live": "target number of live buffers in steady state",
    "mean_lifetime": "mean lifetime of churning buffers, in events (default 2 * live; "
                     "smaller values make the rest of the live set resident)",
    "size_dist": "request size distribution: lognormal (median at the geometric mean of "
                 "min_size and max_size), uniform, or powers (powers of two, uniform in log2)",
    "min_size": "smallest request, bytes",
    "max_size": "largest request, bytes",
    "align": "requests are multiples of this many bytes (element size), except powers",
    "streams": "buffers are spread uniformly over this many streams",
    "seed": "random seed",
}


def random_workload(*, events: int = 20_000, live: int = 1000, mean_lifetime: float | None = None,
                    size_dist: str = "lognormal", min_size: int = 256,
                    max_size: int = 64 << 20, align: int = 4, streams: int = 1,
                    seed: int = 0) -> Trace:
    """A random-workload trace of exactly ``events`` events; see the module docstring."""
    positive(events=events, live=live, min_size=min_size, max_size=max_size, align=align,
             streams=streams)
    within_event_limit(events, f"events={events}")
    within_event_limit(live, f"live={live}")  # every live buffer is an event
    choice("size_dist", size_dist, SIZE_DISTRIBUTIONS)
    if min_size > max_size:
        raise UserInputError(f"min_size ({min_size}) must be <= max_size ({max_size})")
    if mean_lifetime is None:
        mean_lifetime = 2.0 * live
    positive(mean_lifetime=mean_lifetime)
    if mean_lifetime > 2 * live:
        raise UserInputError(f"mean_lifetime {mean_lifetime} events implies about "
                         f"{mean_lifetime / 2:g} live buffers, more than live={live}; "
                         f"use mean_lifetime <= 2 * live")
    checks_done()
    params = {"events": events, "live": live, "mean_lifetime": float(mean_lifetime),
              "size_dist": size_dist, "min_size": min_size, "max_size": max_size, "align": align,
              "streams": streams, "seed": seed}

    rng = np.random.default_rng(seed)
    churn_live = round(mean_lifetime / 2)
    resident = live - churn_live
    burst = resident + churn_live
    # Enough steady-state allocations that, with their frees, the trace passes `events`.
    n_steady = max(0, (events - burst) // 2) * 6 // 5 + 64
    n = burst + n_steady

    size = draw_sizes(rng, n, size_dist, min_size, max_size, align)
    stream = rng.integers(0, streams, n).astype(np.int32) if streams > 1 else None

    burst_end = burst * BURST_GAP_NS
    alloc_t = np.empty(n)
    alloc_t[:burst] = np.arange(burst) * BURST_GAP_NS
    alloc_t[burst:] = burst_end + np.cumsum(rng.exponential(MEAN_ALLOC_GAP_NS, n_steady))
    # Lifetime in time: mean_lifetime events span mean_lifetime/2 allocation gaps.
    life = rng.exponential(mean_lifetime / 2 * MEAN_ALLOC_GAP_NS, n - resident)
    free_t = np.empty(n - resident)
    free_t[:churn_live] = burst_end + life[:churn_live]  # residual life from steady state
    free_t[churn_live:] = alloc_t[burst:] + life[churn_live:]
    freed = np.arange(resident, n)  # residents come first and are never freed

    # Merge by time; allocations first in the concatenation, so a stable sort puts an alloc
    # before a free at the same instant (a free always follows its own alloc: life > 0).
    times = np.concatenate([alloc_t, free_t])
    order = np.argsort(times, kind="stable")[:events]
    buffer = np.concatenate([np.arange(n), freed])[order]
    is_free = order >= n
    time_ns = np.floor(times[order]).astype(np.int64)  # monotone rounding keeps the order

    tags = TagTable()
    tag_of = np.array([tags("random/resident"), tags("random/churn")], dtype=np.int32)
    part = {
        "op": np.where(is_free, OP_FREE, OP_ALLOC).astype(np.int8),
        "id": buffer.astype(np.int64),
        "size": size[buffer],
        "tag": tag_of[(buffer >= resident).astype(np.int64)],
        "gap_ns": np.diff(time_ns, prepend=0),
    }
    return assemble([part], tags, kind="random", params=params,
                    stream=None if stream is None else stream[buffer])


def draw_sizes(rng: np.random.Generator, n: int, dist: str, min_size: int, max_size: int,
               align: int) -> np.ndarray:
    """``n`` request sizes in [min_size, max_size] (int64)."""
    if dist == "powers":
        lo = int(np.ceil(np.log2(min_size)))
        hi = int(np.floor(np.log2(max_size)))
        if hi < lo:
            raise UserInputError(f"no power of two between min_size {min_size} and "
                                 f"max_size {max_size}")
        return np.left_shift(1, rng.integers(lo, hi, n, endpoint=True)).astype(np.int64)
    if dist == "uniform":
        raw = rng.integers(min_size, max_size, n, endpoint=True).astype(np.float64)
    else:  # lognormal: +-3 sigma spans [min_size, max_size]
        lo, hi = np.log(min_size), np.log(max_size)
        raw = np.clip(rng.lognormal((lo + hi) / 2, max(hi - lo, 1e-9) / 6, n), min_size, max_size)
    # Round to the element size, staying >= align so no request is empty.
    return np.maximum(align, (raw // align).astype(np.int64) * align)
