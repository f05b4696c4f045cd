"""Answers at scale: minimum capacity, processes sharing a GPU, CI regression checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocsim.errors import UserInputError
from allocsim.sim.cli import main
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.questions.capacity.minimum import min_capacity
from allocsim.sim.questions.share import ShareSpec, parse_share_spec, parse_start, share
from allocsim.traces import Trace, formats

# Every test here runs on both implementations (tests/conftest.py's `implementation`).
pytestmark = pytest.mark.usefixtures("implementation")

MiB = 1 << 20
GiB = 1 << 30


def device(capacity: int = 64 * GiB) -> DeviceProfile:
    return DeviceProfile("test", capacity)


def steps(sizes_mib: list[int], repeat: int = 3, gap_ns: int = 1_000_000) -> Trace:
    """Each step allocates the sizes in order, then frees them in reverse."""
    events, t, ident = [], 0, 0
    for _ in range(repeat):
        ids = []
        for size in sizes_mib:
            events.append((t, "alloc", ident, size * MiB))
            ids.append(ident)
            ident += 1
            t += gap_ns
        for i in reversed(ids):
            events.append((t, "free", i, None))
            t += gap_ns
    return Trace.from_events(events, name="steps")


# -- minimum capacity ----------------------------------------------------------------------
def test_on_demand_needs_exactly_the_live_peak_at_byte_resolution() -> None:
    answer = min_capacity(steps([10, 20, 30]), "on-demand", device(), resolution=512)
    assert answer.min_capacity == 60 * MiB == answer.lower_bound and answer.monotone


def test_preallocation_needs_its_working_set_divided_by_the_fraction() -> None:
    answer = min_capacity(steps([10, 20, 30]), "preallocate:fraction=0.5", device())
    assert answer.min_capacity == 120 * MiB     # half the device must hold 60 MiB
    assert answer.headroom == 60 * MiB and answer.headroom_ratio == pytest.approx(1.0)


def test_bfc_needs_more_than_the_live_peak_because_regions_do_not_merge() -> None:
    answer = min_capacity(steps([10, 20, 30]), "bfc", device())
    on_demand = min_capacity(steps([10, 20, 30]), "on-demand", device())
    assert answer.min_capacity > on_demand.min_capacity
    # The answer is minimal: one resolution step less fails.
    from allocsim.sim.kernel.engine import replay
    below = replay(steps([10, 20, 30]), "bfc", device(answer.min_capacity - MiB), stop_on_oom=True)
    assert not below.completed


def test_a_trace_that_never_fits_says_so() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 2 << 50)])
    assert min_capacity(trace, "on-demand", device()).min_capacity is None


# -- sharing -------------------------------------------------------------------------------
def test_share_specs_parse_trace_policy_and_start() -> None:
    assert parse_share_spec("run.npz") == ShareSpec("run.npz", "jax", 0)
    assert parse_share_spec("run.npz:bfc:allow_growth=false@2s") == \
        ShareSpec("run.npz", "bfc:allow_growth=false", 2_000_000_000)
    assert parse_start("500ms") == 500_000_000 and parse_start("0.5") == 500_000_000
    with pytest.raises(UserInputError, match="bad start time"):
        parse_start("soon")
    with pytest.raises(ValueError, match="unknown policy"):
        parse_share_spec("run.npz:nope")


def test_two_default_jax_processes_cannot_share_but_at_045_each_they_can() -> None:
    work = steps([100, 200, 100], repeat=4)       # needs 400 MiB: more than 25% of 1 GiB
    specs = [ShareSpec("a", "jax", 0), ShareSpec("b", "jax", 500_000)]
    run = share([work, work], specs, device(GiB))
    assert run.results[0].completed and not run.results[1].completed
    assert run.results[1].first_oom_others == {0: 768 * MiB}
    specs = [ShareSpec("a", "jax:fraction=0.45", 0), ShareSpec("b", "jax:fraction=0.45", 500_000)]
    assert all(r.completed for r in share([work, work], specs, device(GiB)).results)


def test_with_on_demand_growth_the_outcome_is_a_race_decided_by_timing() -> None:
    work = steps([300, 300], repeat=2)            # 600 MiB each at its peak, 1 GiB device
    together = share([work, work], [ShareSpec("a", "on-demand", 0),
                                    ShareSpec("b", "on-demand", 500_000)], device(GiB))
    assert not all(r.completed for r in together.results)
    apart = share([work, work], [ShareSpec("a", "on-demand", 0),
                                 ShareSpec("b", "on-demand", 50_000_000)], device(GiB))
    assert all(r.completed for r in apart.results)


def test_share_cli_writes_json_and_a_figure_and_exits_1_on_oom(capsys, tmp_path: Path) -> None:
    path = tmp_path / "w.npz"
    formats.save(steps([100, 200, 100], repeat=4), path)
    code = main(["share", f"{path}:jax", f"{path}:jax@0.5ms", "--capacity", "1GiB",
                 "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 1 and "cannot share" in out and "p0 held 768.00MiB" in out
    data = json.loads((tmp_path / "out" / "share.json").read_text())
    assert [p["completed"] for p in data["processes"]] == [True, False]
    assert (tmp_path / "out" / "share.png").read_bytes()[:4] == b"\x89PNG"


# -- CI regression checks ------------------------------------------------------------------
def test_baseline_then_check_passes_and_a_worse_figure_fails(capsys, tmp_path: Path) -> None:
    trace_path = tmp_path / "w.npz"
    formats.save(steps([10, 20, 30]), trace_path)
    baseline = tmp_path / "baseline.json"
    assert main(["baseline", str(trace_path), "--policies", "bfc", "best-fit",
                 "-o", str(baseline)]) == 0
    assert main(["check", str(baseline)]) == 0
    assert "check passed" in capsys.readouterr().out
    document = json.loads(baseline.read_text())
    document["cells"][0]["peak_reserved"] //= 2       # the past was better: now a regression
    document["cells"][1]["device_calls"] += 100       # the past was worse: an improvement
    baseline.write_text(json.dumps(document))
    assert main(["check", str(baseline), "--tolerance", "1%"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSIONS:" in out and "bfc: peak_reserved" in out
    assert "improvements:" in out and "best-fit: device_calls" in out


def test_check_reports_a_new_oom_whatever_the_tolerance(capsys, tmp_path: Path) -> None:
    trace_path = tmp_path / "w.npz"
    formats.save(steps([10, 20, 30]), trace_path)
    baseline = tmp_path / "b.json"
    main(["baseline", str(trace_path), "--policies", "on-demand", "--capacity", "100MiB",
          "-o", str(baseline)])
    document = json.loads(baseline.read_text())
    document["device"]["capacity"] = 50 * MiB         # re-run on a smaller device: OOMs
    baseline.write_text(json.dumps(document))
    assert main(["check", str(baseline), "--tolerance", "1000%"]) == 1
    assert "now runs out of memory" in capsys.readouterr().out


def test_share_runs_each_recorded_process_of_a_multi_process_trace(capsys, tmp_path: Path) -> None:
    two = Trace.from_events([(0, "alloc", 1, 600 * MiB, 0, 0),
                             (1000, "alloc", 2, 600 * MiB, 0, 1),
                             (10_000_000, "free", 1, None, 0, 0),
                             (10_000_000, "free", 2, None, 0, 1)])
    path = tmp_path / "two.npz"
    formats.save(two, path)
    assert main(["share", f"{path}:on-demand", "--capacity", "1GiB", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [p["trace"] for p in data["processes"]] == [f"{path}[process 0]", f"{path}[process 1]"]
    assert [p["completed"] for p in data["processes"]] == [True, False]


def _pretend_completes(monkeypatch, completes) -> None:
    import allocsim.sim.questions.capacity.minimum as capacity_module
    monkeypatch.setattr(capacity_module.CompletionOracle, "completes",
                        lambda self, capacity: completes(capacity))


def _sizes_in(note: str) -> list[str]:
    return [word.strip(",") for word in note.split() if word[0].isdigit()]


def test_a_pocket_below_the_bisection_becomes_the_answer_and_is_named(monkeypatch) -> None:
    """A non-monotone policy that completes at the lower bound and otherwise only from 64 MiB
    above it: bisection finds the threshold, the check below finds the pocket and takes it,
    and the note says what the bisection found — never "below the answer" of itself."""
    from allocsim.traces.bundled import load_default_trace
    trace = load_default_trace()
    lower = trace.peak_live()[0] // MiB * MiB
    _pretend_completes(monkeypatch, lambda c: c >= lower + 64 * MiB or c == lower)
    answer = min_capacity(trace, "best-fit", device())
    assert answer.min_capacity == lower and not answer.monotone
    [note] = answer.exceptions
    assert note.startswith("completes at ") and "the bisection found (taken as the answer)" in note
    shown, bisected = _sizes_in(note)
    assert shown != bisected


def test_sizes_in_a_note_are_shown_with_the_digits_that_tell_them_apart(monkeypatch) -> None:
    """A policy that fails only 1 MiB above where it first completes: whichever side the
    bisection lands on, the note compares two sizes 1-2 MiB apart — both "1.53GiB" at two
    decimals — and must show them differently."""
    from allocsim.traces.bundled import load_default_trace
    trace = load_default_trace()
    target = trace.peak_live()[0] // MiB * MiB + 4 * MiB
    _pretend_completes(monkeypatch, lambda c: c >= target and c != target + MiB)
    answer = min_capacity(trace, "best-fit", device())
    assert answer.min_capacity == target and answer.exceptions
    for note in answer.exceptions:
        first, second = _sizes_in(note)
        assert first != second, note


def test_a_non_monotone_answer_keeps_the_failures_above_it_and_where_it_completes_from(
        monkeypatch) -> None:
    """The pocket at the lower bound is the answer, but the policy fails on the way up to the
    bisection's threshold: those failures are kept as numbers, and the range the answer spans
    runs to the capacity from which every one tried completed (issue 40)."""
    from allocsim.traces.bundled import load_default_trace
    trace = load_default_trace()
    lower = trace.peak_live()[0] // MiB * MiB
    _pretend_completes(monkeypatch, lambda c: c >= lower + 64 * MiB or c == lower)
    answer = min_capacity(trace, "best-fit", device())
    assert answer.min_capacity == lower and answer.failed_above
    assert all(lower < c < lower + 64 * MiB for c in answer.failed_above)
    assert answer.completes_from == lower + 64 * MiB
    monkeypatch.undo()
    steady = min_capacity(trace, "bfc", device())
    assert steady.monotone and steady.failed_above == []
    assert steady.completes_from == steady.min_capacity
