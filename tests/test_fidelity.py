"""``allocsim fidelity``: the pytorch model against recorded PyTorch snapshots
(allocsim.sim.questions.fidelity.pytorch).

The round-trip guarantee: a snapshot made by running the model itself (simulate_snapshot:
its addresses, device calls, OOMs, empty_cache() calls, final segments, allocator_settings),
written as a pickle and read back by the importer, must match 100%. Then deliberate changes
must be caught where they are, and a recording started mid-run must be replayed from the
state the importer rebuilt (PyTorchCachingAllocator.seed).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from allocsim.policies import parse_policy
from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.sim.cli.fidelity import register
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.questions.fidelity import replay as fidelity_replay
from allocsim.sim.questions.fidelity.pytorch import (
    COMPARED_ACTIONS,
    FidelityError,
    fidelity,
    settings_from_snapshot,
    simulate_snapshot,
)
from allocsim.sim.questions.fidelity.recording import expandable_range_bases
from allocsim.traces import formats, synth
from allocsim.traces.formats.torch_snapshot import read_snapshot
from allocsim.traces.model import Trace

MiB = 1 << 20
SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


def imported(snapshot: dict[str, Any], name: str = "sim") -> Trace:
    """A snapshot dict through the pickle and the importer, as a user's file would go."""
    return read_snapshot(pickle.dumps(snapshot, protocol=4), f"{name}.pickle", name)


def training(steps: int = 4) -> Trace:
    return synth.generate("training", seed=0, steps=steps)


def profile(capacity: int) -> DeviceProfile:
    return DeviceProfile("small", capacity, granularity=512)


def consistent(report) -> None:
    """What every report must satisfy, matched or not."""
    assert 0 <= report.matched <= report.total
    assert sum(c["recorded"] for c in report.by_action.values()) == report.total
    assert sum(c["matched"] for c in report.by_action.values()) == report.matched
    assert report.exit_status == (0 if report.all_matched and report.final_segments_match else 1)
    data = report.to_json_dict()
    assert json.loads(json.dumps(data))["matched"] == report.matched
    assert report.text().count("\n") < 40


# -- the round trip ----------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["pytorch", "pytorch:max_split_size_mb=64",
                                  "pytorch:roundup_power2_divisions=4",
                                  "pytorch:expandable_segments=true"])
def test_the_model_matches_its_own_snapshot(spec: str) -> None:
    trace = training()
    snapshot = simulate_snapshot(trace, spec, empty_cache_before=[len(trace) // 2, len(trace)])
    report = fidelity(imported(snapshot))
    consistent(report)
    assert report.total > 20 and report.matched == report.total and report.extra == 0
    assert report.final_segments_match and report.exit_status == 0
    assert report.policy == str(parse_policy(spec))           # settings read back
    # An empty_cache() that releases nothing leaves no trace in a recording (with expandable
    # segments the one in the middle finds no wholly free page to unmap).
    assert report.empty_cache_calls == (1 if "expandable" in spec else 2)
    assert report.first_divergence is None


@pytest.mark.parametrize("spec", ["pytorch", "pytorch:max_split_size_mb=20",
                                  "pytorch:expandable_segments=true"])
def test_recorded_ooms_set_the_capacity_and_are_replayed(spec: str) -> None:
    trace = synth.generate("random", seed=2)
    capacity = int(trace.peak_live()[0] * 1.05) // (2 * MiB) * (2 * MiB)
    snapshot = simulate_snapshot(trace, spec, profile(capacity))
    assert any(e["action"] == "oom" for e in snapshot["device_traces"][0])
    report = fidelity(imported(snapshot))
    consistent(report)
    assert report.capacity == capacity and "device_free" in report.capacity_source
    assert report.injected_ooms == report.by_action["oom"]["recorded"] > 0
    assert report.exit_status == 0, report.text()


@pytest.mark.parametrize("spec", ["pytorch", "pytorch:expandable_segments=true"])
def test_several_streams_round_trip(spec: str) -> None:
    """The importer numbers streams by first appearance; PyTorch orders its pools (and so
    what empty_cache() releases first) by the raw stream handle: the model must too."""
    trace = synth.generate("random", seed=3, streams=3)
    capacity = int(trace.peak_live()[0] * 1.05) // (2 * MiB) * (2 * MiB)
    snapshot = simulate_snapshot(trace, spec, profile(capacity), empty_cache_before=[5000])
    recorded = imported(snapshot)
    assert recorded.metadata["stream_handles"] != {"0": 0, "1": 1, "2": 2}
    report = fidelity(recorded)
    assert report.empty_cache_calls == 1 and report.injected_ooms > 0
    assert report.exit_status == 0, report.text()


# -- divergences -------------------------------------------------------------------------
def test_a_changed_recorded_size_is_reported_where_it_is() -> None:
    trace = imported(simulate_snapshot(training()))
    refs = trace.metadata["reference_events"]
    k = next(j for j, r in enumerate(refs) if r["action"] == "segment_alloc" and j > 20)
    original = refs[k]["size"]
    refs[k]["size"] = original + 2 * MiB
    report = fidelity(trace)
    consistent(report)
    assert report.exit_status == 1
    assert report.matched == report.total - 1 and report.extra == 1
    d = report.first_divergence
    assert d["index"] == k and d["event"] == refs[k]["event"] and d["where"] == "alloc"
    assert d["recorded"] == {"action": "segment_alloc", "size": original + 2 * MiB,
                             "addr": refs[k]["addr"], "stream": 0, "time_ns": refs[k]["time_ns"]}
    assert d["simulated"] == {"action": "segment_alloc", "size": original}
    assert d["recorded_reserved"] == d["model_reserved"]       # the state before agreed
    assert any(e["index"] == d["event"] for e in d["trace_events"])
    assert d["model_segments"] and not report.final_segments_match
    assert report.final_segments["only_recorded"] == [original + 2 * MiB]
    assert "DIVERGES" in report.text()


def test_a_call_the_recording_did_not_make_is_a_divergence() -> None:
    trace = imported(simulate_snapshot(training()))
    refs = trace.metadata["reference_events"]
    k = next(j for j, r in enumerate(refs) if r["action"] == "segment_alloc" and j > 10)
    removed = refs.pop(k)
    report = fidelity(trace)
    consistent(report)
    assert report.exit_status == 1 and report.extra >= 1
    d = report.first_divergence
    assert d["event"] == removed["event"] and d["recorded"] is None
    assert d["simulated"] == {"action": "segment_alloc", "size": removed["size"]}


# -- empty_cache() ---------------------------------------------------------------------------
def burst_trace() -> Trace:
    """Three 30 MiB buffers freed; later a free and a 40 MiB alloc (a new segment)."""
    return Trace.from_events([(0, "alloc", 1, 30 * MiB), (1, "alloc", 2, 30 * MiB),
                              (2, "alloc", 3, 30 * MiB), (3, "alloc", 4, 512),
                              (4, "free", 1, None), (5, "free", 2, None),
                              (6, "free", 3, None), (7, "free", 4, None),
                              (8, "alloc", 5, 40 * MiB)], name="bursts")


@pytest.mark.parametrize("before, released", [
    (7, 3),     # before a free: the three 30 MiB segments (the 512 B block still holds its own)
    (8, 4),     # before an alloc that then takes a new segment: the small segment goes too
])
def test_empty_cache_bursts_are_detected_and_replayed(before: int, released: int) -> None:
    snapshot = simulate_snapshot(burst_trace(), empty_cache_before=[before])
    frees = [e for e in snapshot["device_traces"][0] if e["action"] == "segment_free"]
    assert len(frees) == released
    report = fidelity(imported(snapshot))
    assert report.empty_cache_calls == 1
    assert report.by_action["segment_free"] == {"recorded": released, "matched": released}
    assert report.exit_status == 0


def test_a_burst_that_a_failed_cudamalloc_explains_is_not_an_empty_cache() -> None:
    """max_split_size set: a failed cudaMalloc frees only the oversize block that fits
    (release_available_cached_blocks); empty_cache() would free both cached segments."""
    trace = Trace.from_events([(0, "alloc", 1, 12 * MiB), (1, "alloc", 2, 80 * MiB),
                               (2, "free", 1, None), (3, "free", 2, None),
                               (4, "alloc", 3, 50 * MiB)], name="retry")
    snapshot = simulate_snapshot(trace, "pytorch:max_split_size_mb=20", profile(100 * MiB))
    actions = [(e["action"], e["size"] // MiB) for e in snapshot["device_traces"][0]
               if e["action"].startswith("segment")]
    assert actions[-2:] == [("segment_free", 80), ("segment_alloc", 50)]
    report = fidelity(imported(snapshot))          # no oom entry: the capacity is unknown
    assert report.capacity_source.startswith("no oom entry")
    assert report.empty_cache_calls == 0 and report.exit_status == 0, report.text()


# -- starting mid-run ------------------------------------------------------------------------
@pytest.mark.parametrize("fraction", [0.3, 0.6])
@pytest.mark.parametrize("kind", ["training", "transformer"])
def test_a_recording_started_mid_run_starts_from_the_rebuilt_state(kind: str,
                                                                    fraction: float) -> None:
    trace = synth.generate(kind, seed=5)
    snapshot = simulate_snapshot(trace, empty_cache_before=[len(trace) * 3 // 4])
    entries = snapshot["device_traces"][0]
    allocs = [k for k, e in enumerate(entries) if e["action"] == "alloc"]
    late = dict(snapshot, device_traces=[entries[allocs[int(len(allocs) * fraction)]:]])
    cut = imported(late)
    initial = cut.metadata["initial_segments"]
    assert initial and cut.metadata["prologue_events"] > 0
    report = fidelity(cut)
    consistent(report)
    assert report.seeded_segments == len(initial)
    assert report.seeded_blocks == cut.metadata["prologue_events"]
    assert report.exit_status == 0, report.text()
    # Without the start state the model takes new segments for blocks that already had one.
    unseeded = copy.deepcopy(cut.metadata)
    unseeded["initial_segments"] = []
    bare = fidelity(Trace(cut.time_ns, cut.op, cut.id, cut.size, cut.stream, cut.process,
                          cut.tag, cut.tags, unseeded))
    assert bare.exit_status == 1 and bare.extra > 0


def seeded(segments: list[dict[str, Any]], **params: Any):
    view = SimulatedDevice(DeviceProfile("t", 1 << 30, granularity=512)).view(0)
    policy = PyTorchCachingAllocator(view, **params)
    return policy, policy.seed(segments), view


def block(address: int, size: int, state: str = "inactive", requested: int = 0) -> dict:
    return {"address": address, "size": size, "state": state, "requested_size": requested}


def test_seed_lays_out_blocks_and_counts_them() -> None:
    base = 1 << 40
    large = {"address": base, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
             "blocks": [block(base, 4 * MiB, "active_allocated", 4 * MiB - 100),
                        block(base + 4 * MiB, 6 * MiB), block(base + 10 * MiB, 2 * MiB),
                        block(base + 12 * MiB, 8 * MiB, "active_pending_free", 8 * MiB)]}
    small = {"address": base + 64 * MiB, "total_size": 2 * MiB, "stream": 0,
             "segment_type": "small", "blocks": [block(base + 64 * MiB, 2 * MiB)]}
    policy, mapping, view = seeded([small, large])
    assert sorted(mapping) == [base, base + 12 * MiB]
    assert view.reserved == 22 * MiB and view.mallocs == 2
    segments = policy.segments()
    assert [s["total_size"] for s in segments] == [20 * MiB, 2 * MiB]
    # The two touching inactive blocks were joined, as free_block would have.
    assert [(b["size"], b["state"]) for b in segments[0]["blocks"]] == [
        (4 * MiB, "active_allocated"), (8 * MiB, "inactive"), (8 * MiB, "active_allocated")]
    stats = policy.memory_stats()
    assert stats["allocated_bytes.all.current"] == 12 * MiB
    assert stats["requested_bytes.all.current"] == 12 * MiB - 100
    assert stats["segment.all.current"] == 2
    assert stats["inactive_split.all.current"] == 1
    assert stats["inactive_split_bytes.all.current"] == 8 * MiB
    # Cached blocks serve requests; freeing the seeded blocks merges the segment whole.
    assert policy.malloc(512 * 1024) is not None and view.mallocs == 2
    got = policy.malloc(8 * MiB)
    assert got == mapping[base] + 4 * MiB
    policy.free(got)
    policy.free(mapping[base])
    policy.free(mapping[base + 12 * MiB])
    large_seg = next(s for s in policy.segments() if s["segment_type"] == "large")
    assert [(b["size"], b["state"]) for b in large_seg["blocks"]] == [(20 * MiB, "inactive")]
    policy.empty_cache()
    assert view.reserved == 2 * MiB       # the small segment holds the 512 KiB block


def test_seed_refuses_what_it_cannot_model() -> None:
    base = 1 << 40
    gap = {"address": base, "total_size": 20 * MiB, "blocks": [block(base, 4 * MiB)]}
    with pytest.raises(ValueError, match="cover"):
        seeded([gap])
    expandable = {"address": base, "total_size": 20 * MiB, "is_expandable": True,
                  "blocks": [block(base, 20 * MiB)]}
    with pytest.raises(ValueError, match="expandable"):
        seeded([expandable])
    policy, _, _ = seeded([])
    policy.malloc(512)
    with pytest.raises(ValueError, match="fresh"):
        policy.seed([])


# -- starting mid-run with expandable segments --------------------------------------------
def es(address: int, size: int, blocks: list[dict], kind: str = "large", stream: int = 0,
       **extra: Any) -> dict:
    """One recorded mapped range of an expandable segment, as memory_snapshot() reports it."""
    return {"address": address, "total_size": size, "stream": stream, "segment_type": kind,
            "is_expandable": True, "blocks": blocks, **extra}


def test_seed_lays_out_expandable_ranges_in_one_virtual_range_per_stream_and_pool() -> None:
    """Two recorded mapped ranges of the large pool, 40 MiB apart, are one virtual range
    with 40 MiB of unmapped space between them; the small pool's range is another one.
    Worked by hand from find_expandable_block / map_block (CUDACachingAllocator.cpp)."""
    base = 1 << 40
    first = es(base, 40 * MiB, [block(base, 25 * MiB, "active_allocated", 25 * MiB - 100),
                                block(base + 25 * MiB, 15 * MiB)])
    second = es(base + 80 * MiB, 20 * MiB, [block(base + 80 * MiB, 4 * MiB),
                                            block(base + 84 * MiB, 6 * MiB),
                                            block(base + 90 * MiB, 10 * MiB, "active_allocated",
                                                  10 * MiB)])
    small = es(base + (4 << 30), 2 * MiB, [block(base + (4 << 30), 512, "active_allocated", 100),
                                           block(base + (4 << 30) + 512, 2 * MiB - 512)],
               kind="small")
    policy, mapping, view = seeded([small, second, first], expandable_segments=True)
    policy.check()
    assert sorted(mapping) == [base, base + 90 * MiB, base + (4 << 30)]
    start = mapping[base]                          # the model's virtual range of the large pool
    assert mapping[base + 90 * MiB] == start + 90 * MiB            # same offsets, same range
    assert view.reserved == 62 * MiB and view.mallocs == 3         # one map per mapped range
    assert len(policy.segment_map) == 2                            # two virtual ranges
    segments = policy.segments()
    assert [(s["address"] - start, s["total_size"], s["is_expandable"]) for s in segments[:2]] \
        == [(0, 40 * MiB, True), (80 * MiB, 20 * MiB, True)]
    # The touching inactive blocks were joined, as free_block would have.
    assert [(b["size"], b["state"]) for b in segments[1]["blocks"]] == [
        (10 * MiB, "inactive"), (10 * MiB, "active_allocated")]
    stats = policy.memory_stats()
    assert stats["reserved_bytes.all.current"] == 62 * MiB
    assert stats["allocated_bytes.all.current"] == 35 * MiB + 512
    assert stats["requested_bytes.all.current"] == 35 * MiB - 100 + 100
    assert stats["segment.all.current"] == 0          # PyTorch counts no expandable segment
    assert stats["num_device_alloc"] == 3
    # 30 MiB fits no free block; the lowest unmapped block with a free block before it is the
    # gap: 15 MiB free + one 20 MiB page mapped at +40 MiB, the block starting at +25 MiB.
    view.log = []
    assert policy.malloc(30 * MiB) == start + 25 * MiB
    assert [(c.kind, c.nbytes, c.address) for c in view.log] == [
        ("map", 20 * MiB, start + 40 * MiB)]
    policy.check()
    # Everything freed and the cache emptied: every page unmapped, both ranges released.
    for address in [start + 25 * MiB, *mapping.values()]:
        policy.free(address)
    policy.empty_cache()
    assert view.reserved == 0 and not policy.segment_map
    policy.check()


def test_seed_starts_the_virtual_range_where_a_later_map_shows_it_starts() -> None:
    """The first page of a range was unmapped before recording started: the range at the
    start is [base + 20 MiB, base + 60 MiB). The recording's later map at ``base`` (a map
    below every mapped page is made at the range's base) says where the range begins.
    A 25 MiB request then maps one page there (20 MiB unmapped + 10 MiB free before the
    allocated block); taking the range to begin at its lowest mapped page, the model would
    map two pages at the end instead."""
    base = 1 << 40
    start_range = es(base + 20 * MiB, 40 * MiB,
                     [block(base + 20 * MiB, 10 * MiB),
                      block(base + 30 * MiB, 30 * MiB, "active_allocated", 30 * MiB)])
    calls = {}
    for name, seg in (("revealed", dict(start_range, range_base=base)), ("lowest", start_range)):
        policy, mapping, view = seeded([seg], expandable_segments=True)
        policy.check()
        view.log = []
        address = policy.malloc(25 * MiB)
        calls[name] = [(c.kind, c.nbytes, c.address - address) for c in view.log]
        policy.check()
        if name == "revealed":
            assert address == mapping[base + 30 * MiB] - 30 * MiB        # at the range's base
    assert calls == {"revealed": [("map", 20 * MiB, 0)], "lowest": [("map", 40 * MiB, 0)]}


def test_expandable_range_bases_follow_the_recorded_maps_while_the_range_lives() -> None:
    base, small = 1 << 40, (1 << 40) + (2 << 40)
    initial = [es(base + 20 * MiB, 40 * MiB, []), es(small + 4 * MiB, 2 * MiB, [], "small")]

    def ref(action: str, addr: int, size: int) -> dict:
        return {"action": action, "addr": addr, "size": size, "stream": 0}

    refs = [ref("segment_map", small, 2 * MiB),            # a small-pool page (one 2 MiB page)
            ref("segment_map", base - 50 * MiB, 20 * MiB),  # not whole pages away: elsewhere
            ref("segment_map", base, 20 * MiB),            # the large range's base
            ref("segment_unmap", base, 60 * MiB),          # every page: the range is released
            ref("segment_map", base - 40 * MiB, 20 * MiB)]  # ... so this is a new range
    assert expandable_range_bases(initial, refs) == {(0, False): base, (0, True): small}
    assert expandable_range_bases(initial, []) == {(0, False): base + 20 * MiB,
                                                   (0, True): small + 4 * MiB}


def test_seed_refuses_expandable_states_it_cannot_lay_out() -> None:
    base = 1 << 40
    with pytest.raises(ValueError, match="not an expandable segment"):
        seeded([{"address": base, "total_size": 20 * MiB, "blocks": [block(base, 20 * MiB)]}],
               expandable_segments=True)
    # Two large-pool ranges of one stream that are not whole 20 MiB pages apart.
    with pytest.raises(ValueError, match="pages"):
        seeded([es(base, 20 * MiB, [block(base, 20 * MiB)]),
                es(base + 30 * MiB, 20 * MiB, [block(base + 30 * MiB, 20 * MiB)])],
               expandable_segments=True)
    with pytest.raises(ValueError, match="cover"):
        seeded([es(base, 20 * MiB, [block(base, 4 * MiB)])], expandable_segments=True)


@functools.cache
def expandable_snapshot(kind: str, seed: int = 5, **params: Any) -> dict[str, Any]:
    """The expandable-segments model's own snapshot of a synthetic run, empty_cache() every
    tenth of the way (so pages are unmapped and mapped again after each cut, and a pool can
    hold several mapped ranges at a cut)."""
    trace = synth.generate(kind, seed=seed, **params)
    return simulate_snapshot(trace, "pytorch:expandable_segments=true",
                             empty_cache_before=[len(trace) * k // 10 for k in range(1, 10)])


def cut_at(snapshot: dict[str, Any], fraction: float) -> Trace:
    """The snapshot as if recording had started at ``fraction`` of its allocs."""
    entries = snapshot["device_traces"][0]
    allocs = [k for k, e in enumerate(entries) if e["action"] == "alloc"]
    return imported(dict(snapshot, device_traces=[entries[allocs[int(len(allocs) * fraction)]:]]))


def unseeded(trace: Trace) -> Trace:
    meta = copy.deepcopy(trace.metadata)
    meta["initial_segments"] = []
    return Trace(trace.time_ns, trace.op, trace.id, trace.size, trace.stream, trace.process,
                 trace.tag, trace.tags, meta)


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 0.75])
@pytest.mark.parametrize("kind", ["training", "transformer"])
def test_an_expandable_recording_started_mid_run_starts_from_the_rebuilt_state(
        kind: str, fraction: float) -> None:
    """A recording with expandable segments cut at 10-75% of its allocs: the mapped ranges
    at the start (several per pool at some cuts) and their blocks are seeded, and every
    later segment_map / segment_unmap is made again. Without the start state, the model maps
    pages afresh for blocks that already had them. Honest limit: these cuts come from the
    model's own snapshots (simulate_snapshot) — no real expandable-segments snapshot is
    available here — so they check the seeding against the model's rules, not PyTorch's."""
    cut = cut_at(expandable_snapshot(kind), fraction)
    initial = cut.metadata["initial_segments"]
    assert initial and all(s["is_expandable"] for s in initial)
    assert cut.metadata["prologue_events"] > 0
    report = fidelity(cut)
    consistent(report)
    assert report.seeded_segments == len(initial)
    assert report.seeded_blocks == cut.metadata["prologue_events"]
    assert report.total > 0 and report.matched == report.total and report.extra == 0
    assert report.final_segments_match and report.exit_status == 0, report.text()
    bare = fidelity(unseeded(cut))
    assert bare.exit_status == 1 and bare.extra > 0


def test_an_expandable_recording_cut_after_its_first_pages_were_unmapped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """empty_cache() unmapped the first page of the range before recording started; the
    next request maps it again, at the range's base, below every page mapped at the start."""
    trace = Trace.from_events([(0, "alloc", 1, 30 * MiB), (1, "alloc", 2, 30 * MiB),
                               (2, "free", 1, None), (3, "alloc", 3, 25 * MiB),
                               (4, "free", 3, None), (5, "free", 2, None),
                               (6, "alloc", 4, 50 * MiB)], name="gap")
    snapshot = simulate_snapshot(trace, "pytorch:expandable_segments=true",
                                 empty_cache_before=[3, 6])
    maps = [(e["action"], e["size"] // MiB) for e in snapshot["device_traces"][0]
            if e["action"].startswith("segment")]
    assert maps == [("segment_map", 40), ("segment_map", 20), ("segment_unmap", 20),
                    ("segment_map", 20), ("segment_unmap", 60), ("segment_map", 60)]
    entries = snapshot["device_traces"][0]
    after = next(k for k, e in enumerate(entries) if e["action"] == "segment_unmap") + 1
    cut = imported(dict(snapshot, device_traces=[entries[after:]]))   # right after the unmap
    start = cut.metadata["initial_segments"]
    assert [(s["address"] - entries[0]["addr"], s["total_size"]) for s in start] == [
        (20 * MiB, 40 * MiB)]
    report = fidelity(cut)
    assert report.total == 3 and report.exit_status == 0, report.text()
    assert fidelity(unseeded(cut)).exit_status == 1
    # Taking the range to begin at its lowest page mapped at the start maps 40 MiB, not 20.
    monkeypatch.setattr(fidelity_replay, "expandable_range_bases",
                        lambda initial, refs, ranks=None: expandable_range_bases(initial, []))
    lowest = fidelity(cut)
    assert lowest.exit_status == 1
    assert lowest.first_divergence["simulated"] == {"action": "segment_map", "size": 40 * MiB}


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 0.75])
@pytest.mark.parametrize("seed, streams", [(5, 1), (3, 3)])
def test_an_expandable_random_workload_cut_mid_run(seed: int, streams: int,
                                                    fraction: float) -> None:
    """The same cuts of a random workload (three streams in raw-handle order other than
    first appearance at most cuts). The importer must rebuild a block freed after the cut at
    its rounded size in an expandable segment (any rest of 512 B or more is split there),
    not with up to 1 MiB of its room as in a large-pool segment."""
    cut = cut_at(expandable_snapshot("random", seed, streams=streams), fraction)
    assert fidelity(cut).exit_status == 0


def cut_before_alloc(trace: Trace, spec: str, alloc: int) -> Trace:
    """The model's own snapshot of ``trace`` as if recording had started at the request of
    its ``alloc``-th allocation (counting from 0; the segment it made comes first)."""
    snapshot = simulate_snapshot(trace, spec)
    entries = snapshot["device_traces"][0]
    start = [k for k, e in enumerate(entries) if e["action"] == "alloc"][alloc]
    while start > 0 and entries[start - 1]["action"] == "segment_alloc":
        start -= 1
    return imported(dict(snapshot, device_traces=[entries[start:]]))


def test_a_start_block_whose_neighbour_was_freed_before_recording_ends_where_later_allocs_begin(
        ) -> None:
    """A 5.5 MiB request took a 6 MiB free block before recording and kept its 0.5 MiB rest
    (should_split: large pool, remaining > kSmallSize only); the block that bounded it (B) was
    freed before recording too, so nothing live at the start says where A ends. A later
    2 MiB request is carved from the front of the free space after A, at A + 6 MiB: that
    address proves A's size. Laid out at its rounded 5.5 MiB instead, the model would see a
    14.5 MiB hole and serve the 14.25 MiB request from it where the real allocator took a new
    segment."""
    events = [("alloc", 1, 6 * MiB), ("alloc", 2, 14 * MiB), ("free", 1, 6 * MiB),
              ("alloc", 3, 11 * MiB // 2), ("free", 2, 14 * MiB),
              # recording starts here
              ("alloc", 4, 2 * MiB), ("free", 4, 2 * MiB), ("alloc", 5, 14 * MiB + MiB // 4),
              ("free", 3, 11 * MiB // 2), ("free", 5, 14 * MiB + MiB // 4)]
    trace = Trace.from_events((t, op, i, size) for t, (op, i, size) in enumerate(events))
    cut = cut_before_alloc(trace, "pytorch", 3)
    assert cut.metadata["initial_block_sizes_inferred"] == 1
    report = fidelity(cut)
    assert report.total == 1 and report.exit_status == 0, report.text()


def test_a_start_block_is_sized_by_the_recorded_settings_split_rule() -> None:
    """With max_split_size_mb=20 a 22 MiB request is oversize: it is never split, so it kept
    the whole 40 MiB segment it took before recording, not 22 MiB as the default rule (an
    18 MiB rest is more than kSmallSize) would keep. An 18 MiB request during recording then
    needs a new segment; with A laid out at 22 MiB the model would fit it into A's rest."""
    events = [("alloc", 1, 40 * MiB), ("free", 1, 40 * MiB), ("alloc", 2, 22 * MiB),
              # recording starts here
              ("alloc", 3, 18 * MiB), ("free", 2, 22 * MiB), ("free", 3, 18 * MiB)]
    trace = Trace.from_events((t, op, i, size) for t, (op, i, size) in enumerate(events))
    cut = cut_before_alloc(trace, "pytorch:max_split_size_mb=20", 2)
    assert cut.metadata["initial_block_sizes_inferred"] == 1
    report = fidelity(cut)
    assert report.total == 1 and report.exit_status == 0, report.text()


@pytest.mark.parametrize("fraction", [k / 10 for k in range(1, 10)])
def test_a_random_workload_cut_mid_run_is_reproduced_whole(fraction: float) -> None:
    """Cuts of a random workload's snapshot (ordinary segments): blocks live at the cut and
    freed after it carry unsplit rests whose bounding blocks are gone (6 of these 9 cuts
    diverged when their size was guessed up to the next live block only)."""
    trace = synth.generate("random", seed=3)
    snapshot = simulate_snapshot(trace, empty_cache_before=[len(trace) * 3 // 4])
    assert fidelity(cut_at(snapshot, fraction)).exit_status == 0


# -- settings ----------------------------------------------------------------------------
def test_allocator_settings_map_onto_the_policy_parameters() -> None:
    divisions = {str(1 << k): 0 for k in range(16)}
    recorded = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                "garbage_collection_threshold": 0.0, "expandable_segments": False,
                "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                "pinned_use_cuda_host_register": False,
                "graph_capture_record_stream_reuse": False,
                "roundup_power2_divisions": divisions}
    plain = settings_from_snapshot(recorded)
    assert str(plain.spec) == "pytorch" and not plain.not_modelled
    tuned = dict(recorded, max_split_size=128 * MiB, expandable_segments=True,
                 roundup_power2_divisions=dict(divisions, **{"256": 4, "512": 8}),
                 garbage_collection_threshold=0.6, some_new_knob=3)
    settings = settings_from_snapshot(tuned)
    assert settings.params["max_split_size_mb"] == 128
    assert settings.params["expandable_segments"] is True
    table = settings.spec.build(SimulatedDevice(profile(1 << 30)).view(0)).divisions
    assert table[8] == 4 and table[9] == 8 and table[7] == 0
    assert settings.not_modelled == ["some_new_knob=3"]
    assert any("memory fraction" in note for note in settings.notes)
    every = settings_from_snapshot(dict(recorded, roundup_power2_divisions={
        str(1 << k): 4 for k in range(16)}))
    assert str(every.spec) == "pytorch:roundup_power2_divisions=4"
    conf = settings_from_snapshot(dict(recorded,
                                       PYTORCH_CUDA_ALLOC_CONF="max_non_split_rounding_mb:64"))
    assert conf.params == {"max_non_split_rounding_mb": 64}
    missing = settings_from_snapshot(None)
    assert str(missing.spec) == "pytorch" and "defaults" in missing.notes[0]
    with pytest.raises(FidelityError, match="MiB"):
        settings_from_snapshot(dict(recorded, max_split_size=100 * MiB + 1))
    # A value of the wrong type is the file's fault, said in one line, not a traceback.
    with pytest.raises(FidelityError, match="garbage_collection_threshold = 'often'"):
        settings_from_snapshot(dict(recorded, garbage_collection_threshold="often"))


def test_a_trace_that_is_not_a_snapshot_is_refused_in_one_line() -> None:
    with pytest.raises(FidelityError, match="not a PyTorch memory snapshot") as err:
        fidelity(training())
    assert "\n" not in str(err.value)


# -- the command ---------------------------------------------------------------------------
def run_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="allocsim")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_the_command_exits_0_on_a_match_and_1_on_a_divergence(tmp_path, capsys) -> None:
    snapshot = simulate_snapshot(training())
    good = tmp_path / "good.pickle"
    good.write_bytes(pickle.dumps(snapshot, protocol=4))
    assert run_command(["fidelity", str(good)]) == 0
    assert "every recorded decision reproduced" in capsys.readouterr().out
    entry = next(e for e in snapshot["device_traces"][0] if e["action"] == "segment_alloc")
    entry["size"] += 2 * MiB
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps(snapshot, protocol=4))
    assert run_command(["fidelity", str(bad), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["exit_status"] == 1 and data["first_divergence"]["index"] == 0


# -- the real recordings -------------------------------------------------------------------
@pytest.mark.parametrize("name, recorded, segments", [
    ("torch-snapshot-eor.pickle", 7, 10),            # 7 segment_alloc; 10 segments at the end
    ("torch-snapshot-lm-inference.pickle", 0, 98),   # no device call recorded; 98 segments
])
def test_real_snapshots(name: str, recorded: int, segments: int) -> None:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} not available")
    trace = formats.load(str(path))
    report = fidelity(trace)
    consistent(report)
    assert report.total == recorded == sum(
        1 for r in trace.metadata["reference_events"] if r["action"] in COMPARED_ACTIONS)
    assert report.seeded_segments == len(trace.metadata["initial_segments"])
    assert report.final_segments["recorded_count"] == segments
    # Measured: every recorded decision and the final segment list are reproduced.
    assert report.matched == report.total and report.extra == 0
    assert report.final_segments_match and report.exit_status == 0
