"""traces/formats/xla/entry_outputs.py: which allocation holds each output, by hand-made HLO
and buffer assignments in XLA:TPU's form (libtpu 0.0.42.1's dumps)."""

from __future__ import annotations

from pathlib import Path

from allocsim.traces.formats.xla.dump_files import parse_assignment
from allocsim.traces.formats.xla.entry_outputs import entry_outputs

ASSIGNMENT = """BufferAssignment:
allocation 0: size 1024, maybe-live-out:
 value: <1 fusion{0} @0> (size=1024,offset=0): f32[256]{0:T(256)}
allocation 1: size 2048, maybe-live-out:
 value: <2 copy-start{0} @0> (size=2048,offset=0): f32[512]{0:T(512)}
allocation 2: size 4096, parameter 0, shape |f32[1024]| at ShapeIndex {}:
 value: <3 p.1 @0> (size=4096,offset=0): f32[1024]{0:T(1024)}
 value: <4 add @0> (size=4096,offset=0): f32[1024]{0:T(1024)}
allocation 3: size 512, output shape is |(f32[256], f32[512], f32[1024])|, maybe-live-out:
 value: <5 tuple.1{} @0> (size=512,offset=0): (f32[256], f32[512], f32[1024])
"""

HLO = """HloModule jit_step, is_scheduled=true

ENTRY %main.3 (p.1: f32[1024]) -> (f32[256], f32[512], f32[1024]) {
  %p.1 = f32[1024]{0:T(1024)} parameter(0)
  %fusion = (f32[256]{0:T(256)}, f32[8]{0}) fusion(%p.1), kind=kLoop, calls=%f
  %gte = f32[256]{0:T(256)} get-tuple-element(%fusion), index=0
  %copy-start = (f32[512]{0:T(512)}, f32[512]{0:T(512)}, u32[]{:S(2)}) copy-start(%p.1)
  %copy-done = f32[512]{0:T(512)} copy-done(%copy-start)
  %add = f32[1024]{0:T(1024)} add(%p.1, %p.1)
  %bc = f32[1024]{0:T(1024)} bitcast(%add)
  ROOT %tuple.1 = (f32[256]{0:T(256)}, f32[512]{0:T(512)}, /*index=2*/f32[1024]{0:T(1024)}) tuple(%gte, %copy-done, /*index=2*/%bc)
}
"""  # noqa: E501 (XLA's own line, as long as it writes it)


def test_each_output_is_the_allocation_of_the_value_the_root_returns() -> None:
    assignment = parse_assignment(ASSIGNMENT, Path("a.txt"))
    found = entry_outputs(HLO, assignment)
    # a tuple's element, a copy's destination, a bitcast of a value in the donated parameter
    assert found.allocations == [0, 1, 2]
    assert found.tuple_allocation == 3


def test_a_module_returning_one_array_has_it_as_its_only_output() -> None:
    hlo = HLO.split("  ROOT")[0] + "  ROOT %out = f32[1024]{0:T(1024)} bitcast(%add)\n}\n"
    found = entry_outputs(hlo, parse_assignment(ASSIGNMENT, Path("a.txt")))
    assert found.allocations == [2]
    assert found.tuple_allocation is None
