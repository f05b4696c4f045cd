"""Shared machinery of the synthetic generators: step programs, timing, trace assembly.

Training loops repeat the same sequence of allocations every step; only the sizes may change
(with the sequence length, say). So a generator writes ONE step symbolically as a
:class:`StepProgram` -- each buffer's size a linear combination of per-step *features* such as
``tokens`` = batch * seq_len -- and :meth:`StepProgram.render` evaluates it for all steps at once
with numpy. That keeps 10-million-event traces to a few vectorised passes instead of a Python
call per event.

Everything here is private to :mod:`allocsim.traces.synth`; the generators' modules are the
public face.
"""

from __future__ import annotations

import contextvars
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from allocsim.errors import UserInputError
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace

# Rough throughput of a current datacenter GPU, used only to turn work into plausible gaps
# between events. Absolute accuracy does not matter to an allocator; the *shape* does (big
# matmuls take milliseconds, frees take almost nothing).
FLOP_PER_NS = 100e3        # 100 TFLOP/s sustained
BYTES_PER_NS = 1500.0      # 1.5 TB/s memory bandwidth

# CPU-side cost of one framework op that allocates (dispatch + allocator call), and of a free
# (a refcount drop). Multiplied by a jitter in [0.75, 1.25).
ALLOC_OVERHEAD_NS = 3000.0
FREE_OVERHEAD_NS = 400.0

SYNTH_VERSION = 1  # bump when a generator's output changes for the same parameters and seed


def matmul_ns(m: float, k: float, n: float) -> float:
    """Modelled time of an (m x k) @ (k x n) matmul: 2mkn flops at FLOP_PER_NS."""
    return 2.0 * m * k * n / FLOP_PER_NS


def memory_ns(nbytes: float) -> float:
    """Modelled time of a bandwidth-bound kernel touching ``nbytes``."""
    return nbytes / BYTES_PER_NS


class TagTable:
    """Interns tag strings into the indices the Trace ``tag`` column holds."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        index = self._index.get(name)
        if index is None:
            index = self._index[name] = len(self.names)
            self.names.append(name)
        return index


Linear = int | float | Mapping[str, float]


class StepProgram:
    """One step of a repetitive workload, written event by event, rendered for many steps.

    A size or a work amount is a *linear form* over the program's features: a number (times the
    implicit feature ``one``) or a mapping ``{"tokens": 4096, "one": 64}``. Sizes must come out
    as positive integers for every step; work is in nanoseconds of compute that precede the event.

    Buffers are *slots*: ``alloc`` returns a slot number, ``free`` takes it. Each step renders
    every slot under a fresh id, so ids are never reused and steps cannot interfere.

    The one exception is a buffer that outlives its step and is freed by the next one (a
    functional optimizer's new parameters replace the old ones one step later): ``inherit``
    declares a slot for the buffer the *previous* step handed on, and ``hand_on(old, new)`` says
    that this step's ``new`` (left live) is what the next step knows as ``old``. Step 0's
    inherited buffers come from before the program (``render(initial_ids=...)``).
    """

    def __init__(self, features: Sequence[str], tags: TagTable) -> None:
        self.features = ("one", *(f for f in features if f != "one"))
        self._feature_index = {name: i for i, name in enumerate(self.features)}
        self._tags = tags
        self._op: list[int] = []
        self._slot: list[int] = []
        self._tag: list[int] = []
        self._size: list[np.ndarray] = []
        self._work: list[np.ndarray] = []
        self._slot_size: list[np.ndarray] = []
        self._slot_tag: list[str] = []
        self._live: set[int] = set()
        self._inherited: dict[int, int | None] = {}  # inherited slot -> the slot handed on

    # ------------------------------------------------------------------ writing
    def _form(self, value: Linear, dtype: type) -> np.ndarray:
        vector: np.ndarray = np.zeros(len(self.features), dtype=dtype)
        if isinstance(value, Mapping):
            for name, coefficient in value.items():
                if name not in self._feature_index:
                    raise KeyError(f"unknown feature {name!r}; known: {', '.join(self.features)}")
                vector[self._feature_index[name]] = coefficient
        else:
            vector[0] = value
        return vector

    def alloc(self, tag: str, size: Linear, work: Linear = 0.0) -> int:
        """Allocate a buffer of ``size`` bytes after ``work`` ns of compute; returns its slot."""
        slot = len(self._slot_size)
        coefficients = self._form(size, np.int64)
        self._slot_size.append(coefficients)
        self._slot_tag.append(tag)
        self._append(OP_ALLOC, slot, tag, coefficients, work)
        self._live.add(slot)
        return slot

    def inherit(self, tag: str, size: Linear) -> int:
        """A slot for a live buffer that the previous step handed on; free it, never alloc it."""
        slot = len(self._slot_size)
        self._slot_size.append(self._form(size, np.int64))
        self._slot_tag.append(tag)
        self._live.add(slot)
        self._inherited[slot] = None
        return slot

    def hand_on(self, old: int, new: int) -> None:
        """This step's ``new`` buffer (left live) is the next step's inherited ``old``."""
        if old not in self._inherited or self._inherited[old] is not None:
            raise RuntimeError(f"slot {old} is not an inherited slot still waiting for a successor")
        if new in self._inherited or new not in self._live:
            raise RuntimeError(f"slot {new} is not a buffer this step allocated and left live")
        if not np.array_equal(self._slot_size[old], self._slot_size[new]):
            raise RuntimeError(f"slot {new} must have the size of the slot {old} it replaces")
        self._inherited[old] = new

    def free(self, *slots: int, work: Linear = 0.0) -> None:
        """Free the buffers in ``slots``, in that order (``work`` precedes the first)."""
        for slot in slots:
            if slot not in self._live:
                raise RuntimeError(f"slot {slot} is not live")
            self._live.remove(slot)
            self._append(OP_FREE, slot, self._slot_tag[slot], self._slot_size[slot], work)
            work = 0.0

    def _append(self, op: int, slot: int, tag: str, size: np.ndarray, work: Linear) -> None:
        self._op.append(op)
        self._slot.append(slot)
        self._tag.append(self._tags(tag))
        self._size.append(size)
        self._work.append(self._form(work, np.float64))

    # ------------------------------------------------------------------ facts
    @property
    def n_events(self) -> int:
        return len(self._op)

    @property
    def n_slots(self) -> int:
        return len(self._slot_size)

    def live_slots(self) -> list[int]:
        return sorted(self._live)

    def ids_handed_on(self, first_id: int) -> dict[int, int]:
        """The ``initial_ids`` of the step after one rendered with ids from ``first_id``: each
        inherited slot gets the id that step gave the slot handed on to it (a block of steps
        rendered after others starts from the ids the step before handed on)."""
        return {old: first_id + new for old, new in self._inherited.items() if new is not None}

    def table(self) -> ProgramTable:
        """The program as arrays, for renderers other than :meth:`render` (``pattern=jax``)."""
        n_features = len(self.features)
        return ProgramTable(
            features=self.features,
            op=np.array(self._op, dtype=np.int8),
            slot=np.array(self._slot, dtype=np.int64),
            size=np.array(self._size, dtype=np.int64).reshape(-1, n_features),
            work=np.array(self._work, dtype=np.float64).reshape(-1, n_features),
            slot_size=np.array(self._slot_size, dtype=np.int64).reshape(-1, n_features),
            slot_tag=tuple(self._slot_tag),
            handed_on={old: new for old, new in self._inherited.items() if new is not None},
        )

    def require_closed(self) -> None:
        """Raise unless every buffer the step allocated is freed (a per-step invariant).

        The exception: buffers handed on to the next step (:meth:`hand_on`), which must free
        its inherited copies; every inherited slot must have been freed and handed on.
        """
        handed_on = set(self._inherited.values())
        if None in handed_on:
            raise AssertionError("an inherited slot was not handed on to the next step")
        if self._live != handed_on:
            raise AssertionError(f"step program leaves slots live: {sorted(self._live - handed_on)}"
                                 if self._live - handed_on else
                                 "a buffer handed on to the next step was freed")

    # ------------------------------------------------------------------ rendering
    def render(self, values: np.ndarray, *, first_id: int, rng: np.random.Generator,
               initial_ids: Mapping[int, int] | None = None) -> dict:
        """Columns for ``len(values)`` steps; ``values[step, feature]`` in ``self.features`` order.

        Returns ``op``, ``id``, ``size``, ``tag`` and ``gap_ns`` (time since the previous event),
        step-major. Every size is checked to be positive. ``initial_ids`` maps each inherited
        slot to the id of the live buffer step 0 inherits; later steps inherit the buffer the
        step before handed on. The last step's handed-on buffers stay live.
        """
        values = np.asarray(values, dtype=np.int64).reshape(-1, len(self.features))
        n_steps, n_events = len(values), self.n_events
        size_coef = np.array(self._size, dtype=np.int64).reshape(n_events, -1)
        work_coef = np.array(self._work, dtype=np.float64).reshape(n_events, -1)
        ops = np.array(self._op, dtype=np.int8)

        # sizes[step, event] = sum over features of value * coefficient; one outer product per
        # feature that any event uses, so the common all-constant case costs one broadcast.
        size = np.zeros((n_steps, n_events), dtype=np.int64)
        work = np.zeros((n_steps, n_events), dtype=np.float64)
        for f in range(len(self.features)):
            if size_coef[:, f].any():
                size += np.multiply.outer(values[:, f], size_coef[:, f])
            if work_coef[:, f].any():
                work += np.multiply.outer(values[:, f].astype(np.float64), work_coef[:, f])
        if size.size and size.min() <= 0:
            raise UserInputError("a generated buffer size is not positive; check the parameters")

        overhead = np.where(ops == OP_ALLOC, ALLOC_OVERHEAD_NS, FREE_OVERHEAD_NS)
        gap = jittered(rng, (work + overhead).ravel())
        ids = first_id + (np.arange(n_steps, dtype=np.int64)[:, None] * self.n_slots
                          + np.array(self._slot, dtype=np.int64)[None, :])
        if self._inherited:
            given = initial_ids or {}
            missing = set(self._inherited) - set(given)
            if missing:
                raise RuntimeError("render needs initial_ids for inherited slots "
                                   f"{sorted(missing)}")
            slots = np.array(self._slot, dtype=np.int64)
            for old, new in self._inherited.items():
                if new is None:
                    raise RuntimeError(f"inherited slot {old} was not handed on (see hand_on)")
                events = np.flatnonzero(slots == old)
                ids[0, events] = given[old]
                ids[1:, events] = (first_id + np.arange(n_steps - 1, dtype=np.int64)[:, None]
                                   * self.n_slots + new)
        return {
            "op": np.tile(ops, n_steps),
            "id": ids.ravel(),
            "size": size.ravel(),
            "tag": np.tile(np.array(self._tag, dtype=np.int32), n_steps),
            "gap_ns": gap,
        }


@dataclass(frozen=True)
class ProgramTable:
    """A :class:`StepProgram` as arrays: per event its op, slot and the linear forms of its
    size and preceding work (rows in ``features`` order); per slot its size form and tag;
    ``handed_on`` maps each inherited slot to the slot that replaces it for the next step."""

    features: tuple[str, ...]
    op: np.ndarray
    slot: np.ndarray
    size: np.ndarray
    work: np.ndarray
    slot_size: np.ndarray
    slot_tag: tuple[str, ...]
    handed_on: dict[int, int]


def jittered(rng: np.random.Generator, ns: np.ndarray) -> np.ndarray:
    """Integer gaps of ``ns`` times a uniform jitter in [0.75, 1.25), at least 1 ns.

    Uniform rather than lognormal because it is several times cheaper to draw for 1e7 events
    and the allocator does not care about the tail of kernel-time noise.
    """
    factor = 0.75 + 0.5 * rng.random(len(ns))
    return np.maximum(1, (ns * factor).astype(np.int64))


def assemble(parts: Sequence[Mapping[str, np.ndarray]], tags: TagTable, *, kind: str,
             params: Mapping[str, Any], stream: np.ndarray | None = None) -> Trace:
    """Concatenate rendered parts into a Trace with times from the cumulative gaps."""
    columns = {name: np.concatenate([p[name] for p in parts]) for name in
               ("op", "id", "size", "tag", "gap_ns")}
    time_ns = np.cumsum(columns.pop("gap_ns"), dtype=np.int64)
    if len(time_ns):
        time_ns -= time_ns[0]  # traces start at 0
    return Trace.from_columns(
        time_ns, columns["op"], columns["id"], columns["size"], stream=stream,
        tag=columns["tag"], tags=list(tags.names), **metadata(kind, params))


def metadata(kind: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata every synthetic trace carries: enough to regenerate it."""
    plain = {k: plain_value(v) for k, v in params.items()}
    return {"name": f"synth-{kind}", "source": f"synth:{kind}", "params": plain,
            "synth_version": SYNTH_VERSION}


def plain_value(value: Any) -> Any:
    """numpy scalars to Python ones, so metadata stays JSON-serialisable."""
    if isinstance(value, np.generic):
        return value.item()
    return value


def steps_for_events(events: int, fixed_events: int, per_step: int) -> int:
    """How many steps bring a trace of ``fixed_events`` + steps * ``per_step`` nearest
    ``events``."""
    return max(1, round((events - fixed_events) / per_step))


# The most events a generator makes in memory: ten times the documented range (1e3-1e7),
# ~6 GB while the columns are built. More is refused before anything is drawn, as one line.
MAX_EVENTS = 100_000_000
# The most events of a trace streamed to a file a block at a time
# (:mod:`allocsim.traces.synth.rendering`): memory no longer bounds it, the file does (37
# bytes/event: 370 GB here).
MAX_STREAMED_EVENTS = 10_000_000_000


class ParamsChecked(Exception):
    """Raised by :func:`checks_done` in a generator run by :func:`allocsim.traces.synth.check`:
    every parameter passed the generator's checks, and nothing was generated."""


_CHECKING: contextvars.ContextVar[bool] = contextvars.ContextVar("allocsim_synth_checking",
                                                                 default=False)


def checks_done() -> None:
    """Called by each generator once its parameters are checked, before the work: under
    :func:`allocsim.traces.synth.check` (a sweep validating its cells up front) it stops there."""
    if _CHECKING.get():
        raise ParamsChecked


# Set while :func:`allocsim.traces.synth.plan` asks a generator for its plan, to be rendered a
# block at a time: a generator that can be streamed is then held to MAX_STREAMED_EVENTS.
_PLANNING: contextvars.ContextVar[bool] = contextvars.ContextVar("allocsim_synth_planning",
                                                                 default=False)


def within_event_limit(events: float, what: str, *, streamable: bool = False) -> None:
    """Refuse a trace of ``events`` events (as ``what`` asks for) above :data:`MAX_EVENTS`, or
    above :data:`MAX_STREAMED_EVENTS` for a ``streamable`` trace asked for as a plan."""
    streamed = streamable and _PLANNING.get()
    limit = MAX_STREAMED_EVENTS if streamed else MAX_EVENTS
    if events > limit:
        hint = (f" in memory (`allocsim gen ... -o FILE.npz` streams up to "
                f"{MAX_STREAMED_EVENTS:,})" if streamable and not streamed else "")
        raise UserInputError(f"{what} asks for about {events:.3g} events; a generated trace "
                             f"holds at most {limit:,}{hint}")


def positive(**values: float) -> None:
    """Raise one ValueError naming the first parameter that is not > 0."""
    for name, value in values.items():
        if value is None or value <= 0:
            raise UserInputError(f"{name} must be > 0, got {value!r}")


def choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise UserInputError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


# ---------------------------------------------------------------------- parameter descriptions
ParamSpec = tuple  # (type, default, help)


def describe(function: Callable[..., Trace], help: Mapping[str, str]) -> dict[str, ParamSpec]:
    """``name -> (type, default, help)`` for each keyword parameter of ``function``.

    The signature is the single source of the types and defaults; ``help`` must describe every
    parameter (checked here, at import time, so a new parameter cannot go undocumented).
    """
    hints = typing.get_type_hints(function)
    specs: dict[str, ParamSpec] = {}
    for name, parameter in inspect.signature(function).parameters.items():
        if name not in help:
            raise AssertionError(f"{function.__name__}: parameter {name!r} has no help text")
        specs[name] = (_base_type(hints[name]), parameter.default, help[name])
    extra = set(help) - set(specs)
    if extra:
        raise AssertionError(f"{function.__name__}: help for unknown parameters {sorted(extra)}")
    return specs


def _base_type(hint: Any) -> type:
    """``int | None`` -> int; plain types unchanged."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint



# ---------------------------------------------------------------------- optimizer updates
OPTIMIZER_MODES = ("inplace", "functional")


def check_optimizer_mode(optimizer_mode: str, donate: bool) -> None:
    """Validate ``optimizer_mode`` and ``donate`` together (donation needs a functional update)."""
    choice("optimizer_mode", optimizer_mode, OPTIMIZER_MODES)
    if donate and optimizer_mode != "functional":
        raise UserInputError("donate=true needs optimizer_mode=functional (an in-place optimizer "
                         "already updates its buffers where they are)")


def _owner(name: str) -> str:
    return name.split("/")[0]


def inherit_persistent(p: StepProgram, shapes: Mapping[str, int], elt_bytes: int,
                       state_buffers: int) -> tuple[list[int], list[list[int]], dict[int, int]]:
    """Inherited slots for the parameters and optimizer state that the prologue left live.

    The prologue must have allocated, from id 0, one ``param/<owner>`` buffer per entry of
    ``shapes`` in order, then ``state_buffers`` ``optimizer/state/<owner>`` buffers per entry.
    Returns (parameter slots, state slots per parameter, the ``initial_ids`` for render).
    """
    params: list[int] = []
    states: list[list[int]] = []
    initial: dict[int, int] = {}
    for index, (name, elements) in enumerate(shapes.items()):
        slot = p.inherit(f"param/{_owner(name)}", elements * elt_bytes)
        params.append(slot)
        initial[slot] = index
    for index, (name, elements) in enumerate(shapes.items()):
        row = []
        for k in range(state_buffers):
            slot = p.inherit(f"optimizer/state/{_owner(name)}", elements * elt_bytes)
            row.append(slot)
            initial[slot] = len(shapes) + index * state_buffers + k
        states.append(row)
    return params, states, initial


def functional_update(p: StepProgram, shapes: Mapping[str, int], elt_bytes: int,
                      params: Sequence[int], states: Sequence[Sequence[int]], *,
                      adam: bool) -> None:
    """A functional optimizer step without buffer donation (JAX/optax without donate_argnums).

    For each parameter, in order: the update kernel allocates its NEW optimizer state buffers
    and NEW parameter while the old ones are still live (Adam also builds its ``denom``
    temporary, as the in-place step does, so the two modes differ only in the new buffers). The
    new buffers are handed on to the next step; the caller frees the old ones (``params`` and
    ``states``) after the step, when the training loop rebinds its variables.
    """
    for index, (name, elements) in enumerate(shapes.items()):
        nbytes = elements * elt_bytes
        tmp = None
        if adam:
            tmp = p.alloc("optimizer/tmp", nbytes, work=memory_ns(4 * nbytes))
        work = 0.0 if adam else memory_ns(3 * nbytes)  # SGD: momentum and parameter update
        for old in states[index]:
            p.hand_on(old, p.alloc(f"optimizer/state/{_owner(name)}", nbytes, work=work))
            work = 0.0
        p.hand_on(params[index], p.alloc(f"param/{_owner(name)}", nbytes, work=work))
        if tmp is not None:
            p.free(tmp, work=memory_ns(4 * nbytes))


# ---------------------------------------------------------------------- allocation patterns
PATTERNS = ("eager", "jax")


def check_pattern(pattern: str, optimizer_mode: str, temp_alignment: int) -> None:
    """Validate ``pattern`` with the optimizer mode (a jitted step is functional)."""
    choice("pattern", pattern, PATTERNS)
    positive(temp_alignment=temp_alignment)
    if pattern == "jax" and optimizer_mode != "functional":
        raise UserInputError("pattern=jax needs optimizer_mode=functional (a jitted step returns "
                             "new parameters and state; add donate=true for donate_argnums)")
