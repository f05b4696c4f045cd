"""The validator on the host backend (no GPU): exact agreement with the simulator, caught
overlaps, the no-GPU error, results.json, reports, the CLI and the GPU backends on a fake CuPy
(calibration is tests/test_calibrate.py's)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fake_gpu import FakeCupy, FakeTorch, install_fake_gpu
from policy_checks import OverlapBFC, SameAddressBFC

from allocsim.policies import POLICIES, parse_policy
from allocsim.sim.cli import calibrate as calibrate_command
from allocsim.sim.cli import main
from allocsim.sim.cli import validate as validate_command
from allocsim.sim.kernel.device import DeviceProfile, resolve_device
from allocsim.sim.kernel.engine import replay
from allocsim.sim.questions.compare import compare
from allocsim.sim.validation.backends import BACKENDS
from allocsim.sim.validation.errors import NoGPUError, ValidatorError
from allocsim.sim.validation.host_device import HostDevice
from allocsim.sim.validation.patterns import count_pattern_errors, fill_pattern
from allocsim.sim.validation.report import ValidationReport
from allocsim.sim.validation.validator import bundled_match, validate, validate_results
from allocsim.traces import Trace, formats, synth
from allocsim.traces.bundled import bundled_path

MiB = 1 << 20
GiB = 1 << 30
POLICY_SPECS = ("bfc", "best-fit", "on-demand", "preallocate")


@pytest.fixture(scope="module")
def traces() -> dict[str, Trace]:
    return {"training": synth.generate("training", steps=2, layers=2),
            "random": synth.generate("random", events=3000)}


def profile(capacity: int = 2 * GiB) -> DeviceProfile:
    return resolve_device("a100-80g", capacity=capacity)


# -- the host backend agrees with the simulator exactly --------------------------------


@pytest.mark.parametrize("kind", ["training", "random"])
@pytest.mark.parametrize("spec", POLICY_SPECS)
def test_host_backend_matches_the_simulation_after_every_event(traces, kind: str,
                                                               spec: str) -> None:
    trace = traces[kind]
    report = validate(trace, spec, "host", profile())
    assert report.corruptions == 0 and report.blocks_checked > 0
    assert np.array_equal(report.measured_reserved, report.sim_reserved)
    assert len(report.sim_reserved) == len(trace)
    assert report.reserved_error.max_abs == 0 and report.reserved_error.mismatched_events == 0
    oom = report.metric("first OOM event")
    assert oom.simulated == oom.measured
    calls = report.metric("device calls")
    assert calls.simulated == calls.measured > 0
    assert report.passed, report.verdict()
    # The simulated side is what `allocsim compare` reports for the same trace and device.
    expected = replay(trace, spec, profile())
    assert report.simulated["peak_reserved"] == expected.peak_reserved
    assert report.metric("peak reserved").measured == expected.peak_reserved
    assert report.simulated["first_oom_event"] == expected.first_oom_event
    assert report.simulated["device_mallocs"] == expected.device_mallocs


@pytest.mark.parametrize("spec", ["bfc", "best-fit", "on-demand",
                                  "bfc:allow_growth=false,fraction=0.5"])
def test_oom_happens_at_the_same_event(traces, spec: str) -> None:
    report = validate(traces["random"], spec, "host", profile(GiB // 2))
    oom = report.metric("first OOM event")
    assert oom.simulated is not None and oom.simulated == oom.measured
    assert report.metric("OOMs").simulated == report.metric("OOMs").measured > 0
    assert np.array_equal(report.measured_reserved, report.sim_reserved)
    assert report.corruptions == 0 and report.passed


def test_other_policies_when_they_exist(traces) -> None:
    """The PyTorch / CuPy models are written elsewhere; validate them when registered."""
    ran = 0
    for spec in ("pytorch", "pytorch:expandable_segments=true", "cupy", "cuda-async"):
        try:
            parse_policy(spec)
        except ValueError:
            continue
        report = validate(traces["random"], spec, "host", profile(GiB))
        assert report.corruptions == 0 and report.passed, (spec, report.verdict())
        ran += 1
    if not ran:
        pytest.skip("no pytorch/cupy/cuda-async policy registered yet")


# -- broken placements are caught ------------------------------------------------------


@pytest.mark.parametrize("broken", [SameAddressBFC, OverlapBFC])
def test_overlapping_placements_are_caught(traces, monkeypatch, broken: type) -> None:
    monkeypatch.setitem(POLICIES, broken.name, broken)
    report = validate(traces["training"], broken.name, "host", profile())
    assert report.corruptions > 0 and report.first_corruption
    assert report.corruption_kinds.get("overwritten", 0) > 0, report.corruption_kinds
    assert sum(report.corruption_kinds.values()) == report.corruptions
    assert not report.passed
    assert "patterns" in report.verdict()


SMALL_BUNDLED = [p for p in sorted(bundled_path().parent.glob("*.npz"))
                 if len(formats.load(p)) <= 5000]


@pytest.mark.parametrize("path", SMALL_BUNDLED, ids=lambda p: p.stem)
def test_overlaps_are_caught_on_the_bundled_samples(monkeypatch, path: Path) -> None:
    monkeypatch.setitem(POLICIES, OverlapBFC.name, OverlapBFC)
    trace = formats.load(path)
    report = validate(trace, OverlapBFC.name, "host", profile())
    assert report.corruption_kinds.get("overwritten", 0) > 0, report.corruption_kinds
    assert validate(trace, "bfc", "host", profile()).corruptions == 0


def test_pattern_catches_any_overlap_of_four_bytes_or_more() -> None:
    for shift in range(9):
        memory = np.zeros(64, dtype=np.uint8)
        fill_pattern(memory[0:32], key=7)
        fill_pattern(memory[32 - 4 - shift:60], key=8)   # overlaps the first by 4 + shift bytes
        assert count_pattern_errors(memory[0:32], key=7) > 0, shift
        assert count_pattern_errors(memory[32 - 4 - shift:60], key=8) == 0
    # Two allocations whose keys differ only in high bits are still told apart.
    memory = np.zeros(16, dtype=np.uint8)
    fill_pattern(memory, key=1)
    assert count_pattern_errors(memory, key=1 + (1 << 18)) > 0


def test_host_device_records_what_a_real_driver_would_refuse() -> None:
    device = HostDevice(profile())
    base = device.address_range(64 * MiB)
    assert device.map(base, 2 * MiB)
    assert device.map(base, 2 * MiB)                  # the same page again
    device.unmap(base + 4 * MiB, 2 * MiB)             # a page never mapped
    device.release(12345)                             # not a reserved base
    assert len(device.problems) == 3
    assert device.fill(base, 2 * MiB, 1) and device.check(base, 2 * MiB, 1) == 0
    assert not device.fill(base, 2 * MiB + 1, 2)      # runs past the mapped page
    assert device.check(base + 2 * MiB, 16, 3) == -1


def test_a_block_in_a_reservations_rounding_slack_is_out_of_region() -> None:
    device = HostDevice(profile())
    base = device.reserve(1000)                       # 1024 bytes held, 1000 usable
    assert base is not None and device.reserved == 1024
    assert device.fill(base, 1000, 1)
    assert not device.fill(base + 512, 500, 2)


# -- no GPU ----------------------------------------------------------------------------


def _assert_no_gpu_line(err: BaseException) -> None:
    text = str(err)
    assert "\n" not in text
    assert text.startswith("no CUDA GPU visible (cupy")
    assert text.endswith("allocsim validate needs one except with --backend host")


def test_no_gpu_gives_one_line(traces, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)    # as if cupy were not installed
    with pytest.raises(NoGPUError) as caught:
        validate(traces["training"], "bfc", "policy", profile())
    _assert_no_gpu_line(caught.value)
    assert "cupy is not installed" in str(caught.value)
    with pytest.raises(NoGPUError):
        validate(traces["training"], None, "cupy-raw", profile())


class _FakeRuntime:
    def __init__(self, count: int | None) -> None:
        self.count = count

    def getDeviceCount(self) -> int:
        if self.count is None:
            raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected\n(code 100)")
        return self.count


class _FakeCupy:
    __version__ = "13.0.0-fake"

    def __init__(self, count: int | None) -> None:
        self.cuda = type("cuda", (), {"runtime": _FakeRuntime(count)})()


@pytest.mark.parametrize("count, says", [(None, "cudaErrorNoDevice"), (0, "sees 0 devices")])
def test_no_gpu_when_cupy_sees_none(traces, monkeypatch, count, says) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _FakeCupy(count))
    with pytest.raises(NoGPUError) as caught:
        validate(traces["training"], "on-demand", "policy", profile())
    _assert_no_gpu_line(caught.value)
    assert says in str(caught.value) and "13.0.0-fake" in str(caught.value)


def test_allocator_backends_fail_clearly_without_their_model_or_gpu(traces, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    for backend in ("cupy-pool", "cupy-async"):
        with pytest.raises(ValidatorError) as caught:
            validate(traces["training"], None, backend, profile())
        text = str(caught.value)
        assert "\n" not in text
        assert "no CUDA GPU visible" in text or "policy model" in text


def test_cli_no_gpu_exits_2_with_one_line(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    path = tmp_path / "t.csv"
    formats.save(synth.generate("training", steps=1, layers=1), path)
    assert main(["validate", str(path), "--policy", "bfc", "--backend", "policy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("allocsim: error: no CUDA GPU visible (cupy")


def test_importing_the_validator_needs_no_cupy() -> None:
    # Every module of the room, and its two commands.
    room = Path(__file__).resolve().parents[1] / "sim" / "validation"
    modules = [f"allocsim.sim.validation.{path.stem}" for path in sorted(room.glob("*.py"))
               if path.stem != "__init__"] + ["allocsim.sim.cli.validate",
                                               "allocsim.sim.cli.calibrate"]
    code = (f"import sys, {', '.join(modules)}; "
            "print(sorted(m for m in ('cupy', 'torch', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True).stdout
    assert out.strip() == "[]"


def test_user_mistakes_are_one_line_value_errors(traces) -> None:
    with pytest.raises(ValidatorError, match="unknown backend"):
        validate(traces["training"], "bfc", "gpu", profile())
    with pytest.raises(ValidatorError, match="--policy"):
        validate(traces["training"], None, "host", profile())
    with pytest.raises(ValueError, match="unknown policy"):
        validate(traces["training"], "no-such-policy", "host", profile())
    shared = Trace.from_events([(0, "alloc", 1, 4096, 0, 0), (1, "alloc", 2, 4096, 0, 1),
                                (2, "free", 1, None, 0, 0), (3, "free", 2, None, 0, 1)])
    with pytest.raises(ValidatorError, match="one process"):
        validate(shared, "bfc", "host", profile())
    assert all(isinstance(b.exact, bool) for b in BACKENDS.values())


# -- validate the winner of a compare results.json -------------------------------------


def _results_json(tmp_path: Path, trace: Trace, capacity: int = 2 * GiB) -> Path:
    comparison = compare(trace, ["on-demand", "preallocate", "best-fit", "bfc"],
                         profile(capacity), max_slowdown=None)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(comparison.to_json_dict()))
    return path


def test_validate_results_json_validates_the_winner(tmp_path) -> None:
    trace = synth.generate("training", steps=2, layers=2)
    trace_path = tmp_path / "run.npz"
    trace.metadata["source"] = str(trace_path)        # as a recorded trace would say
    formats.save(trace, trace_path)
    results = _results_json(tmp_path, formats.load(trace_path))
    winner = json.loads(results.read_text())["winner"]
    assert winner
    report = validate_results(results, "host")
    assert report.policy == winner and report.backend == "host"
    assert report.profile["capacity"] == 2 * GiB       # the comparison's device
    assert report.passed and report.corruptions == 0
    assert report.simulated["peak_reserved"] == next(
        r["peak_reserved"] for r in json.loads(results.read_text())["results"]
        if r["policy"] == winner)
    # --policy overrides the winner.
    assert validate_results(results, "host", policy="bfc").policy == "bfc"


def test_validate_results_json_needs_a_trace_file(tmp_path) -> None:
    trace = synth.generate("training", steps=1, layers=1)      # source "synth:training"
    results = _results_json(tmp_path, trace)
    with pytest.raises(ValidatorError, match="is not a file") as caught:
        validate_results(results, "host")
    assert "\n" not in str(caught.value)
    data = json.loads(results.read_text())
    data["winner"] = None
    results.write_text(json.dumps(data))
    with pytest.raises(ValidatorError, match="no winner"):
        validate_results(results, "host")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValidatorError, match="not JSON"):
        validate_results(tmp_path / "bad.json", "host")


def test_validate_results_json_of_the_bundled_trace(tmp_path) -> None:
    """`allocsim compare` with no trace records the generator as source: the bundled file is
    found by name and facts."""
    from allocsim.sim.questions.compare import trace_facts
    from allocsim.traces.bundled import load_default_trace
    facts = trace_facts(load_default_trace())
    assert bundled_match(facts) is not None
    assert bundled_match({**facts, "events": facts["events"] + 1}) is None


def test_validate_results_json_refuses_a_changed_trace(tmp_path) -> None:
    trace = synth.generate("training", steps=2, layers=2)
    trace_path = tmp_path / "run.npz"
    trace.metadata["source"] = str(trace_path)
    formats.save(trace, trace_path)
    results = _results_json(tmp_path, trace)
    other = synth.generate("training", steps=1, layers=2)
    other.metadata["source"] = str(trace_path)
    formats.save(other, trace_path)
    with pytest.raises(ValidatorError, match="changed since"):
        validate_results(results, "host")


# -- reports ---------------------------------------------------------------------------


def test_report_json_markdown_and_plot_are_written(traces, tmp_path) -> None:
    report = validate(traces["random"], "best-fit", "host", profile(GiB))
    written = report.write(tmp_path)
    assert [p.suffix for p in written] == [".json", ".md", ".png"]
    assert all(p.stat().st_size > 0 for p in written)
    assert written[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(written[0].read_text())
    assert data["kind"] == "allocsim-validation" and data["backend"] == "host"
    assert data["passed"] is True and data["patterns"]["corruptions"] == 0
    assert data["patterns"]["kinds"] == {}
    for key in ("device", "versions", "date", "metrics", "reserved_error", "checks", "calls",
                "series", "simulated", "trace", "profile"):
        assert key in data
    assert {"numpy", "platform"} <= set(data["versions"])
    names = {m["name"] for m in data["metrics"]}
    assert {"peak reserved", "first OOM event", "device calls", "device-call time"} <= names
    back = ValidationReport.from_json_dict(data)
    assert np.array_equal(back.sim_reserved, report.sim_reserved)
    assert np.array_equal(back.measured_reserved, report.measured_reserved)
    markdown = written[1].read_text()
    assert "| metric | simulated | measured | difference |" in markdown
    assert "PASS" in markdown and "peak reserved" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert all(line.replace("\\|", "").count("|") == 5 for line in rows), rows
    text = report.text()
    assert "reserved after each device call: max |error|" in text and "PASS" in text


# -- CLI -------------------------------------------------------------------------------


def test_cli_validate_host_writes_the_report(tmp_path, capsys) -> None:
    path = tmp_path / "t.npz"
    formats.save(synth.generate("training", steps=2, layers=2), path)
    out = tmp_path / "out"
    code = main(["validate", str(path), "--policy", "bfc", "--backend", "host",
                 "--capacity", "2GiB", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "PASS" in captured.out and "wrote" in captured.err
    assert len(list(out.glob("*.json"))) == 1 and len(list(out.glob("*.png"))) == 1
    code = main(["validate", str(path), "--policy", "on-demand", "--backend", "host",
                 "--capacity", "2GiB", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "on-demand"


def test_cli_validate_exit_1_on_a_failed_check(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(POLICIES, OverlapBFC.name, OverlapBFC)
    path = tmp_path / "t.npz"
    formats.save(synth.generate("training", steps=1, layers=2), path)
    assert main(["validate", str(path), "--policy", OverlapBFC.name, "--backend", "host",
                 "--capacity", "2GiB"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_cli_mistakes_exit_2_with_one_line(tmp_path, capsys) -> None:
    path = tmp_path / "t.npz"
    formats.save(synth.generate("training", steps=1, layers=1), path)
    for argv in (["validate", str(path), "--backend", "host"],
                 ["validate", str(path), "--backend", "host", "--policy", "nope"],
                 ["validate", str(tmp_path / "missing.npz"), "--backend", "host", "--policy",
                  "bfc"],
                 ["validate", str(tmp_path / "missing.json"), "--backend", "host"],
                 ["validate", str(path), "--backend", "host", "--policy", "bfc",
                  "--capacity", "lots"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("allocsim: error: ") and err.count("\n") == 1, (argv, err)


def test_parsers_plug_into_the_allocsim_cli() -> None:
    parser = argparse.ArgumentParser(prog="allocsim")
    sub = parser.add_subparsers(dest="command", required=True)
    validate_command.register(sub)
    calibrate_command.register(sub)
    args = parser.parse_args(["validate", "run.npz", "--policy", "bfc", "--backend", "host",
                              "--capacity", "24GiB", "--out", "d"])
    assert args.func.__name__ == "cmd_validate"
    assert (args.input, args.policy, args.backend, args.capacity, args.out) == (
        "run.npz", "bfc", "host", "24GiB", "d")
    args = parser.parse_args(["validate", "results.json"])
    assert args.backend == "policy" and args.policy is None
    args = parser.parse_args(["calibrate", "-o", "gpu.json"])
    assert args.func.__name__ == "cmd_calibrate" and args.output == "gpu.json"


# -- the GPU backends' code paths on a fake CuPy -------------------------------------------
# These run every GPU backend's Python against a fake ``cupy`` (and ``torch``) whose device
# memory is host buffers at fake addresses, whose two "kernels" are numpy, and which raises on
# any access outside memory it handed out. They check the validator's own logic (bookkeeping,
# capacity rule, pattern safety, clean-up), NOT that real CuPy/CUDA behave as assumed: that is
# what tests/test_validator_gpu.py does on a GPU.


@pytest.fixture()
def fake_gpu(monkeypatch) -> FakeCupy:
    return install_fake_gpu(monkeypatch)


@pytest.mark.parametrize("spec", POLICY_SPECS)
def test_policy_backend_code_path_on_a_fake_gpu(traces, fake_gpu, spec: str) -> None:
    report = validate(traces["training"], spec, "policy", "a100-80g")
    assert report.backend == "policy" and report.device == "Fake GPU"
    assert report.versions["cupy"] == "13.9.9-fake" and report.versions["cuda_runtime"] == "12.4"
    assert report.corruptions == 0 and report.blocks_checked > 0
    assert report.passed, report.verdict()
    assert report.profile["capacity"] == 8 * GiB - 2 * MiB    # free at the start (counter)
    assert report.tolerance_bytes == 2 * MiB                  # the probe: 2 MiB + 1 -> 4 MiB
    # memGetInfo moves in 2 MiB granules: measured is the simulated rounded up to granules.
    assert np.all(report.measured_reserved >= report.sim_reserved)
    assert fake_gpu.mem.used == 0                             # everything given back


def test_policy_backend_catches_overlaps_without_touching_foreign_memory(
        traces, fake_gpu, monkeypatch) -> None:
    for broken in (SameAddressBFC, OverlapBFC):
        monkeypatch.setitem(POLICIES, broken.name, broken)
        report = validate(traces["training"], broken.name, "policy", "a100-80g")
        assert report.corruptions > 0 and not report.passed
        assert fake_gpu.mem.used == 0


def test_policy_backend_oom_at_the_capacity_rule(traces, fake_gpu) -> None:
    report = validate(traces["random"], "bfc", "policy", "a100-80g", capacity="1GiB")
    oom = report.metric("first OOM event")
    assert oom.simulated is not None and oom.simulated == oom.measured and report.passed


def test_cupy_pool_code_path_on_a_fake_gpu(traces, fake_gpu) -> None:
    # The fake pool caches nothing, so the on-demand model describes it byte for byte (sizes
    # aligned to the pool's 512 bytes: on-demand counts requested bytes as in use).
    trace = synth.generate("random", events=3000, align=512)
    report = validate(trace, "on-demand", "cupy-pool", "a100-80g", capacity="512MiB")
    assert report.used_error is not None and report.used_error.max_abs == 0
    assert report.reserved_error.max_abs == 0
    assert report.metric("first OOM event").measured is not None
    assert report.metric("device calls").simulated == report.metric("device calls").measured
    assert report.passed, report.verdict()
    assert fake_gpu.mem.used == 0


def test_cupy_raw_is_judged_by_the_measured_granularity(traces, fake_gpu) -> None:
    coarse = DeviceProfile("fake-2m", 8 * GiB, granularity=2 * MiB)
    report = validate(traces["training"], None, "cupy-raw", coarse)
    assert report.policy == "on-demand" and report.reserved_error.max_abs == 0
    assert report.passed, report.verdict()
    fine = DeviceProfile("fake-512", 8 * GiB, granularity=512)
    report = validate(traces["training"], None, "cupy-raw", fine)
    assert not report.passed and "granularity" in report.verdict()
    assert fake_gpu.mem.used == 0


def test_cupy_async_code_path_on_a_fake_gpu(traces, fake_gpu) -> None:
    report = validate(traces["training"], "on-demand", "cupy-async", "a100-80g")
    assert report.backend == "cupy-async" and report.metric("device calls").measured > 0
    assert any("release threshold" in note for note in report.notes)


def test_torch_code_path_on_a_fake_torch(traces, monkeypatch) -> None:
    torch = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    trace = synth.generate("random", events=3000, align=512)   # on-demand counts requested
    report = validate(trace, "on-demand", "torch", "a100-80g", capacity="512MiB")
    assert report.versions["torch"] == "2.9.9-fake"
    assert report.reserved_error.max_abs == 0 and report.used_error.max_abs == 0
    oom = report.metric("first OOM event")
    assert oom.measured is not None and oom.measured == oom.simulated
    calls = report.metric("device calls")
    assert calls.measured == calls.simulated       # from memory_stats()
    assert report.passed, report.verdict()
    assert torch.state["fraction"] == 1.0 and torch.mem.used == 0


def test_calibrate_code_path_on_a_fake_gpu(fake_gpu, tmp_path, capsys) -> None:
    out = tmp_path / "fake.json"
    assert main(["calibrate", "-o", str(out), "--sizes", "4KiB", "1MiB", "64MiB",
                 "--repeats", "2", "--measurements", str(tmp_path / "raw.json")]) == 0
    assert "wrote" in capsys.readouterr().out
    profile = resolve_device(profile_file=out)
    assert profile.name == "fake_gpu-calibrated" and profile.capacity == 8 * GiB
    assert profile.granularity == 2 * MiB and profile.map_granularity == 2 * MiB
    assert "Fake GPU" in profile.source
    raw = json.loads((tmp_path / "raw.json").read_text())
    assert [s["size"] for s in raw["latencies"]] == [4096, MiB, 64 * MiB]
    # The fake rounds every allocation to its own 2 MiB granule: one page per allocation.
    assert raw["packing"]["512"]["pages_taken"] == raw["packing"]["512"]["count"] == 64
    assert fake_gpu.mem.used == 0


def test_cli_validate_on_a_fake_gpu(fake_gpu, tmp_path, capsys) -> None:
    path = tmp_path / "t.npz"
    formats.save(synth.generate("training", steps=2, layers=2), path)
    assert main(["validate", str(path), "--policy", "best-fit", "--out",
                 str(tmp_path / "out")]) == 0
    assert "PASS" in capsys.readouterr().out
    data = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    assert data["backend"] == "policy" and data["device"] == "Fake GPU"


@pytest.mark.parametrize("environment, model", [
    ({}, "pytorch"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "pytorch:expandable_segments=true"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",      # the newer name wins
      "PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}, "pytorch:max_split_size_mb=64"),
])
def test_torch_backend_models_the_allocator_settings_of_this_process(monkeypatch, environment,
                                                                      model) -> None:
    for variable in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setitem(sys.modules, "torch", FakeTorch())
    trace = synth.generate("random", events=300, align=512)
    report = validate(trace, None, "torch", "a100-80g")
    assert report.policy == model
    if environment:
        assert any("ALLOC_CONF=" in note for note in report.notes)
    capped = validate(trace, None, "torch", "a100-80g", capacity="256MiB")
    assert capped.policy.endswith("per_process_memory_fraction=1.0")


def test_torch_backend_refuses_settings_the_model_cannot_take(monkeypatch) -> None:
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "backend:cudaMallocAsync")
    monkeypatch.setitem(sys.modules, "torch", FakeTorch())
    with pytest.raises(ValidatorError, match="PYTORCH_ALLOC_CONF=backend:cudaMallocAsync"):
        validate(synth.generate("random", events=300), None, "torch", "a100-80g")
