"""Importer for XLA dump folders (``XLA_FLAGS=--xla_dump_to=DIR``): one compiled module's
buffers as a trace.

Follows ``shared/reference/trace-formats.md`` ("JAX / XLA"); the files are read by
:mod:`allocsim.traces.formats.xla.dump_files`. ``formats.load(DIR)`` reads a folder that holds
``module_NNNN.NAME.*-buffer-assignment.txt`` / ``*-live-range.txt`` files; ``load(FILE)`` on one
of a module's four text files reads that module from the file's folder.

Two views (option ``view``; ``--xla-view`` on the command line):

- ``runtime`` (the default of every command but ``fidelity``): the module's executions as
  JAX's runtime asks its allocator — the parameters allocated as arrays before the first
  execution, then per execution the temp and each output allocation no donated parameter
  aliases (the temp freed at the end of the execution; the outputs held until the next call);
  option ``steps`` (``--steps N``) executions. Peak live is ``argument + temp + output - alias``
  of ``memory_analysis()``. The rules and their source: :mod:`allocsim.traces.formats.xla.runtime`.
- ``buffers`` (``fidelity``'s, and for the offline plan against XLA's own packing): one
  execution's logical buffers, each over its live range, as below.

How a module becomes a :class:`~allocsim.traces.model.Trace` in the ``buffers`` view:

- **Which module.** Option ``module``: ``module_0000.jit_step``, ``jit_step``, ``step`` or
  ``0000``; by default the module with the largest temp allocation (first on ties) in the
  ``buffers`` view — the ``runtime`` view of a dump of several modules needs one named
  (:class:`SeveralModules`: it replays one module's executions, and a dump has no schedule).
  An unknown or ambiguous name is one line listing the known ones. ``metadata["listing"]``
  has one line per module (argument, output and temp bytes; the one read marked ``(read)``)
  — ``allocsim info DIR`` prints them.
- **Buffers, shared bytes counted once.** Every value of the buffer assignment with a live
  range (``-live-range.txt``) lives ``[start, end]`` (positions in the instruction sequence,
  both ends inclusive). XLA puts values that share memory — an in-place update
  (``dynamic-update-slice`` over its operand), an alias, a tuple element and its producer, a
  while loop's phi values, a donated parameter and the output that reuses it — at the *same
  offset of the same allocation with overlapping or touching live ranges*; such values are one
  buffer from the first start to the last end (its size the largest of theirs). Values at the
  same bytes at disjoint times are separate buffers (XLA reused the space). As a check, the
  buffers of each allocation are never live beyond its size at once; where they would be
  (bytes shared at other offsets), every pair that overlaps in time and bytes is merged too
  (``metadata["xla"]["overlap_merges"]``).
- **Left out** (counted in ``metadata["xla"]["left_out"]``): thread-local values (scalars of
  called computations: no heap memory), values with no live range, values of another memory
  space (colour != 0, e.g. host memory) and zero-size values.
- **Time.** The schedule's position ``p`` is ``p`` µs (``metadata["time_unit"]``); a buffer is
  allocated at its start position and freed half a µs after its end position (so after the
  allocations of that position: a buffer ending where another starts overlaps it, as in XLA's
  heap simulator). ``metadata["synthetic_times"]`` is True (no wall-clock times).
- **Tags.** ``instruction: op_name`` of the buffer's first value (``op_name`` from the values
  file, JAX-level names such as ``jit(step)/transpose(jvp())/dot_general``), then
  ``(+N in place)`` when N more values share it, ``[parameter P]``, ``[output]`` or both
  (a donated parameter updated in place).
- **Roles.** Buffer ids are numbered by the kind of allocation they live in:
  ``metadata["xla"]["id_ranges"]`` maps ``argument``, ``output``, ``temp``, ``constant`` to
  ``[first id, end id)``; :func:`role_trace` selects one role's buffers (the ``temp`` ones are
  what XLA's temp allocation holds). Temporaries that XLA placed inside a parameter's or
  output's allocation (after the parameter's last use, before the output is written) count
  with that allocation, as XLA counts their bytes there.
- **XLA's own assignment, as the reference** (``metadata["xla"]``): ``temp_bytes`` (the temp
  allocations: what ``memory_analysis().temp_size_in_bytes`` reports), ``argument_bytes``,
  ``output_bytes``, ``alias_bytes`` (parameter allocations that are also outputs),
  ``constant_bytes``, ``total_bytes`` (every allocation but thread-local ones) and
  ``allocations`` (``index, size, kind, role, values, buffers`` each); ``alignment`` (64 on
  the CPU, 256 on GPUs), which a plan over the same buffers should use.

A module with a missing, cut or malformed live-range or buffer-assignment file (a half-written
dump) is a :class:`~allocsim.traces.model.TraceError` naming the file and the problem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.ascii_numbers import is_whole_number
from allocsim.traces.formats.native.common import file_metadata
from allocsim.traces.formats.registry import register_folder_format, register_format
from allocsim.traces.formats.xla.dump_buffers import (
    Buffers,
    check_same_compilation,
    module_buffers,
)
from allocsim.traces.formats.xla.dump_files import (
    Allocation,
    allocation_headers,
    parse_assignment,
    parse_live_range,
    parse_op_names,
    read_text,
    total_bytes,
)
from allocsim.traces.formats.xla.runtime import executable_of, replay_steps
from allocsim.traces.formats.xla.tpu_scratch import (
    hbm_temp_bytes,
    hbm_temp_holds_arrays,
    runtime_scratch_bytes,
)
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace, TraceError
from allocsim.traces.synth._common import MAX_EVENTS

__all__ = ["FORMAT_NAME", "OPTIONS", "ROLES", "VIEWS", "ModuleFiles", "SeveralModules",
           "detect_xla_dump", "is_dump_path", "list_modules", "read_xla_dump", "role_trace"]

FORMAT_NAME = "xla-dump"
ROLES = ("argument", "output", "temp", "constant")
STEP_NS = 1000  # one position of the instruction sequence
TIME_UNIT = ("position p of the instruction sequence is p µs; a buffer is allocated at its "
             "start position and freed 0.5 µs after its end position")
_KINDS = ("live-range", "buffer-assignment", "buffer-assignment-values", "memory-usage-report")
# The stage is ``cpu_after_optimizations`` on the CPU and ``sm_9.0a_gpu_after_optimizations``
# (the CUDA compute capability first) on XLA:GPU: the capability's dot is part of the stage.
_FILE = re.compile(r"^module_(\d+)\.(.+?)\.((?:sm_\d+\.\d+a?_)?[a-z0-9_]*after_optimizations)-"
                   r"(live-range|buffer-assignment|buffer-assignment-values|"
                   r"memory-usage-report)\.txt$", re.A)
_EXTENSIONS = tuple(f"-{kind}.txt" for kind in _KINDS)
# XLA:TPU (libtpu) appends the compiler's changelist to the module's name and writes a bare
# ``after_optimizations`` stage: ``module_0000.jit_step.cl_933746096.after_optimizations-...``.
_CHANGELIST = re.compile(r"^(.+)\.cl_(\d+)$", re.A)
_ALIGNMENT = {"cpu": 64, "gpu": 256}
VIEWS = ("runtime", "buffers")
OPTIONS = ("module", "view", "steps")
MAX_STEPS = 1_000_000
RUNTIME_TIME_UNIT = ("synthetic: the arguments at 0; each execution takes as many µs as its "
                     "schedule has positions, one µs between event groups")
_DEFAULT_ALIGNMENT = 256


@dataclass
class ModuleFiles:
    """One compiled module's dump files and the facts its allocation lines give."""

    key: str                    # "module_0000.jit_step"
    number: str                 # "0000"
    name: str                   # "jit_step" ("jit_step.cl_933746096" on XLA:TPU)
    stage: str                  # "cpu_after_optimizations"
    paths: dict[str, Path] = field(default_factory=dict)
    allocations: list[Allocation] = field(default_factory=list)
    problem: TraceError | None = None  # why the module cannot be read (a half-written dump)

    @property
    def changelist(self) -> str | None:
        """``933746096`` for XLA:TPU's name ``jit_step.cl_933746096``, else None."""
        m = _CHANGELIST.match(self.name)
        return m.group(2) if m else None

    @property
    def plain_name(self) -> str:
        """The name as the program knows it: ``jit_step``, without XLA:TPU's changelist."""
        m = _CHANGELIST.match(self.name)
        return m.group(1) if m else self.name

    @property
    def platform(self) -> str:
        """``cpu``, ``gpu`` (an ``sm_X.Y_gpu_...`` stage), ``tpu`` (a name with libtpu's
        changelist and a bare ``after_optimizations`` stage) or what the stage starts with."""
        if self.stage.startswith("sm_") or "_gpu_" in self.stage:
            return "gpu"
        if self.changelist is not None and self.stage == "after_optimizations":
            return "tpu"
        return self.stage.split("_")[0] if "_" in self.stage else "unknown"

    @property
    def compute_capability(self) -> str | None:
        """``9.0a`` for a stage ``sm_9.0a_gpu_after_optimizations``, else None."""
        m = re.match(r"sm_(\d+\.\d+a?)_", self.stage)
        return m.group(1) if m else None

    def bytes_of(self, role: str) -> int:
        return sum(a.size for a in self.allocations if a.role == role)

    def facts(self) -> dict[str, int]:
        allocs = [a for a in self.allocations if not a.thread_local]
        return {"argument_bytes": self.bytes_of("argument"),
                "output_bytes": sum(a.size for a in allocs if a.live_out),
                "alias_bytes": sum(a.size for a in allocs
                                   if a.live_out and a.parameter is not None),
                "temp_bytes": self.bytes_of("temp"),
                "constant_bytes": self.bytes_of("constant"),
                "thread_local_bytes": self.bytes_of("thread-local"),
                "total_bytes": sum(a.size for a in allocs)}


def _modules_in(folder: Path) -> dict[str, ModuleFiles]:
    found: dict[str, ModuleFiles] = {}
    try:
        entries = sorted(folder.iterdir())
    except OSError as err:
        raise TraceError(f"cannot list the folder: {err.strerror or err}",
                         source=str(folder)) from None
    for path in entries:
        m = _FILE.match(path.name)
        if m is None or not path.is_file():
            continue
        number, name, stage, kind = m.groups()
        key = f"module_{number}.{name}"
        module = found.setdefault(key, ModuleFiles(key, number, name, stage))
        if stage != module.stage and kind in module.paths:
            continue  # another stage of the same module: keep the first one
        module.paths[kind] = path
    return dict(sorted(found.items(), key=lambda kv: (int(kv[1].number), kv[0])))


def detect_xla_dump(folder: Path) -> bool:
    """True when ``folder`` holds a module's live-range or buffer-assignment file."""
    try:
        return any(_FILE.match(p.name) and p.name.endswith(("-live-range.txt",
                                                             "-buffer-assignment.txt"))
                   for p in folder.iterdir())
    except OSError:
        return False


def is_dump_path(path: str | Path) -> bool:
    """True for a dump folder or one of a module's dump files (by name)."""
    p = Path(path)
    return detect_xla_dump(p) if p.is_dir() else bool(_FILE.match(p.name))


def _check_module(module: ModuleFiles) -> None:
    """Read the allocation lines; set ``module.problem`` when the module is incomplete."""
    for kind in ("live-range", "buffer-assignment"):
        if kind not in module.paths:
            module.problem = TraceError(f"module {module.key} has no {kind} file (a "
                                        "half-written dump?)", source=str(module.paths[
                                            next(iter(module.paths))].parent))
            return
    try:
        text = read_text(module.paths["buffer-assignment"])
        module.allocations = allocation_headers(text, module.paths["buffer-assignment"])
        live = read_text(module.paths["live-range"])
        if "\n  Live ranges at " not in live:
            raise TraceError("no 'Live ranges at' section after the buffer live ranges: the "
                             "file is cut short (a half-written dump?)",
                             source=str(module.paths["live-range"]))
        _check_total(module)
    except TraceError as err:
        module.problem = err


def _check_total(module: ModuleFiles) -> None:
    """The memory-usage report (else the values file) states the sum of every allocation: a
    buffer-assignment file cut between two allocations adds up to less."""
    stated = None
    report = module.paths.get("memory-usage-report")
    if report is not None:
        totals = re.findall(r"^Total bytes: (\d+)", read_text(report), re.M)
        stated = sum(int(t) for t in totals) if totals else None
    if stated is None and "buffer-assignment-values" in module.paths:
        stated = total_bytes(read_text(module.paths["buffer-assignment-values"]))
    found = sum(a.size for a in module.allocations)
    if stated is not None and found != stated:
        raise TraceError(f"the allocations add up to {found} bytes but "
                         f"{(report or module.paths['buffer-assignment-values']).name} says "
                         f"{stated}: the file is cut short or from another compilation",
                         source=str(module.paths["buffer-assignment"]))


def list_modules(folder: Path) -> list[ModuleFiles]:
    """The modules of a dump folder, their allocation lines read (``problem`` set for the
    incomplete ones)."""
    modules = list(_modules_in(folder).values())
    for module in modules:
        _check_module(module)
    return modules


def _choose(modules: list[ModuleFiles], wanted: str | None, source: str) -> ModuleFiles:
    known = ", ".join(m.key for m in modules)
    if wanted is None:
        broken = next((m.problem for m in modules if m.problem), None)
        if broken is not None:
            hint = (f"; read another module with --module NAME (modules: {known})"
                    if len(modules) > 1 else "")
            raise TraceError(broken.problem + hint, source=broken.source)
        return max(modules, key=lambda m: (m.bytes_of("temp"), -modules.index(m)))
    text = str(wanted).strip()
    bare = text.removeprefix("module_")
    matches = [m for m in modules
               if text in (m.key, m.name, m.name.removeprefix("jit_"),
                           f"module_{m.number}.{m.plain_name}", m.plain_name,
                           m.plain_name.removeprefix("jit_"))
               or (is_whole_number(bare) and int(bare) == int(m.number))]
    if not matches:
        raise TraceError(f"no module {text!r} in the dump (modules: {known})", source=source)
    if len(matches) > 1:
        raise TraceError(f"module {text!r} is ambiguous: "
                         f"{', '.join(m.key for m in matches)}; name one of them",
                         source=source)
    if matches[0].problem:
        raise matches[0].problem
    return matches[0]


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n}B"


def _listing(modules: list[ModuleFiles], chosen: ModuleFiles | None) -> list[str]:
    lines = []
    for m in modules:
        if m.problem:
            lines.append(f"module {m.key}: incomplete ({m.problem.problem})")
            continue
        facts = m.facts()
        lines.append(f"module {m.key}: arguments {_size_text(facts['argument_bytes'])}, "
                     f"outputs {_size_text(facts['output_bytes'])}, temp "
                     f"{_size_text(facts['temp_bytes'])}"
                     + (f" ({_size_text(facts['alias_bytes'])} aliased)"
                        if facts["alias_bytes"] else "")
                     + (" (read)" if m is chosen else ""))
    return lines


def _roles(buffers: Buffers, allocs: list[Allocation], length: int) -> tuple[np.ndarray,
                                                                                list[str]]:
    """Each buffer's class (index into :data:`ROLES`) and its mark for the tag."""
    role_of = np.array([ROLES.index(a.role) if a.role in ROLES else ROLES.index("temp")
                        for a in allocs], np.int64)
    classes = role_of[buffers.alloc] if len(buffers.alloc) else np.zeros(0, np.int64)
    marks = []
    for k in range(len(buffers.alloc)):
        a = allocs[int(buffers.alloc[k])]
        parts = []
        if a.parameter is not None and buffers.start[k] == 0:
            parts.append(f"parameter {a.parameter}")
        if a.live_out and buffers.end[k] == length:
            parts.append("output")
        marks.append(f" [{', '.join(parts)}]" if parts else "")
    return classes, marks


def read_module(module: ModuleFiles, source: str, listing: list[str], *,
                view: str | None = None, steps: object = None) -> Trace:
    """The trace of one module in the view asked for (see the module docstring)."""
    chosen_view = _view_option(view, source)
    count = _steps_option(steps, source)
    if chosen_view == "buffers":
        if steps is not None:
            raise TraceError("option 'steps' applies to the runtime view only (the buffers "
                             "view is one execution's logical buffers)", source=source)
        return _buffers_trace(module, source, listing)
    return _runtime_trace(module, source, listing, count)


def _view_option(view: str | None, source: str) -> str:
    text = "runtime" if view is None else str(view).strip()
    if text not in VIEWS:
        raise TraceError(f"view {text!r} is not one of {', '.join(VIEWS)}", source=source)
    return text


def _steps_option(steps: object, source: str) -> int:
    if steps is None:
        return 1
    text = str(steps).strip()
    if not is_whole_number(text) or not 1 <= int(text) <= MAX_STEPS:
        raise TraceError(f"steps must be a whole number of executions from 1 to {MAX_STEPS:,}; "
                         f"got {text!r}", source=source)
    return int(text)


def _runtime_trace(module: ModuleFiles, source: str, listing: list[str], steps: int) -> Trace:
    """The module's executions as the runtime asks its allocator (xla/runtime.py)."""
    assign_path = module.paths["buffer-assignment"]
    assignment = parse_assignment(read_text(assign_path), assign_path)
    live = parse_live_range(read_text(module.paths["live-range"]), module.paths["live-range"])
    check_same_compilation(live, assignment, assign_path)
    executable = executable_of(module.name, assignment, live.length)
    # Held to the generators' bound before one event is made: 2,000 outputs over a million
    # steps ask for ~4e9 events, which no machine holds.
    events = 2 * (len(executable.parameters)
                  + steps * (len(executable.temps) + len(executable.outputs)))
    if events > MAX_EVENTS:
        raise TraceError(f"steps={steps:,} asks for up to {events:,} events ({module.key}: "
                         f"{len(executable.temps) + len(executable.outputs):,} allocations per "
                         f"execution); a trace holds at most {MAX_EVENTS:,} events",
                         source=source)
    tpu: dict[str, Any] = {}
    if module.platform == "tpu":
        # The TPU runtime holds the temp as scratch (bytes_reserved), not as a buffer.
        tpu = _tpu_facts(read_text(assign_path), module)
        executable = replace(executable, temps=())
    replay = replay_steps(executable, steps)
    xla: dict[str, Any] = {
        "module": module.key, "platform": module.platform, "stage": module.stage,
        "compute_capability": module.compute_capability, "sequence_length": live.length,
        "alignment": _ALIGNMENT.get(module.platform, _DEFAULT_ALIGNMENT),
        **module.facts(),
        "view": "runtime", "steps": steps,
        "runtime": {"parameters": len(executable.parameters),
                    "temp_allocations": len(executable.temps),
                    "new_outputs": len(executable.outputs),
                    "per_execution_bytes": executable.temp_bytes + executable.new_output_bytes,
                    "peak_bytes": executable.peak_bytes,
                    "constant_bytes_outside_allocator": executable.constant_bytes},
        "files": {kind: path.name for kind, path in module.paths.items()},
    }
    meta = file_metadata({}, source, module.key)
    meta.update(format=FORMAT_NAME, synthetic_times=True, time_unit=RUNTIME_TIME_UNIT,
                listing=listing, xla=xla)
    if tpu:
        meta.update(xla_tpu=tpu, sizes_on_device="tpu: XLA:TPU's buffer assignment")
    return replay.trace(**meta)


def _tpu_facts(assignment_text: str, module: ModuleFiles) -> dict[str, Any]:
    """An XLA:TPU module's scratch as the runtime reserves it, and what a dump cannot say."""
    hbm = hbm_temp_bytes(assignment_text)
    counted = hbm if hbm_temp_holds_arrays(assignment_text) else 0
    return {"scratch_bytes": runtime_scratch_bytes(hbm, counted), "hbm_temp_bytes": hbm,
            "module": module.plain_name, "changelist": module.changelist,
            "scratch_rule": "the HBM preallocated temp rounded up to 16 KiB "
                            "(runtime_scratch_bytes), none where it holds only tuples "
                            "(hbm_temp_holds_arrays: memory_analysis() then counts no temp; "
                            "12 of 12 compiled programs)",
            "not_modelled": "the executable's generated code, which the runtime holds in HBM: "
                            "a dump does not say its size (executable_size 0); compile_for "
                            "and record --framework jax --target read it from the compiled "
                            "executable"}


def _buffers_trace(module: ModuleFiles, source: str, listing: list[str]) -> Trace:
    """The module's logical buffers over their live ranges (the ``buffers`` view)."""
    live_path, assign_path = module.paths["live-range"], module.paths["buffer-assignment"]
    live = parse_live_range(read_text(live_path), live_path)
    assignment = parse_assignment(read_text(assign_path), assign_path)
    values_path = module.paths.get("buffer-assignment-values")
    op_names = parse_op_names(read_text(values_path)) if values_path else {}
    buffers, left_out = module_buffers(live, assignment, assign_path)
    classes, marks = _roles(buffers, assignment.allocations, live.length)
    order = np.lexsort((buffers.offset, buffers.alloc, buffers.start, classes))
    n = len(order)
    ids = np.empty(n, np.int64)
    ids[order] = np.arange(n)
    tags: list[str] = []
    tag_index: dict[str, int] = {}
    tag_of = np.empty(n, np.int32)
    for k in range(n):
        name = assignment.names[int(buffers.first_value[k])]
        instruction = name[:-2] if name.endswith("{}") else name
        text = instruction
        op = op_names.get(name.split("{", 1)[0])
        if op:
            text += f": {op}"
        if buffers.n_values[k] > 1:
            text += f" (+{int(buffers.n_values[k]) - 1} in place)"
        text += marks[k]
        tag_of[k] = tag_index.setdefault(text, len(tags))
        if tag_of[k] == len(tags):
            tags.append(text)
    times = np.concatenate([buffers.start * STEP_NS, buffers.end * STEP_NS + STEP_NS // 2])
    event_ids = np.concatenate([ids, ids])
    events = np.lexsort((event_ids, times))
    ops = np.concatenate([np.full(n, OP_ALLOC, np.int8), np.full(n, OP_FREE, np.int8)])
    sizes = np.concatenate([buffers.size, buffers.size])
    event_tags = np.concatenate([tag_of, tag_of])
    counts = np.bincount(classes, minlength=len(ROLES)) if n else np.zeros(len(ROLES), np.int64)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    per_alloc = np.bincount(buffers.alloc, minlength=len(assignment.allocations)) if n else \
        np.zeros(len(assignment.allocations), np.int64)
    values_per_alloc = np.bincount(assignment.allocation,
                                   minlength=len(assignment.allocations))
    xla: dict[str, Any] = {
        "module": module.key, "platform": module.platform, "stage": module.stage,
        "compute_capability": module.compute_capability, "sequence_length": live.length,
        "alignment": _ALIGNMENT.get(module.platform, _DEFAULT_ALIGNMENT),
        **module.facts(), "view": "buffers",
        "values": len(assignment.names), "buffers": n,
        "shared_values": int(buffers.n_values.sum() - n) if n else 0,
        "overlap_merges": buffers.overlap_merges, "left_out": left_out,
        "id_ranges": {role: [int(bounds[i]), int(bounds[i + 1])]
                      for i, role in enumerate(ROLES)},
        "allocations": [{"index": a.index, "size": a.size, "kind": a.kind, "role": a.role,
                         "values": int(values_per_alloc[k]), "buffers": int(per_alloc[k])}
                        for k, a in enumerate(assignment.allocations)],
        "files": {kind: path.name for kind, path in module.paths.items()},
    }
    meta = file_metadata({}, source, module.key)
    meta.update(format=FORMAT_NAME, synthetic_times=True, time_unit=TIME_UNIT,
                listing=listing, xla=xla)
    return Trace.from_columns(times[events], ops[events], event_ids[events], sizes[events],
                              tag=event_tags[events], tags=tags, **meta)


def read_xla_dump(folder: Path, source: str, name: str, *, module: str | None = None,
                  view: str | None = None, steps: object = None) -> Trace:
    """Read one module of the dump folder ``folder`` (the folder reader of the registry)."""
    modules = list_modules(folder)
    if not modules:
        raise TraceError("holds no XLA dump module files", source=source)
    chosen = _choose(modules, module, source)
    if module is None and len(modules) > 1 and _view_option(view, source) == "runtime":
        _steps_option(steps, source)  # a bad --steps is named first
        raise SeveralModules(modules, source)
    return read_module(chosen, source, _listing(modules, chosen), view=view, steps=steps)


class SeveralModules(TraceError):
    """A dump of several modules read in the runtime view with no module named: the runtime
    replays one module's executions, and a dump says nothing of their order or counts."""

    def __init__(self, modules: list[ModuleFiles], source: str) -> None:
        self.listing = _listing(modules, None)  # one line per module, as info prints them
        known = ", ".join(m.key for m in modules)
        super().__init__(f"{len(modules)} modules in the dump and no schedule of their "
                         f"executions: name the one to replay with --module NAME (modules: "
                         f"{known}); for several, compile with xla_gpu.compile_for and a "
                         "Schedule", source=source)


def detect_xla_file(path: str, head: bytes) -> bool:
    name = Path(path).name
    return bool(_FILE.match(name)) and (head.startswith((b"HloLiveRange", b"BufferAssignment"))
                                        or name.endswith(_EXTENSIONS[2:]))


def read_xla_file(data: bytes, source: str, name: str, *, module: str | None = None,
                  view: str | None = None, steps: object = None) -> Trace:
    """One of a module's files: read that module from the file's folder."""
    path = Path(source)
    m = _FILE.match(path.name)
    if m is None:
        raise TraceError("not an XLA dump file name (module_NNNN.NAME.<stage>-<kind>.txt)",
                         source=source)
    key = f"module_{m.group(1)}.{m.group(2)}"
    modules = list_modules(path.parent)
    if module is not None and _choose(modules, module, source).key != key:
        raise TraceError(f"--module {module!r} is not this file's module ({key}); give the "
                         "folder to choose another", source=source)
    chosen = next(x for x in modules if x.key == key)
    if chosen.problem:
        raise chosen.problem
    return read_module(chosen, source, _listing(modules, chosen), view=view, steps=steps)


def role_trace(trace: Trace, roles: tuple[str, ...] | list[str]) -> Trace:
    """The buffers of an imported module whose allocation has one of ``roles`` (see
    :data:`ROLES`): e.g. ``("temp",)`` is what XLA's temp allocation holds."""
    ranges = trace.metadata.get("xla", {}).get("id_ranges")
    if not isinstance(ranges, dict):
        raise TraceError("not a trace of an XLA dump module (no id ranges in its metadata)",
                         source=str(trace.metadata.get("source")))
    mask = np.zeros(len(trace), bool)
    for role in roles:
        lo, hi = ranges[role]
        mask |= (trace.id >= lo) & (trace.id < hi)
    return trace.select(mask, name=f"{trace.name}[{'+'.join(roles)}]")


register_folder_format(FORMAT_NAME, read_xla_dump, detect_xla_dump, recorded=True,
                       options=OPTIONS)
register_format(FORMAT_NAME, _EXTENSIONS, read_xla_file, detect=detect_xla_file, recorded=True,
                options=OPTIONS)
