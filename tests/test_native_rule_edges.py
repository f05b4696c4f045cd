"""The rule edges of tests/test_rule_edges.py that the native core's policies have, worked by
hand and run through both implementations: whole replays (allocsim.sim.kernel.engine's
ProcessReplay for the Python models, the core through sim/kernel/native.py), each asserting
the hand-worked answer — the addresses handed out, the OOMs, the bytes reserved — rather than
the two implementations' agreement, so a mutation of either one's rule fails here
(tests/rule_mutations.toml lists the native mutations; tests/test_rule_mutations.py builds the
mutated core). Where the core is not built the native runs skip.

Sources followed: pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (get_free_block's
expandable walk); cupy/cupy cupy/cuda/memory.pyx (_try_malloc's limit); the stream-ordered
pool's growth and trim (cuMemPoolTrimTo), as policies/cuda_async.py models them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import native_cases as cases
from policy_checks import small_device

from allocsim.sim.kernel.results import RunResult
from allocsim.traces.model import Trace

MiB = 1 << 20


@dataclass(frozen=True)
class Edge:
    spec: str
    capacity: int
    events: list[tuple[str, int, int]]          # (op, buffer id, bytes)
    holds: Callable[[RunResult, list[int]], bool]


def _offsets(addresses: list[int]) -> list[int]:
    return [a - addresses[0] if a >= 0 else -1 for a in addresses]


# The expandable walk (pytorch_expandable.py's _expandable_best_fit): on a 64 MiB device a
# large pool's range is 4 pages of 20 MiB. 24 MiB freed at the bottom (a block in use behind
# it) ties with the 4 MiB free at the top of the mapped pages plus the 20 MiB unmapped behind
# them: the walk stays on the 4 MiB one, so 3 MiB goes at 56 MiB. With 22 MiB at the bottom
# the top block's expandable size is 6 + 20 = 26 MiB: the walk moves on to the 22 MiB block.
_WALK = [("alloc", 2, 16 * MiB), ("alloc", 3, 16 * MiB), ("free", 1, 0), ("alloc", 4, 3 * MiB)]
EDGES = {
    "pytorch-expandable-walk-stays-on-a-tie": Edge(
        "pytorch:expandable_segments=true", 64 * MiB, [("alloc", 1, 24 * MiB), *_WALK],
        lambda result, addresses: _offsets(addresses)[3] == 56 * MiB),
    "pytorch-expandable-walk-moves-on": Edge(
        "pytorch:expandable_segments=true", 64 * MiB, [("alloc", 1, 22 * MiB), *_WALK],
        lambda result, addresses: _offsets(addresses)[3] == 0),
    # CuPy's limit holds total_bytes + size <= limit: 2 MiB fills a 2 MiB limit; 512 more not.
    "cupy-fills-its-limit-exactly": Edge(
        "cupy:limit=2MiB", 1 << 30, [("alloc", 1, 2 * MiB), ("alloc", 2, 512)],
        lambda result, addresses: addresses[0] >= 0 and addresses[1] == -1 and result.ooms == 1),
    # The pool grows by round_up(request, 2 MiB): 2 MiB maps one chunk, 2 MiB + 1 two more.
    "cuda-async-maps-one-chunk-for-one-chunk": Edge(
        "cuda-async", 1 << 30, [("alloc", 1, 2 * MiB), ("alloc", 2, 2 * MiB + 1)],
        lambda result, addresses: result.peak_reserved == 6 * MiB),
    # cuMemPoolTrimTo(2 MiB) may take a 4 MiB pool to exactly 2 MiB: the wholly free chunk goes.
    "cuda-async-releases-to-its-threshold-exactly": Edge(
        "cuda-async:release_threshold=2MiB", 1 << 30,
        [("alloc", 1, 2 * MiB), ("alloc", 2, 2 * MiB), ("free", 2, 2 * MiB)],
        lambda result, addresses: result.final_reserved == 2 * MiB and result.device_frees == 1),
}


def _trace(events: list[tuple[str, int, int]]) -> Trace:
    sizes: dict[int, int] = {}
    rows = []
    for time, (op, buffer, nbytes) in enumerate(events):
        nbytes = sizes.setdefault(buffer, nbytes) if op == "alloc" else sizes[buffer]
        rows.append((time, op, buffer, nbytes))
    return Trace.from_events(rows, name="edge")


@pytest.mark.parametrize("implementation", ["python", "native"])
@pytest.mark.parametrize("name", sorted(EDGES))
def test_the_rule_holds_at_its_edge(name: str, implementation: str) -> None:
    edge = EDGES[name]
    if implementation == "native":
        cases.need_core()
    run = cases.native_run if implementation == "native" else cases.python_run
    result, addresses = run(_trace(edge.events), edge.spec, small_device(edge.capacity))
    assert edge.holds(result, addresses), (name, implementation, _offsets(addresses), result)
