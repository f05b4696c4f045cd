"""A replay leaves no reference cycles behind: whatever a policy drops (a released region, a
merged chunk, a freed block) goes with its last reference, never waiting for Python's cyclic
garbage collector. Why it matters: the stream-ordered pool's released regions were each a ring
and a chunk pointing at each other, and collecting them took a tenth of cuda-async's replay
time at release on every free (issue 17). Held here for every policy (each has one malloc and
one free, driven by the engine's one loop), on a roomy device and on one tight enough for
growth to fail, releases and OOMs, with and without PyTorch's memory_stats() counters.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest
from random_workloads import random_events

from allocsim.policies import parse_policy
from allocsim.policies.cuda_async import CudaAsyncAllocator
from allocsim.sim.kernel.device import SimulatedDevice, resolve_device
from allocsim.sim.kernel.engine import ProcessReplay

MiB = 1 << 20
SETTINGS = ("on-demand", "preallocate", "best-fit", "best-fit:trim=true", "bfc",
            "bfc:garbage_collection=true", "pytorch", "pytorch:expandable_segments=true",
            "cupy", "cuda-async", "cuda-async:fraction=0.75", "cuda-async:sync=none",
            "cuda-async:release_threshold=24MiB", "buddy", "jax:allocator=platform")


def cyclic_garbage_of(work: Callable[[], object]) -> int:
    """Objects in reference cycles that nothing reaches, left by ``work``: earlier garbage is
    collected first and automatic collection is off while it runs, so that what it leaves for
    the collector is still there to count."""
    gc.collect()
    gc.disable()
    try:
        work()
        return gc.collect()
    finally:
        gc.enable()


def replay_to_the_end(run: ProcessReplay) -> None:
    while run.next_index < run.n and not run.stopped:
        run.advance(run.n)


@pytest.mark.parametrize("spec", SETTINGS)
@pytest.mark.parametrize("memory_stats", [False, True], ids=["engine", "memory-stats"])
@pytest.mark.parametrize("capacity", ["1GiB", "48MiB"])
def test_a_replay_leaves_no_cyclic_garbage(spec: str, memory_stats: bool, capacity: str) -> None:
    run = ProcessReplay(random_events(2, 2000), parse_policy(spec),
                        SimulatedDevice(resolve_device("t4-16g", capacity)), call_log=False,
                        memory_stats=memory_stats)
    assert cyclic_garbage_of(lambda: replay_to_the_end(run)) == 0


def test_a_trimmed_pool_leaves_no_cyclic_garbage() -> None:
    """cudaMemPoolTrimTo's releases (ChunkMap.remove_region), outside any replay."""
    pool = CudaAsyncAllocator(SimulatedDevice(resolve_device("t4-16g")).view(0), sync="none")

    def fill_free_and_trim() -> None:
        addresses = [pool.malloc(size) for size in (3 * MiB, 100, 5 * MiB, 4 * MiB)]
        for address in addresses:
            assert address is not None
            pool.free(address)
        assert pool.total_bytes() > 0
        pool.trim_to(0)
        assert pool.total_bytes() == 0

    assert cyclic_garbage_of(fill_free_and_trim) == 0
