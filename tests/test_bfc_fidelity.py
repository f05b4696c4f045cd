"""``allocsim fidelity PROFILE`` for BFC recordings (sim/questions/fidelity/bfc.py).

Real TensorFlow runs (tests/data/xplane/, see tests/make_xplane.py) match 100%; synthetic
recordings of the JAX-on-GPU shape are written from a BFC run itself, then damaged to check
that a divergence is found, named and located.
"""

from __future__ import annotations

import contextlib
import io
import json
from importlib import resources
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from allocsim.policies.bfc import BFCAllocator
from allocsim.sim.cli.main import main
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.questions.fidelity.bfc import BFCFidelityError, bfc_fidelity
from allocsim.traces import formats
from allocsim.traces.formats.xla.xplane_proto import encode_xspace
from allocsim.traces.model import Trace

DATA = Path(__file__).parent / "data" / "xplane"
# Profiles recorded from the program's first tensor; the "midrun" ones start later on purpose.
REAL = sorted(p for p in DATA.glob("*.xplane.pb") if "midrun" not in p.name)
MiB = 1 << 20


def run_cli(*argv: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def validator() -> Draft202012Validator:
    text = (resources.files("allocsim.sim.output") / "schemas" /
            "bfc-fidelity.schema.json").read_text(encoding="utf-8")
    return Draft202012Validator(json.loads(text))


def recording(calls: list[tuple[str, int]], limit: int = 64 * MiB, *, spacing: int = 1,
              digits: int | None = None) -> list[dict]:
    """Run ``bfc`` over ``calls`` (("alloc", bytes) / ("free", index of the alloc)) and write
    what a real BFC would record: chunk, address, bytes in use after each call. Regions lie
    at multiples of ``spacing`` (a host's allocator puts them apart); ``digits``: the
    fragmentation stat to that many significant digits, as a real profile has it."""
    device = SimulatedDevice(DeviceProfile("t", 1 << 44, granularity=spacing))
    policy = BFCAllocator(device.view(0), memory_limit=limit)
    addresses: list[int] = []
    events = []
    for step, (kind, value) in enumerate(calls):
        if kind == "alloc":
            address = policy.malloc(value)
            assert address is not None
            addresses.append(address)
            chunk, requested = policy.chunks.size[address], value
        else:
            address = addresses[value]
            chunk, requested = policy.chunks.size[address], policy.requested[address]
            policy.free(address)
        events.append({"name": "MemoryAllocation" if kind == "alloc" else "MemoryDeallocation",
                       "offset_ps": 1000 * step,
                       "stats": {"allocator_name": "GPU_0_bfc", "bytes_reserved": 0,
                                 "bytes_allocated": policy.bytes_in_use,
                                 "bytes_available": limit - policy.bytes_in_use,
                                 "fragmentation": policy.fragmentation() if digits is None
                                 else float(f"{policy.fragmentation():.{digits}g}"),
                                 "peak_bytes_in_use": policy.peak_bytes_in_use,
                                 "requested_bytes": requested, "allocation_bytes": chunk,
                                 "addr": address, "tf_op": "jit(f)/op", "shape": "f32[]"}})
    return events


CALLS = [("alloc", 1000), ("alloc", 3 * MiB), ("alloc", 700), ("free", 0), ("alloc", 900),
         ("alloc", 5 * MiB), ("free", 1), ("alloc", 2 * MiB), ("free", 2), ("alloc", 100)]


def write(tmp_path: Path, events: list[dict], name: str = "gpu") -> Path:
    path = tmp_path / f"{name}.xplane.pb"
    path.write_bytes(encode_xspace([{"name": "/host:CPU", "lines": [
        {"name": "python", "timestamp_ns": 1, "events": events}]}]))
    return path


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_tensorflow_runs_match_completely(path: Path) -> None:
    report = bfc_fidelity(formats.load(path))
    assert report.total == len(formats.load(path)) and report.matched == report.total
    assert report.by_field == {"chunk": report.total, "address": report.total,
                               "in_use": report.total}
    assert report.allow_growth and not report.started_mid_run and report.exit_status == 0
    code, out, _ = run_cli("fidelity", path)
    assert code == 0 and f"matched {report.total:,}/{report.total:,} records (100.0%)" in out


def test_json_validates_against_the_schema(tmp_path: Path) -> None:
    code, out, _ = run_cli("fidelity", REAL[0], "--json")
    assert code == 0
    data = json.loads(out)
    assert not list(validator().iter_errors(data)) and data["first_divergence"] is None
    events = recording(CALLS)
    events[4]["stats"]["addr"] += 256
    code, out, _ = run_cli("fidelity", write(tmp_path, events), "--json")
    assert code == 1
    data = json.loads(out)
    assert not list(validator().iter_errors(data)) and data["first_divergence"]["event"] == 4


def test_synthetic_gpu_recording_matches_and_divergence_is_named(tmp_path: Path) -> None:
    good = bfc_fidelity(formats.load(write(tmp_path, recording(CALLS))))
    assert good.matched == good.total == len(CALLS) and good.exit_status == 0
    # A recorded chunk one size class larger at the same place: the split rule.
    events = recording(CALLS)
    events[0]["stats"]["allocation_bytes"] += 256
    split = bfc_fidelity(formats.load(write(tmp_path, events, "split")))
    assert split.exit_status == 1 and split.first_divergence is not None
    assert split.first_divergence["rule"] == "split" and split.matched_until == -1
    code, out, _ = run_cli("fidelity", write(tmp_path, events, "split"))
    assert code == 1 and "first divergence at event 0" in out and "ShouldSplitChunk" in out
    # A recorded address elsewhere inside the model's regions: the best fit.
    events = recording(CALLS)
    events[4]["stats"]["addr"] += 4096
    fit = bfc_fidelity(formats.load(write(tmp_path, events, "fit")))
    assert fit.first_divergence is not None and fit.first_divergence["rule"] == "best_fit"
    assert fit.matched_until == 3 and fit.matched < fit.total


def test_recording_that_starts_mid_run(tmp_path: Path) -> None:
    """Drop the first two calls: the allocator's state before the third is rebuilt from the
    records (sim/questions/fidelity/bfc_start.py) and every record matches, the frees of the two
    buffers allocated before recording included. The 8 MiB region Extend makes during the
    recording is taken as there from the start: wholly free until its first chunk, at the
    address recorded, it changes no decision, and the records cannot tell the two apart."""
    events = recording(CALLS)[2:]
    report = bfc_fidelity(formats.load(write(tmp_path, events, "mid")))
    assert report.started_mid_run and report.unknowable == 0
    assert report.bytes_in_use_at_start > 0
    assert report.total == len(events) and report.matched == report.total
    assert report.start_state is not None
    assert report.start_state["live_bytes"] == report.bytes_in_use_at_start
    assert "recording started mid-run" in report.text()


def test_a_start_the_records_cannot_pin_is_said_and_replayed_from_nothing(
        tmp_path: Path) -> None:
    """Without a fragmentation above 0 the pool size is open: the state is not rebuilt, the
    report says why, and the buffers from before recording are left out of the comparison."""
    events = recording(CALLS)[2:]
    for event in events:
        event["stats"]["fragmentation"] = 0.0
    report = bfc_fidelity(formats.load(write(tmp_path, events, "flat")))
    assert report.started_mid_run and report.start_state is None and report.unknowable == 2
    assert report.total == len(events) - 2
    # regions made before recording are unknown, so places diverge; sizes and in-use do not
    assert report.by_field["chunk"] == report.by_field["in_use"] == report.total
    assert report.first_divergence is not None and report.first_divergence["rule"] == "extend"
    said = [n for n in report.notes if "was not rebuilt" in n]
    assert said and "every record's fragmentation stat is 0" in said[0]
    assert "note: the allocator's state at the first record was not rebuilt" in report.text()


def test_not_a_bfc_recording() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 10)])
    with pytest.raises(BFCFidelityError):
        bfc_fidelity(trace)


@pytest.mark.slow
@pytest.mark.parametrize("limit_mb", [None, 100])
def test_a_live_keras_run_matches_the_real_bfc_at_every_record(tmp_path, limit_mb) -> None:
    # The cases, recorded now by TensorFlow's own BFC (CI installs the extra): a Keras
    # fit() traced from before its first tensor, at the default limit and at 100 MiB.
    pytest.importorskip("tensorflow")
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from make_xplane import record

    from allocsim.sim.questions.fidelity.bfc import bfc_fidelity
    from allocsim.traces import formats
    extra = {} if limit_mb is None else {"TF_CPU_BFC_MEM_LIMIT_IN_MB": str(limit_mb)}
    profile = record("keras", extra, str(tmp_path))
    report = bfc_fidelity(formats.load(profile))
    data = report.to_json_dict()
    assert report.exit_status == 0, report.text()
    assert data["matched"] == data["total"] > 1000


@pytest.mark.parametrize("name", ["tf-cpu-midrun", "tf-cpu-keras-midrun"])
def test_a_match_up_to_an_event_counts_recorded_calls_never_the_prologue(name: str) -> None:
    """Real TensorFlow profiles started mid-run (tests/make_xplane.py: the profiler started at
    step 3 of an MLP, and at batch 3 of a Keras fit as TensorBoard(profile_batch=(3, 5)) does).
    The prologue's allocations are the replay's guess of what was live, not recorded calls:
    "matched without a break up to event N" must not count them."""
    trace = formats.load(DATA / f"{name}.xplane.pb")
    prologue = trace.metadata["prologue_events"]
    assert prologue > 0
    report = bfc_fidelity(trace)
    assert report.started_mid_run
    first_recorded = min(int(r["event"]) for r in trace.metadata["reference_events"])
    assert first_recorded >= prologue
    assert report.matched_until == -1 or report.matched_until >= first_recorded
    if report.matched_until == -1:
        assert "no recorded call matched before the first divergence" in report.text()
