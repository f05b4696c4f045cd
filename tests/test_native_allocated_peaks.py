"""The core's peak of allocated bytes where it and the timeline bucket's most part ways, as
the Python engine keeps it.

The core's loop tests each alloc against the lower of the run's peak and the bucket's most
(native/src/engine.hpp, Running::raise_above). The bucket's most is the lower but for two
edges, which are here: a bucket's first event counts whatever it is, and a free of a negative
size (an unknown alloc size, matched to the free by Trace.matched_sizes) raises the allocated
bytes. So a bucket that opens with such a free holds a most above the run's peak, and an alloc
after it that lands between the two is a new peak all the same.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import native_cases as cases

from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.kernel.engine import TIMELINE_POINTS
from allocsim.traces.model import Trace

MIB = 1 << 20
BUCKET = 3  # events per timeline bucket: the case below fills one


def a_bucket_opened_by_a_free_that_raises_the_allocated_bytes() -> tuple[Trace, int]:
    """Small buffers alloc'd and freed, then 100 and 40 MiB kept and an alloc of id 1 of
    unknown size (-60 MiB: skipped, its buffer still live); the bucket that opens with id 1's
    free (-60 MiB, matched to that alloc: the allocated bytes rise to 200 MiB over a peak of
    140), 40 MiB freed, then 20 MiB: 180 MiB, a new peak below the bucket's most."""
    rows: list[tuple] = []

    def add(op: str, buffer: int, size: int) -> None:
        rows.append((len(rows), op, buffer, size, 0))

    opening = BUCKET * (TIMELINE_POINTS - 2)  # a bucket's first event, 3 from the end
    while len(rows) < opening - 4:
        add("alloc", 1000 + len(rows), 512)
        add("free", 1000 + len(rows) - 1, 512)
    while len(rows) < opening - 3:
        add("alloc", 999, 512)
    add("alloc", 1, 100 * MIB)
    add("alloc", 3, 40 * MIB)
    add("alloc", 1, -60 * MIB)
    add("free", 1, -1)
    add("free", 3, 40 * MIB)
    add("alloc", 4, 20 * MIB)
    trace = Trace.from_events(rows, name="a free raising the allocated bytes")
    return trace, opening


@pytest.mark.parametrize("spec", ["bfc", "pytorch", "cupy", "cuda-async"])
def test_an_alloc_between_the_peak_and_the_buckets_most_is_a_new_peak(spec: str) -> None:
    cases.need_core()
    trace, opening = a_bucket_opened_by_a_free_that_raises_the_allocated_bytes()
    assert -(-len(trace) // TIMELINE_POINTS) == BUCKET and opening % BUCKET == 0
    assert trace.matched_sizes()[opening] == -60 * MIB
    profile = resolve_device("a100-80g")
    python, python_addresses = cases.python_run(trace, spec, profile)
    core, core_addresses = cases.native_run(trace, spec, profile)
    assert python.peak_allocated == 180 * MIB + 512  # the case is what it says
    assert core.peak_allocated == python.peak_allocated
    assert core_addresses == python_addresses
