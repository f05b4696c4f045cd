"""Expandable segments on a device smaller than one page (a capacity search's probe floored to
a coarse device granularity): the first map is refused — an OOM, in the Python model and in the
native core alike — where an empty virtual range used to be walked off (Python: an
AttributeError; the core: a write past its blocks, which crashed the process)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from allocsim.policies.registry import parse_policy
from allocsim.sim.kernel import native
from allocsim.sim.kernel.device import SimulatedDevice
from allocsim.sim.kernel.device_profile import resolve_device
from allocsim.sim.kernel.engine import TIMELINE_POINTS, ProcessReplay
from allocsim.sim.questions.capacity.minimum import min_capacity
from allocsim.traces import formats

MLP = Path(__file__).parents[1] / "traces" / "data" / "sample-torch-cpu-mlp.npz"
SPEC = "pytorch:expandable_segments=true"


def tiny_device():  # type: ignore[no-untyped-def]
    return replace(resolve_device("a100-80g", None), capacity=0, context_bytes=0)


def test_a_device_smaller_than_a_page_refuses_the_first_map_in_python() -> None:
    trace = formats.load(MLP)
    run = ProcessReplay(trace, parse_policy(SPEC), SimulatedDevice(tiny_device()))
    run.advance(len(trace))
    assert run.report.ooms > 0


def test_a_device_smaller_than_a_page_refuses_the_first_map_in_the_core() -> None:
    trace = formats.load(MLP)
    core = native.open_run(trace, parse_policy(SPEC), tiny_device(), stop_on_oom=False,
                           timeline_points=TIMELINE_POINTS)
    if core is None:
        return   # no native core in this build: the Python test above holds the rule
    core.advance(len(trace))
    assert core.state()["ooms"] > 0


def test_min_capacity_at_a_20_mib_granularity_answers() -> None:
    trace = formats.load(MLP)
    device = replace(resolve_device("a100-80g", None), context_bytes=0, granularity=20 << 20)
    answer = min_capacity(trace, SPEC, device)
    assert answer.min_capacity is not None and answer.min_capacity % (20 << 20) == 0
