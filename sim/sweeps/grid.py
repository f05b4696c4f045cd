"""The grid grammar: a sweep's TOML file, its ranges, and the cells it expands to.

A sweep is a TOML file naming a grid of traces × policies × devices × capacities;
:func:`load_definition` reads and validates it into a :class:`SweepDefinition`, whose
:meth:`~SweepDefinition.cells` are the units of work (one trace, one policy, one device, one
capacity) that :func:`allocsim.sim.sweeps.run.run_sweep` runs.

The sweep file
==============

::

    name = "fragmentation"                        # optional; default: the file's stem
    output = "results/fragmentation.jsonl"        # optional; default: <stem>.jsonl beside it
    [grid]
    traces = ["traces/*.npz", "synth:transformer?steps=20&seed=[1..3]"]
    policies = ["bfc", "pytorch:max_split_size_mb=[128,256,512]", "best-fit"]
    devices = ["a100-40g"]                        # optional; default a100-80g
    capacities = ["16GiB", "24GiB"]               # optional; each as --capacity (no context)

``policies`` is optional; its default is every policy of
:data:`allocsim.policies.DEFAULT_POLICIES` (the set ``allocsim compare`` runs by default).
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
trace extension (``.npz``, ``.csv``, ``.csv.gz``, ``.jsonl``, ...) and must match at least one;
it lists a file once however many names reach it, and ``**`` enters a folder once however
many links lead there (:mod:`~allocsim.sim.sweeps.trace_glob`); a
plain path must exist. A trace is identified by its path as written relative to the TOML file
(or by its canonical synth spec, parameters sorted by name), so moving the sweep directory
keeps the results file valid.

**Policies** are policy specs as everywhere in allocsim (``NAME[:key=value,...]``), plus
``offline`` (the offline plan, shown beside the policies, never a winner). **Devices** are
profile names (``allocsim devices``) or device-profile JSON files (a path ending in ``.json``).
**Capacities** are sizes (``"24GiB"``, ``"80GB"``, or an integer number of bytes), each what
``--capacity`` is: the allocators' memory, with no context (``DeviceProfile.device_with``).

Everything is validated before anything runs: an unknown policy (the error lists the known
ones), device, generator, generator parameter or size, or a glob matching no file, is one
:class:`SweepError` line naming the file and the key. A trace file that exists but is
malformed is *not* a definition error: its cells fail and record why.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocsim.errors import UserInputError
from allocsim.policies import (
    DEFAULT_POLICIES,
    PolicySpecError,
    format_size,
    parse_policy,
    parse_size,
)
from allocsim.sim.kernel.device import (
    DEFAULT_PROFILE,
    DeviceProfile,
    SimulatedDevice,
    resolve_device,
)
from allocsim.sim.kernel.device_profile import check_capacity
from allocsim.sim.questions.compare import OFFLINE_NAME, normalize_spec
from allocsim.sim.sweeps.trace_glob import expand_trace_glob
from allocsim.traces import formats, synth
from allocsim.traces.formats.limits import read_input_text, regular_file_problem
from allocsim.traces.model import Trace, TraceError

__all__ = [
    "Cell",
    "DeviceEntry",
    "SweepDefinition",
    "SweepError",
    "TraceSource",
    "expand_ranges",
    "load_definition",
    "parse_definition",
]

SYNTH_PREFIX = "synth:"
GRID_KEYS = ("traces", "policies", "devices", "capacities")
TOP_KEYS = ("name", "output", "grid")
MAX_RANGE_ITEMS = 1_000_000      # one LO..HI range; a typo like 1..1e9 fails fast, not hangs
# The most cells a sweep may hold: traces x policies x devices x capacities, counted from the
# ranges before any is expanded (a 1e9-cell grid is refused at once, not after filling memory).
MAX_GRID_CELLS = 1_000_000
_RANGE = re.compile(r"\[([^\[\]]*)\]")
_INT_RANGE = re.compile(r"^\s*(-?[0-9]{1,18})\s*\.\.\s*(-?[0-9]{1,18})\s*$")  # ASCII digits


class SweepError(UserInputError):
    """A sweep definition or results file is wrong; the message is one line naming where."""


def expand_ranges(text: str) -> list[str]:
    """``"a=[1,2],b=[x,y]"`` -> ``["a=1,b=x", "a=1,b=y", "a=2,b=x", "a=2,b=y"]``.

    Items ``LO..HI`` expand to every integer in between (inclusive). See the module docstring.
    """
    parts = _RANGE.split(text)
    literals, groups = parts[0::2], [_range_items(g, text) for g in parts[1::2]]
    return [literals[0] + "".join(value + literal for value, literal in zip(combo, literals[1:]))
            for combo in itertools.product(*groups)]


def count_ranges(text: str) -> int:
    """How many strings :func:`expand_ranges` makes of ``text``, without making them."""
    count = 1
    for group in _RANGE.split(text)[1::2]:
        count *= sum(_item_count(item.strip(), group, text) for item in group.split(","))
    return count


def _item_count(item: str, group: str, text: str) -> int:
    if not item:
        raise SweepError(f"empty item in range [{group}] of {text!r}")
    match = _INT_RANGE.match(item)
    if not match:
        return 1
    lo, hi = int(match.group(1)), int(match.group(2))
    if hi < lo or hi - lo >= MAX_RANGE_ITEMS:
        raise SweepError(f"bad range {item!r} in {text!r} (need LO <= HI, at most "
                         f"{MAX_RANGE_ITEMS:,} values)")
    return hi - lo + 1


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
        assert self.kind is not None, "a TraceSource has a path or a generator kind"
        params: dict[str, Any] = dict(self.params)
        return synth.generate(self.kind, **params)

    def load_from_bytes(self, data: bytes) -> Trace:
        """Decode a file's bytes shipped to a machine without the file (a Dask worker). Goes
        through a temporary file of the same name so the public loader, with its format
        detection and strict validation, is the only reader."""
        assert self.path is not None, "only a file's trace travels as bytes"
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
        """Every cell, trace-major (all cells of a trace are adjacent: see "how traces travel"
        in :mod:`allocsim.sim.sweeps.executors`), duplicates (specs that canonicalise to the
        same string) dropped."""
        cells: dict[str, Cell] = {}
        for trace in self.traces:
            for device in self.devices:
                for capacity in self.capacities:
                    profile = device.profile.device_with(capacity)
                    for policy in self.policies:
                        cell = Cell(trace, policy, device.key, capacity, profile)
                        cells.setdefault(cell.key, cell)
        return list(cells.values())


def _toml_parser() -> Any:
    """The standard library's TOML reader (3.11+), or the same parser as ``tomli`` on 3.10."""
    if sys.version_info >= (3, 11):
        import tomllib
        return tomllib
    try:
        import tomli
    except ModuleNotFoundError:
        raise SweepError("reading sweep files on Python < 3.11 needs the 'tomli' package "
                         "(pip install tomli)") from None
    return tomli


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        parser = _toml_parser()
    except SweepError as err:
        raise SweepError(f"{path}: {err}") from None
    try:
        text = read_input_text(path, what="a sweep file")
    except TraceError as err:
        problem = "no such sweep file" if err.problem == "no such file" else err.problem
        raise SweepError(f"{path}: {problem}") from None
    try:
        data: dict[str, Any] = parser.loads(text)
    except parser.TOMLDecodeError as err:
        raise SweepError(f"{path}: not valid TOML: {err}") from None
    except RecursionError:
        raise SweepError(f"{path}: not valid TOML: nested too deeply") from None
    return data


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

    # The grid's size from its ranges, before any is expanded (a file glob counts as one here;
    # the exact count is checked again below).
    sizes: dict[str, int] = {}
    for key, default in (("traces", None), ("policies", list(DEFAULT_POLICIES)),
                         ("devices", [DEFAULT_PROFILE]), ("capacities", [None])):
        entries = strings(key, default, allow_int=key == "capacities") if (
            key in grid or default is None) else default
        try:
            sizes[key] = sum(count_ranges(e) if isinstance(e, str) and (
                key != "traces" or e.strip().startswith(SYNTH_PREFIX)) else 1 for e in entries)
        except SweepError as err:
            raise fail(f"grid.{key}", str(err)) from None
    _check_grid_size(sizes, fail)

    traces: dict[str, TraceSource] = {}
    files: set[str] = set()     # resolved: a file under two names (a link, two entries) once
    for entry in strings("traces", None):
        try:
            found = _trace_sources(entry.strip(), base)
        except (SweepError, ValueError) as err:
            raise fail("grid.traces", str(err)) from None
        for trace in found:
            if trace.path is not None:
                real = os.path.realpath(trace.path)
                if real in files:
                    continue
                files.add(real)
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
                        raise SweepError(f"capacity must be positive, got {text!r}")
                    capacities[check_capacity(size, f"capacity {text!r}")] = None
            except (SweepError, ValueError) as err:
                raise fail("grid.capacities", str(err)) from None
    else:
        capacities[None] = None
    _check_grid_size({"traces": len(traces), "policies": len(policies),
                      "devices": len(devices), "capacities": len(capacities)}, fail)
    _check_policies_build(list(policies), list(devices.values()), list(capacities), fail)

    return SweepDefinition(name=name, output=output, traces=list(traces.values()),
                           policies=list(policies), devices=list(devices.values()),
                           capacities=list(capacities), source=source)


def _check_grid_size(sizes: Mapping[str, int], fail: Any) -> None:
    cells = math.prod(sizes.values())
    if cells > MAX_GRID_CELLS:
        raise fail("grid", f"{cells:,} cells (" + " x ".join(
            f"{count:,} {key}" for key, count in sizes.items()) + f"), more than the "
            f"{MAX_GRID_CELLS:,} a sweep may hold")


def _check_policies_build(policies: Sequence[str], devices: Sequence[DeviceEntry],
                          capacities: Sequence[int | None], fail: Any) -> None:
    """Build every policy of the grid on every device and capacity of it, as its cells will:
    a value a policy's constructor refuses (``bfc:fraction=2``) is one line now, before any
    cell runs, not a column of failed cells."""
    for device in devices:
        for capacity in capacities:
            profile = device.profile.device_with(capacity)
            for policy in policies:
                if policy == OFFLINE_NAME:
                    continue
                try:
                    parse_policy(policy).build(SimulatedDevice(profile).view(0))
                except UserInputError as err:
                    where = f"{device.key}" + ("" if capacity is None
                                               else f" at {format_size(capacity)}")
                    raise fail("grid.policies", f"{err} (on {where})") from None


def _trace_sources(entry: str, base: Path) -> list[TraceSource]:
    if entry.startswith(SYNTH_PREFIX):
        return [_synth_source(text) for text in expand_ranges(entry)]
    pattern = os.path.expanduser(entry)
    absolute = os.path.isabs(pattern)
    if any(ch in pattern for ch in "*?["):
        extensions = tuple(formats.supported_extensions())
        matches = sorted(
            m for m in expand_trace_glob(pattern, None if absolute else str(base))
            if m.lower().endswith(extensions)
            and (Path(m) if absolute else base / m).is_file())
        if not matches:
            raise SweepError(f"{entry!r} matches no trace file (looked in {base.resolve()}; "
                             f"extensions: {', '.join(extensions)})")
    else:
        target = Path(pattern) if absolute else base / pattern
        if not target.is_file():
            if target.exists() and not target.is_dir():  # a FIFO, a device: never opened
                problem = regular_file_problem(target.stat().st_mode)
                raise SweepError(f"{entry!r}: {problem}")
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
    synth.check(kind, **params)  # the generator's own checks (events=-5), generating nothing
    ordered = tuple(sorted(params.items()))
    key = SYNTH_PREFIX + kind + ("?" + "&".join(f"{k}={v}" for k, v in ordered) if ordered else "")
    return TraceSource(key=key, kind=kind, params=ordered)


def _device_entry(text: str, base: Path) -> DeviceEntry:
    if text.lower().endswith(".json"):
        path = Path(os.path.expanduser(text))
        return DeviceEntry(key=text, profile=resolve_device(
            profile_file=path if path.is_absolute() else base / path))
    return DeviceEntry(key=text.lower(), profile=resolve_device(text))


