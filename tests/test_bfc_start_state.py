"""A mid-run BFC profile's start state, rebuilt (sim/questions/fidelity/bfc_start.py) and seeded
into the model (BFCAllocator.seed), so that ``allocsim fidelity`` follows TensorFlow's BFC from
the first record (issue 25.12, issue 14).

Hand-worked: the seed's chunk layout and what malloc and free then do; the pool size the
fragmentation stat pins; the region sizes BFC's doubling allows; a synthetic recording started
after a warm-up. Real: the two TensorFlow profiles started mid-run (tests/make_xplane.py).
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_bfc_fidelity import DATA, recording, run_cli, write

from allocsim.policies.bfc import BFCAllocator
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.questions.fidelity import bfc_start_refine
from allocsim.sim.questions.fidelity.bfc import PlacedDevice, Replay, bfc_fidelity
from allocsim.sim.questions.fidelity.bfc_start import (
    StartState,
    pool_bytes_from_records,
    region_sequences,
)
from allocsim.sim.questions.fidelity.device import address_floor
from allocsim.traces import formats

MiB = 1 << 20


BASE = 0x10_0000_0000


def fresh(place: bool = True) -> tuple[BFCAllocator, int]:
    """A BFC over the fidelity's device, told to put the first range at BASE."""
    device = PlacedDevice(DeviceProfile("t", 1 << 30, granularity=1), address_floor([BASE]))
    if place:
        device.places = [BASE]
    return BFCAllocator(device.view(0), memory_limit=64 * MiB), BASE


def test_seed_carves_live_chunks_and_leaves_coalesced_free_runs() -> None:
    policy, base = fresh()
    policy.seed([(base, MiB)], [(base + 0x100, 512, 500), (base + 0x1000, 4096, 4000)],
                curr_region_allocation_bytes=4 * MiB)
    policy.check()
    # [free 256][live 512][free 3,328][live 4,096][free the rest]
    assert list(policy.chunks.chunks()) == [
        (base, 256, False), (base + 0x100, 512, True), (base + 0x300, 3328, False),
        (base + 0x1000, 4096, True), (base + 0x2000, MiB - 0x2000, False)]
    assert policy.bytes_in_use == 4608 and policy.pool_bytes == MiB
    assert policy.requested[base + 0x100] == 500
    assert policy.curr_region_allocation_bytes == 4 * MiB
    # Best fit: 200 B (rounded 256) takes the 256-byte chunk at the base, the smallest.
    assert policy.malloc(200) == base
    # 3,000 B (rounded 3,072) takes the 3,328-byte chunk whole (3,328 < 2·3,072: no split).
    assert policy.malloc(3000) == base + 0x300 and policy.chunks.size[base + 0x300] == 3328
    # Freeing a seeded chunk: both neighbours are in use, nothing merges.
    policy.free(base + 0x100)
    assert policy.chunks.size[base + 0x100] == 512
    policy.check()
    # A chunk the seed made at the region's end merges with the free tail when freed.
    policy.free(base + 0x1000)
    assert policy.chunks.size[base + 0x1000] == MiB - 0x1000
    policy.check()


@pytest.mark.parametrize("regions, live, message", [
    ([(BASE, MiB)], [], "the device put region"),               # the device not told: elsewhere
    ("here", [(0, 100, 1)], "is not a multiple of 256"),
    ("here", [(-1, 256, 1)], "not inside free space"),         # outside the region
    ("here", [(0, 512, 1), (256, 512, 1)], "not inside free space"),   # overlapping
])
def test_seed_refuses_a_state_it_cannot_hold(regions, live, message) -> None:
    policy, base = fresh(place=regions == "here")
    if regions == "here":
        regions = [(base, 100 if message.startswith("is not") else MiB)]
        live = [(base + a, n, q) for a, n, q in live]
    with pytest.raises(ValueError, match=message):
        policy.seed(regions, live)


def test_the_fragmentation_stat_pins_the_pool() -> None:
    """Six digits, as TensorFlow's TraceMe prints them: pool 6 MiB, bytes in use U and the
    largest free chunk L give (6 MiB − U − L)/(6 MiB − U)."""
    pool = 6 * MiB
    cases = [(980224, 4 * MiB), (1897472, 4 * MiB), (1373184, 4 * MiB), (1383680, 4 * MiB)]
    refs = [{"fragmentation": float(f"{(pool - u - big) / (pool - u):.6g}"), "in_use": u}
            for u, big in cases]
    pools, why = pool_bytes_from_records(refs, 2 * MiB, 64 << 30)
    assert why == "" and pools[0] == pool
    # Without a fragmentation above 0 nothing tells pools apart: said, not guessed.
    flat = [{"fragmentation": 0.0, "in_use": u} for u, _ in cases]
    assert pool_bytes_from_records(flat, 2 * MiB, 64 << 30) == (
        [], "every record's fragmentation stat is 0 (it tells no pool size apart)")


def test_region_sizes_follow_the_doubling_rule() -> None:
    # curr starts at 2 MiB: 2 then 4 (curr doubles after a region that needed no doubling);
    # 16 after 2 needs a request over 8 MiB (curr doubled to 16 and kept); 2+8+8 is the other
    # way to 18 MiB.
    assert region_sequences(6 * MiB, 2 * MiB, 64 << 30) == [[2 * MiB, 4 * MiB]]
    eighteen = region_sequences(18 * MiB, 2 * MiB, 64 << 30)
    assert [2 * MiB, 16 * MiB] in eighteen and [2 * MiB, 8 * MiB, 8 * MiB] in eighteen
    assert all(sum(s) == 18 * MiB for s in eighteen)
    assert region_sequences(MiB, 2 * MiB, 64 << 30) == []


# A warm-up (the first five calls: A, B, C, D live, then B freed, leaving a 300 KiB hole) and
# a recording from the sixth call on. One 2 MiB region; C and A are freed in the recording
# (known from their free records), D never (its 50 KiB lies in the gap between recorded chunks).
WARM_UP = [("alloc", 1000), ("alloc", 300 << 10), ("alloc", 200 << 10), ("alloc", 50 << 10),
           ("free", 1)]
RECORDED = [("alloc", 100 << 10), ("free", 2), ("alloc", 250 << 10), ("free", 0),
            ("alloc", 700), ("alloc", 150 << 10), ("free", 7), ("alloc", 120 << 10)]


def test_a_synthetic_recording_started_after_a_warm_up_is_followed_from_its_start(
        tmp_path: Path) -> None:
    events = recording(WARM_UP + RECORDED, limit=64 * MiB)[len(WARM_UP):]
    trace = formats.load(write(tmp_path, events, "warm"))
    report = bfc_fidelity(trace)
    assert report.started_mid_run and report.start_state is not None, report.text()
    assert report.matched == report.total == len(RECORDED) and report.unknowable == 0
    (base, size), = report.start_state["regions"]
    assert size == 2 * MiB
    # Live at the start: A (1,024 B chunk) and C (200 KiB), freed in the recording, and D
    # (50 KiB), never freed.
    assert report.start_state["live_bytes"] == 1024 + (200 << 10) + (50 << 10)
    # The first record: 100 KiB goes into B's 300 KiB hole (smaller than the free tail), right
    # after A; a model started from nothing puts it at a new region's base.
    assert int(trace.metadata["reference_events"][0]["addr"]) == base + 1024
    from_nothing = Replay(trace, report.memory_limit, True, False).run()
    assert from_nothing.matched < report.total
    assert "state at the first record rebuilt from the records" in report.text()


MIDRUN = [("tf-cpu-midrun", 122, [2 * MiB, 4 * MiB]),
          ("tf-cpu-keras-midrun", 409, [2 * MiB, 16 * MiB]),
          ("tf-cpu-100mb-midrun", 126, [2 * MiB, 4 * MiB]),
          ("tf-cpu-keras-midrun-2", 407, [2 * MiB, 4 * MiB, 16 * MiB]),
          ("tf-cpu-keras-midrun-3", 411, [2 * MiB, 4 * MiB, 16 * MiB])]


@pytest.mark.parametrize("name, records, regions", MIDRUN)
def test_real_tensorflow_profiles_started_mid_run_match_from_their_start(
        name: str, records: int, regions: list[int]) -> None:
    """The MLP profiled from step 3 of 5 (120 recorded calls after the prologue, plus the 2
    frees of buffers allocated before recording, now compared too), the Keras fit profiled as
    TensorBoard(profile_batch=(3, 5)) does (396 + 13) — both matched 0% when the model started
    from nothing — and two more runs of the same (tests/make_xplane.py): the MLP at a 100 MiB
    limit, the Keras fit in another process, whose 16 MiB and 4 MiB regions lie 4 KiB apart
    (parted only at a gap wider than a region, it matched 235/407)."""
    path = DATA / f"{name}.xplane.pb"
    report = bfc_fidelity(formats.load(path))
    assert report.started_mid_run and report.start_state is not None
    assert report.total == records and report.matched == report.total
    assert report.unknowable == 0 and report.exit_status == 0
    assert report.by_field == {"chunk": records, "address": records, "in_use": records}
    assert report.start_state["live_bytes"] == report.bytes_in_use_at_start
    assert sorted(size for _, size in report.start_state["regions"]) == regions
    code, out, _ = run_cli("fidelity", path)
    assert code == 0 and f"matched {records}/{records} records (100.0%)" in out


def test_a_start_state_is_decided_by_the_records_after_it() -> None:
    """A third fresh run of the mid-run Keras fit (tests/make_xplane.py): the state at the
    first record had free bytes in two gaps between recorded chunks, which no proposal of
    start_states holds (it frees whole gaps at a region's ends and one more gap or one gap's
    end). Replayed from the best proposal the model matched 324/411 and diverged at event 76:
    a 256-byte chunk left alone at 0x...19200 was best fit where the real allocator's was
    part of a larger free chunk (512 B of the 2 KiB gap after it were free). The records
    after the start decide it (bfc_start_refine): 411/411, the bytes live at the start kept,
    and the report says how many states match as far."""
    path = DATA / "tf-cpu-keras-midrun-3.xplane.pb"
    report = bfc_fidelity(formats.load(path))
    assert report.matched == report.total == 411
    state = report.start_state
    assert state is not None and state["live_bytes"] == report.bytes_in_use_at_start
    assert any("(2,048 B) free at its low 512 B" in g for g in state["guesses"])
    assert state["states_left"] >= 1
    if state["states_left"] > 1:
        assert f"the records leave {state['states_left']} start states" in report.text()


def test_a_refinement_keeps_the_bytes_live_at_the_start() -> None:
    """Every change the refinement tries frees in one gap what another gap's free end gives
    back (or the reverse): the start state's live bytes are what was in use."""
    state = StartState(regions=[(0, 1 << 20)],
                       live=[(0, 256, 200), (4096, 3840, 3840), (12288, 2048, 2048)],
                       curr_region_allocation_bytes=1 << 20, prologue_address={},
                       gaps=[(256, 1024), (4096, 4096), (12288, 2048)], known_live=1)
    live = sum(n for _, n, _ in state.live)
    variants = [v for k in range(3) for v, _ in bfc_start_refine._variants(state, k)]
    assert variants
    for variant in variants:
        assert sum(n for _, n, _ in variant.live) == live
        assert variant.live[0] == (0, 256, 200)


def test_a_refinement_stops_at_its_bound_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refinement replays at most MAX_REPLAYED_EVENTS trace events; past that it stops,
    the report names the bound and gives the state it reached (here: none better)."""
    from allocsim.sim.questions.fidelity import bfc as fidelity_module

    monkeypatch.setattr(bfc_start_refine, "MAX_REPLAYED_EVENTS", 10)
    monkeypatch.setattr(fidelity_module, "MAX_REPLAYED_EVENTS", 10)
    report = bfc_fidelity(formats.load(DATA / "tf-cpu-keras-midrun-3.xplane.pb"))
    assert report.matched < report.total and report.exit_status == 1
    assert "refinement stopped after replaying 10 events" in report.text()


def test_pool_sizes_the_stat_leaves_open_are_all_replayed() -> None:
    """A random mix of requests (seeded) whose regions lie apart, profiled from its 61st call,
    with the fragmentation stat at six significant digits as TensorFlow writes it: 14 pool
    sizes fit the first records. The rebuild refused past 8 and replayed from nothing (0 of 17
    compared records); every size the stat allows is a candidate, the replay decides between
    them, and all 20 records match (the frees of buffers from before recording included)."""
    rng = random.Random(31)
    calls: list[tuple[str, int]] = []
    live: list[int] = []
    allocs = 0
    for _ in range(80):
        if live and rng.random() < 0.4:
            calls.append(("free", live.pop(rng.randrange(len(live)))))
        else:
            calls.append(("alloc", rng.choice([3 * MiB, 5 * MiB, 700, 20000, 200000, MiB,
                                                100000])))
            live.append(allocs)
            allocs += 1
    events = recording(calls, 1 << 34, spacing=1 << 30, digits=6)[60:]
    refs = [{"fragmentation": e["stats"]["fragmentation"], "in_use": e["stats"]["bytes_allocated"]}
            for e in events]
    pools, _ = pool_bytes_from_records(refs, 2 * MiB, 1 << 34)
    assert len(pools) == 14
    with tempfile.TemporaryDirectory() as folder:
        report = bfc_fidelity(formats.load(write(Path(folder), events, "open-pool")))
    assert report.start_state is not None and report.matched == report.total == 20
