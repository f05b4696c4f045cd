"""Sweeps: replay a grid of traces × policies × devices × capacities, in parallel, resumably.

What it is for: questions a single ``allocsim compare`` cannot answer in one go — "which
``max_split_size_mb`` is best across these 300 recorded jobs, on a 24 GiB and a 40 GiB card?"
A sweep is a TOML file naming the grid; :func:`run_sweep` expands it into *cells* (one trace,
one policy, one device, one capacity), runs them on local cores or on a Dask cluster, and
appends one JSON line per finished cell to a results file, so an interrupted sweep resumes
where it stopped and a failing cell is recorded instead of stopping the others.

The sweep file
==============

::

    name = "fragmentation"                        # optional; default: the file's stem
    output = "results/fragmentation.jsonl"        # optional; default: <stem>.jsonl beside it
    [grid]
    traces = ["traces/*.npz", "synth:transformer?steps=20&seed=[1..3]"]
    policies = ["bfc", "pytorch:max_split_size_mb=[128,256,512]", "best-fit"]   # default: the four defaults
    devices = ["a100-40g"]                        # optional; default a100-80g
    capacities = ["16GiB", "24GiB"]               # optional; each overrides the device's capacity

Relative paths (``output``, trace globs, device-profile files) are relative to the TOML file.
No other keys are accepted (a misspelt key is an error, not a silently ignored setting).

**Ranges.** Any string in ``policies``, ``devices``, ``capacities`` and any ``synth:`` entry of
``traces`` may hold ranges ``[a,b,c]``; a string expands to the cartesian product of its
ranges, leftmost range slowest (``bfc:fraction=[0.5,0.9],allow_growth=[true,false]`` gives four
specs). Inside a range, items are separated by commas and an item ``LO..HI`` (integers) stands
for every integer from LO to HI inclusive (``seed=[1..20]``); ranges do not nest. In a trace
*file* entry, ``[...]`` keeps its glob meaning (a character class), so file entries have no
ranges.

**Traces.** An entry is either a file path / glob (``*``, ``?``, ``[...]``, ``**`` recursive),
or a synthetic generator spec ``synth:KIND[?key=value&key=value...]`` (``,`` also separates
parameters; ``seed`` is a parameter like any other, default 0). A glob keeps only files with a
trace extension (``.npz``, ``.csv``, ``.csv.gz``, ``.jsonl``, ...) and must match at least one; a
plain path must exist. A trace is identified by its path as written relative to the TOML file
(or by its canonical synth spec, parameters sorted by name), so moving the sweep directory
keeps the results file valid.

**Policies** are policy specs as everywhere in allocsim (``NAME[:key=value,...]``), plus
``offline`` (the offline-plan bound, never a winner). **Devices** are profile names
(``allocsim devices``) or device-profile JSON files (a path ending in ``.json``).
**Capacities** are sizes (``"24GiB"``, ``"80GB"``, or an integer number of bytes).

Everything is validated before anything runs: an unknown policy (the error lists the known
ones), device, generator, generator parameter or size, or a glob matching no file, is one
:class:`SweepError` line naming the file and the key. A trace file that exists but is
malformed is *not* a definition error: its cells fail and record why.

Results file
============

JSON lines, one object per finished cell, appended and fsync'ed as each cell finishes::

    {"cell": "traces/a.npz | bfc | a100-40g | 17179869184", "trace": "traces/a.npz",
     "policy": "bfc", "device": "a100-40g", "capacity": 17179869184,   # null: the device's own
     "status": "ok" | "error", "error": null | "TraceError: ...",
     "result": RunResult.to_json_dict() (no timeline) | null,
     "wall_s": 0.21, "trace_loaded": true, "worker": "host:pid"}

``cell`` (``TRACE | POLICY | DEVICE | CAPACITY-BYTES-or-default``, policy in canonical form) is
what resuming matches on. ``wall_s``, ``trace_loaded`` (did this cell have to load its trace,
or did the worker already hold it) and ``worker`` are diagnostics that differ between runs;
everything else is deterministic. On start the file is read (a truncated last line — a crash
mid-write — is cut off), cells with ``status: ok`` are skipped, and errored cells are skipped
too unless ``retry_errors`` (a retried cell appends a new line; the last line of a cell wins,
an ``ok`` line over an ``error`` line). Only the coordinating process writes the file, under an
exclusive ``flock``, so two sweeps cannot interleave lines in one file.

Executors and how traces travel
===============================

- **local** (default): a :class:`~concurrent.futures.ProcessPoolExecutor` with one process per
  usable core. A cell carries only its trace's *source* (path or synth spec); each worker
  process loads (or regenerates) a trace the first time it runs one of its cells and keeps the
  last few in a per-process cache. Cells are submitted trace by trace and each worker takes
  cells in submission order, so a worker never returns to a trace it has left: each trace is
  loaded at most once per worker process, never once per cell (counted by the ``trace_loaded``
  field; ``tests/test_sweep.py`` checks it). A worker process that dies (killed for memory,
  say) fails every cell in flight on the pool, not only its own: the pool is restarted, those
  cells are retried one at a time, and a cell that kills its worker while running alone
  records the error.
- **dask://HOST:PORT** (``tcp://`` works too, or pass a ``distributed.Client``): an existing
  Dask cluster through its concurrent.futures executor. Workers need allocsim installed but
  not the trace files: the coordinator reads each file's bytes once and ``scatter``\\s them, one
  task per trace decodes them (or runs the generator, for ``synth:``) on a worker, and every
  cell of that trace takes that task's future as its argument — Dask ships the decoded trace
  to each worker that needs it once and keeps it there while cells use it; the coordinator
  drops its futures when the trace's last cell is done, so cluster memory holds only the
  traces in flight. Each trace is thus decoded once per sweep (counted per worker process by
  :func:`loads_in_this_process`; the tests check the sum). The simulator is pure Python and
  holds the GIL, so start workers with one thread each (``dask worker ADDRESS --nworkers N
  --nthreads 1``): the threads of one worker process take turns, they do not add speed.
- any other :class:`concurrent.futures.Executor` object: like local (per-process cache).

Ctrl-C: the first stops submitting, cancels cells not yet started and waits for the running
ones (their lines are written; on Dask, whose executor cannot tell running from queued, all
are cancelled at once); a second abandons them. Either way :func:`run_sweep` returns a
:class:`SweepSummary` with ``interrupted`` set whose :meth:`~SweepSummary.text` says how to
resume (run the same command again).

Python API: :func:`load_definition`, :func:`run_sweep`, :func:`load_results`,
:func:`latest_records`, :func:`best_policies` / :func:`best_policies_text` (the winner per
trace × device × capacity by the rule of :mod:`allocsim.sim.questions.compare`), and for the CLI
:func:`add_sweep_arguments` / :func:`cmd_sweep`.
"""

from __future__ import annotations

import argparse
import collections
import glob as globlib
import itertools
import json
import math
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allocsim.errors import UserInputError
from allocsim.policies import DEFAULT_POLICIES, PolicySpecError, format_size, parse_size
from allocsim.sim.kernel.device import DEFAULT_PROFILE, DeviceProfile, resolve_device
from allocsim.sim.kernel.engine import replay
from allocsim.sim.output.tables import format_table
from allocsim.sim.questions.compare import DEFAULT_MAX_SLOWDOWN, normalize_spec
from allocsim.sim.questions.offline import OFFLINE_NAME, offline_result
from allocsim.traces import formats, synth
from allocsim.traces.model import Trace, TraceError

__all__ = [
    "BestRow",
    "Cell",
    "DeviceEntry",
    "SweepDefinition",
    "SweepError",
    "SweepSummary",
    "TraceSource",
    "add_sweep_arguments",
    "best_policies",
    "best_policies_text",
    "cmd_sweep",
    "expand_ranges",
    "latest_records",
    "load_definition",
    "load_results",
    "loads_in_this_process",
    "parse_definition",
    "run_sweep",
]

SYNTH_PREFIX = "synth:"
GRID_KEYS = ("traces", "policies", "devices", "capacities")
TOP_KEYS = ("name", "output", "grid")
MAX_RANGE_ITEMS = 1_000_000      # one LO..HI range; a typo like 1..1e9 fails fast instead of hanging
TRACE_CACHE_SIZE = 2             # traces a local worker keeps (it never returns to one it left)
_RANGE = re.compile(r"\[([^\[\]]*)\]")
_INT_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")


class SweepError(UserInputError):
    """A sweep definition or results file is wrong; the message is one line naming where."""


# ---------------------------------------------------------------------------------------
# The definition
# ---------------------------------------------------------------------------------------

def expand_ranges(text: str) -> list[str]:
    """``"a=[1,2],b=[x,y]"`` -> ``["a=1,b=x", "a=1,b=y", "a=2,b=x", "a=2,b=y"]``.

    Items ``LO..HI`` expand to every integer in between (inclusive). See the module docstring.
    """
    parts = _RANGE.split(text)
    literals, groups = parts[0::2], [_range_items(g, text) for g in parts[1::2]]
    return [literals[0] + "".join(value + literal for value, literal in zip(combo, literals[1:]))
            for combo in itertools.product(*groups)]


def _range_items(group: str, text: str) -> list[str]:
    items: list[str] = []
    for raw in group.split(","):
        item = raw.strip()
        if not item:
            raise SweepError(f"empty item in range [{group}] of {text!r}")
        match = _INT_RANGE.match(item)
        if match:
            lo, hi = int(match.group(1)), int(match.group(2))
            if hi < lo or hi - lo >= MAX_RANGE_ITEMS:
                raise SweepError(f"bad range {item!r} in {text!r} (need LO <= HI, at most "
                                 f"{MAX_RANGE_ITEMS:,} values)")
            items.extend(str(v) for v in range(lo, hi + 1))
        else:
            items.append(item)
    return items


@dataclass(frozen=True)
class TraceSource:
    """Where a trace comes from: a file (``path``) or a generator (``kind`` + ``params``).

    ``key`` names it in cell keys and results; it is all a local worker needs to load it.
    """

    key: str
    path: str | None = None
    kind: str | None = None
    params: tuple[tuple[str, str], ...] = ()

    def load(self) -> Trace:
        if self.path is not None:
            return formats.load(self.path)
        assert self.kind is not None
        return synth.generate(self.kind, **dict(self.params))

    def load_from_bytes(self, data: bytes) -> Trace:
        """Decode a file's bytes shipped to a machine without the file (a Dask worker). Goes
        through a temporary file of the same name so the public loader, with its format
        detection and strict validation, is the only reader."""
        assert self.path is not None
        with tempfile.TemporaryDirectory(prefix="allocsim-sweep-") as folder:
            temp = Path(folder) / Path(self.path).name
            temp.write_bytes(data)
            try:
                trace = formats.load(temp)
            except TraceError as err:
                # Name the file the user knows, not the temporary copy.
                raise err.located(self.path) from None
        if trace.metadata.get("source") == str(temp):
            trace.metadata["source"] = self.path
        return trace


@dataclass(frozen=True)
class DeviceEntry:
    """A device of the grid: its key in results (profile name or the JSON path as written)."""

    key: str
    profile: DeviceProfile


@dataclass(frozen=True)
class Cell:
    """One unit of work: a trace through a policy on a device of some capacity."""

    trace: TraceSource
    policy: str                  # canonical spec (str(PolicySpec)) or "offline"
    device: str                  # DeviceEntry.key
    capacity: int | None         # bytes; None = the profile's own
    profile: DeviceProfile       # with the capacity applied

    @property
    def key(self) -> str:
        capacity = "default" if self.capacity is None else str(self.capacity)
        return f"{self.trace.key} | {self.policy} | {self.device} | {capacity}"


@dataclass
class SweepDefinition:
    """A parsed, validated sweep file (or one built in Python with :func:`parse_definition`)."""

    name: str
    output: Path
    traces: list[TraceSource]
    policies: list[str]
    devices: list[DeviceEntry]
    capacities: list[int | None]
    source: str = "<sweep>"

    def cells(self) -> list[Cell]:
        """Every cell, trace-major (all cells of a trace are adjacent: see "how traces travel"),
        duplicates (specs that canonicalise to the same string) dropped."""
        cells: dict[str, Cell] = {}
        for trace in self.traces:
            for device in self.devices:
                for capacity in self.capacities:
                    profile = (device.profile if capacity is None
                               else device.profile.with_capacity(capacity))
                    for policy in self.policies:
                        cell = Cell(trace, policy, device.key, capacity, profile)
                        cells.setdefault(cell.key, cell)
        return list(cells.values())


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # type: ignore[no-redef]  # the same parser, for 3.10
        except ModuleNotFoundError:
            raise SweepError(f"{path}: reading sweep files on Python < 3.11 needs the 'tomli' "
                             "package (pip install tomli)") from None
    try:
        with open(path, "rb") as stream:
            return tomllib.load(stream)
    except FileNotFoundError:
        raise SweepError(f"{path}: no such sweep file") from None
    except OSError as err:
        raise SweepError(f"{path}: cannot read: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise SweepError(f"{path}: not valid TOML: {err}") from None


def load_definition(path: str | os.PathLike[str]) -> SweepDefinition:
    """Read and validate the sweep file at ``path`` (see the module docstring)."""
    p = Path(path)
    return parse_definition(_read_toml(p), base_dir=p.parent, source=str(p), stem=p.stem)


def parse_definition(data: Mapping[str, Any], *, base_dir: str | os.PathLike[str] = ".",
                     source: str = "<sweep>", stem: str = "sweep") -> SweepDefinition:
    """Validate a sweep given as the TOML's dict; relative paths are relative to ``base_dir``.

    Raises :class:`SweepError` (one line) for anything wrong, before anything runs.
    """
    base = Path(base_dir)

    def fail(where: str, problem: str) -> SweepError:
        return SweepError(f"{source}: {where}: {problem}")

    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise fail(unknown[0], f"unknown key (known: {', '.join(TOP_KEYS)})")
    grid = data.get("grid")
    if not isinstance(grid, Mapping):
        raise fail("grid", "missing [grid] table (with traces = [...] at least)")
    unknown = sorted(set(grid) - set(GRID_KEYS))
    if unknown:
        raise fail(f"grid.{unknown[0]}", f"unknown key (known: {', '.join(GRID_KEYS)})")

    def strings(key: str, default: Sequence[Any] | None, *, allow_int: bool = False) -> list[Any]:
        value = grid.get(key, default)
        if value is None:
            raise fail(f"grid.{key}", "missing (a list of strings)")
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            value = [value]
        ok = (str, int) if allow_int else (str,)
        if (not isinstance(value, list) or not value
                or any(isinstance(v, bool) or not isinstance(v, ok) for v in value)):
            raise fail(f"grid.{key}", "expected a non-empty list of strings")
        return value

    name = data.get("name", stem)
    if not isinstance(name, str) or not name:
        raise fail("name", "expected a string")
    output_text = data.get("output", f"{stem}.jsonl")
    if not isinstance(output_text, str) or not output_text:
        raise fail("output", "expected a path")
    output = Path(os.path.expanduser(output_text))
    if not output.is_absolute():
        output = base / output

    traces: dict[str, TraceSource] = {}
    for entry in strings("traces", None):
        try:
            found = _trace_sources(entry.strip(), base)
        except (SweepError, ValueError) as err:
            raise fail("grid.traces", str(err)) from None
        for trace in found:
            traces.setdefault(trace.key, trace)

    policies: dict[str, None] = {}
    for entry in strings("policies", list(DEFAULT_POLICIES)):
        try:
            for text in expand_ranges(entry):
                # Validated here, before anything runs; PolicySpecError lists the known names.
                policies[str(normalize_spec(text))] = None
        except (SweepError, PolicySpecError, ValueError) as err:
            raise fail("grid.policies", str(err)) from None

    devices: dict[str, DeviceEntry] = {}
    for entry in strings("devices", [DEFAULT_PROFILE]):
        try:
            for text in expand_ranges(entry):
                device = _device_entry(text.strip(), base)
                devices.setdefault(device.key, device)
        except (SweepError, ValueError) as err:
            raise fail("grid.devices", str(err)) from None

    capacities: dict[int | None, None] = {}
    if "capacities" in grid:
        for entry in strings("capacities", None, allow_int=True):
            try:
                for text in (expand_ranges(entry) if isinstance(entry, str) else [entry]):
                    size = parse_size(text)
                    if size <= 0:
                        raise ValueError(f"capacity must be positive, got {text!r}")
                    capacities[size] = None
            except (SweepError, ValueError) as err:
                raise fail("grid.capacities", str(err)) from None
    else:
        capacities[None] = None

    return SweepDefinition(name=name, output=output, traces=list(traces.values()),
                           policies=list(policies), devices=list(devices.values()),
                           capacities=list(capacities), source=source)


def _trace_sources(entry: str, base: Path) -> list[TraceSource]:
    if entry.startswith(SYNTH_PREFIX):
        return [_synth_source(text) for text in expand_ranges(entry)]
    pattern = os.path.expanduser(entry)
    absolute = os.path.isabs(pattern)
    if any(ch in pattern for ch in "*?["):
        extensions = tuple(formats.supported_extensions())
        matches = sorted(
            m for m in globlib.glob(pattern, root_dir=None if absolute else base, recursive=True)
            if m.lower().endswith(extensions)
            and (Path(m) if absolute else base / m).is_file())
        if not matches:
            raise SweepError(f"{entry!r} matches no trace file (looked in {base.resolve()}; "
                             f"extensions: {', '.join(extensions)})")
    else:
        if not (Path(pattern) if absolute else base / pattern).is_file():
            raise SweepError(f"{entry!r}: no such file (looked in {base.resolve()})")
        matches = [pattern]
    sources = []
    for match in matches:
        key = Path(match).as_posix()
        path = match if absolute else str(base / match)
        sources.append(TraceSource(key=key, path=path))
    return sources


def _synth_source(text: str) -> TraceSource:
    spec = text[len(SYNTH_PREFIX):]
    kind, _, query = spec.partition("?")
    kind = kind.strip()
    items = [item.strip() for item in re.split(r"[&,]", query) if item.strip()]
    synth.parse_params(kind, items)  # unknown kind / parameter / bad value: one line, now
    params: dict[str, str] = {}
    for item in items:
        key, _, value = item.partition("=")
        params[key.strip()] = value.strip()
    ordered = tuple(sorted(params.items()))
    key = SYNTH_PREFIX + kind + ("?" + "&".join(f"{k}={v}" for k, v in ordered) if ordered else "")
    return TraceSource(key=key, kind=kind, params=ordered)


def _device_entry(text: str, base: Path) -> DeviceEntry:
    if text.lower().endswith(".json"):
        path = Path(os.path.expanduser(text))
        return DeviceEntry(key=text, profile=resolve_device(
            profile_file=path if path.is_absolute() else base / path))
    return DeviceEntry(key=text.lower(), profile=resolve_device(text))


# ---------------------------------------------------------------------------------------
# Running one cell (in a worker)
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Failed:
    """A trace that could not be loaded: the cells that need it record this message."""

    message: str


_CACHE: collections.OrderedDict[str, Trace | _Failed] = collections.OrderedDict()
_CACHE_LOCK = threading.Lock()   # a thread-pool executor shares one process's cache
_LOADS: collections.Counter[str] = collections.Counter()


def _worker_name() -> str:
    # At call time, not import time: forked pool workers inherit the parent's module globals.
    return f"{socket.gethostname()}:{os.getpid()}"


def loads_in_this_process() -> dict[str, int]:
    """How many times this process loaded (or decoded, or generated) each trace: the check that
    traces travel once (run it on Dask workers with ``client.run``)."""
    return dict(_LOADS)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".replace("\n", " ")


def _materialise(source: TraceSource, data: bytes | None = None) -> Trace | _Failed:
    """Load a trace (from its file, from shipped bytes, or by generating it); failures become
    a :class:`_Failed` so every cell of the trace records the same one-line reason."""
    _LOADS[source.key] += 1
    try:
        return source.load() if data is None else source.load_from_bytes(data)
    except Exception as err:
        return _Failed(_describe(err))


def _cached_trace(source: TraceSource) -> tuple[Trace | _Failed, bool]:
    """The trace of ``source`` from this process's cache, loading it on a miss."""
    with _CACHE_LOCK:
        trace = _CACHE.get(source.key)
        if trace is not None:
            _CACHE.move_to_end(source.key)
            return trace, False
        trace = _materialise(source)
        _CACHE[source.key] = trace
        while len(_CACHE) > TRACE_CACHE_SIZE:
            _CACHE.popitem(last=False)
        return trace, True


def _record(cell: Cell, *, result: dict[str, Any] | None = None, error: str | None = None,
            wall_s: float = 0.0, loaded: bool = False, worker: str | None = None) -> dict[str, Any]:
    return {"cell": cell.key, "trace": cell.trace.key, "policy": cell.policy,
            "device": cell.device, "capacity": cell.capacity,
            "status": "ok" if error is None else "error", "error": error, "result": result,
            "wall_s": round(wall_s, 6), "trace_loaded": loaded, "worker": worker}


def _run_cell(cell: Cell, trace: Trace | _Failed | None = None) -> dict[str, Any]:
    """Replay one cell; never raises for a problem of the cell itself (it is recorded)."""
    start = time.perf_counter()
    loaded = False
    if trace is None:
        trace, loaded = _cached_trace(cell.trace)
    if isinstance(trace, _Failed):
        return _record(cell, error=trace.message, wall_s=time.perf_counter() - start,
                       loaded=loaded, worker=_worker_name())
    try:
        if cell.policy == OFFLINE_NAME:
            result = offline_result(trace, cell.profile)
        else:
            result = replay(trace, cell.policy, cell.profile)
        data = result.to_json_dict()
    except Exception as err:
        return _record(cell, error=_describe(err), wall_s=time.perf_counter() - start,
                       loaded=loaded, worker=_worker_name())
    return _record(cell, result=data, wall_s=time.perf_counter() - start, loaded=loaded,
                   worker=_worker_name())


def _init_local_worker() -> None:
    # Ctrl-C in a terminal reaches the whole process group; the coordinator decides what
    # happens (finish running cells, then stop), so workers must not die mid-cell on it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _ping() -> str:
    return _worker_name()


# ---------------------------------------------------------------------------------------
# Executors
# ---------------------------------------------------------------------------------------

def _usable_cores() -> int:
    counter = getattr(os, "process_cpu_count", None)  # 3.13+: honours the affinity mask
    if counter is not None:
        return counter() or 1
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


class _Runner:
    """Submits cells to some executor; ``slots`` is how many to keep in flight."""

    slots: int = 1
    description: str = ""

    def submit(self, cell: Cell) -> Future:
        raise NotImplementedError

    def finished(self, cell: Cell) -> None:
        """Called once per cell that will not be submitted again."""

    def handle_broken(self, future: Future) -> None:
        """``future`` failed because a worker died (local pool only): start a fresh pool for
        the cells still to run."""

    def abort(self) -> None:
        """Abandon everything in flight, quickly."""

    def close(self) -> None:
        """Release resources after a normal finish."""


class _PoolRunner(_Runner):
    """A local process pool (owned) or a caller's Executor; traces load in the workers."""

    def __init__(self, workers: int, executor: Executor | None = None) -> None:
        self.workers = workers
        self.owned = executor is None
        self.executor = executor or self._new_pool()
        # Futures of the current pool: when a pool breaks, every future in flight on it fails;
        # only the first may replace the pool, not the later ones (the new pool is fine).
        self.current: weakref.WeakSet[Future] = weakref.WeakSet()
        # Two per worker: a worker finishing a cell finds the next one already queued.
        self.slots = max(2, 2 * workers)
        kind = "process pool" if self.owned else type(self.executor).__name__
        self.description = f"{kind}, {workers} worker{'s' if workers != 1 else ''}"

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.workers, initializer=_init_local_worker)

    def submit(self, cell: Cell) -> Future:
        try:
            future = self.executor.submit(_run_cell, cell)
        except BrokenProcessPool:
            # The pool broke before any of its futures told us; its futures in flight will
            # fail and be retried as suspects.
            if not self.owned:
                raise
            self._restart()
            future = self.executor.submit(_run_cell, cell)
        self.current.add(future)
        return future

    def handle_broken(self, future: Future) -> None:
        if self.owned and future in self.current:
            self._restart()

    def _restart(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.executor = self._new_pool()
        self.current = weakref.WeakSet()

    def abort(self) -> None:
        if isinstance(self.executor, ProcessPoolExecutor) and self.owned:
            # The documented API cannot stop a running task; terminating the workers can.
            processes = dict(getattr(self.executor, "_processes", None) or {})
            self.executor.shutdown(wait=False, cancel_futures=True)
            for process in processes.values():
                process.terminate()
        else:
            self.executor.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        if self.owned:
            self.executor.shutdown(wait=True)


class _DaskRunner(_Runner):
    """A Dask cluster: traces scattered (files) or generated (synth) once, cells take futures."""

    def __init__(self, client: Any, owned: bool, cells: Sequence[Cell]) -> None:
        self.client = client
        self.owned = owned
        self.executor = client.get_executor(pure=False)
        info = client.scheduler_info()
        workers = info.get("workers", {})
        threads = sum(w.get("nthreads", 1) for w in workers.values()) or 1
        per_trace = collections.Counter(cell.trace.key for cell in cells)
        # Enough cells in flight to keep every thread busy even though Dask runs a trace's
        # cells near the worker holding it; plus one trace's worth so the next one is loading.
        self.slots = 2 * threads + max(per_trace.values(), default=1)
        self.remaining = per_trace
        self.traces: dict[str, Any] = {}
        self.description = (f"dask {info.get('address', '')}, {len(workers)} workers, "
                            f"{threads} threads")
        self.many_threads = any(w.get("nthreads", 1) > 1 for w in workers.values())

    def check_workers(self) -> None:
        """Fail early and clearly when the workers cannot import allocsim."""
        try:
            self.client.submit(_ping, pure=False).result(timeout=60)
        except Exception as err:
            if self.owned:
                self.client.close()
            raise SweepError(f"the Dask workers cannot run allocsim tasks ({_describe(err)}); "
                             "install allocsim on every worker") from None

    def _trace_future(self, source: TraceSource) -> Any:
        future = self.traces.get(source.key)
        if future is not None:
            return future
        if source.path is None:
            # A generator spec is a few bytes: generate on a worker, not in the coordinator.
            future = self.client.submit(_materialise, source, pure=False)
        else:
            try:
                data = Path(source.path).read_bytes()
            except OSError as err:
                future = _Failed(f"TraceError: {source.path}: cannot read: {err.strerror or err}")
            else:
                # Scatter the raw bytes once (no hashing of megabytes); decoding happens in a
                # task on the worker that received them, and Dask moves the decoded trace to
                # other workers at most once each.
                shipped = self.client.scatter(data, hash=False)
                future = self.client.submit(_materialise, source, shipped, pure=False)
        self.traces[source.key] = future
        return future

    def submit(self, cell: Cell) -> Future:
        return self.executor.submit(_run_cell, cell, self._trace_future(cell.trace))

    def finished(self, cell: Cell) -> None:
        key = cell.trace.key
        self.remaining[key] -= 1
        if self.remaining[key] <= 0:
            # Dropping our reference lets Dask forget the trace once its last cell is done.
            self.traces.pop(key, None)

    def abort(self) -> None:
        self.executor.shutdown(wait=False)
        self.traces.clear()
        if self.owned:
            self.client.close()

    def close(self) -> None:
        self.traces.clear()
        if self.owned:
            self.client.close()


def _dask_client(address: str) -> Any:
    try:
        from distributed import Client
    except ModuleNotFoundError:
        raise SweepError("--executor dask://... needs Dask's distributed package, an optional "
                         "extra: pip install 'allocsim[dask]'") from None
    target = "tcp://" + address[len("dask://"):] if address.startswith("dask://") else address
    try:
        return Client(target, timeout="30s")
    except (OSError, TimeoutError) as err:
        raise SweepError(f"cannot reach the Dask scheduler at {target}: {err}") from None


def _make_runner(executor: str | Executor | Any | None, workers: int | None,
                 cells: Sequence[Cell]) -> _Runner:
    if executor is None or executor == "local":
        count = workers or _usable_cores()
        return _PoolRunner(max(1, min(count, len(cells))))
    if isinstance(executor, str):
        if executor.startswith(("dask://", "tcp://", "tls://")):
            runner = _DaskRunner(_dask_client(executor), True, cells)
            runner.check_workers()
            return runner
        raise SweepError(f"unknown executor {executor!r}: use 'local' or dask://HOST:PORT")
    if isinstance(executor, Executor):
        return _PoolRunner(workers or _usable_cores(), executor)
    distributed = sys.modules.get("distributed")  # a Client object means it is imported
    if distributed is not None and isinstance(executor, distributed.Client):
        runner = _DaskRunner(executor, False, cells)
        runner.check_workers()
        return runner
    raise SweepError(f"unknown executor {executor!r}")


# ---------------------------------------------------------------------------------------
# The results file
# ---------------------------------------------------------------------------------------

def load_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record in a results file, in file order. A last line without its newline (a crash
    mid-write) and lines that are not JSON objects are skipped. A missing file is empty."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    return _parse_lines(raw)[0]


def _parse_lines(raw: bytes) -> tuple[list[dict[str, Any]], int]:
    """(records, length of the good prefix: everything up to the last newline)."""
    end = raw.rfind(b"\n") + 1
    records = []
    for line in raw[:end].splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("cell"), str):
            records.append(record)
    return records, end


def latest_records(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """One record per cell: the last ``ok`` line, or the last line if the cell never succeeded."""
    latest: dict[str, dict[str, Any]] = {}
    for record in records:
        key = record["cell"]
        kept = latest.get(key)
        if kept is None or record.get("status") == "ok" or kept.get("status") != "ok":
            latest[key] = dict(record)
    return latest


class _ResultsFile:
    """The append-only results file, locked for the sweep's duration."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            self._lock()
            raw = self._read_all()
            records, good = _parse_lines(raw)
            if good < len(raw):
                # A crash left half a line: cut it so the next line starts on its own.
                os.ftruncate(self.fd, good)
                os.fsync(self.fd)
            self.truncated = len(raw) - good
            self.previous = latest_records(records)
        except BaseException:
            os.close(self.fd)
            raise

    def _lock(self) -> None:
        try:
            import fcntl
        except ModuleNotFoundError:  # not POSIX: no lock, one sweep per file is on the user
            return
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SweepError(f"{self.path}: another sweep is writing this results file") from None

    def _read_all(self) -> bytes:
        chunks = []
        offset = 0
        while True:
            chunk = os.pread(self.fd, 1 << 20, offset)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            offset += len(chunk)

    def append(self, record: Mapping[str, Any]) -> None:
        # One write of a whole line (O_APPEND), then fsync: a crash loses at most this line,
        # and at worst leaves half of it, which the next start cuts off.
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)  # closing releases the flock


# ---------------------------------------------------------------------------------------
# Progress and Ctrl-C
# ---------------------------------------------------------------------------------------

def _seconds(value: float) -> str:
    if not math.isfinite(value):
        return "?"
    value = int(round(value))
    return f"{value // 3600}:{value // 60 % 60:02d}:{value % 60:02d}" if value >= 3600 else \
        f"{value // 60}:{value % 60:02d}"


class _Progress:
    """Cells done/total, errors, elapsed and ETA on stderr: tqdm when installed, else one line
    redrawn in place on a terminal (a line every 10 s in a log)."""

    def __init__(self, total: int, name: str, enabled: bool) -> None:
        self.total = total
        self.name = name
        self.enabled = enabled and total > 0
        self.done = 0
        self.errors = 0
        self.start = time.monotonic()
        self.last_draw = 0.0
        self.bar: Any = None
        self.tty = sys.stderr.isatty()
        if not self.enabled:
            return
        try:
            from tqdm import tqdm
        except ModuleNotFoundError:
            self._draw(force=True)
        else:
            self.bar = tqdm(total=total, desc=name, unit="cell", file=sys.stderr,
                            dynamic_ncols=True)

    def advance(self, ok: bool) -> None:
        self.done += 1
        self.errors += not ok
        if not self.enabled:
            return
        if self.bar is not None:
            if not ok:
                self.bar.set_postfix(errors=self.errors, refresh=False)
            self.bar.update(1)
        else:
            self._draw(force=self.done == self.total)

    def note(self, text: str) -> None:
        if not self.enabled:
            print(text, file=sys.stderr)
        elif self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            sys.stderr.write(("\r\x1b[K" if self.tty else "") + text + "\n")
            self._draw(force=True)

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_draw < (0.1 if self.tty else 10.0):
            return
        self.last_draw = now
        elapsed = now - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else math.inf
        line = (f"{self.name}: {self.done:,}/{self.total:,} cells "
                f"({self.done / self.total:.0%}), {self.errors:,} error"
                f"{'s' if self.errors != 1 else ''}, {_seconds(elapsed)} elapsed, "
                f"ETA {_seconds(eta)}")
        if self.tty:
            sys.stderr.write("\r\x1b[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        elif self.tty:
            self._draw(force=True)
            sys.stderr.write("\n")
            sys.stderr.flush()


class _StopRequest:
    """The first Ctrl-C asks to stop (checked by the loop); the second raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.requested = False
        self.previous: Any = None
        self.installed = False

    def __enter__(self) -> _StopRequest:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
            self.installed = True
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: Any) -> None:
        if self.installed:
            signal.signal(signal.SIGINT, self.previous)


# ---------------------------------------------------------------------------------------
# Running a sweep
# ---------------------------------------------------------------------------------------

@dataclass
class SweepSummary:
    """What a :func:`run_sweep` call did."""

    name: str
    results_path: Path
    total: int                  # cells in the grid
    skipped: int                # already in the results file (ok, or errored without retry)
    done: int = 0               # finished ok in this run
    failed: int = 0             # recorded an error in this run
    not_run: int = 0            # left for a later run (interrupted)
    interrupted: bool = False
    elapsed_s: float = 0.0
    executor: str = ""
    truncated_bytes: int = 0    # half-written line cut from the results file at start
    failures: list[str] = field(default_factory=list)   # "cell: error" of this run's failures

    @property
    def complete(self) -> bool:
        """Every cell of the grid has a line in the results file."""
        return not self.interrupted and self.not_run == 0

    def text(self) -> str:
        """A few lines for the terminal: counts, where the results are, how to resume."""
        lines = [f"sweep {self.name}: {self.total:,} cells; {self.done:,} done, "
                 f"{self.failed:,} failed, {self.skipped:,} skipped (already in the results "
                 f"file) in {self.elapsed_s:.1f} s" + (f" on {self.executor}" if self.executor
                                                       else "")]
        lines.append(f"results: {self.results_path}")
        if self.truncated_bytes:
            lines.append(f"note: cut a half-written last line ({self.truncated_bytes} bytes) "
                         "left by an earlier crash")
        for failure in self.failures[:5]:
            lines.append(f"  failed: {failure}")
        if len(self.failures) > 5:
            lines.append(f"  ... and {len(self.failures) - 5} more (status \"error\" in the "
                         "results file)")
        if self.interrupted:
            lines.append(f"interrupted: {self.not_run:,} cells not run; run the same command "
                         "again to resume (finished cells are skipped)")
        elif self.failed:
            lines.append("errored cells are skipped on the next run; rerun them with "
                         "--retry-errors")
        return "\n".join(lines)


def run_sweep(definition: str | os.PathLike[str] | SweepDefinition, *,
              executor: str | Executor | Any | None = None, workers: int | None = None,
              progress: bool = True, retry_errors: bool = False,
              output: str | os.PathLike[str] | None = None) -> SweepSummary:
    """Run every cell of the sweep not already in its results file; see the module docstring.

    ``executor``: None / ``"local"`` (a process pool of ``workers`` processes, default one per
    usable core), ``"dask://HOST:PORT"``, a ``distributed.Client`` or any
    ``concurrent.futures.Executor``. ``output`` overrides the definition's results file.
    Definition errors raise :class:`SweepError` before anything runs; failing cells do not
    raise (they are recorded). Ctrl-C returns a summary with ``interrupted`` set.
    """
    sweep = definition if isinstance(definition, SweepDefinition) else load_definition(definition)
    cells = sweep.cells()
    path = Path(output) if output is not None else sweep.output
    started = time.monotonic()
    results = _ResultsFile(path)
    try:
        previous = results.previous
        todo = [cell for cell in cells
                if not _finished(previous.get(cell.key), retry_errors)]
        summary = SweepSummary(name=sweep.name, results_path=path, total=len(cells),
                               skipped=len(cells) - len(todo),
                               truncated_bytes=results.truncated)
        if todo:
            _run_cells(todo, results, summary, executor, workers, progress, sweep.name)
    finally:
        results.close()
    summary.elapsed_s = time.monotonic() - started
    return summary


def _finished(record: Mapping[str, Any] | None, retry_errors: bool) -> bool:
    if record is None:
        return False
    return record.get("status") == "ok" or not retry_errors


def _run_cells(todo: list[Cell], results: _ResultsFile, summary: SweepSummary,
               executor: Any, workers: int | None, progress: bool, name: str) -> None:
    runner = _make_runner(executor, workers, todo)
    summary.executor = runner.description
    bar = _Progress(len(todo), name, progress)
    if isinstance(runner, _DaskRunner) and runner.many_threads:
        bar.note("note: some Dask workers have several threads; the simulator holds the GIL, "
                 "so start workers with --nthreads 1 --nworkers <cores> for full speed")
    queue = collections.deque(todo)
    inflight: dict[Future, Cell] = {}
    suspects: collections.deque[Cell] = collections.deque()   # in flight when a worker died
    alone: Future | None = None                                 # a suspect running by itself
    stopping = False
    aborted = False
    try:
        with _StopRequest() as stop:
            while queue or inflight or (suspects and not stopping):
                if stop.requested and not stopping:
                    stopping = True
                    summary.not_run += len(queue) + len(suspects)
                    queue.clear()
                    suspects.clear()
                    for future in inflight:
                        future.cancel()   # only cells not yet started can be cancelled
                    running = sum(not f.cancelled() for f in inflight)
                    bar.note(f"stopping: waiting for {running} cell"
                             f"{'s' if running != 1 else ''} already handed to workers "
                             "(Ctrl-C again to abandon them)")
                if suspects and not stopping:
                    # After a worker died, the cells that were in flight run one at a time:
                    # a cell that kills its worker while alone is the culprit.
                    if not inflight:
                        cell = suspects.popleft()
                        alone = runner.submit(cell)
                        inflight[alone] = cell
                else:
                    while queue and len(inflight) < runner.slots:
                        cell = queue.popleft()
                        inflight[runner.submit(cell)] = cell
                # A timeout so a Ctrl-C (which only sets a flag) is acted on promptly.
                done, _ = wait(list(inflight), timeout=0.25, return_when=FIRST_COMPLETED)
                for future in done:
                    cell = inflight.pop(future)
                    if future.cancelled():
                        summary.not_run += 1
                        continue
                    record = _outcome(future, cell, runner)
                    if record is None:
                        # A worker died: every cell in flight on that pool fails, not only the
                        # culprit, so they are retried one at a time.
                        if stopping:
                            summary.not_run += 1
                            continue
                        if future is not alone:
                            suspects.append(cell)
                            continue
                        record = _record(cell, error=BROKEN_POOL_ERROR)
                    results.append(record)
                    runner.finished(cell)
                    if record["status"] == "ok":
                        summary.done += 1
                    else:
                        summary.failed += 1
                        summary.failures.append(f"{record['cell']}: {record['error']}")
                    bar.advance(record["status"] == "ok")
            summary.interrupted = stopping
    except KeyboardInterrupt:
        # The second Ctrl-C (or the first, outside the main thread): abandon what is running.
        aborted = True
        summary.interrupted = True
        summary.not_run += len(queue) + len(inflight) + len(suspects)
        runner.abort()
    finally:
        bar.close()
        if not aborted:
            runner.close()


BROKEN_POOL_ERROR = ("BrokenProcessPool: the worker process running this cell (alone) died: "
                     "killed for memory? a crash?")


def _outcome(future: Future, cell: Cell, runner: _Runner) -> dict[str, Any] | None:
    """The cell's record, an error record when the executor failed it, or None when a local
    worker process died (which fails every cell in flight, not only the culprit)."""
    try:
        return future.result()
    except BrokenProcessPool:
        runner.handle_broken(future)
        return None
    except Exception as err:
        return _record(cell, error=_describe(err))


# ---------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------

@dataclass
class BestRow:
    """The winner of one (trace, device, capacity) group of a sweep."""

    trace: str
    device: str
    capacity: int | None
    winner: str | None
    peak_reserved: int | None
    alloc_time_s: float | None
    slowdown: float | None
    runner_up: str | None
    policies: int           # policies with a result in the group
    errors: int             # cells of the group that failed
    reason: str = ""


def _rank(result: Mapping[str, Any], policy: str) -> tuple:
    # allocsim.sim.questions.compare.rank_key on a result dict: completed first, then the lowest peak reserved,
    # then the lowest modelled allocator time, then the spec's name.
    return (not result["completed"], result["peak_reserved"], result["alloc_time_s"], policy)


def best_policies(records: Iterable[Mapping[str, Any]], *,
                  max_slowdown: float | None = DEFAULT_MAX_SLOWDOWN) -> list[BestRow]:
    """The best policy per trace × device × capacity, by the winner rule of :mod:`allocsim.sim.questions.compare`:
    among results that complete without OOM and stay within the slowdown budget (None: no
    budget), the lowest peak reserved, then the lowest allocator time; ``offline`` is a bound,
    never the winner. Takes raw records (duplicates resolved by :func:`latest_records`)."""
    budget = math.inf if max_slowdown is None else max_slowdown
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for record in latest_records(records).values():
        group = (record["trace"], record["device"], record.get("capacity"))
        groups.setdefault(group, []).append(record)
    rows = []
    for (trace, device, capacity), members in groups.items():
        ok = [r for r in members if r.get("status") == "ok" and r.get("result")]
        errors = len(members) - len(ok)
        candidates = sorted(((r["result"], r["policy"]) for r in ok
                             if r["policy"] != OFFLINE_NAME
                             and r["result"]["completed"] and r["result"]["slowdown"] <= budget),
                            key=lambda pair: _rank(*pair))
        if candidates:
            best, policy = candidates[0]
            reason = "lowest peak reserved among policies completing within the budget"
            rows.append(BestRow(trace, device, capacity, policy, best["peak_reserved"],
                                best["alloc_time_s"], best["slowdown"],
                                candidates[1][1] if len(candidates) > 1 else None,
                                len(ok), errors, reason))
        else:
            completed = [r for r in ok if r["result"]["completed"]]
            reason = ("no policy completes within the slowdown budget" if completed else
                      "no policy completes without running out of memory" if ok else
                      "every cell failed")
            rows.append(BestRow(trace, device, capacity, None, None, None, None, None,
                                len(ok), errors, reason))
    rows.sort(key=lambda r: (r.trace, r.device, -1 if r.capacity is None else r.capacity))
    return rows


def best_policies_text(rows: Sequence[BestRow]) -> str:
    """A plain table of :func:`best_policies` rows."""
    table = []
    for row in rows:
        table.append([
            row.trace, row.device, "default" if row.capacity is None else format_size(row.capacity),
            row.winner or f"none ({row.reason})",
            "-" if row.peak_reserved is None else format_size(row.peak_reserved),
            "-" if row.alloc_time_s is None else f"{row.alloc_time_s * 1e3:.3g} ms",
            "-" if row.slowdown is None else f"{row.slowdown:.3f}x",
            row.runner_up or "-", str(row.policies), str(row.errors)])
    return format_table(table, ["trace", "device", "capacity", "best policy", "peak reserved",
                                "alloc time", "slowdown", "runner-up", "policies", "errors"],
                        left=(0, 1, 3, 7))


# ---------------------------------------------------------------------------------------
# CLI hooks (sim/cli.py registers the subcommand with these)
# ---------------------------------------------------------------------------------------

def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``allocsim sweep`` arguments."""
    parser.add_argument("definition", metavar="FILE.toml", help="the sweep file")
    parser.add_argument("--executor", default="local", metavar="local|dask://HOST:PORT",
                        help="where cells run: local processes (default) or an existing Dask "
                             "cluster (needs the dask extra)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="local worker processes (default: one per core)")
    parser.add_argument("--retry-errors", action="store_true",
                        help="rerun cells that recorded an error (default: skip them)")
    parser.add_argument("--output", metavar="FILE.jsonl",
                        help="results file (default: the sweep file's `output`)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--report", action="store_true",
                        help="run nothing; print the best policy per trace from the results file")
    parser.add_argument("--max-slowdown", type=float, default=DEFAULT_MAX_SLOWDOWN, metavar="X",
                        help="slowdown budget of the best-policy table (default "
                             f"{DEFAULT_MAX_SLOWDOWN}; inf = none)")


def cmd_sweep(args: argparse.Namespace) -> int:
    """``allocsim sweep``: 0 when every cell ran ok, 1 when some failed, 130 when interrupted."""
    budget = None if args.max_slowdown == float("inf") else args.max_slowdown
    sweep = load_definition(args.definition)
    path = Path(args.output) if args.output else sweep.output
    if args.report:
        keys = {cell.key for cell in sweep.cells()}
        records = [r for r in load_results(path) if r["cell"] in keys]
        print(f"{path}: {len(latest_records(records)):,} of {len(keys):,} cells recorded")
        print(best_policies_text(best_policies(records, max_slowdown=budget)))
        return 0
    summary = run_sweep(sweep, executor=args.executor, workers=args.workers,
                        progress=not args.no_progress, retry_errors=args.retry_errors,
                        output=path)
    print(summary.text())
    if summary.interrupted:
        return 130
    keys = {cell.key for cell in sweep.cells()}
    records = [r for r in load_results(path) if r["cell"] in keys]
    print()
    print(best_policies_text(best_policies(records, max_slowdown=budget)))
    return 1 if summary.failed else 0
