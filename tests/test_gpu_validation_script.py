"""experiments/gpu_validation.sh, the one prepared script for a GPU machine, runs end to end.

A GPU session has 15 minutes of device time and no package registry: the script must not fail
for a reason that could have been seen here. Without a GPU every GPU step fails with its one
line (exit 2) or skips, and the script still records each step, writes SUMMARY.md and packs the
files the device tool brings back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "experiments" / "gpu_validation.sh"
STEPS = ["pytest-gpu", "calibrate", "compare-default", "validate-compare-winner",
         "cli-cupy-pool", "cli-torch", "cli-cupy-raw", "cli-cupy-async"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": sys.executable, "DEADLINE": "240",
                   "VALIDATION_DIR": str(tmp_path / "validation"), **env}
    environment.pop("PYTHONPATH", None)
    return subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=600)


def test_without_a_gpu_every_step_is_recorded_and_the_results_packed(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = _run(tmp_path, OUT=str(out))
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "validation"
    rows = [line.split("\t") for line in (folder / "steps.tsv").read_text().splitlines()[1:]]
    assert [row[0] for row in rows] == STEPS
    exits = {row[0]: row[1] for row in rows}
    assert exits["compare-default"] == "0"                  # the simulation needs no GPU
    for step in ("calibrate", "cli-cupy-pool", "cli-cupy-raw", "cli-cupy-async"):
        assert exits[step] == "2", step                       # "no CUDA GPU visible", one line
        log = (folder / "logs" / f"{step}.log").read_text()
        assert "no CUDA GPU visible" in log and "Traceback" not in log
    summary = (folder / "SUMMARY.md").read_text()
    assert "## Steps" in summary and "compare-default" in summary
    assert sorted(p.name for p in out.iterdir()) == ["SUMMARY.md", "pytest-gpu.log",
                                                     "steps.tsv", "validation.tar.gz"]
    with tarfile.open(out / "validation.tar.gz") as packed:
        assert "validation/steps.tsv" in packed.getnames()


def test_a_step_that_no_longer_fits_before_the_deadline_is_skipped_not_run(tmp_path) -> None:
    result = _run(tmp_path, DEADLINE="0")
    assert result.returncode == 0, result.stderr
    rows = (tmp_path / "validation" / "steps.tsv").read_text().splitlines()[1:]
    assert rows and all(row.split("\t")[1] == "skipped" for row in rows)
