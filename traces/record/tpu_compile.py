"""Compile a JAX function for a TPU with libtpu, on a machine without one: the executable, its
memory analysis, scratch and code, and each output leaf as the runtime hands it out.

The layer under :class:`~allocsim.traces.record.tpu_program.Program` and
:func:`~allocsim.traces.record.xla_tpu.compile_for` (traces/record/xla_tpu.py says how the
TPU runtime holds a step).
"""

from __future__ import annotations

import importlib.metadata
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from allocsim.errors import UserInputError
from allocsim.traces.formats.xla.dump_files import parse_assignment
from allocsim.traces.formats.xla.entry_outputs import entry_outputs
from allocsim.traces.formats.xla.runtime import Executable
from allocsim.traces.formats.xla.tpu_scratch import hbm_temp_bytes, runtime_scratch_bytes
from allocsim.traces.record.compiled_dump import executable_from_dump

__all__ = ["NO_TPU_ENVIRONMENT", "TOPOLOGIES", "OutputLeaf", "TpuStep", "compile_step",
           "libtpu_environment", "libtpu_version"]

# A device profile's chip and its one-chip topology name in libtpu's notation.
TOPOLOGIES = {"tpu-v5e": "v5e:1x1", "tpu-v4": "v4:1x1x1", "tpu-v5p": "v5p:1x1x1",
              "tpu-v6e": "v6e:1x1"}
_HINT = ('pip install "jax[tpu]==0.10.2" (libtpu 0.0.42.1, the build the TPU rules were read '
         'from; it compiles for a TPU without one)')


@dataclass(frozen=True)
class OutputLeaf:
    """One output array of a compiled step, in the order of JAX's flattened outputs: its
    bytes on the device and, when a donated parameter's buffer becomes it, that parameter."""

    size: int
    label: str
    donated_parameter: int | None = None


class TpuStep:
    """One step compiled for a TPU: its executable, argument leaves and memory analysis, and
    each output leaf as the runtime hands it to the program (``outputs``; ``tuple_bytes``: the
    output tuple's address table, allocated for the call and let go when it returns)."""

    def __init__(self, executable: Executable, leaves: list[Any], memory: dict[str, int],
                 code_bytes: int, hbm_temp: int = 0, outputs: tuple[OutputLeaf, ...] = (),
                 tuple_bytes: int = 0, out_info: Any = None) -> None:
        self.executable = executable
        self.leaves = leaves
        self.memory = memory
        self.code_bytes = code_bytes
        self.hbm_temp = hbm_temp
        self.outputs = outputs
        self.tuple_bytes = tuple_bytes
        self.out_info = out_info

    @property
    def name(self) -> str:
        return self.executable.name

    @property
    def scratch_bytes(self) -> int:
        return runtime_scratch_bytes(self.hbm_temp, self.memory["temp"])


# libtpu's environment for a compile on a machine without a TPU: without the first two it
# asks a TPU VM's metadata server for the slice's shape and waits about three minutes,
# printing warnings, before it compiles (read here, libtpu 0.0.42.1; ../shared/reference/
# tpu.md). The accelerator type only silences "could not determine TPU accelerator type":
# a compile for v6e:1x1 gave the same memory analysis with and without it. Set only where no
# TPU's device files exist, so a real TPU VM keeps its own.
NO_TPU_ENVIRONMENT = {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_HOSTNAMES": "localhost",
                      "TPU_ACCELERATOR_TYPE": "v5litepod-1"}
_TPU_DEVICE_FILES = ("/dev/accel0", "/dev/vfio/0")


def libtpu_environment() -> dict[str, str]:
    """The variables :func:`_jax` sets (where the process has not set them itself)."""
    if any(os.path.exists(path) for path in _TPU_DEVICE_FILES):
        return {}
    return dict(NO_TPU_ENVIRONMENT)


def _jax() -> Any:
    # A compile needs no chip: libtpu's lock (/tmp/libtpu_lockfile) is for processes that own
    # one, and a second compiling process, or a lock left by a killed one, must not stop it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    for key, value in libtpu_environment().items():
        os.environ.setdefault(key, value)
    try:
        import jax
        from jax.experimental import topologies  # noqa: F401
    except ImportError:
        raise UserInputError(f"jax is not installed: {_HINT}") from None
    return jax


def libtpu_version() -> str | None:
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None


def _topology(target: str, topology: str | None) -> Any:
    from jax.experimental import topologies
    if target not in TOPOLOGIES:
        raise UserInputError(f"target {target!r} is not a TPU (TPUs: {', '.join(TOPOLOGIES)})")
    name = topology or TOPOLOGIES[target]
    if libtpu_version() is None:
        raise UserInputError(f"libtpu is not installed: {_HINT}")
    try:
        # One chip is a host of one; a slice takes libtpu's own host bounds for its name.
        bounds = {"chips_per_host_bounds": (1, 1, 1)} if topology is None else {}
        return topologies.get_topology_desc(topology_name=name, platform="tpu", **bounds)
    except Exception as err:   # libtpu's errors are XlaRuntimeErrors with long texts
        text = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserInputError(f"topology {name!r}: libtpu {libtpu_version()} does not know it "
                             f"({text[:200]})") from None


def compile_step(step: Callable[..., Any], args: Sequence[Any], *,
                 donate_argnums: int | Sequence[int] = (), target: str = "tpu-v5e",
                 topology: str | None = None, keep_dump: str | Path | None = None,
                 _topo: Any = None) -> TpuStep:
    """Compile ``step`` for ``target`` with no TPU (module docstring)."""
    jax = _jax()
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec
    topo = _topo if _topo is not None else _topology(target, topology)
    devices = list(topo.devices)
    mesh = topologies.make_mesh(topo, (len(devices),), ("d",))
    sharding = NamedSharding(mesh, PartitionSpec())

    def abstract(leaf: Any) -> Any:
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            raise UserInputError(f"an argument leaf has no shape and dtype ({type(leaf).__name__}"
                                 "): give jax.ShapeDtypeStruct or arrays")
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    abstract_args = tuple(jax.tree.map(abstract, a) for a in args)
    donate = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    name = getattr(step, "__name__", "step")
    with tempfile.TemporaryDirectory(prefix="allocsim-xla-tpu-") as tmp:
        folder = Path(keep_dump) if keep_dump is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            compiled = jax.jit(step, donate_argnums=donate, keep_unused=True).lower(
                *abstract_args).compile(compiler_options={"xla_dump_to": str(folder)})
        except Exception as err:
            text = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UserInputError(f"{name} does not compile for {target}: {text[:300]}") \
                from None
        memory = compiled.memory_analysis()
        stats = {key: int(getattr(memory, f"{key}_size_in_bytes"))
                 for key in ("argument", "output", "alias", "temp", "generated_code")}
        leaves = jax.tree.leaves(tuple(args))
        executable = executable_from_dump(
            folder, name, "XLA:TPU", len(leaves),
            lambda m: "buffer-assignment" in m.paths and "live-range" in m.paths)
        assignments = sorted(folder.glob("*after_optimizations-buffer-assignment.txt"))
        assignments = [a for a in assignments if f".jit_{name}." in a.name] or assignments
        text = assignments[-1].read_text() if assignments else ""
        hbm_temp = hbm_temp_bytes(text)
        outputs, tuple_bytes = _output_leaves(executable, assignments[-1] if assignments
                                              else None, text)
    # On a TPU the temp is scratch held as bytes_reserved, not an allocation.
    return TpuStep(replace(executable, temps=()), leaves, stats, stats["generated_code"],
                   hbm_temp, outputs, tuple_bytes, compiled.out_info)


def _output_leaves(executable: Executable, assignment_path: Path | None,
                   text: str) -> tuple[tuple[OutputLeaf, ...], int]:
    """Each output leaf's bytes and aliasing (the optimized HLO's root, beside the assignment:
    :mod:`allocsim.traces.formats.xla.entry_outputs`), and the output tuple's table."""
    if assignment_path is None:
        return (), 0
    hlo_path = assignment_path.with_name(
        assignment_path.name.removesuffix("-buffer-assignment.txt") + ".txt")
    if not hlo_path.exists():
        raise UserInputError(f"{executable.name}: XLA wrote no optimized HLO beside its buffer "
                             f"assignment ({hlo_path.name})")
    found = entry_outputs(hlo_path.read_text(), parse_assignment(text, assignment_path))
    blocks = {b.allocation: b for b in (*executable.parameters, *executable.outputs)}
    leaves = []
    for position, allocation in enumerate(found.allocations):
        block = blocks.get(allocation) if allocation is not None else None
        if block is None:
            raise UserInputError(f"{executable.name}: output {position} is in no allocation "
                                 "the runtime hands out (an output XLA did not place)")
        donated = block.parameter if block.parameter is not None and block.donated else None
        if block.parameter is not None and donated is None:
            raise UserInputError(f"{executable.name}: output {position} is parameter "
                                 f"{block.parameter}, which is not donated")
        leaves.append(OutputLeaf(block.size, block.label, donated))
    table = blocks.get(found.tuple_allocation) if found.tuple_allocation is not None else None
    return tuple(leaves), table.size if table is not None else 0


