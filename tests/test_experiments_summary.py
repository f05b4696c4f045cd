"""experiments/README.md's summary: every size and percentage a line quotes is a number the data
of the experiment it links to renders, or is declared on the line
(experiments/runner/summary.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from experiments.runner.summary import summary_number_problems, summary_problems

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def summary_beside(tmp_path: Path, line: str) -> Path:
    """A summary README linking to a copy of the compilation experiment's data."""
    shutil.copytree(EXPERIMENTS / "compilation", tmp_path / "compilation")
    readme = tmp_path / "README.md"
    readme.write_text("| claim | answer | evidence |\n| --- | --- | --- |\n"
                      f"| x | {line} | [compilation](compilation/README.md) |\n")
    return readme


def test_the_shipped_summary_agrees_with_the_data() -> None:
    assert summary_problems(EXPERIMENTS / "README.md") == []


def test_a_number_the_data_does_not_make_is_found(tmp_path: Path) -> None:
    readme = summary_beside(tmp_path, "jit alone raises it by +99.7%")
    assert [p.split(": ", 1)[1] for p in summary_number_problems(readme)] == [
        "99.7% is in no table of compilation's data and not declared on the line "
        "(<!-- numbers: ... -->)"]


def test_a_number_from_outside_the_data_is_declared_on_its_line(tmp_path: Path) -> None:
    readme = summary_beside(tmp_path, "the literature says 99.7% "
                                      "<!-- numbers: 99.7% (a paper) -->")
    assert summary_number_problems(readme) == []


def test_a_number_of_the_data_passes(tmp_path: Path) -> None:
    readme = summary_beside(tmp_path, "jit alone raises BFC's smallest device (+5.3%)")
    assert summary_number_problems(readme) == []
