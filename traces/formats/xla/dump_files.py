"""The text files of an XLA dump (``--xla_dump_to=DIR``), read into plain columns.

For each compiled module XLA writes ``module_NNNN.NAME.<stage>-<kind>.txt`` (``<stage>`` is
``cpu_after_optimizations``, ``gpu_after_optimizations``, ...). Read here, for
:mod:`allocsim.traces.formats.xla.dump`:

- ``-live-range.txt`` (:func:`parse_live_range`)::

      HloLiveRange (max 21):
        InstructionSequence:
          0:p__b1__.1
          ...
        BufferLiveRange:
          p__b1__.1{}:0-21           <- value{shape index}:start-end, positions, both inclusive
          ...
        Live ranges at 19 (peak):    <- written after the ranges: its absence means a cut file
          ...

- ``-buffer-assignment.txt`` (:func:`parse_assignment`)::

      BufferAssignment:
      allocation 0: size 32768, parameter 2, shape |f32[64,128]| at ShapeIndex {}, maybe-live-out:
       value: <75 p__w1__.1 @0> (size=32768,offset=0): f32[64,128]{1,0}
       value: <92 arg_tuple.1{1} (phi) @0> (size=2048,offset=0): f32[16,32]{1,0}

  (``@0`` is the value's memory space, its colour; ``{1}`` its index in a tuple);

- ``-buffer-assignment-values.txt`` (:func:`parse_op_names`): per value ``from instruction:
  %name = ... metadata={op_name="jit(step)/jvp()/tanh" ...}`` — the JAX-level names;
- ``-memory-usage-report.txt`` / the values file's ``Total bytes...: N`` (:func:`total_bytes`),
  the sum of every allocation, used to tell a cut buffer-assignment file.

Whole files are matched with compiled regular expressions (no Python loop per line), which
keeps a 100,000-value module to about a second. A file that does not have the shape above —
cut short, a line that does not parse, numbers out of range — is a
:class:`~allocsim.traces.model.TraceError` naming the file and the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from allocsim.ascii_numbers import is_whole_number
from allocsim.traces.formats.limits import read_input
from allocsim.traces.model import TraceError

__all__ = ["Allocation", "Assignment", "LiveRanges", "allocation_headers", "parse_assignment",
           "parse_live_range", "parse_op_names", "read_text", "total_bytes"]

# ``\d`` with re.A: ASCII digits, as XLA writes them (a Unicode digit is no number there).
_LIVE_HEADER = re.compile(r"\AHloLiveRange \(max (\d+)\):\n  InstructionSequence:\n", re.A)
_SEQUENCE_LINE = re.compile(r"^    (\d+):(\S+)$", re.M | re.A)
_RANGE_LINE = re.compile(r"^    (\S+):(\d+)-(\d+)$", re.M | re.A)
_PEAK_MARK = "\n  Live ranges at "
_ALLOC_LINE = re.compile(r"^allocation (\d+): size (\d+)(.*):$", re.M | re.A)
_VALUE_LINE = re.compile(
    r"^ value: <(\d+) (\S+?)( \(phi\))?(?: @(\d+))?> \(size=(\d+),offset=(\d+)\): .*$", re.M | re.A)
_SHAPE_TEXT = re.compile(r"\|[^|]*\|")
_FROM_LINE = re.compile(r'^ from instruction: %(\S+) = [^\n]*?op_name="((?:[^"\\\n]|\\.)*)"',
                        re.M)
_TOTAL_LINE = re.compile(r"^Total bytes(?: used)?: (\d+)", re.M | re.A)


def read_text(path: Path) -> str:
    data = read_input(path)   # the one guard and input limit of every reader
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TraceError(f"not an XLA dump text file (not UTF-8 at byte {err.start})",
                         source=str(path)) from None
    # A dump copied through Windows (or a git checkout with autocrlf) has CRLF line ends;
    # XLA writes LF. The files say the same either way, so read them as XLA wrote them.
    return text.replace("\r\n", "\n") if "\r" in text else text


def _line_of(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def _cut(path: Path, what: str) -> TraceError:
    return TraceError(f"{what}: the file is cut short (a half-written dump?)", source=str(path))


def _check_lines(text: str, path: Path, section_start: int, section_end: int,
                 spans: list[tuple[int, int]], what: str) -> None:
    """Every line of ``text[section_start:section_end]`` is one of ``spans`` (matched lines);
    else the first other line is named."""
    covered = sum(end - start + 1 for start, end in spans)  # each span plus its newline
    if covered >= section_end - section_start:
        return
    position = section_start
    for start, end in spans:
        if start != position:
            break
        position = end + 1
    stop = text.find("\n", position)
    line = text[position:stop if stop >= 0 else len(text)]
    raise TraceError(f"line {_line_of(text, position)}: not a {what} line: {line[:80]!r}",
                     source=str(path))


@dataclass
class LiveRanges:
    """``-live-range.txt``: the schedule's length and each value's ``[start, end]``."""

    length: int                 # the N of "HloLiveRange (max N)": positions 0..N
    instructions: list[str]     # the instruction sequence
    names: list[str]            # value names, "instr{index}"
    starts: np.ndarray
    ends: np.ndarray


def parse_live_range(text: str, path: Path) -> LiveRanges:
    header = _LIVE_HEADER.match(text)
    if header is None:
        raise TraceError("not an XLA live-range file (no 'HloLiveRange (max N):' header)",
                         source=str(path))
    length = int(header.group(1))
    ranges_at = text.find("\n  BufferLiveRange:\n")
    if ranges_at < 0:
        raise _cut(path, "no BufferLiveRange section")
    peak_at = text.find(_PEAK_MARK, ranges_at)
    if peak_at < 0:
        raise _cut(path, "no 'Live ranges at' section after the buffer live ranges")
    sequence_end = ranges_at + 1
    ranges_start = ranges_at + len("\n  BufferLiveRange:\n")
    ranges_end = peak_at + 1
    steps = list(_SEQUENCE_LINE.finditer(text, header.end(), sequence_end))
    _check_lines(text, path, header.end(), sequence_end, [m.span() for m in steps],
                 "instruction-sequence")
    if [int(m.group(1)) for m in steps] != list(range(len(steps))):
        raise TraceError("the instruction sequence is not numbered 0, 1, 2, ...",
                         source=str(path))
    ranges = list(_RANGE_LINE.finditer(text, ranges_start, ranges_end))
    _check_lines(text, path, ranges_start, ranges_end, [m.span() for m in ranges],
                 "buffer live range")
    names = [m.group(1) for m in ranges]
    starts = np.fromiter((int(m.group(2)) for m in ranges), np.int64, len(ranges))
    ends = np.fromiter((int(m.group(3)) for m in ranges), np.int64, len(ranges))
    if len(ranges):
        bad = np.flatnonzero((ends < starts) | (ends > length))
        if len(bad):
            m = ranges[int(bad[0])]
            raise TraceError(f"line {_line_of(text, m.start())}: live range {m.group(2)}-"
                             f"{m.group(3)} outside 0..{length}", source=str(path))
    return LiveRanges(length, [m.group(2) for m in steps], names, starts, ends)


@dataclass
class Allocation:
    """One ``allocation K: size S, <kinds>:`` line."""

    index: int
    size: int
    kind: str                   # the kinds as written, shapes left out
    parameter: int | None       # entry parameter number
    live_out: bool              # maybe-live-out (an output, or aliased to one)
    constant: bool
    thread_local: bool

    @property
    def temp(self) -> bool:
        """What XLA counts as temp bytes: not a parameter, output, constant or thread-local."""
        return not (self.parameter is not None or self.live_out or self.constant
                    or self.thread_local)

    @property
    def role(self) -> str:
        """``argument`` (parameter allocations, donated ones too), ``output``, ``temp``,
        ``constant`` or ``thread-local``."""
        if self.parameter is not None:
            return "argument"
        if self.live_out:
            return "output"
        if self.constant:
            return "constant"
        return "thread-local" if self.thread_local else "temp"


def _allocation(match: re.Match[str]) -> Allocation:
    rest = _SHAPE_TEXT.sub("", match.group(3))
    parts = [p.strip() for p in rest.split(",") if p.strip()]
    kinds = [p for p in parts if not p.startswith("shape")]
    parameter = next((int(p.split()[1]) for p in parts
                      if p.startswith("parameter ") and is_whole_number(p.split()[1])), None)
    kind = ", ".join(k.replace("output shape is", "output").strip() for k in kinds) or "temp"
    return Allocation(int(match.group(1)), int(match.group(2)), kind, parameter,
                      "maybe-live-out" in parts, "constant" in parts, "thread-local" in parts)


def allocation_headers(text: str, path: Path) -> list[Allocation]:
    """Only the allocation lines (cheap: for listing the modules of a dump)."""
    if not text.startswith("BufferAssignment:\n"):
        raise TraceError("not an XLA buffer-assignment file (no 'BufferAssignment:' header)",
                         source=str(path))
    if not text.endswith("\n"):
        raise _cut(path, "the last line is incomplete")
    return [_allocation(m) for m in _ALLOC_LINE.finditer(text)]


@dataclass
class Assignment:
    """``-buffer-assignment.txt``: the allocations and, one row per value, where it lives."""

    allocations: list[Allocation]
    value_ids: np.ndarray
    names: list[str]            # "instr{index}", as the live-range file names them
    allocation: np.ndarray      # index into ``allocations``
    sizes: np.ndarray
    offsets: np.ndarray
    colors: np.ndarray          # memory space (0: device memory)
    phi: np.ndarray             # bool


def parse_assignment(text: str, path: Path) -> Assignment:
    allocations = allocation_headers(text, path)
    headers = list(_ALLOC_LINE.finditer(text))
    values = list(_VALUE_LINE.finditer(text))
    spans = sorted([m.span() for m in headers] + [m.span() for m in values])
    body_start = len("BufferAssignment:\n")
    # The file may end with a trailer in newer XLA; only the allocation blocks are checked.
    _check_lines(text, path, body_start, len(text), spans, "buffer-assignment")
    header_starts = np.fromiter((m.start() for m in headers), np.int64, len(headers))
    value_starts = np.fromiter((m.start() for m in values), np.int64, len(values))
    owner = np.searchsorted(header_starts, value_starts, side="right") - 1
    if len(values) and int(owner.min()) < 0:
        raise TraceError(f"line {_line_of(text, int(value_starts[0]))}: a value before any "
                         "allocation", source=str(path))
    names = []
    for m in values:
        name = m.group(2)
        names.append(name if name.endswith("}") else name + "{}")
    sizes = np.fromiter((int(m.group(5)) for m in values), np.int64, len(values))
    offsets = np.fromiter((int(m.group(6)) for m in values), np.int64, len(values))
    colors = np.fromiter((int(m.group(4) or 0) for m in values), np.int64, len(values))
    phi = np.fromiter((m.group(3) is not None for m in values), bool, len(values))
    ids = np.fromiter((int(m.group(1)) for m in values), np.int64, len(values))
    alloc_sizes = np.array([a.size for a in allocations], np.int64)
    if len(values):
        over = np.flatnonzero(offsets + sizes > alloc_sizes[owner])
        if len(over):
            m = values[int(over[0])]
            raise TraceError(f"line {_line_of(text, m.start())}: value {m.group(2)} "
                             f"(offset {m.group(6)}, size {m.group(5)}) does not fit its "
                             f"allocation of {alloc_sizes[owner[int(over[0])]]} bytes",
                             source=str(path))
    counts = np.bincount(owner, minlength=len(allocations)) if len(values) else \
        np.zeros(len(allocations), np.int64)
    # A last allocation without values is a file cut after its header, unless it is empty:
    # XLA:TPU ends with a 0-byte temp of another memory space ("size 0, color 1,
    # preallocated-temp:"), which holds nothing.
    if len(allocations) and counts[-1] == 0 and allocations[-1].size > 0:
        raise _cut(path, f"allocation {allocations[-1].index} has no values")
    return Assignment(allocations, ids, names, owner.astype(np.int64), sizes, offsets,
                      colors, phi)


def parse_op_names(text: str) -> dict[str, str]:
    """``instruction name -> op_name`` from a ``-buffer-assignment-values.txt`` file."""
    return {m.group(1): m.group(2).replace("\\'", "'").replace('\\"', '"')
            for m in _FROM_LINE.finditer(text)}


def total_bytes(text: str) -> int | None:
    """The ``Total bytes: N`` / ``Total bytes used: N`` a report or values file states."""
    m = _TOTAL_LINE.search(text)
    return int(m.group(1)) if m else None
