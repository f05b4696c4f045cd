"""What the TPU runtime reserves as a loaded executable's scratch, from XLA:TPU's buffer
assignment: one rule, read by compile_for (traces/record/xla_tpu.py), the TPU Program
(traces/record/tpu_program.py) and an XLA:TPU dump read as a trace (traces/formats/xla/dump.py).
"""

from __future__ import annotations

import re

__all__ = ["SCRATCH_ALIGNMENT", "hbm_temp_bytes", "hbm_temp_holds_arrays",
           "runtime_scratch_bytes"]

# The runtime reserves scratch in 16 KiB units (runtime_scratch_bytes).
SCRATCH_ALIGNMENT = 16 * 1024
_HBM_TEMP = re.compile(r"^allocation \d+: size (\d+), preallocated-temp:", re.M)


def runtime_scratch_bytes(hbm_temp_bytes: int, analysed_temp_bytes: int) -> int:
    """What the TPU runtime holds as ``bytes_reserved`` for a loaded executable, as the chip
    shows it: XLA's preallocated temp in HBM (the buffer assignment's ``preallocated-temp``
    allocation of memory space 0; VMEM's and SMEM's are other colours) rounded up to 16 KiB —
    none when ``memory_analysis()`` counts no temp (``analysed_temp_bytes``), though the
    assignment then still holds a 512 B HBM temp. Read from the chip: ``peak_bytes_reserved``
    of all 12 jitted GPT steps of tests/data/tpu/steps (4 sizes, with and without donation and
    remat) and of the matmul step (exec-matmul: 0) is exactly this, and it then predicted five
    programs it was not read from (tests/data/tpu/scratch: three with a temp, two whose
    assignment holds an HBM temp memory_analysis() does not count). On all of them the temp ends
    512 B past a 16 KiB boundary, so "temp + 15,872 B" fits them too: these programs do not
    tell the two roundings apart, and why an uncounted temp is not reserved is not known."""
    if analysed_temp_bytes == 0:
        return 0
    return -(-hbm_temp_bytes // SCRATCH_ALIGNMENT) * SCRATCH_ALIGNMENT


def hbm_temp_bytes(assignment_text: str) -> int:
    """The HBM preallocated-temp allocation of a buffer-assignment file (0: none)."""
    return sum(int(size) for size in _HBM_TEMP.findall(assignment_text))


_TEMP_BLOCK = re.compile(r"^allocation \d+: size \d+, preallocated-temp:\n((?: value: .*\n?)*)",
                         re.M)
_VALUE_SHAPE = re.compile(r"^ value: <[^>]*> \(size=\d+,offset=\d+\): (.*)$", re.M)


def hbm_temp_holds_arrays(assignment_text: str) -> bool:
    """Whether the HBM preallocated temp holds any array, not only tuples (the address tables
    of async copies and multi-output fusions). Where it holds tuples alone, XLA:TPU's
    ``memory_analysis()`` counts no temp and the chip reserves no scratch: what a dump, which
    has no memory analysis, reads in its place."""
    for block in _TEMP_BLOCK.findall(assignment_text):
        if any(not shape.lstrip().startswith("(") for shape in _VALUE_SHAPE.findall(block)):
            return True
    return False
