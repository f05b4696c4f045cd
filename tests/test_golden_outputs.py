"""`allocsim compare --json` on the bundled traces stays byte-identical across refactors.

The golden files were recorded before the move into the `allocsim` namespace (issue 12): a
change that alters a number, a key or the order of keys shows up here as a diff. Regenerate
them only for an intended change of results, and say why in the commit. Changed since:
compare's reason calls the offline plan a heuristic, not a bound, and names peak live as the
bound (issue 16.15) — only the "reason" strings of the all-policies file changed; a bundled
JAX recording joined the bundled traces (sample-jax-cpu-train, issue 13), and a winner that
ties the next policy on memory and on time is said to be first by name instead of "spends less
time" (two reasons changed; no number did); the offline plan follows XLA's heap simulator
(offsets aligned, sizes unpadded), which changed only its diagnostic heap_size; the device
section names the device's own share, context_bytes (issue 26; a key added, no number
changed); compare weighs each recording's own framework's settings by default and says what
it compared and why (issue 37: the recorded samples' results are now PyTorch's and JAX's
settings, the synthetic trace's are unchanged; every comparison gained a "framework" key,
with no number of the all-policies file changed).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from allocsim.sim.cli import main

GOLDEN = Path(__file__).parent / "data" / "golden"
ALL_POLICIES = ["on-demand", "preallocate", "best-fit", "bfc", "pytorch", "cupy", "cuda-async",
                "buddy", "offline", "jax", "jax:preallocate=false", "jax:allocator=platform",
                "pytorch:expandable_segments=true"]


@pytest.mark.parametrize("golden, extra", [
    ("compare-bundled.json", []),
    ("compare-bundled-all-policies.json", ["--policies", *ALL_POLICIES]),
])
def test_compare_json_on_the_bundled_traces_is_byte_identical(capsys, golden: str,
                                                              extra: list[str]) -> None:
    assert main(["compare", "--json", *extra]) == 0
    out, _ = capsys.readouterr()
    assert out == (GOLDEN / golden).read_text()
