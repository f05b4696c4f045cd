"""A report stays quick whatever the names and the number of policies it is given (issue 36.8):
300 policies, or a trace named with 100-400 KB of text, took 30-54 s to draw (one panel per
policy, every glyph of the name laid out in matplotlib's C++, where SIGTERM waits). Displays
show a name's start and an ellipsis; results.json keeps it whole. Work is counted (panels and
characters laid out), not timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.output.html_report import comparison_figures
from allocsim.sim.output.results_dir import write_comparisons
from allocsim.sim.output.tables import comparison_text
from allocsim.sim.questions.compare import compare
from allocsim.traces import synth

LONG_NAME = "N" * 400_000
MANY = [f"bfc:fraction=0.{k:03d}" for k in range(100, 400)]     # 300 policies


@pytest.fixture(scope="module")
def crowded():
    trace = synth.generate("random", seed=1, events=120)
    trace.metadata["name"] = LONG_NAME
    return trace, compare(trace, MANY, resolve_device("a100-80g"))


def laid_out(fig) -> int:
    """Characters matplotlib would lay out, glyph by glyph, to draw ``fig``."""
    from matplotlib.text import Text
    return sum(len(t.get_text()) for t in fig.findobj(Text))


def test_figures_of_300_policies_and_a_400_kb_name_are_bounded(crowded) -> None:
    _, comparison = crowded
    figures = comparison_figures(comparison.to_json_dict(timeline=True))
    try:
        for fig in figures:
            assert len(fig.axes) <= 20
            assert laid_out(fig) <= 20_000
        timeline = figures[0]
        assert "first 16 of 300 policies" in timeline.get_suptitle()
        assert "…" in timeline.get_suptitle()
    finally:
        from matplotlib import pyplot
        for fig in figures:
            pyplot.close(fig)


def test_the_name_is_shown_short_and_kept_whole(crowded, tmp_path: Path) -> None:
    trace, comparison = crowded
    written = write_comparisons([comparison], tmp_path / "out", traces=[trace],
                                figures=True)
    document = json.loads((tmp_path / "out" / "results.json").read_text())
    assert document["trace"]["name"] == LONG_NAME              # nothing the user gave is lost
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count(LONG_NAME) <= 1                          # at most the embedded data
    assert len(written) == 5


def test_the_terminal_table_shows_the_name_short(crowded) -> None:
    _, comparison = crowded
    text = comparison_text(comparison)
    assert LONG_NAME not in text and "N…" in text
