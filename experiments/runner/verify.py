"""Regenerate an experiment from its definition and diff it against what is committed.

:func:`regenerate` runs ``experiments/NAME`` into a copy of its folder (experiment.toml and
README.md only, in a temporary directory: nothing committed is touched) and returns the
unified diff of results.json and README.md against the committed files — empty when the
committed results are what a clean clone regenerates. ``python -m experiments.run --all
--verify`` prints the diffs and exits 1 on any; tests/test_experiments_regenerate.py (marked
``slow``) asserts each is empty. Figures are written but not compared: PNG bytes depend on the
matplotlib and libpng builds, and every number they draw is in results.json.
"""

from __future__ import annotations

import difflib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

COMPARED = ("results.json", "README.md")


def regenerate(folder: Path, run: Callable[[Path], object]) -> str:
    """The diff (empty: none) between ``folder``'s committed results and a fresh run of it;
    ``run`` is :func:`experiments.run.run_experiment` (passed in: no import circle)."""
    with tempfile.TemporaryDirectory(prefix="allocsim-regenerate-") as tmp:
        fresh = Path(tmp) / folder.name
        fresh.mkdir()
        for name in ("experiment.toml", "README.md"):
            if (folder / name).exists():
                shutil.copy(folder / name, fresh / name)
        run(fresh)
        diff: list[str] = []
        for name in COMPARED:
            old = (folder / name).read_text() if (folder / name).exists() else ""
            new = (fresh / name).read_text() if (fresh / name).exists() else ""
            diff += difflib.unified_diff(old.splitlines(keepends=True),
                                         new.splitlines(keepends=True),
                                         f"committed/{folder.name}/{name}",
                                         f"regenerated/{folder.name}/{name}")
        return "".join(diff)
