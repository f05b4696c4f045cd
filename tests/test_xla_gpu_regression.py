"""CI for a JAX program's GPU memory without a GPU (issue 26 item 5): ``allocsim baseline`` of
a step compiled with XLA:GPU, and ``allocsim check`` failing when a change to the program grows
its GPU memory past what the card's default settings hold.

The program is docs/examples/gpu_step.py (docs/jax.md's example), compiled in a child process
(the CUDA plugin loads with no device visible before anything imports jax). Needs the plugin:
skipped, saying so, without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from xla_gpu_compiler import needs_cuda_plugin

from allocsim.sim.cli.main import main

pytestmark = needs_cuda_plugin

PROGRAM = Path(__file__).resolve().parents[1] / "docs" / "examples" / "gpu_step.py"
POLICIES = ["jax", "jax:preallocate=false", "jax:allocator=platform"]


def compile_step(folder: Path, layers: int) -> None:
    """The step with ``layers`` layers of 16384 × 16384 f32 (1 GiB each, and as much again of
    momentum), compiled for an L4 into ``folder/step.npz``."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run([sys.executable, str(PROGRAM), "-o", str(folder / "step.npz"),
                           "--target", "l4-24g", "--hidden", "16384", "--layers", str(layers),
                           "--steps", "2"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_check_fails_when_a_change_grows_the_programs_gpu_memory(tmp_path: Path,
                                                                  capsys) -> None:
    compile_step(tmp_path, layers=6)    # 12 GiB of state: the L4's 75% pool (16.87 GiB) holds it
    baseline = tmp_path / "gpu-baseline.json"
    assert main(["baseline", str(tmp_path / "step.npz"), "--policies", *POLICIES,
                 "--device", "l4-24g", "-o", str(baseline)]) == 0
    assert main(["check", str(baseline)]) == 0
    assert "check passed: 0 regression(s)" in capsys.readouterr().out

    compile_step(tmp_path, layers=9)    # the change under review: 18 GiB of state
    assert main(["check", str(baseline)]) == 1
    out = capsys.readouterr().out
    assert "step.npz / jax: completed before, now runs out of memory" in out
    assert "step.npz / jax:allocator=platform: peak_reserved" in out
    assert "the trace file changed since the baseline" in out
