"""The ``tpu`` policy (policies/tpu.py): each rule on a hand-worked case, then the whole model
against the TPU runtime's own records from a real v5e chip (tests/data/tpu/, recorded by
experiments/tpu/chip_probe.py: JAX 0.10.2, libtpu 0.0.42.1), in both implementations: the
Python model driven call by call, and the native core's twin (native/src/tpu.hpp) replaying
the recording through its engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from allocsim.policies.registry import parse_policy
from allocsim.policies.tpu import (
    GRANULE,
    V5E_RUNTIME_BYTES,
    TpuRuntimeAllocator,
    compaction_seconds,
    round_to_granule,
)
from allocsim.sim.kernel import native
from allocsim.sim.kernel.device import SimulatedDevice
from allocsim.sim.kernel.device_profile import (
    TPU_COSTS,
    TPU_V5E_BYTES_LIMIT,
    DeviceProfile,
    resolve_device,
)
from allocsim.sim.kernel.engine import TIMELINE_POINTS
from allocsim.traces import formats
from allocsim.traces.model import OP_ALLOC

sys.path.insert(0, str(Path(__file__).parent))
import native_cases as cases

DATA = Path(__file__).parent / "data" / "tpu"
MiB = 1 << 20


def small_tpu(capacity: int, runtime: int = 0, scratch: int = 0) -> TpuRuntimeAllocator:
    profile = DeviceProfile("tiny-tpu", capacity, granularity=512, map_granularity=512,
                            costs=TPU_COSTS)
    return TpuRuntimeAllocator(SimulatedDevice(profile).view(0), runtime_bytes=runtime,
                               scratch_bytes=scratch)


def v5e() -> TpuRuntimeAllocator:
    policy = parse_policy("tpu").build(SimulatedDevice(resolve_device("tpu-v5e")).view(0))
    assert isinstance(policy, TpuRuntimeAllocator)
    return policy


# -- each rule, by hand ---------------------------------------------------------------------
def test_a_fresh_heap_fills_from_the_top_below_the_runtimes_own_bytes() -> None:
    tpu = small_tpu(64 * MiB, runtime=V5E_RUNTIME_BYTES)
    a = tpu.malloc(3 * MiB)
    b = tpu.malloc(1 * MiB)
    assert a is not None and b is not None
    top = 64 * MiB - V5E_RUNTIME_BYTES
    assert tpu.hbm_offset(a) == top - 3 * MiB
    assert tpu.hbm_offset(b) == top - 4 * MiB
    tpu.check()


def test_sizes_are_whole_512_byte_granules() -> None:
    assert [round_to_granule(n) for n in (1, 511, 512, 513, 1025)] == [512, 512, 512, 1024, 1536]
    tpu = small_tpu(1 * MiB)
    one = tpu.malloc(1)
    two = tpu.malloc(513)
    assert one is not None and two is not None
    assert tpu.hbm_offset(one) == 1 * MiB - GRANULE
    assert tpu.hbm_offset(two) == 1 * MiB - GRANULE - 2 * GRANULE
    assert tpu.bytes_in_use == 3 * GRANULE


def test_best_fit_takes_the_smallest_hole_and_places_at_its_top() -> None:
    # From the top: 3, 6, 1, 2, 5, 4, 7 MiB; freeing the 6, 2 and 4 leaves holes of those sizes.
    tpu = small_tpu(64 * MiB)
    handles = [tpu.malloc(n * MiB) for n in (3, 6, 1, 2, 5, 4, 7)]
    offsets = [tpu.hbm_offset(h) for h in handles if h is not None]
    for i in (1, 3, 5):
        tpu.free(handles[i])  # type: ignore[arg-type]
    small = tpu.malloc(3 * MiB // 2)   # best fit: the 2 MiB hole (first fit would take the 6)
    assert small is not None
    assert tpu.hbm_offset(small) == offsets[3] + 2 * MiB - 3 * MiB // 2
    tpu.check()


def test_among_equal_holes_the_highest_address_wins() -> None:
    tpu = small_tpu(16 * MiB)
    a, b, c, d = (tpu.malloc(1 * MiB) for _ in range(4))
    assert None not in (a, b, c, d)
    high, low = tpu.hbm_offset(a), tpu.hbm_offset(c)  # type: ignore[arg-type]
    tpu.free(a)  # type: ignore[arg-type]
    tpu.free(c)  # type: ignore[arg-type]
    first = tpu.malloc(1 * MiB)
    second = tpu.malloc(1 * MiB)
    assert (tpu.hbm_offset(first), tpu.hbm_offset(second)) == (high, low)  # type: ignore[arg-type]


def test_a_freed_buffer_merges_with_both_free_neighbours() -> None:
    tpu = small_tpu(16 * MiB)
    a, b, c, keep = (tpu.malloc(1 * MiB) for _ in range(4))
    tpu.free(a)  # type: ignore[arg-type]
    tpu.free(c)  # type: ignore[arg-type]
    tpu.free(b)  # type: ignore[arg-type]
    tpu.check()
    assert tpu.stats().free_blocks == 2                      # the merged 3 MiB and the rest
    merged = tpu.malloc(3 * MiB)
    assert tpu.hbm_offset(merged) == 16 * MiB - 3 * MiB       # type: ignore[arg-type]
    assert keep is not None


def test_when_no_hole_fits_live_buffers_slide_to_the_top_in_address_order() -> None:
    tpu = small_tpu(8 * MiB)
    blocks = [tpu.malloc(1 * MiB) for _ in range(8)]
    for i in (1, 3, 5, 7):
        tpu.free(blocks[i])  # type: ignore[arg-type]
    # 4 MiB free in four 1 MiB holes: a 2 MiB request compacts.
    big = tpu.malloc(2 * MiB)
    assert big is not None and tpu.num_compactions == 1
    kept = [blocks[i] for i in (0, 2, 4, 6)]
    assert [tpu.hbm_offset(h) for h in kept] == [7 * MiB, 6 * MiB, 5 * MiB, 4 * MiB]  # type: ignore[arg-type]
    assert tpu.hbm_offset(big) == 2 * MiB
    assert tpu.compaction_moved_bytes == 3 * MiB             # block 0 was already at the top
    assert tpu.compaction_s == pytest.approx(compaction_seconds(3 * MiB))
    tpu.check()


def test_a_request_fails_only_when_the_free_total_is_short() -> None:
    tpu = small_tpu(8 * MiB)
    blocks = [tpu.malloc(1 * MiB) for _ in range(8)]
    for i in (1, 3, 5, 7):
        tpu.free(blocks[i])  # type: ignore[arg-type]
    assert tpu.malloc(4 * MiB + GRANULE) is None
    assert tpu.num_ooms == 1
    assert tpu.malloc(4 * MiB) is not None                    # exactly the free total fits


def test_a_refused_request_still_compacts_first() -> None:
    """On the chip (tests/data/tpu/steps/350m-eager) the frees after a refused request name
    the addresses a compaction gives the live buffers: the runtime compacts on every miss."""
    tpu = small_tpu(8 * MiB)
    blocks = [tpu.malloc(1 * MiB) for _ in range(8)]
    for i in (1, 3, 5, 7):
        tpu.free(blocks[i])  # type: ignore[arg-type]
    assert tpu.malloc(4 * MiB + GRANULE) is None
    kept = [blocks[i] for i in (0, 2, 4, 6)]
    assert [tpu.hbm_offset(h) for h in kept] == [7 * MiB, 6 * MiB, 5 * MiB, 4 * MiB]  # type: ignore[arg-type]
    assert (tpu.num_compactions, tpu.compaction_moved_bytes) == (1, 3 * MiB)
    assert tpu.malloc(4 * MiB + GRANULE) is None              # already compact: nothing moves
    assert (tpu.num_ooms, tpu.num_compactions) == (2, 1)
    tpu.check()


def test_the_runtime_holds_from_the_device_what_it_has_in_use_not_all_of_hbm() -> None:
    # Each buffer is taken as it is placed and given back as it is freed: reserved follows
    # bytes in use (the chip's bytes_in_use less its own bytes), not HBM's size.
    tpu = small_tpu(64 * MiB, runtime=V5E_RUNTIME_BYTES)
    view = tpu.device
    a, b = tpu.malloc(3 * MiB), tpu.malloc(1000)
    assert view.reserved == 3 * MiB + 1024                   # type: ignore[attr-defined]
    tpu.free(a)  # type: ignore[arg-type]
    assert view.reserved == 1024                              # type: ignore[attr-defined]
    assert view.peak_reserved == 3 * MiB + 1024               # type: ignore[attr-defined]
    tpu.free(b)  # type: ignore[arg-type]
    assert view.reserved == 0                                 # type: ignore[attr-defined]


def test_the_scratch_sits_at_the_bottom_and_the_free_total_leaves_it_out() -> None:
    # 8 MiB of HBM, 2 MiB of scratch: buffers fill from the top down to 2 MiB, not to 0 (the
    # chip's fill stopped 1.61 GB above offset 0 with that much scratch held, scratch-place).
    tpu = small_tpu(8 * MiB, scratch=2 * MiB)
    blocks = [tpu.malloc(1 * MiB) for _ in range(6)]
    assert [tpu.hbm_offset(h) for h in blocks] == [m * MiB for m in (7, 6, 5, 4, 3, 2)]  # type: ignore[arg-type]
    assert tpu.malloc(GRANULE) is None and tpu.num_ooms == 1  # the scratch is not free
    assert tpu.device.reserved == 8 * MiB                    # type: ignore[attr-defined]
    tpu.check()


def test_compaction_leaves_the_free_block_above_the_scratch() -> None:
    tpu = small_tpu(8 * MiB, scratch=2 * MiB)
    blocks = [tpu.malloc(1 * MiB) for _ in range(6)]
    for i in (1, 3, 5):
        tpu.free(blocks[i])  # type: ignore[arg-type]
    big = tpu.malloc(3 * MiB)     # 3 MiB free in three holes: compacts, then fits exactly
    assert big is not None and tpu.num_compactions == 1
    assert [tpu.hbm_offset(blocks[i]) for i in (0, 2, 4)] == [7 * MiB, 6 * MiB, 5 * MiB]  # type: ignore[arg-type]
    assert tpu.hbm_offset(big) == 2 * MiB
    tpu.check()


def test_the_bottom_block_is_the_one_just_above_the_scratch() -> None:
    # After a 1 MiB buffer at the top and a 2 MiB one below it, the 2 MiB freed: a 1 MiB request
    # takes that hole, not the bottom block [scratch, 5 MiB) that holds it too.
    tpu = small_tpu(8 * MiB, scratch=2 * MiB)
    top = tpu.malloc(1 * MiB)
    hole = tpu.malloc(2 * MiB)
    assert top is not None and hole is not None
    tpu.free(hole)
    small = tpu.malloc(1 * MiB)
    assert small is not None and tpu.hbm_offset(small) == 6 * MiB


@pytest.mark.parametrize("engine", ["python", "native"])
def test_a_run_with_scratch_is_refused_where_the_scratch_leaves_no_room(engine: str) -> None:
    # 8 MiB of HBM, 2 MiB of scratch, seven 1 MiB buffers: six fit, the seventh is refused,
    # and the run's peak reserved is the six and the scratch — in each engine.
    from allocsim.sim.kernel.engine import ProcessReplay
    from allocsim.traces.model import Trace
    trace = Trace.from_columns(list(range(7)), [OP_ALLOC] * 7, list(range(7)), [MiB] * 7)
    device = resolve_device("tpu-v5e").device_with(capacity=8 * MiB)
    spec = parse_policy("tpu:runtime_bytes=0,scratch_bytes=2MiB")
    if engine == "native":
        result = native.native_replay(trace, spec, device, stop_on_oom=False, progress=None,
                                      timeline_points=TIMELINE_POINTS, step=len(trace))
        if result is None:
            pytest.skip("the native core is not built here")
    else:
        run = ProcessReplay(trace, spec, SimulatedDevice(device))
        run.advance(len(trace))
        result = run.result(device.label)
    assert (result.ooms, result.first_oom_event) == (1, 6)
    assert result.peak_reserved == 8 * MiB


def test_a_compaction_is_charged_to_the_runs_modelled_time() -> None:
    tpu = small_tpu(8 * MiB)
    blocks = [tpu.malloc(1 * MiB) for _ in range(8)]
    for i in (1, 3, 5, 7):
        tpu.free(blocks[i])  # type: ignore[arg-type]
    before = tpu.device.cost_s                                # type: ignore[attr-defined]
    assert tpu.malloc(2 * MiB) is not None
    assert tpu.device.cost_s - before == pytest.approx(compaction_seconds(3 * MiB))  # type: ignore[attr-defined]


@pytest.mark.parametrize("keep_one_in, measured_s", [(2, 0.0391), (4, 0.0225), (8, 0.0163)])
def test_a_chip_recordings_modelled_time_is_its_measured_compaction(keep_one_in: int,
                                                                   measured_s: float) -> None:
    # The time from the request to its record on the chip (compaction-K, chip_probe.py); the
    # run's modelled time is its one compaction's (a TPU's other calls cost nothing), within
    # the three-point line's residual.
    from allocsim.sim.kernel.engine import replay
    result = replay(formats.load(DATA / f"compaction-{keep_one_in}"), "tpu",
                    resolve_device("tpu-v5e"))
    assert result.policy_stats["num_compactions"] == 1
    assert result.alloc_time_s == pytest.approx(measured_s, rel=0.05)


def test_a_tpu_devices_calls_cost_nothing_but_compaction() -> None:
    profile = resolve_device("tpu-v5e")
    costs = profile.costs
    assert (costs.malloc(1 << 30), costs.free(1 << 30), costs.map(1 << 30)) == (0.0, 0.0, 0.0)


def test_the_chip_placed_buffers_above_the_scratch_until_it_needed_its_room() -> None:
    # experiments/tpu/scratch_place_probe.py: a 1 GiB argument, a program with a 1.61 GB temp
    # run once, then 256 MiB buffers. The model with that scratch places every buffer the chip
    # placed while the scratch was held, and refuses the request at which the chip gave the
    # idle program's scratch up (not modelled: policies/tpu.py says why). The program's code
    # is loaded without a record of its own: its bytes show in the next record's
    # bytes_allocated, and the model takes them as a buffer just before that record.
    from allocsim.traces.formats.xla.xplane import xplane_records
    path = next((DATA / "scratch-place" / "scratch-fill").rglob("*.xplane.pb"))
    records, _ = xplane_records(path.read_bytes(), str(path))
    first = next(i for i, r in enumerate(records) if r["bytes_reserved"] > 0)
    end = next(i for i in range(first, len(records)) if records[i]["bytes_reserved"] == 0)
    scratch = records[first]["bytes_reserved"]
    assert scratch == 1_610_612_736
    tpu = TpuRuntimeAllocator(SimulatedDevice(resolve_device("tpu-v5e")).view(0),
                              scratch_bytes=scratch)
    handles: dict[int, int] = {}
    placed = 0
    for record in records[:end - 1]:          # up to the code's eviction, just before `end`
        after = tpu.bytes_in_use + (record["requested_bytes"] if record["kind"] == "alloc"
                                    else -tpu._live[handles[record["addr"]]][1])
        unrecorded = record["bytes_allocated"] - V5E_RUNTIME_BYTES - after
        if unrecorded > 0:
            assert tpu.malloc(unrecorded) is not None       # the program's code
        if record["kind"] == "alloc":
            handle = tpu.malloc(record["requested_bytes"])
            assert handle is not None and tpu.hbm_offset(handle) == record["addr"]
            handles[record["addr"]] = handle
            placed += 1
        else:
            tpu.free(handles.pop(record["addr"]))
    assert placed == 54
    lowest = min(tpu.hbm_offset(h) for h in handles.values())
    assert 0 < lowest - scratch < 256 * MiB                  # the fill stopped at the scratch
    assert records[end]["requested_bytes"] == 256 * MiB
    assert tpu.malloc(256 * MiB) is None                     # where the chip evicted it


def test_the_v5e_profile_is_the_chips_own_limit() -> None:
    profile = resolve_device("tpu-v5e")
    env = json.loads((DATA / "env.json").read_text())
    assert profile.capacity == TPU_V5E_BYTES_LIMIT == env["stats_before_any_array"]["bytes_limit"]
    before = env["stats_before_any_array"]["bytes_in_use"]
    assert before == V5E_RUNTIME_BYTES == profile.context_bytes
    for name in ("tpu-v4", "tpu-v5p", "tpu-v6e"):
        assert "assumed" in resolve_device(name).source


# -- against the chip's own records ---------------------------------------------------------
# The probes, then three bundled traces replayed on the chip as u8[n] buffers, each in a fresh
# process (the four larger replays, 53,002 records more, matched too but are not committed:
# see CHANGELOG.md).
RECORDED = ["placement", "random-small", "random-large", "compaction-2", "compaction-4",
            "compaction-8", "replay-sample-jax-cpu-train", "replay-sample-torch-cpu-mlp",
            "replay-sample-torch-cpu-transformer"]


def replay_against_records(folder: Path) -> tuple[int, int, TpuRuntimeAllocator]:
    """Every recorded allocation's and free's HBM offset against the model's; returns
    (matched, records, policy). The recordings start on a fresh runtime."""
    trace = formats.load(folder)
    refs = trace.metadata["reference_events"]
    tpu = v5e()
    handles: dict[int, int] = {}
    matched = 0
    for ref in refs:
        event = ref["event"]
        buffer = int(trace.id[event])
        if int(trace.op[event]) == OP_ALLOC:
            handle = tpu.malloc(int(trace.size[event]))
            assert handle is not None, f"{folder.name}: event {event} refused"
            handles[buffer] = handle
            where = tpu.hbm_offset(handle)
        else:
            handle = handles.pop(buffer)
            where = tpu.hbm_offset(handle)
            tpu.free(handle)
        matched += where == ref["addr"]
    return matched, len(refs), tpu


def native_replay_against_records(folder: Path) -> tuple[int, int, int]:
    """The same through the native core's engine, an event at a time: each buffer's handle is
    the engine's record of its malloc, its offset read off the core's blocks (after an
    allocation; before a free). Returns (matched, records, compactions)."""
    cases.need_core()
    trace = formats.load(folder)
    refs = trace.metadata["reference_events"]
    run = native.open_run(trace, parse_policy("tpu"), resolve_device("tpu-v5e"),
                          stop_on_oom=False, timeline_points=TIMELINE_POINTS,
                          record_addresses=True)
    assert run is not None, "the native core declined the tpu policy"
    handles: dict[int, int] = {}
    matched = 0
    for ref in refs:
        event = ref["event"]
        buffer = int(trace.id[event])
        if int(trace.op[event]) == OP_ALLOC:
            run.advance(event + 1)
            state = run.state()
            handle = int(state["addresses"][-1])
            assert handle > 0 and state["ooms"] == 0, f"{folder.name}: event {event} refused"
            handles[buffer] = handle
            where = cases.native_offsets(state)[handle]
        else:
            where = cases.native_offsets(run.state())[handles.pop(buffer)]
            run.advance(event + 1)
        matched += where == ref["addr"]
    assert run.advance(len(trace)) == len(trace)
    return matched, len(refs), run.state()["policy_state"]["num_compactions"]


@pytest.mark.parametrize("name", RECORDED)
def test_every_placement_on_the_chip_is_the_models(name: str) -> None:
    matched, total, tpu = replay_against_records(DATA / name)
    assert total > 70
    assert matched == total
    tpu.check()


@pytest.mark.parametrize("name", RECORDED)
def test_every_placement_on_the_chip_is_the_native_twins(name: str) -> None:
    matched, total, _ = native_replay_against_records(DATA / name)
    assert total > 70
    assert matched == total


@pytest.mark.parametrize("keep_one_in", [2, 4, 8])
def test_the_chips_compactions_are_the_models(keep_one_in: int) -> None:
    _, _, tpu = replay_against_records(DATA / f"compaction-{keep_one_in}")
    assert tpu.num_compactions == 1
    _, _, compactions = native_replay_against_records(DATA / f"compaction-{keep_one_in}")
    assert compactions == 1
    log = json.loads((DATA / f"compaction-{keep_one_in}.json").read_text())
    oom = next(e for e in log["events"] if e.get("key") == 300000)
    assert "RESOURCE_EXHAUSTED" in oom["error"]   # what the model does at a true shortage


def test_a_compaction_for_a_request_the_runtime_then_refused_is_followed() -> None:
    """The runtime compacts before it gives up on a request (its OOM) and records neither the
    move nor the request: the next frees name the moved addresses (the chip did this in
    steps/350m-eager). 16 KiB of HBM: A, B, C of 4 KiB top down, B freed, 12 KiB asked for
    (8 KiB free: refused after C slid up to B's place), then C and A freed."""
    from allocsim.traces.formats.xla.xplane import trace_from_records
    limit, k4 = 16 * 1024, 4 * 1024
    records = []

    def record(kind: str, addr: int, in_use: int, size: int | None = None) -> None:
        entry = {"kind": kind, "addr": addr, "bytes_allocated": in_use,
                 "bytes_available": limit - in_use, "peak_bytes_in_use": 3 * k4,
                 "time_ps": 1000 * len(records), "order": len(records), "plane": "/host:CPU"}
        if size is not None:
            entry.update(requested_bytes=size, allocation_bytes=size)
        records.append(entry)

    record("alloc", limit - k4, k4, k4)             # A
    record("alloc", limit - 2 * k4, 2 * k4, k4)     # B
    record("alloc", limit - 3 * k4, 3 * k4, k4)     # C
    record("free", limit - 2 * k4, 2 * k4)          # B
    record("free", limit - 2 * k4, k4)              # C, where the compaction moved it
    record("free", limit - k4, 0)                   # A
    trace = trace_from_records(records, "refused.xplane.pb", "refused")
    assert trace.metadata.get("prologue_events", 0) == 0   # every free found its alloc
    allocated = {int(b) for op, b in zip(trace.op, trace.id) if op == OP_ALLOC}
    freed = [int(b) for op, b in zip(trace.op, trace.id) if op != OP_ALLOC]
    assert len(allocated) == 3 and sorted(freed) == sorted(allocated)


def test_a_tpu_profiles_frees_take_their_sizes_from_the_allocs() -> None:
    trace = formats.load(DATA / "placement")
    sizes: dict[int, int] = {}
    for op, buffer, size in zip(trace.op, trace.id, trace.size):
        if op == OP_ALLOC:
            sizes[int(buffer)] = int(size)
        else:
            assert sizes.pop(int(buffer)) == int(size)
    assert not sizes


# -- fidelity: a TPU profile replayed through the model, record by record -------------------
def test_fidelity_of_a_recording_started_mid_run_places_its_earlier_buffers_first() -> None:
    from allocsim.sim.questions.fidelity.tpu import tpu_fidelity
    report = tpu_fidelity(formats.load(DATA / "midrun"))
    assert report.live_before > 0 and report.notes
    assert report.exact, report.lines()


def test_fidelity_names_the_first_record_the_model_places_elsewhere() -> None:
    from allocsim.sim.questions.fidelity.tpu import tpu_fidelity
    trace = formats.load(DATA / "placement")
    refs = trace.metadata["reference_events"]
    moved = next(k for k in range(10, len(refs)) if refs[k]["action"] == "alloc")
    refs[moved]["addr"] += 512       # as if the runtime had chosen another place
    report = tpu_fidelity(trace)
    assert report.matched == report.total - 1
    assert report.first_divergence is not None and report.first_divergence["record"] == moved
    assert "best fit" in report.first_divergence["rule"]


def test_fidelity_refuses_a_profile_that_is_not_a_tpus() -> None:
    from allocsim.sim.questions.fidelity.tpu import tpu_fidelity
    from allocsim.traces.model import TraceError
    trace = formats.load(DATA / "placement")
    trace.metadata["memory_runtime"] = "bfc"
    with pytest.raises(TraceError, match="not a TPU runtime's profile"):
        tpu_fidelity(trace)


def test_the_fidelity_command_judges_a_tpu_profile_by_the_tpu_model(
        capsys: pytest.CaptureFixture[str]) -> None:
    from allocsim.sim.cli.main import main
    assert main(["fidelity", str(DATA / "compaction-4")]) == 0
    out = capsys.readouterr().out
    assert "512/512 matched" in out and "compactions in the model: 1" in out


def test_tune_on_a_tpu_says_no_allocator_setting_changes_memory_there(
        capsys: pytest.CaptureFixture[str]) -> None:
    from allocsim.sim.cli.main import main
    assert main(["tune", str(DATA / "compaction-2"), "--framework", "jax", "--device",
                 "tpu-v5e"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "no allocator setting changes memory" in err and "min-capacity" in err


def test_a_runs_result_reports_the_tpus_compactions_in_both_twins() -> None:
    # policy_stats holds PolicyStats' fields and then the tpu's own counts (num_compactions,
    # compaction_moved_bytes): what compare --json and the report read.
    from allocsim.sim.kernel.engine import ProcessReplay
    trace = formats.load(DATA / "compaction-2")
    v5e = resolve_device("tpu-v5e")
    run = ProcessReplay(trace, parse_policy("tpu"), SimulatedDevice(v5e))
    run.advance(len(trace))
    python = run.result(v5e.label)
    assert python.policy_stats["num_compactions"] == 1
    assert python.policy_stats["compaction_moved_bytes"] > 0
    core = native.native_replay(trace, parse_policy("tpu"), v5e, stop_on_oom=False,
                                progress=None, timeline_points=TIMELINE_POINTS,
                                step=len(trace))
    if core is not None:
        assert core.policy_stats == python.policy_stats
