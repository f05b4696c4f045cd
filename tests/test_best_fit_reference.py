"""``best-fit`` at 16-byte alignment on a 16-byte-granular device is Johnstone & Wilson's
reference policy, to the byte (issue 16.10): every block at the same offset, the heap the same
size after every request, held to an independent plain model (tests/reference_best_fit.py).

On malloc-lab traces: hand-worked ones, random ones in the malloc-lab text format read through
the importer, and the real-program traces of the CMU/Autolab malloc lab when a folder of them
is given (``ALLOCSIM_MALLOCLAB_TRACES=DIR``, or ``../shared/traces/malloclab``): they are other
people's files, not shipped with the project.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from reference_best_fit import ReferenceBestFit

from allocsim.policies.best_fit import BestFitAllocator
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.traces import formats
from allocsim.traces.formats.malloclab import read_malloclab
from allocsim.traces.model import OP_ALLOC, Trace

GRAIN = 16


def allocsim_best_fit() -> BestFitAllocator:
    profile = DeviceProfile("malloc-lab heap", 1 << 40, granularity=GRAIN, map_granularity=GRAIN)
    return BestFitAllocator(SimulatedDevice(profile).view(0), alignment=GRAIN, page=GRAIN)


def run_both(trace: Trace) -> tuple[list[int | None], int]:
    """Replay ``trace`` through both; assert they agree after every event; return the offsets
    handed out (None for a 0-byte request) and the peak heap."""
    ours, reference = allocsim_best_fit(), ReferenceBestFit(GRAIN)
    live: dict[int, int] = {}
    offsets: list[int | None] = []
    for k in range(len(trace)):
        ident, size = int(trace.id[k]), int(trace.size[k])
        if trace.op[k] == OP_ALLOC:
            address = ours.malloc(size)
            offset = reference.malloc(size)
            got = None if address is None else address - ours.heap_base
            assert got == offset, f"event {k}: best-fit put {size} B at {got}, J-W at {offset}"
            if address is not None:
                live[ident] = address
            offsets.append(offset)
        elif ident in live:
            address = live.pop(ident)
            ours.free(address)
            reference.free(address - ours.heap_base)
        assert ours.mapped == reference.top, f"event {k}: heap {ours.mapped} vs {reference.top}"
    assert ours.peak_mapped == reference.peak_top
    return offsets, reference.peak_top


def malloclab(text: str, name: str = "t") -> Trace:
    return read_malloclab(text.encode(), f"{name}.rep", name)


def header(ids: int, ops: int) -> str:
    return f"1\n{ids}\n{ops}\n1\n"


# -- hand-worked ----------------------------------------------------------------------------
def test_the_smallest_fitting_hole_is_taken_not_the_first() -> None:
    # a0 100→112 at 0; a1 16 at 112; a2 48 at 128; a3 16 at 176 (heap 192). Free a0 (hole 112
    # at 0) and a2 (hole 48 at 128). A 40-byte request (48) takes the 48-byte hole at 128.
    ops = ["a 0 100", "a 1 16", "a 2 48", "a 3 16", "f 0", "f 2", "a 4 40"]
    offsets, peak = run_both(malloclab(header(5, len(ops)) + "\n".join(ops) + "\n"))
    assert offsets == [0, 112, 128, 176, 128] and peak == 192


def test_equal_holes_go_to_the_lowest_address() -> None:
    ops = ["a 0 32", "a 1 16", "a 2 32", "a 3 16", "f 2", "f 0", "a 4 32"]
    offsets, _ = run_both(malloclab(header(5, len(ops)) + "\n".join(ops) + "\n"))
    assert offsets[-1] == 0


def test_a_free_block_at_the_top_is_extended_not_skipped() -> None:
    # a0 16 at 0, a1 64 at 16 (heap 80); free a1: 64 free at the top; a 100-byte request (112)
    # grows the heap by 48 and starts at 16: heap 128, not 80 + 112.
    ops = ["a 0 16", "a 1 64", "f 1", "a 2 100"]
    offsets, peak = run_both(malloclab(header(3, len(ops)) + "\n".join(ops) + "\n"))
    assert offsets == [0, 16, 16] and peak == 128


def test_freed_neighbours_merge_at_once() -> None:
    # Three 16-byte blocks freed in the order middle, first, last leave one 48-byte hole.
    ops = ["a 0 16", "a 1 16", "a 2 16", "a 3 16", "f 1", "f 0", "f 2", "a 4 48"]
    offsets, peak = run_both(malloclab(header(5, len(ops)) + "\n".join(ops) + "\n"))
    assert offsets[-1] == 0 and peak == 64


def test_realloc_and_free_of_null_follow_the_importer() -> None:
    ops = ["a 0 20", "r 0 40", "f -1", "a 1 8", "r 1 0", "f 0"]
    run_both(malloclab(header(2, len(ops)) + "\n".join(ops) + "\n"))


# -- random malloc-lab traces -----------------------------------------------------------------
def random_malloclab(seed: int, ops: int = 3000) -> str:
    rng = random.Random(seed)
    live: list[int] = []
    lines: list[str] = []
    next_id = 0
    while len(lines) < ops:
        roll = rng.random()
        if live and roll < 0.42:
            lines.append(f"f {live.pop(rng.randrange(len(live)))}")
        elif live and roll < 0.5:
            lines.append(f"r {rng.choice(live)} {rng.choice([1, 7, 24, 100, 4000, 65536])}")
        else:
            size = rng.choice([rng.randint(1, 64), rng.randint(1, 4096), 16, 32, 1 << 17])
            lines.append(f"a {next_id} {size}")
            live.append(next_id)
            next_id += 1
    return header(max(next_id, 1), len(lines)) + "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", range(12))
def test_random_malloclab_traces_agree_to_the_byte(seed: int) -> None:
    run_both(malloclab(random_malloclab(seed), f"random-{seed}"))


# -- the real programs' traces, when given -----------------------------------------------------
def _real_traces() -> list[Path]:
    folder = os.environ.get("ALLOCSIM_MALLOCLAB_TRACES")
    root = Path(folder) if folder else (Path(__file__).resolve().parents[2] / "shared" /
                                        "traces" / "malloclab")
    return sorted(root.glob("*.rep")) if root.is_dir() else []


@pytest.mark.skipif(not _real_traces(), reason="no malloc-lab traces given "
                    "(ALLOCSIM_MALLOCLAB_TRACES=DIR)")
@pytest.mark.parametrize("path", _real_traces(), ids=lambda p: p.stem)
def test_real_program_traces_agree_to_the_byte(path: Path) -> None:
    trace = formats.load(path)
    _, peak = run_both(trace)
    assert peak >= trace.peak_live()[0]
