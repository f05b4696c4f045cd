"""A synthetic trace before its events exist: rendered whole, or a block of steps at a time.

A generator that can be streamed (``training`` and ``transformer`` with ``pattern=eager``)
builds its step programs, draws what it draws up front (the transformer's sequence lengths)
and hands :func:`planned` a :class:`SynthPlan`: its parts in order (each a step program and
the feature values of its steps), the random generator in the state the parts' jitter
continues from, the tag table and the metadata. :meth:`SynthPlan.trace` renders every part at
once: what :func:`allocsim.traces.synth.generate` returns. :meth:`SynthPlan.blocks` renders a
few steps at a time, for a writer that never holds the trace (``allocsim gen ... -o F.npz``
past :data:`STREAM_ABOVE_EVENTS`, :func:`save_streamed`), and gives the same columns:

- a part's steps go in order, each block's jitter drawn from the same generator after the
  blocks before it (``Generator.random`` fills its output one draw at a time from the stream,
  so n draws in pieces are the n draws at once);
- a block's ids are those a whole render gives its steps, and the ids its first step
  inherits are those the step before handed on (:meth:`StepProgram.ids_handed_on`);
- times are the running sum of the gaps, the first gap taken off, as :func:`assemble` does.

``tests/test_synth_streamed.py`` holds the two to the same trace.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocsim.traces.model import OP_ALLOC, Trace
from allocsim.traces.synth._common import _PLANNING, StepProgram, TagTable, assemble, metadata

__all__ = ["BLOCK_EVENTS", "STREAM_ABOVE_EVENTS", "Planned", "Steps", "StreamedFacts",
           "SynthPlan", "planned", "save_streamed"]

# Events rendered at a time: a block's temporaries (sizes, work, gaps, ids: ~60 bytes/event)
# stay near 100 MB, and a block is long enough that per-block costs vanish.
BLOCK_EVENTS = 1 << 21
# ``allocsim gen`` writes an .npz of more events than this block by block: the whole trace in
# memory peaks ~125 bytes/event while it is built (1.25 GB here).
STREAM_ABOVE_EVENTS = 10_000_000


@dataclass(frozen=True)
class Steps:
    """``program`` rendered for ``len(values)`` steps (``values[step, feature]`` in the
    program's feature order), ids from ``first_id``; ``initial_ids`` are the ids step 0's
    inherited slots free (:meth:`StepProgram.render`)."""

    program: StepProgram
    values: np.ndarray
    first_id: int
    initial_ids: Mapping[int, int] | None = None

    @property
    def n_events(self) -> int:
        return len(self.values) * self.program.n_events

    def render(self, rng: np.random.Generator, start: int = 0,
               stop: int | None = None) -> dict[str, np.ndarray]:
        """Columns of steps ``start`` to ``stop``: those of a render of every step, when
        ``rng`` has drawn the steps before ``start``'s jitter."""
        program = self.program
        first_id = self.first_id + start * program.n_slots
        initial = (self.initial_ids if start == 0
                   else program.ids_handed_on(first_id - program.n_slots))
        return program.render(self.values[start:stop], first_id=first_id, rng=rng,
                              initial_ids=initial)


@dataclass
class SynthPlan:
    """A generator's trace, not yet rendered (module docstring)."""

    kind: str
    params: dict[str, Any]
    parts: list[Steps]
    rng: np.random.Generator
    tags: TagTable
    extra_metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def n_events(self) -> int:
        return sum(part.n_events for part in self.parts)

    @property
    def metadata(self) -> dict[str, Any]:
        """What the rendered trace's metadata holds."""
        return {**metadata(self.kind, self.params), **self.extra_metadata}

    def trace(self) -> Trace:
        """Every part rendered at once, as one Trace (the rng is used up: render once)."""
        trace = assemble([part.render(self.rng) for part in self.parts], self.tags,
                         kind=self.kind, params=self.params)
        trace.metadata.update(self.extra_metadata)
        return trace

    def blocks(self, block_events: int = BLOCK_EVENTS) -> Iterator[dict[str, np.ndarray]]:
        """The trace's columns ``time_ns``, ``op``, ``id``, ``size`` and ``tag``, in order,
        about ``block_events`` events (whole steps) at a time; the same values as
        :meth:`trace` (the rng is used up: render once)."""
        clock: int | None = None  # the time of the last event so far
        for part in self.parts:
            per_step = max(1, part.program.n_events)
            steps = max(1, block_events // per_step)
            for start in range(0, len(part.values), steps):
                columns = part.render(self.rng, start, start + steps)
                gap = columns.pop("gap_ns")
                if not len(gap):
                    continue
                time_ns = np.cumsum(gap, dtype=np.int64)
                # assemble: times from the cumulative gaps, less the first gap (start at 0)
                time_ns += -int(gap[0]) if clock is None else clock
                clock = int(time_ns[-1])
                yield {"time_ns": time_ns, **columns}


class Planned(Exception):
    """Raised by :func:`planned` under :func:`allocsim.traces.synth.plan`: the generator's
    checks passed and here is its plan, not rendered."""

    def __init__(self, plan: SynthPlan) -> None:
        super().__init__(plan.kind)
        self.plan = plan


def planned(plan: SynthPlan) -> Trace:
    """A streamable generator's last call: its trace rendered whole, or, asked for its plan
    (:func:`allocsim.traces.synth.plan`), the plan handed out as :class:`Planned`."""
    if _PLANNING.get():
        raise Planned(plan)
    return plan.trace()


@dataclass(frozen=True)
class StreamedFacts:
    """What :func:`save_streamed` wrote: its events and their peak live bytes."""

    events: int
    peak_live: int


def save_streamed(plan: SynthPlan, path: str | os.PathLike[str], *,
                  block_events: int = BLOCK_EVENTS) -> StreamedFacts:
    """Write ``plan`` as an ``.npz`` trace file block by block (atomically, as
    :func:`allocsim.traces.formats.save` writes), never holding the trace: the file is the
    one ``save(plan.trace(), path)`` writes, as the loader reads it."""
    from allocsim.traces.formats.native.npz_stream import save_npz_blocks

    peak = running = 0

    def counted() -> Iterator[dict[str, np.ndarray]]:
        nonlocal peak, running
        for block in plan.blocks(block_events):
            size = block["size"]
            live = np.cumsum(np.where(block["op"] == OP_ALLOC, size, -size),
                             dtype=np.int64) + np.int64(running)
            peak, running = max(peak, int(live.max())), int(live[-1])
            yield block

    save_npz_blocks(path, plan.n_events, counted(), tags=list(plan.tags.names),
                    metadata=plan.metadata)
    return StreamedFacts(plan.n_events, peak)
