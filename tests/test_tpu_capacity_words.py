"""min-capacity's words on a TPU program: the gap between the ``tpu`` policy's answer and peak
live holds the program's XLA:TPU scratch (trace metadata ``xla_tpu.scratch_bytes``, held beside
the buffers: sim/kernel/trace_scratch.py), which is the program's, not the allocator's; the
executables' generated code (``xla_tpu.code_bytes``) is the program's too."""

from __future__ import annotations

import re

import pytest

from allocsim.policies.units import format_size
from allocsim.sim.kernel.device_profile import resolve_device
from allocsim.sim.output.tables import capacity_text
from allocsim.sim.questions.capacity.minimum import min_capacities
from allocsim.sim.questions.compare import trace_facts
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace

MiB = 1 << 20
SCRATCH = 64 * MiB
CODE = 4 * MiB


def tpu_trace(**xla_tpu: object) -> Trace:
    """Three 32 MiB buffers and a 4 MiB code buffer, with the program's XLA:TPU facts."""
    ops = [OP_ALLOC, OP_ALLOC, OP_ALLOC, OP_FREE, OP_ALLOC, OP_FREE, OP_FREE, OP_FREE]
    ids = [0, 1, 2, 1, 3, 2, 3, 0]
    sizes = [CODE, 32 * MiB, 32 * MiB, 32 * MiB, 32 * MiB, 32 * MiB, 32 * MiB, CODE]
    return Trace.from_columns(list(range(len(ops))), ops, ids, sizes, name="step@tpu-v5e",
                              xla_tpu=xla_tpu)


def answer_text(trace: Trace, policies: list[str]) -> tuple[str, list]:
    device = resolve_device("tpu-v5e")
    answers = min_capacities(trace, policies, device, resolution=MiB)
    return capacity_text(trace_facts(trace), device, MiB,
                         answers, xla_tpu=trace.metadata.get("xla_tpu")), answers


def cells(text: str, policy: str) -> dict[str, str]:
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("policy"))
    names = re.split(r"\s{2,}", header.strip())
    row = next(line for line in lines if line.startswith(policy + " "))
    return dict(zip(names, re.split(r"\s{2,}", row.strip())))


def test_the_scratch_is_the_programs_not_the_allocators() -> None:
    trace = tpu_trace(scratch_bytes=SCRATCH, code_bytes=CODE)
    text, answers = answer_text(trace, ["tpu", "bfc"])
    tpu, bfc = answers
    gap = tpu.allocator_headroom
    assert gap is not None and gap >= SCRATCH   # the policy held the scratch beside the buffers
    row = cells(text, "tpu")
    assert row["of it program"] == f"scratch {format_size(SCRATCH)}"
    assert row["of it allocator"].startswith(format_size(gap - SCRATCH))
    assert not row["of it allocator"].startswith(format_size(gap) + " ")
    # bfc holds no scratch: its gap is its own, as before
    other = cells(text, "bfc")
    assert other["of it program"] == "-"
    assert other["of it allocator"].startswith(format_size(bfc.allocator_headroom))
    note = text[text.index("note:"):]
    assert "the program's, not the allocator's" in note
    assert f"XLA:TPU's scratch {format_size(SCRATCH)}" in note
    assert "xla_tpu.scratch_bytes" in note
    assert f"generated code ({format_size(CODE)}, xla_tpu.code_bytes)" in note


def test_a_spec_that_sets_no_scratch_leaves_the_gap_the_allocators() -> None:
    trace = tpu_trace(scratch_bytes=SCRATCH, code_bytes=CODE)
    text, answers = answer_text(trace, ["tpu:scratch_bytes=0"])
    assert "of it program" not in text
    assert cells(text, "tpu:scratch_bytes=0")["of it allocator"].startswith(
        format_size(answers[0].allocator_headroom))
    assert "generated code" in text   # the code is still named as the program's


@pytest.mark.parametrize("xla_tpu", [None, {}])
def test_without_xla_tpu_facts_the_table_is_as_before(xla_tpu: dict | None) -> None:
    trace = tpu_trace()
    device = resolve_device("tpu-v5e")
    answers = min_capacities(trace, ["tpu"], device, resolution=MiB)
    plain = capacity_text(trace_facts(trace), device, MiB, answers)
    assert capacity_text(trace_facts(trace), device, MiB, answers, xla_tpu=xla_tpu) == plain
    assert "of it program" not in plain and "XLA:TPU" not in plain
