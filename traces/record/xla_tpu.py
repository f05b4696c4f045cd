"""Compile a JAX step for a TPU without one, and replay it as the TPU runtime holds it.

``compile_for(step, args, donate_argnums=(0,), target="tpu-v5e", steps=3)`` compiles
``jax.jit(step, donate_argnums=...)`` with XLA:TPU for a TPU topology (libtpu's own compiler,
``jax.experimental.topologies.get_topology_desc(topology_name="v5e:1x1", platform="tpu")``, as
MaxText's train_compile.py does) on a machine with no TPU, and returns the trace of what the
TPU runtime's allocator is asked over ``steps`` calls. Needs libtpu (``pip install
"jax[tpu]==0.10.2"``: libtpu 0.0.42.1); the prediction names the libtpu it compiled with
(another libtpu gives other numbers: 0.0.52 differs from the chip's 0.0.42.1).

How the TPU runtime holds a step (read off a v5e chip, tests/data/tpu/exec-*.json, JAX 0.10.2,
libtpu 0.0.42.1):

- the **arguments** are arrays allocated before the first call, each its parameter's
  allocation in XLA's buffer assignment (the tiled layout's bytes);
- the executable's **generated code** is an ordinary buffer of ``generated_code_size`` bytes,
  allocated at its first call and held while it is loaded;
- each call allocates its **outputs** that no donated argument aliases; a donated argument's
  buffer passes to the output;
- the **temp** (scratch) is not an allocation: the runtime holds it as ``bytes_reserved`` (the
  largest temp of the executables loaded, a little under ``memory_analysis()``'s), off the
  free total. The trace records it in metadata (``xla_tpu.scratch_bytes``), not as events.

So on the chip ``peak_bytes_in_use`` = the runtime's own bytes + arguments + outputs −
aliased + code, which is this trace's peak live on the ``tpu`` policy.

Topologies: ``target`` is a TPU device profile (``tpu-v5e``, ``tpu-v4``, ``tpu-v5p``,
``tpu-v6e``) compiled as one chip; ``topology="v5e:2x2"`` compiles for a slice and the trace is
one device's. A topology libtpu does not know, or a program larger than HBM, is one line.
"""


from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from allocsim.errors import UserInputError
from allocsim.traces.formats.xla.tpu_scratch import (
    SCRATCH_ALIGNMENT,
    hbm_temp_bytes,
    runtime_scratch_bytes,
)
from allocsim.traces.model import Trace
from allocsim.traces.record.tpu_compile import (
    NO_TPU_ENVIRONMENT,
    TOPOLOGIES,
    OutputLeaf,
    TpuStep,
    compile_step,
    libtpu_environment,
    libtpu_version,
)
from allocsim.traces.record.tpu_program import Program

__all__ = ["LOOPS", "NO_TPU_ENVIRONMENT", "SCRATCH_ALIGNMENT", "TOPOLOGIES", "OutputLeaf",
           "TpuStep", "compile_for", "compile_step", "hbm_temp_bytes", "libtpu_environment",
           "libtpu_version", "runtime_scratch_bytes"]


LOOPS = ("rebind", "keep")


def compile_for(step: Callable[..., Any], args: Sequence[Any], *,
                donate_argnums: int | Sequence[int] = (), target: str = "tpu-v5e",
                topology: str | None = None, steps: int = 1, loop: str = "rebind",
                carry: dict[int, int] | None = None,
                keep_dump: str | Path | None = None,
                output: str | Path | None = None) -> Trace:
    """The trace of ``steps`` calls of ``step`` compiled for ``target``, as the TPU runtime
    holds them (:mod:`allocsim.traces.record.tpu_program`); ``output``: also save it there.

    The arguments are placed from the host first. ``loop`` says how the calls follow each
    other, as the caller's Python loop does:

    - ``"rebind"`` (the default): ``state, loss = step(state, batch)`` — an output becomes the
      next call's argument (``carry``: argument position -> output position; by default every
      leading argument but the last whose output in the same position has its structure,
      shapes and dtypes: ``step(params, opt_state, batch) -> (params, opt_state, loss)``
      carries 0 and 1), and the argument it replaces is dropped once the call returns;
    - ``"keep"``: every call takes the original arguments, which the caller keeps; each
      call's outputs are dropped when the next returns.

    The trace's ``xla_tpu.loop`` says which, and what was carried."""
    if steps < 1:
        raise UserInputError(f"steps must be at least 1, got {steps}")
    if loop not in LOOPS:
        raise UserInputError(f"loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    program = Program(target, topology)
    if keep_dump is not None:
        compile_step(step, args, donate_argnums=donate_argnums, target=target,
                     topology=topology, keep_dump=keep_dump, _topo=program._topo)
    current = list(program.put(list(args), tag="argument (from the host)"))
    carried: dict[int, int] = {}
    held: Any = None
    for _ in range(steps):
        outputs = program.call(step, *current, donate_argnums=donate_argnums)
        if loop == "rebind":
            carried = _carried(current, outputs) if carry is None else dict(carry)
            for position, out in carried.items():
                current[position] = outputs[out] if isinstance(outputs, tuple | list) \
                    else outputs
        held = outputs          # the previous call's outputs are dropped here
    del current, held, outputs
    name = getattr(step, "__name__", "step")
    trace = program.trace(name=f"{name}@{target}", source="compile_for", xla_tpu={
        "steps": steps, "loop": {"mode": loop, "carried": {str(k): v for k, v in
                                                            sorted(carried.items())}}})
    if output is not None:
        from allocsim.traces.formats import save
        save(trace, output)
    return trace


def _carried(args: list[Any], outputs: Any) -> dict[int, int]:
    """compile_for's default carry: argument ``i`` <- output ``i`` for each leading argument
    but the last (the batch, in every training loop) whose output has its structure."""
    import jax
    outs = list(outputs) if isinstance(outputs, tuple | list) else [outputs]
    carried: dict[int, int] = {}
    for position in range(min(len(outs), max(len(args) - 1, 1))):
        a_leaves, a_tree = jax.tree.flatten(args[position])
        o_leaves, o_tree = jax.tree.flatten(outs[position])
        if str(a_tree) != str(o_tree) or [(x.shape, x.dtype) for x in a_leaves] != \
                [(y.shape, y.dtype) for y in o_leaves]:
            break
        carried[position] = position
    return carried
