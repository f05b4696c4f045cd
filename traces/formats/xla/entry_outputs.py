"""Which allocation of a buffer assignment holds each output of a compiled module.

A buffer-assignment file says which allocations are ``maybe-live-out`` but not which output
each one is. The optimized HLO says it: the entry computation's ``ROOT`` is a ``tuple(...)``
of the values returned, in the order of the outputs (JAX's flattened output leaves), or a
single value; each value is a ``value: <N name @0>`` line of one allocation. So output ``k``
is the allocation holding the ``k``-th operand of the root. A module that returns one array
(no tuple) has that array as its only output. The tuple itself, when there is one, is an
allocation of its own (``output shape is |(...)|``): the table of the outputs' addresses.
"""

from __future__ import annotations

import re

from allocsim.traces.formats.xla.dump_files import Assignment

__all__ = ["EntryOutputs", "entry_outputs"]

_ENTRY = re.compile(r"^ENTRY .*$", re.MULTILINE)
_COMMENT = re.compile(r"/\*.*?\*/")   # XLA marks every fifth operand: /*index=5*/


class EntryOutputs:
    """Each output's allocation index (None: not found in the assignment) and the tuple's own
    allocation (None when the module returns one array)."""

    def __init__(self, allocations: list[int | None], tuple_allocation: int | None) -> None:
        self.allocations = allocations
        self.tuple_allocation = tuple_allocation


_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%(\S+)\s*=\s*(.*)$")
_OPERATION = re.compile(r"\s([a-z][a-z0-9-]*)\((%[^)]*)?\)")
_INDEX = re.compile(r"\bindex=(\d+)")
# Instructions that define no buffer of their own: the value is their operand's.
_VIEWS = ("bitcast",)


def _entry(hlo_text: str) -> tuple[str, str, dict[str, tuple[str, list[str], int | None]]]:
    """The root's name and text, and each entry instruction's (opcode, operands, index)."""
    entry = _ENTRY.search(hlo_text)
    if entry is None:
        raise ValueError("no ENTRY computation in the optimized HLO")
    instructions: dict[str, tuple[str, list[str], int | None]] = {}
    root: tuple[str, str] | None = None
    for line in hlo_text[entry.end():].split("\n"):
        if line.startswith("}"):
            break
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        name, rest = match.group(2), _COMMENT.sub("", match.group(3).split(", metadata=")[0])
        operation = _OPERATION.search(rest)
        if operation is not None:
            operands = [o.strip().lstrip("%") for o in (operation.group(2) or "").split(",")
                        if o.strip()]
            index = _INDEX.search(rest[operation.end():])
            instructions[name] = (operation.group(1), operands,
                                  int(index.group(1)) if index else None)
        if match.group(1):
            root = (name, rest)
    if root is None:
        raise ValueError("the ENTRY computation has no ROOT")
    return root[0], root[1], instructions


def _value(name: str, instructions: dict[str, tuple[str, list[str], int | None]]) -> str:
    """The buffer-assignment value an instruction's result is (XLA's dataflow analysis: these
    define no value of their own): a get-tuple-element is its tuple's element (``fusion{0}``),
    a copy-done its copy-start's element {0} (the copy's destination), a bitcast its
    operand's value."""
    path: list[int] = []
    for _ in range(len(instructions) + 1):
        opcode, operands, index = instructions.get(name, ("", [], None))
        if opcode == "get-tuple-element" and operands and index is not None:
            path.insert(0, index)
            name = operands[0]
        elif opcode == "copy-done" and operands:   # the copy-start's element {0}
            path.insert(0, 0)
            name = operands[0]
        elif opcode in _VIEWS and operands and not path:
            name = operands[0]
        else:
            break
    return f"{name}{{{','.join(str(i) for i in path)}}}"


def entry_outputs(hlo_text: str, assignment: Assignment) -> EntryOutputs:
    """The allocation of each output of the module whose optimized HLO is ``hlo_text``."""
    holder: dict[str, int] = {}
    for row, name in enumerate(assignment.names):
        holder.setdefault(name, assignment.allocations[int(assignment.allocation[row])].index)
    name, body, instructions = _entry(hlo_text)
    opcode, operands, _ = instructions.get(name, ("", [], None))
    if opcode != "tuple" or not body.lstrip().startswith("("):   # one array: the root itself
        return EntryOutputs([holder.get(_value(name, instructions))], None)
    return EntryOutputs([holder.get(_value(o, instructions)) for o in operands],
                        holder.get(f"{name}{{}}"))
