"""Compile a JAX program for a named GPU without one, and replay it as JAX's runtime would.

``compile_for(step, args, donate_argnums=(0,), target="h100-80g", schedule=Schedule(steps=
10))`` is ``jax.jit(step, donate_argnums=...).lower(*args).compile()`` for XLA:GPU with the
target config of a device profile (:mod:`allocsim.traces.record.gpu_targets`), on a machine
with no GPU and no array allocated, and returns the trace of what the runtime asks its
allocator over the schedule: the arguments allocated as arrays before the first call, then per
call the preallocated temp and the outputs no donated argument aliases
(:mod:`allocsim.traces.formats.xla.runtime`). ``args`` are abstract: ``jax.ShapeDtypeStruct``
pytrees (what ``jax.eval_shape(init, ...)`` gives) or arrays, whose shapes and dtypes are read.

Needs jax's CUDA plugin and ptxas (``pip install 'allocsim[jax-gpu]'``: ``jax[cuda12-local]`` and
``nvidia-cuda-nvcc-cu12``, ~0.6 GB; the other NVIDIA wheels of ``jax[cuda12]`` are not needed).
The CUDA plugin must be loaded with no device visible and its version check (which calls
``cuInit``) skipped: :func:`prepare` sets ``CUDA_VISIBLE_DEVICES=-1``,
``JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1`` and ``JAX_PLATFORMS=cpu`` — call it before importing jax.

**Schedule** (:class:`Schedule`): ``steps`` calls of the train step; an eval step every
``eval_every`` steps; ``buckets``, other argument tuples of the train step (one executable per
sequence-length bucket), taken in turn. An argument leaf of an eval step or bucket that is the
same Python object as one of the train step's first arguments is the same array (the train
state); any other leaf, and the train step's ``batch_argnums``, is an array made for the call
and freed after it. A step's new outputs are held until the next call of that kind rebinds
them (``state = step(state, batch)``).

**Sharded programs**: ``devices=N`` compiles for N GPUs of the target in one mesh axis
``"d"`` (``shard="fsdp"`` splits each argument's largest divisible dimension over it, a batch's
first; ``"replicate"`` copies them); the trace is one device's (every device runs the same SPMD
program). Not modelled: NCCL's own buffers and the collectives' workspaces (allocated by NCCL,
outside XLA's buffer assignment), nor cuBLAS/cuDNN workspaces, autotuning scratch and
command-buffer (CUDA graph) memory.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocsim.errors import UserInputError
from allocsim.traces.formats.xla.runtime import Executable, RuntimeReplay
from allocsim.traces.model import Trace
from allocsim.traces.record.compiled_dump import executable_from_dump
from allocsim.traces.record.gpu_targets import TargetConfig, target_config

__all__ = ["ENVIRONMENT", "CompiledStep", "Schedule", "compile_for", "compile_step", "prepare"]

ENVIRONMENT = {"CUDA_VISIBLE_DEVICES": "-1", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1",
               "JAX_PLATFORMS": "cpu"}
_PLUGIN_HINT = ("pip install 'allocsim[jax-gpu]' (jax[cuda12-local] and nvidia-cuda-nvcc-cu12: "
                "the CUDA plugin compiles for a GPU without one)")


def prepare() -> None:
    """Set the environment the CUDA plugin needs without a GPU (before jax is imported)."""
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)


@dataclass(frozen=True)
class Schedule:
    """What runs, in order (see the module docstring)."""

    steps: int = 1
    eval_step: Callable[..., Any] | None = None
    eval_args: tuple[Any, ...] = ()
    eval_every: int = 0
    buckets: tuple[tuple[Any, ...], ...] = ()
    batch_argnums: tuple[int, ...] = ()

    def check(self) -> None:
        if self.steps < 1:
            raise UserInputError(f"schedule: steps must be at least 1, got {self.steps}")
        if self.eval_every < 0 or (self.eval_every and self.eval_step is None):
            raise UserInputError("schedule: eval_every needs an eval_step (and is >= 0)")


@dataclass
class CompiledStep:
    """One compiled executable: what it asks of the allocator and which arguments it takes."""

    executable: Executable
    leaves: list[Any]           # the flattened argument leaves, parameter i = leaves[i]
    memory: dict[str, int]      # memory_analysis(): argument, output, alias, temp bytes
    dump: Path | None = None


def _jax() -> Any:
    if "jax" not in sys.modules:
        prepare()
    try:
        import jax
        from jax.experimental import topologies  # noqa: F401
    except ImportError:
        raise UserInputError(f"jax is not installed: {_PLUGIN_HINT}") from None
    return jax


def _topology(jax: Any, target: TargetConfig, devices: int) -> Any:
    from jax.experimental import topologies
    try:
        return topologies.get_topology_desc(platform="cuda", target_config=target.text,
                                            topology=f"1x1x{devices}")
    except Exception as err:  # the plugin's errors are plain RuntimeErrors / XlaRuntimeErrors
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "not implemented" in text or "Unknown backend" in text or "cuda" in text.lower():
            raise UserInputError(
                f"XLA:GPU is not available ({text}): {_PLUGIN_HINT}; with no GPU, set "
                + " ".join(f"{k}={v}" for k, v in ENVIRONMENT.items())
                + " before jax is imported (allocsim.traces.record.xla_gpu.prepare())") from None
        raise UserInputError(f"{target.name}: the GPU target config does not load: {text}") \
            from None


def _spec(jax: Any, leaf: Any, devices: int, shard: str | Callable[..., Any], batch: bool) -> Any:
    from jax.sharding import PartitionSpec
    if callable(shard):
        return shard(leaf)
    shape = tuple(getattr(leaf, "shape", ()))
    if shard == "replicate" or devices == 1 or not shape:
        return PartitionSpec()
    dims = [0] if batch else sorted(range(len(shape)), key=lambda d: -shape[d])
    for d in dims:
        if shape[d] % devices == 0:
            return PartitionSpec(*[("d" if k == d else None) for k in range(len(shape))])
    return PartitionSpec()


def _abstract(jax: Any, args: Sequence[Any], mesh: Any, devices: int,
              shard: str | Callable[..., Any], batch_argnums: Sequence[int]) -> tuple[Any, ...]:
    from jax.sharding import NamedSharding

    def one(leaf: Any, batch: bool) -> Any:
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            raise UserInputError(f"an argument leaf has no shape and dtype ({type(leaf).__name__}"
                                 "): give jax.ShapeDtypeStruct or arrays")
        spec = _spec(jax, leaf, devices, shard, batch)
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))
    return tuple(jax.tree.map(lambda leaf, b=(i in batch_argnums): one(leaf, b), arg)
                 for i, arg in enumerate(args))


def compile_step(step: Callable[..., Any], args: Sequence[Any], *,
                 donate_argnums: int | Sequence[int] = (), target: str | Path = "h100-80g",
                 devices: int = 1, shard: str | Callable[..., Any] = "fsdp",
                 batch_argnums: Sequence[int] = (), keep_dump: str | Path | None = None,
                 _topo: Any = None) -> CompiledStep:
    """Compile ``step`` for ``target`` with no GPU; returns what one call asks of the
    allocator (``keep_dump``: a folder to keep XLA's dump files in)."""
    jax = _jax()
    config = target_config(target)
    if devices < 1:
        raise UserInputError(f"devices must be at least 1, got {devices}")
    if shard not in ("fsdp", "replicate") and not callable(shard):
        raise UserInputError(f"shard must be 'fsdp', 'replicate' or a function; got {shard!r}")
    from jax.experimental import topologies
    topo = _topo if _topo is not None else _topology(jax, config, devices)
    mesh = topologies.make_mesh(topo, (devices,), ("d",))
    abstract = _abstract(jax, args, mesh, devices, shard, batch_argnums)
    donate = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    with tempfile.TemporaryDirectory(prefix="allocsim-xla-") as tmp:
        folder = Path(keep_dump) if keep_dump is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            compiled = jax.jit(step, donate_argnums=donate, keep_unused=True).lower(
                *abstract).compile(compiler_options={"xla_dump_to": str(folder)})
        except UserInputError:
            raise
        except Exception as err:
            text = (str(err).strip().splitlines() or [type(err).__name__])[0]
            hint = ("; XLA:GPU needs ptxas: pip install nvidia-cuda-nvcc-cu12"
                    if "ptxas" in text else "")
            raise UserInputError(f"{getattr(step, '__name__', 'step')} does not compile for "
                                 f"{config.name}: {text[:300]}{hint}") from None
        memory = compiled.memory_analysis()
        stats = {key: int(getattr(memory, f"{key}_size_in_bytes"))
                 for key in ("argument", "output", "alias", "temp")}
        leaves = jax.tree.leaves(tuple(args))
        executable = executable_from_dump(folder, getattr(step, "__name__", "step"), "XLA",
                                          len(leaves), lambda m: m.platform == "gpu")
    return CompiledStep(executable, leaves, stats, Path(keep_dump) if keep_dump else None)


def _bind(compiled: CompiledStep, state: dict[int, list[int]], replay: RuntimeReplay,
          call: str) -> tuple[dict[int, int], list[int]]:
    """An array for each parameter: the train state's where the leaf is one of its leaves (the
    k-th use of a leaf object is its k-th array in the state), else one made for the call."""
    bound, fresh = {}, []
    used: dict[int, int] = {}
    for block, leaf in zip(compiled.executable.parameters, compiled.leaves):
        assert block.parameter is not None
        arrays = state.get(id(leaf), [])
        k = used.get(id(leaf), 0)
        used[id(leaf)] = k + 1
        if k < len(arrays):
            bound[block.parameter] = arrays[k]
            continue
        ident = replay.array(block.size, f"{call}: argument {block.parameter}: {block.label}")
        fresh.append(ident)
        bound[block.parameter] = ident
    return bound, fresh


def compile_for(step: Callable[..., Any], args: Sequence[Any], *,
                donate_argnums: int | Sequence[int] = (), target: str | Path = "h100-80g",
                schedule: Schedule | None = None, devices: int = 1,
                shard: str | Callable[..., Any] = "fsdp",
                keep_dump: str | Path | None = None,
                output: str | Path | None = None) -> Trace:
    """The trace of ``schedule`` run with ``step`` compiled for ``target`` (module docstring).
    ``output``: also save it there (``.npz``, ``.jsonl``, ...: any file every command reads);
    ``keep_dump``: keep XLA's dump of each executable in ``keep_dump/train0``, ``/eval``, ...
    (each a dump folder the commands read)."""
    plan = schedule or Schedule()
    plan.check()
    jax = _jax()
    config = target_config(target)
    topo = _topology(jax, config, devices)
    dump = Path(keep_dump) if keep_dump is not None else None

    def build(fn: Callable[..., Any], fn_args: Sequence[Any], name: str,
              batch: Sequence[int]) -> CompiledStep:
        return compile_step(fn, fn_args, donate_argnums=donate_argnums if fn is step else (),
                            target=target,
                            devices=devices, shard=shard, batch_argnums=batch,
                            keep_dump=dump / name if dump else None, _topo=topo)

    trains = [build(step, a, f"train{k}", plan.batch_argnums)
              for k, a in enumerate([tuple(args), *plan.buckets])]
    evaluate = build(plan.eval_step, plan.eval_args, "eval", ()) if plan.eval_step else None
    replay = RuntimeReplay()
    # The train state: the train step's non-batch arguments, one array per parameter, made
    # before the first call and kept (a donated one passes to the output aliasing it).
    batch_leaves = {id(leaf) for i, a in enumerate(args) if i in plan.batch_argnums
                    for leaf in jax.tree.leaves(a)}
    state: dict[int, list[int]] = {}
    for block, leaf in zip(trains[0].executable.parameters, trains[0].leaves):
        if id(leaf) not in batch_leaves:
            state.setdefault(id(leaf), []).append(replay.array(
                block.size, f"state: parameter {block.parameter}: {block.label}"
                + (" [donated]" if block.donated else "")))
    replay.tick()
    state_ids = {ident for arrays in state.values() for ident in arrays}
    held: dict[str, list[int]] = {"train": [], "eval": []}

    def run(compiled: CompiledStep, kind: str) -> None:
        for ident in held[kind]:      # the previous call's outputs, rebound by this one
            replay.release(ident)
        replay.tick()
        bound, fresh = _bind(compiled, state, replay, kind)
        made = replay.execute(compiled.executable, bound)
        outputs = set(made.values())
        held[kind] = [i for i in made.values() if i not in state_ids]
        for ident in fresh:           # the call's own arguments (its batch), freed after it
            if ident not in outputs:
                replay.release(ident)

    for k in range(plan.steps):
        run(trains[k % len(trains)], "train")
        if evaluate is not None and plan.eval_every and (k + 1) % plan.eval_every == 0:
            run(evaluate, "eval")
    replay.release_all()
    metadata = {
        "name": f"{getattr(step, '__name__', 'step')}@{config.name}", "source": "compile_for",
        "format": "xla-gpu-compile", "synthetic_times": True,
        "xla_gpu": {
            "target": config.name, "description": config.description,
            "compute_capability": config.compute_capability,
            "device_memory_size": config.device_memory_size, "devices": devices,
            "shard": shard if isinstance(shard, str) else "custom",
            "steps": plan.steps, "eval_every": plan.eval_every,
            "executables": [{"name": c.executable.name, "kind": kind, **c.memory,
                             "peak_bytes": c.executable.peak_bytes,
                             "constant_bytes_outside_allocator": c.executable.constant_bytes}
                            for c, kind in [*((t, "train") for t in trains),
                                            *(((evaluate, "eval"),) if evaluate else ())]],
            "not_modelled": "NCCL buffers and collective workspaces, cuBLAS/cuDNN workspaces, "
                            "autotuning scratch, command-buffer (CUDA graph) memory, the CUDA "
                            "context",
        },
    }
    trace = replay.trace(**metadata)
    if output is not None:
        from allocsim.traces.formats import save
        save(trace, output)
    return trace
