"""An XLA executable replayed as the runtime hands it to its allocator.

A dump's buffer assignment (:mod:`allocsim.traces.formats.xla.dump_files`) says which memory
one execution of a compiled module needs. The runtime does not ask its allocator for the
logical buffers (that packing is XLA's, done at compile time inside the allocations); it asks
for the allocations themselves. What XLA:GPU does per execution
(``GpuExecutable::BufferForAllocation`` in openxla/xla ``xla/service/gpu/gpu_executable.cc``):

- a **thread-local** allocation gets no memory;
- an **entry-computation parameter** allocation is the argument's own buffer: the arrays the
  program holds, allocated by the caller before the first execution;
- a **constant** allocation is a global of the loaded module (``ResolveConstantGlobals``: the
  CUDA driver's or ``CreateOrShareConstant``), held by the executable and never taken from the
  allocator: its bytes are reported (``constant_bytes``), not allocated;
- every other allocation — each ``maybe-live-out`` one and the ``preallocated-temp`` — is
  ``memory_allocator->Allocate(size)`` at the start of the execution. The temp is freed when
  the execution ends; an output becomes an array the caller holds.
- An output allocation that is also a parameter's (a donated argument the output aliases) is
  no allocation at all: the donated buffer passes to the output (``alias_bytes``).

So one execution takes ``temp + output - alias`` bytes from the allocator on top of the
arguments, and the peak of the replay is ``argument + temp + output - alias`` bytes of
``memory_analysis()``, exactly. XLA:CPU's runtime follows the same rules (its temps and outputs
come from its allocator per execution), so CPU dumps replay the same way.

A run of several executions (:class:`RuntimeReplay`): arrays are allocated with
:meth:`~RuntimeReplay.array` and freed with :meth:`~RuntimeReplay.release`;
:meth:`~RuntimeReplay.execute` runs one executable with the arrays bound to its parameters and
returns the arrays its outputs became. Times are synthetic: each event group one µs apart, one
execution as many µs as its schedule has positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocsim.traces.formats.xla.dump_files import Assignment
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace

__all__ = ["Block", "Executable", "RuntimeReplay", "executable_of"]

STEP_NS = 1000


@dataclass(frozen=True)
class Block:
    """One allocation of the buffer assignment the runtime takes from its allocator (or, for a
    parameter, the caller's array bound to it)."""

    allocation: int     # the allocation's index in the buffer assignment
    size: int
    label: str          # the first value's instruction name, for the tag
    parameter: int | None = None
    donated: bool = False  # a parameter whose buffer an output reuses (maybe-live-out)


@dataclass(frozen=True)
class Executable:
    """What one compiled module asks of the allocator."""

    name: str
    parameters: tuple[Block, ...]   # by parameter number
    temps: tuple[Block, ...]        # allocated at the call, freed at its end
    outputs: tuple[Block, ...]      # allocated at the call, held by the caller after it
    constant_bytes: int             # held by the executable, outside the allocator
    length: int = 1                 # positions of its schedule (the execution's duration)

    @property
    def argument_bytes(self) -> int:
        return sum(b.size for b in self.parameters)

    @property
    def alias_bytes(self) -> int:
        return sum(b.size for b in self.parameters if b.donated)

    @property
    def temp_bytes(self) -> int:
        return sum(b.size for b in self.temps)

    @property
    def new_output_bytes(self) -> int:
        """Output bytes the allocator gives (outputs not aliased to a donated parameter)."""
        return sum(b.size for b in self.outputs)

    @property
    def peak_bytes(self) -> int:
        """``argument + temp + output - alias`` of ``memory_analysis()``: arguments live, then
        the temp and the new outputs of one execution."""
        return self.argument_bytes + self.temp_bytes + self.new_output_bytes


def executable_of(name: str, assignment: Assignment, length: int = 1) -> Executable:
    """The :class:`Executable` of a parsed buffer-assignment file (rules in the module
    docstring)."""
    first_value: dict[int, str] = {}
    for row in range(len(assignment.names) - 1, -1, -1):
        first_value[int(assignment.allocation[row])] = assignment.names[row]
    parameters, temps, outputs = [], [], []
    constant_bytes = 0
    for k, a in enumerate(assignment.allocations):
        label = first_value.get(k, f"allocation {a.index}")
        label = label[:-2] if label.endswith("{}") else label
        if a.thread_local:
            continue
        if a.parameter is not None:
            parameters.append(Block(a.index, a.size, label, a.parameter, a.live_out))
        elif a.live_out:
            outputs.append(Block(a.index, a.size, label))
        elif a.constant:
            constant_bytes += a.size
        elif a.size > 0:
            temps.append(Block(a.index, a.size, label))
    parameters.sort(key=lambda b: (b.parameter, b.allocation))
    return Executable(name, tuple(parameters), tuple(temps),
                      tuple(b for b in outputs if b.size > 0), constant_bytes, max(1, length))


@dataclass
class RuntimeReplay:
    """Events of arrays and executions, as a runtime asks its allocator (see the module
    docstring). Ids are given in the order of allocation."""

    time_ns: list[int] = field(default_factory=list)
    op: list[int] = field(default_factory=list)
    id: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    tag: list[int] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    clock: int = 0
    live: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (size, tag)
    executions: int = 0
    _tag_index: dict[str, int] = field(default_factory=dict)
    _next_id: int = 0

    def _tag(self, text: str) -> int:
        index = self._tag_index.setdefault(text, len(self.tags))
        if index == len(self.tags):
            self.tags.append(text)
        return index

    def _event(self, op: int, ident: int, size: int, tag: int) -> None:
        self.time_ns.append(self.clock)
        self.op.append(op)
        self.id.append(ident)
        self.size.append(size)
        self.tag.append(tag)

    def tick(self, positions: int = 1) -> None:
        self.clock += positions * STEP_NS

    def array(self, size: int, tag: str) -> int:
        """Allocate an array (an argument the caller makes); returns its id."""
        ident = self._next_id
        self._next_id += 1
        tag_index = self._tag(tag)
        self.live[ident] = (size, tag_index)
        self._event(OP_ALLOC, ident, size, tag_index)
        return ident

    def release(self, ident: int) -> None:
        """Free an array the caller lets go of."""
        size, tag_index = self.live.pop(ident)
        self._event(OP_FREE, ident, size, tag_index)

    def release_all(self) -> None:
        for ident in sorted(self.live):
            self.release(ident)

    def parameters(self, executable: Executable, prefix: str = "") -> dict[int, int]:
        """Allocate one array per parameter of ``executable`` (number -> id)."""
        return {b.parameter: self.array(b.size, f"{prefix}parameter {b.parameter}: {b.label}"
                                        + (" [donated]" if b.donated else ""))
                for b in executable.parameters if b.parameter is not None}

    def execute(self, executable: Executable, bound: dict[int, int]) -> dict[int, int]:
        """One execution with the arrays ``bound`` to its parameters (number -> id): temps and
        new outputs allocated at the call, temps freed at its end. Returns the outputs it made
        (allocation index -> id) plus each donated parameter's array, which the output aliasing
        it now is (allocation index of the parameter -> the same id)."""
        missing = [b.parameter for b in executable.parameters if b.parameter not in bound]
        if missing:
            raise ValueError(f"{executable.name}: no array bound to parameter {missing[0]}")
        self.executions += 1
        run = f"{executable.name}"
        temp_ids = [self.array(b.size, f"{run}: preallocated temp (allocation {b.allocation})"
                               if len(executable.temps) == 1 else
                               f"{run}: temp allocation {b.allocation}: {b.label}")
                    for b in executable.temps]
        made = {b.allocation: self.array(b.size, f"{run}: output (allocation {b.allocation}): "
                                                 f"{b.label}")
                for b in executable.outputs}
        self.tick(executable.length)
        for ident in temp_ids:
            self.release(ident)
        self.tick()
        made.update({b.allocation: bound[b.parameter] for b in executable.parameters
                     if b.donated and b.parameter is not None})
        return made

    def trace(self, **metadata: Any) -> Trace:
        return Trace.from_columns(np.asarray(self.time_ns, np.int64),
                                  np.asarray(self.op, np.int8), np.asarray(self.id, np.int64),
                                  np.asarray(self.size, np.int64),
                                  tag=np.asarray(self.tag, np.int32), tags=list(self.tags),
                                  **metadata)


def replay_steps(executable: Executable, steps: int, *, code_bytes: int = 0) -> RuntimeReplay:
    """``steps`` executions of one executable over the same arguments, as a training loop
    runs it: the parameters allocated once before the first (a donated one passes to the output
    that aliases it, and on to the next execution), each execution's new outputs held through
    the next call and let go when it returns (the loop rebinds them after the call:
    ``state, loss = step(state, batch)`` keeps the previous loss while the step runs) and
    everything freed at the end. Read on the chip: a GPT step given exactly the HBM its first
    call needs ran it and was refused at the second the 512 B of the loss it still held
    (experiments/tpu/min_capacity_probe.py, tests/data/tpu/min-capacity). Not followed: an
    output not aliased but passed back as the next call's donated argument (a state part XLA
    gave a buffer of its own) is let go by JAX as that call starts; it is held through it here,
    so the answer can be a little high (the same probe: 512 B above the chip's minimum for the
    small GPT step, 512–1,024 B for the 125M one).
    ``code_bytes``: the executable's generated code, a buffer from its first call to the end
    (XLA:TPU's runtime holds it in HBM; XLA:GPU's is the driver's, outside the trace)."""
    replay = RuntimeReplay()
    bound = replay.parameters(executable)
    replay.tick()
    if code_bytes:
        replay.array(code_bytes, f"{executable.name}: generated code")
    held: list[int] = []
    donated = {bound[b.parameter] for b in executable.parameters
               if b.donated and b.parameter is not None}
    for _ in range(steps):
        replay.tick()
        made = replay.execute(executable, bound)
        for ident in held:      # the previous call's outputs, rebound once this one returns
            replay.release(ident)
        held = [ident for ident in made.values() if ident not in donated]
    replay.release_all()
    return replay
