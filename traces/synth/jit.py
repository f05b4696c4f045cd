"""``pattern=jax``: what a jitted, compiled training step hands its allocator.

An eager framework asks its allocator for every op's output; a jitted JAX program does not.
XLA compiles the step, plans every buffer that lives and dies inside the step into one
address range (buffer assignment, with its heap simulator: :mod:`allocsim.traces.plan`), and
combines those into ONE temp allocation per executable (BufferAssignment::
CombineTempAllocations). At run time PjRt allocates, per execution, that temp buffer and one
buffer per output that does not alias a donated input, and frees the temp when the execution
ends. This module turns a generator's step program -- written op by op, as the eager pattern
replays it -- into that pattern. Per step, in order:

1. the arguments the step is fed (the program's ``data/...`` buffers: the batch) are put on
   the device (their own buffers, tags unchanged);
2. the executable's temp buffer, tag ``jit(step)/temp`` (``jit(step)[seq=128]/temp`` when the
   generator compiles one executable per shape), sized by the plan of the step's
   intermediates: every other buffer the program allocates and frees inside the step
   (activations, gradients, workspaces, the optimizer's temporaries) with its lifetime in the
   program's event order, placed by XLA's global decreasing-size best fit with offsets aligned
   to ``temp_alignment``; temp size = max(offset + size);
3. the outputs (tags ``jit(step)/output/<what>``): the loss, and -- without donation -- the new
   parameters and optimizer state. With donation (``donate_argnums``) each new parameter or
   state buffer aliases the donated input it replaces (output-aliases-input): no new buffer
   and no free for it, the inputs' buffers simply carry the new values;
4. after the step's compute, the temp buffer is freed, then the arguments (the loop drops the
   batch), then -- without donation -- the old parameters and state (the loop rebinds its
   variables to the outputs), then the previous step's loss (rebound too). The last step's
   outputs stay live, as the generators leave persistent buffers live.

So with and without donation differ by exactly the donated bytes at every moment of a step:
the peak drops by one copy of parameters + optimizer state, no more, no less, and the temp is
the same. A real XLA may grow the temp to honour the aliases (copies of inputs still read after
their output is written), which this does not model: in the bundled recordings of
experiments/jax_train.py the donated executable's temp is 1,581,056 B larger than the
undonated one's, so donation saved 2,351,104 B of the 3,932,160 B donated.

Timing: an argument keeps its eager event's transfer time, the temp comes after one dispatch
overhead, outputs follow at runtime (not op-dispatch) cost, and the temp's free waits for the
whole eager step's modelled compute. Compile time is not modelled (it is host time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from allocsim.traces.model import OP_ALLOC, OP_FREE
from allocsim.traces.plan import plan_lifetimes
from allocsim.traces.synth._common import (
    ALLOC_OVERHEAD_NS,
    FREE_OVERHEAD_NS,
    ProgramTable,
    StepProgram,
    TagTable,
    jittered,
)

ARGUMENT_PREFIX = "data/"
LOSS_TAG = "forward/loss/scalar"

# XLA:CPU's buffer alignment (cpu_executable / the CPU compiler's
# cpu_function_runtime::MinAlign(), 64 bytes: a cache line, enough for AVX-512 loads), which
# the bundled recordings were made with; XLA:GPU aligns to 256 bytes
# (gpu::kXlaAllocatedBufferAlignBytes, what cudaMalloc guarantees).
CPU_TEMP_ALIGNMENT = 64
GPU_TEMP_ALIGNMENT = 256


def step_roles(table: ProgramTable, loss_tag: str = LOSS_TAG) -> dict[str, list[int]]:
    """Each slot's role in a compiled step, as slot lists in program order: ``arguments``,
    ``loss``, ``state_in`` (inherited: old parameters and state), ``state_out`` (their
    successors, aligned with ``state_in``) and ``intermediates`` (all the rest)."""
    order = [int(s) for s in table.slot[table.op == OP_ALLOC]]
    state_in = sorted(table.handed_on)
    state_out = [table.handed_on[old] for old in state_in]
    arguments = [s for s in order if table.slot_tag[s].startswith(ARGUMENT_PREFIX)]
    loss = [s for s in order if table.slot_tag[s] == loss_tag]
    if len(loss) != 1:
        raise RuntimeError(f"a compiled step needs exactly one {loss_tag!r} buffer")
    special = set(arguments) | set(loss) | set(state_out)
    return {"arguments": arguments, "loss": loss, "state_in": state_in, "state_out": state_out,
            "intermediates": [s for s in order if s not in special]}


def intermediate_events(table: ProgramTable,
                        intermediates: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(start, end)`` of each intermediate: the program's event indices of its alloc and its
    free (a lifetime is the half-open ``[start, end)``, as the offline plan's)."""
    slots = np.asarray(intermediates, dtype=np.int64)
    position = np.full(len(table.slot_size), -1, dtype=np.int64)
    position[slots] = np.arange(len(slots))
    where = position[table.slot]
    mine = where >= 0
    starts = np.full(len(slots), -1, dtype=np.int64)
    ends = np.full(len(slots), -1, dtype=np.int64)
    events = np.arange(len(table.op), dtype=np.int64)
    alloc = mine & (table.op == OP_ALLOC)
    free = mine & (table.op == OP_FREE)
    starts[where[alloc]] = events[alloc]
    ends[where[free]] = events[free]
    if (starts < 0).any() or (ends < 0).any():
        raise RuntimeError("an intermediate is not allocated and freed within the step")
    return starts, ends


def temp_size(table: ProgramTable, row: np.ndarray, intermediates: Sequence[int],
              alignment: int, events: tuple[np.ndarray, np.ndarray] | None = None) -> int:
    """The temp buffer of one executable, for one step's feature values ``row``: the heap of
    the plan of its intermediates (``events``: :func:`intermediate_events`, if known)."""
    starts, ends = events if events is not None else intermediate_events(table, intermediates)
    sizes = table.slot_size[np.asarray(intermediates, dtype=np.int64)] @ np.asarray(
        row, dtype=np.int64)
    return plan_lifetimes(starts, ends, sizes, alignment)[1]


def render_jit(program: StepProgram, values: np.ndarray, executables: Sequence[str], *,
               tags: TagTable, first_id: int, rng: np.random.Generator,
               initial_ids: Mapping[int, int], donate: bool, temp_alignment: int,
               name: str = "step") -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Columns (as :meth:`StepProgram.render` returns them) of ``len(values)`` compiled steps,
    and the ``jit`` metadata: the executables, their temp sizes, the compile count.

    ``program`` is a functional step (its inherited slots are the old parameters and state,
    ``initial_ids`` their prologue ids); ``executables[step]`` names the executable a step runs
    ("" for one static executable, "[seq=128]" for one per shape): steps with the same name
    must have the same feature values.
    """
    table = program.table()
    roles = step_roles(table)
    values = np.asarray(values, dtype=np.int64).reshape(-1, len(table.features))
    n_steps = len(values)
    if len(executables) != n_steps:
        raise RuntimeError("one executable name per step")
    if set(roles["state_in"]) - set(initial_ids):
        raise RuntimeError("render_jit needs initial_ids for every inherited slot")

    # ---- one plan per executable (each distinct shape compiles once).
    lifetimes = intermediate_events(table, roles["intermediates"])
    temps: dict[str, int] = {}
    rows: dict[str, np.ndarray] = {}
    steps_of: dict[str, int] = {}
    for step, key in enumerate(executables):
        if key in rows:
            if not np.array_equal(rows[key], values[step]):
                raise RuntimeError(f"executable {key!r} runs steps of different shapes")
            steps_of[key] += 1
            continue
        rows[key], steps_of[key] = values[step], 1
        temps[key] = temp_size(table, values[step], roles["intermediates"], temp_alignment,
                               lifetimes)
    temp_of_step = np.array([temps[key] for key in executables], dtype=np.int64)
    temp_tag = np.array([tags(f"jit({name}){key}/temp") for key in executables], dtype=np.int32)

    # ---- the per-step template: arguments, temp, outputs; temp, arguments, old state, loss.
    args, loss = roles["arguments"], roles["loss"][0]
    state_in = [] if donate else roles["state_in"]
    outputs = sorted([loss, *([] if donate else roles["state_out"])],
                     key=lambda s: int(np.flatnonzero((table.slot == s)
                                                      & (table.op == OP_ALLOC))[0]))
    n_new = len(args) + 1 + len(outputs)
    # frees: the temp, the arguments, the old state, the previous loss (none at step 0)
    n_events = n_new + 1 + len(args) + len(state_in) + 1
    op = np.array([OP_ALLOC] * n_new + [OP_FREE] * (n_events - n_new), dtype=np.int8)

    slot_bytes = values @ table.slot_size.T            # [step, slot]
    work_ns = values.astype(np.float64) @ table.work.T  # [step, event]
    arg_events = [int(np.flatnonzero((table.slot == s) & (table.op == OP_ALLOC))[0])
                  for s in args]
    compute = work_ns.sum(axis=1) - work_ns[:, arg_events].sum(axis=1)

    size = np.empty((n_steps, n_events), dtype=np.int64)
    gap = np.empty((n_steps, n_events), dtype=np.float64)
    ident = np.empty((n_steps, n_events), dtype=np.int64)
    tag = np.empty((n_steps, n_events), dtype=np.int32)
    new_ids = first_id + np.arange(n_steps, dtype=np.int64)[:, None] * n_new + np.arange(n_new)

    output_tags = [tags(f"jit({name})/output/" + ("loss" if s == loss else table.slot_tag[s]))
                   for s in outputs]
    a = len(args)
    # allocations
    size[:, :a] = slot_bytes[:, args]
    gap[:, :a] = work_ns[:, arg_events] + ALLOC_OVERHEAD_NS
    tag[:, :a] = [tags(table.slot_tag[s]) for s in args]
    size[:, a] = temp_of_step
    gap[:, a] = ALLOC_OVERHEAD_NS
    tag[:, a] = temp_tag
    size[:, a + 1:n_new] = slot_bytes[:, outputs]
    gap[:, a + 1:n_new] = FREE_OVERHEAD_NS
    tag[:, a + 1:n_new] = output_tags
    ident[:, :n_new] = new_ids
    # frees: the temp after the step's compute, then the arguments
    f = n_new
    size[:, f:f + 1 + a] = size[:, [a, *range(a)]]
    ident[:, f:f + 1 + a] = ident[:, [a, *range(a)]]
    tag[:, f:f + 1 + a] = tag[:, [a, *range(a)]]
    gap[:, f:n_events] = FREE_OVERHEAD_NS
    gap[:, f] += compute
    f += 1 + a
    # the old parameters and state (without donation): step 0's from the prologue
    column = {s: a + 1 + outputs.index(s) for s in outputs}
    for k, (old, new) in enumerate(zip(state_in, roles["state_out"])):
        size[:, f + k] = slot_bytes[:, old]
        ident[0, f + k] = initial_ids[old]
        ident[1:, f + k] = new_ids[:-1, column[new]]
        tag[0, f + k] = tags(table.slot_tag[old])
        tag[1:, f + k] = output_tags[outputs.index(new)]
    # the previous step's loss
    size[:, -1] = slot_bytes[:, loss]
    ident[1:, -1] = new_ids[:-1, column[loss]]
    ident[0, -1] = -1
    tag[:, -1] = output_tags[outputs.index(loss)]

    keep = np.ones(n_steps * n_events, dtype=bool)
    keep[n_events - 1] = False     # step 0 has no previous loss
    columns: dict[str, np.ndarray] = {
        "op": np.tile(op, n_steps)[keep],
        "id": ident.ravel()[keep],
        "size": size.ravel()[keep],
        "tag": tag.ravel()[keep],
        "gap_ns": jittered(rng, gap.ravel()[keep]),
    }
    if size.size and size.min() <= 0:
        raise RuntimeError("a compiled step has a buffer of size <= 0")
    meta: dict[str, Any] = {
        "pattern": "jax", "compiles": len(temps), "temp_alignment": temp_alignment,
        "donate": donate, "intermediates_per_step": len(roles["intermediates"]),
        "outputs_per_step": len(outputs),
    }
    if len(temps) <= 10_000:
        meta["executables"] = {f"jit({name}){key}": {"temp_bytes": int(temps[key]),
                                                      "steps": steps_of[key]}
                               for key in temps}
    return columns, meta


def events_per_step(program: StepProgram, donate: bool) -> int:
    """Events of one compiled step after the first: the ``events=`` parameter's unit."""
    roles = step_roles(program.table())
    outputs = 1 + (0 if donate else len(roles["state_out"]))
    n_args = len(roles["arguments"])
    return (n_args + 1 + outputs) + (1 + n_args) + (0 if donate else len(roles["state_in"])) + 1
