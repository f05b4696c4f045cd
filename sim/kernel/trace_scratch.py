"""A TPU program's scratch as its trace says it: what the ``tpu`` policy holds beside the buffers.

The TPU runtime holds each program's scratch (XLA's temp) as ``bytes_reserved``, not as a
buffer, so a trace of a step's buffers does not carry it as events. compile_for
(traces/record/xla_tpu.py) writes it into the trace's metadata instead
(``xla_tpu.scratch_bytes``: XLA:TPU's HBM temp rounded up to 16 KiB, what the chip reserved
for every step measured). Both engines build a run's policy through :func:`with_trace_scratch`
(the Python ``ProcessReplay`` and the native core's ``open_run``, so min-capacity, tune and
fidelity too): the ``tpu`` policy holds that scratch unless its spec sets ``scratch_bytes``
itself (``tpu:scratch_bytes=0``: none). Every other policy is left as given: on a GPU, XLA's
temp is an allocation of the plan, in the events.
"""

from __future__ import annotations

from dataclasses import replace

from allocsim.policies import PolicySpec
from allocsim.traces.model import Trace

__all__ = ["SCRATCH_PARAM", "trace_scratch_bytes", "with_trace_scratch"]

SCRATCH_PARAM = "scratch_bytes"


def trace_scratch_bytes(trace: Trace) -> int:
    """The scratch the trace's program needs on a TPU (0 when it says none)."""
    facts = trace.metadata.get("xla_tpu")
    if not isinstance(facts, dict):
        return 0
    scratch = facts.get(SCRATCH_PARAM, 0)
    return scratch if isinstance(scratch, int) and scratch > 0 else 0


def with_trace_scratch(spec: PolicySpec, trace: Trace) -> PolicySpec:
    """``spec`` with the trace's scratch when it is the ``tpu`` policy and sets none itself."""
    if spec.name != "tpu" or any(key == SCRATCH_PARAM for key, _ in spec.params):
        return spec
    scratch = trace_scratch_bytes(trace)
    if not scratch:
        return spec
    return replace(spec, params=(*spec.params, (SCRATCH_PARAM, scratch)))
