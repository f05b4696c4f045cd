"""Memory a process holds outside its allocator on a shared device (issue 40): its own CUDA
context, taken when it starts, and the module images it loads lazily at its first step.

Worked by hand on a 100 MiB device: two jobs of 40 MiB each fit together (80 MiB); give each a
15 MiB context and the second's 40 MiB no longer fits (15 + 40 + 15 + 40 = 110 MiB).
"""

from __future__ import annotations

import json

import pytest

from allocsim.errors import UserInputError
from allocsim.sim.cli.main import main
from allocsim.sim.kernel.device import CostModel, DeviceProfile
from allocsim.sim.kernel.engine import CONTEXT, FIRST_STEP, SharedProcess, run_shared
from allocsim.sim.questions.share import (
    OutsideMemory,
    ShareSpec,
    parse_share_spec,
    share,
    share_json,
    with_outside,
)
from allocsim.traces import Trace, formats
from allocsim.traces.bundled import bundled_path

MiB = 1 << 20
MS = 1_000_000


def card(capacity: int = 100 * MiB) -> DeviceProfile:
    return DeviceProfile("test", capacity, costs=CostModel())


def job(nbytes: int = 40 * MiB) -> Trace:
    """One buffer of ``nbytes`` held for 10 ms."""
    return Trace.from_events([(0, "alloc", 1, nbytes), (10 * MS, "free", 1, None)])


def pair(context: int = 0, *, first_step: int = 0) -> list[SharedProcess]:
    """Two 40 MiB jobs, the second started 1 ms after the first (so both hold at once)."""
    return [SharedProcess(job(), "on-demand", context_bytes=context, first_step_bytes=first_step),
            SharedProcess(job(), "on-demand", start_ns=1 * MS, context_bytes=context,
                          first_step_bytes=first_step)]


def test_two_jobs_that_fit_without_contexts_do_not_fit_with_them() -> None:
    without = run_shared(pair(), card(), stop_on_oom=True)
    assert [r.completed for r in without.results] == [True, True]
    assert without.device_peak == 80 * MiB

    with_contexts = run_shared(pair(15 * MiB), card(), stop_on_oom=True)
    first, second = with_contexts.results
    assert first.completed and not second.completed
    # The second got its context (15 + 40 + 15 = 70 MiB taken) and then could not get its
    # 40 MiB: an ordinary OOM of its allocator at its first event, not a refused context.
    assert (second.first_oom_event, second.first_oom_size) == (0, 40 * MiB)
    assert with_contexts.refused_outside == [None, None]
    assert with_contexts.device_peak == 70 * MiB


def test_contexts_count_in_the_device_peak_never_in_a_process_reserved_bytes() -> None:
    run = run_shared(pair(5 * MiB, first_step=3 * MiB), card(), stop_on_oom=True)
    assert all(r.completed for r in run.results)
    assert [r.peak_reserved for r in run.results] == [40 * MiB, 40 * MiB]
    assert run.device_peak == 2 * (5 + 3 + 40) * MiB
    # Taken in order (context, first-step load, buffer, ...) and all given back at the exits.
    assert run.device_used.tolist()[:4] == [0, 5 * MiB, 8 * MiB, 48 * MiB]
    assert run.device_used[-1] == 0


def test_a_process_whose_context_does_not_fit_never_starts_and_says_so() -> None:
    big = Trace.from_events([(0, "alloc", 1, 90 * MiB), (10 * MS, "free", 1, None)])
    run = run_shared([SharedProcess(big, "on-demand"),
                      SharedProcess(job(), "on-demand", start_ns=1 * MS, context_bytes=20 * MiB)],
                     card(), stop_on_oom=False)      # refused a context, it stops regardless
    first, second = run.results
    assert first.completed and not second.completed
    assert run.refused_outside == [None, CONTEXT]
    assert (second.ooms, second.first_oom_event, second.first_oom_size) == (1, 0, 20 * MiB)
    assert second.peak_reserved == 0 and second.device_mallocs == 0
    assert run.spans_ns[1] == (1 * MS, 1 * MS)        # it never ran
    assert run.device_peak == 90 * MiB


def test_a_first_step_load_is_taken_before_its_event_and_refused_it_ends_the_process() -> None:
    steps = Trace.from_events([(0, "alloc", 1, 10 * MiB), (1 * MS, "alloc", 2, 10 * MiB),
                               (2 * MS, "free", 2, None), (3 * MS, "free", 1, None)])
    fits = run_shared([SharedProcess(steps, "on-demand", first_step_bytes=30 * MiB,
                                     first_step_event=1)], card())
    assert fits.results[0].completed
    assert fits.device_used.tolist()[:4] == [0, 10 * MiB, 40 * MiB, 50 * MiB]

    refused = run_shared([SharedProcess(steps, "on-demand", first_step_bytes=95 * MiB,
                                        first_step_event=1)], card())
    result = refused.results[0]
    assert refused.refused_outside == [FIRST_STEP]
    assert not result.completed
    assert (result.first_oom_event, result.first_oom_size) == (1, 95 * MiB)
    assert result.peak_allocated == 10 * MiB          # event 1 never ran


def test_a_negative_amount_outside_is_refused_in_one_line() -> None:
    with pytest.raises(UserInputError, match="context_bytes must be >= 0"):
        SharedProcess(job(), "on-demand", context_bytes=-1)
    with pytest.raises(UserInputError, match="first_step_bytes must be a whole number >= 0"):
        OutsideMemory(first_step_bytes=-MiB)


def test_memory_outside_the_allocator_goes_back_when_the_process_exits() -> None:
    run = run_shared([SharedProcess(job(50 * MiB), "on-demand", context_bytes=40 * MiB),
                      SharedProcess(job(50 * MiB), "on-demand", start_ns=20 * MS,
                                    context_bytes=40 * MiB)], card())
    assert all(r.completed for r in run.results)
    assert run.device_peak == 90 * MiB and run.device_used[-1] == 0


def test_without_outside_memory_a_shared_run_is_the_run_it_always_was() -> None:
    trace = formats.load(bundled_path())
    specs = [ShareSpec("default", "jax", 0), ShareSpec("default", "jax", 10 * MS)]
    device = card(6 << 30)
    plain = share([trace, trace], specs, device)
    zero = share([trace, trace], with_outside(specs, OutsideMemory(0, 0)), device)
    assert json.dumps(share_json(zero, specs, device)) == json.dumps(share_json(plain, specs,
                                                                                device))
    assert "outside" not in share_json(plain, specs, device)["processes"][0]
    assert [r.to_json_dict(timeline=True) for r in zero.results] == [
        r.to_json_dict(timeline=True) for r in plain.results]


def test_the_json_names_what_a_process_held_and_what_it_was_refused() -> None:
    specs = with_outside([parse_share_spec("a:on-demand"), parse_share_spec("b:on-demand@1ms")],
                         OutsideMemory(context_bytes=15 * MiB))
    run = share([job(), job()], specs, card())
    second = share_json(run, specs, card())["processes"][1]
    assert second["outside"] == {"context_bytes": 15 * MiB, "first_step_bytes": 0,
                                 "first_step_event": 0, "refused": None}
    assert not second["completed"]


@pytest.mark.parametrize("value", ["-1", "NaN", "300XiB", "1.5B"])
def test_the_cli_refuses_a_bad_size_in_one_line(value: str, capsys: pytest.CaptureFixture) -> None:
    for option in ("--process-context", "--first-step-load"):
        assert main(["share", "default:jax", "--capacity", "6GiB", f"{option}={value}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"allocsim: error: {option}: not a ")   # names option and problem


def test_the_cli_reports_a_refused_context_as_that_process_oom(
        capsys: pytest.CaptureFixture) -> None:
    assert main(["share", "default:on-demand", "default:on-demand@1ms", "--capacity", "1GiB",
                 "--process-context", "600MiB"]) == 1
    out = capsys.readouterr().out
    assert "its 600.00MiB context did not fit, it never started" in out
    assert "600.00MiB context and 0B first-step load held by each process" in out
