"""The executable a deviceless compile dumped: shared by the XLA:GPU and XLA:TPU compilers'
front ends (:mod:`allocsim.traces.record.xla_gpu`, :mod:`allocsim.traces.record.xla_tpu`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from allocsim.errors import UserInputError
from allocsim.traces.formats.xla.dump import ModuleFiles, list_modules
from allocsim.traces.formats.xla.dump_files import parse_assignment, parse_live_range, read_text
from allocsim.traces.formats.xla.runtime import Executable, executable_of

__all__ = ["executable_from_dump"]


def executable_from_dump(folder: Path, step_name: str, compiler: str, leaves: int,
                         accept: Callable[[ModuleFiles], bool]) -> Executable:
    """The last module ``accept`` takes in XLA's dump ``folder``, as the runtime asks its
    allocator for it; one line (UserInputError) when there is none or when its parameters are
    not the ``leaves`` argument leaves of the step."""
    modules = [m for m in list_modules(folder) if not m.problem and accept(m)]
    if not modules:
        raise UserInputError(f"{compiler} wrote no buffer assignment for {step_name} "
                             f"(in {folder})")
    module = modules[-1]
    assign_path = module.paths["buffer-assignment"]
    live = parse_live_range(read_text(module.paths["live-range"]), module.paths["live-range"])
    executable = executable_of(module.name, parse_assignment(read_text(assign_path),
                                                             assign_path), live.length)
    if leaves != len(executable.parameters):
        raise UserInputError(f"{module.name}: {len(executable.parameters)} parameters for "
                             f"{leaves} argument leaves (tuple-shaped parameters are not read)")
    return executable
