"""A simulated run exported as a PyTorch snapshot: loadable, faithful, and matched by fidelity."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocsim.sim.cli import main
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.output.export import run_as_snapshot
from allocsim.sim.questions.fidelity.pytorch import fidelity
from allocsim.traces import Trace, formats
from allocsim.traces.synth import generate

MiB = 1 << 20


@pytest.mark.parametrize("policy", ["bfc", "best-fit", "pytorch",
                                    "pytorch:expandable_segments=true", "on-demand", "cupy"])
def test_every_policy_exports_a_snapshot_that_imports_back_with_the_same_events(
        policy: str, tmp_path: Path, capsys) -> None:
    trace_path = tmp_path / "t.npz"
    trace = generate("training", layers=2, steps=2)
    formats.save(trace, trace_path)
    out = tmp_path / "run.pickle"
    assert main(["export-snapshot", str(trace_path), "--policy", policy, "-o", str(out)]) == 0
    back = formats.load(out)
    assert len(back) == len(trace) and back.peak_live() == trace.peak_live()
    actions = {e["action"] for e in back.metadata["reference_events"]}
    assert actions <= {"segment_alloc", "segment_free", "segment_map", "segment_unmap"} and actions


def test_the_pytorch_models_exported_run_passes_its_own_fidelity_check(tmp_path: Path) -> None:
    import pickle
    path = tmp_path / "run.pickle"
    path.write_bytes(pickle.dumps(run_as_snapshot(generate("transformer", steps=3), "pytorch",
                                                  DeviceProfile("d", 80 << 30)), protocol=4))
    report = fidelity(formats.load(path))
    assert report.total > 0 and report.matched == report.total and report.exit_status == 0


def test_failed_requests_become_oom_entries() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 30 * MiB), (1, "alloc", 2, 30 * MiB),
                               (2, "free", 1, None), (3, "free", 2, None)])
    snapshot = run_as_snapshot(trace, "on-demand", DeviceProfile("d", 40 * MiB))
    entries = snapshot["device_traces"][0]
    assert [e["action"] for e in entries if e["action"] == "oom"] == ["oom"]
    assert sum(e["action"] == "alloc" for e in entries) == 1


def test_an_oom_entry_comes_where_the_request_failed() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 30 * MiB), (1, "alloc", 2, 30 * MiB),
                               (2, "free", 1, None), (3, "free", 2, None)])
    snapshot = run_as_snapshot(trace, "on-demand", DeviceProfile("d", 40 * MiB))
    actions = [e["action"] for e in snapshot["device_traces"][0]]
    assert actions.index("oom") > actions.index("alloc"), "after the request that succeeded"


def test_a_run_that_fails_at_its_first_allocation_says_so_and_exports_the_rest(
        tmp_path: Path, capsys) -> None:
    """Issue 36.15: it blamed the trace ("segment_events[0]: 'event' is -1")."""
    source, out = tmp_path / "t.npz", tmp_path / "run.pickle"
    formats.save(Trace.from_events([(0, "alloc", 1, 30 * MiB), (1, "alloc", 2, MiB),
                                    (2, "free", 2, None), (3, "free", 1, None)]), source)
    capsys.readouterr()
    argv = ["export-snapshot", str(source), "--policy", "on-demand", "--capacity", "20MiB",
            "-o", str(out)]
    assert main(argv) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"allocsim: note: {source}: the run under on-demand on a100-80g@20.00MiB runs out of "
        "memory at event 0 (30.00MiB requested); the snapshot shows each failed request as an "
        "oom entry and leaves its buffer out"]
    back = formats.load(out)
    assert len(back) == 2 and back.size.max() == MiB


def test_a_run_whose_every_allocation_fails_is_one_line_and_writes_nothing(
        tmp_path: Path, capsys) -> None:
    source, out = tmp_path / "t.npz", tmp_path / "run.pickle"
    formats.save(generate("random", seed=1, events=200), source)
    capsys.readouterr()
    argv = ["export-snapshot", str(source), "--capacity", "1MiB", "-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"allocsim: error: {source}: the run under pytorch on ")
    assert "runs out of memory at event 0 (" in err[0]
    assert err[0].endswith("every allocation fails, so there is nothing to export (give a "
                           "larger --capacity)")
    assert not out.exists()
