"""The HTML report: self-contained, every figure embedded, and it renders in a real browser."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from allocsim import __version__
from allocsim.sim.cli import main
from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.output.figures import POLICY_COLORS, policy_colors, size_unit
from allocsim.sim.output.html_report import (
    MEMORY_VIZ_URL,
    render_report,
)
from allocsim.sim.output.ownership import REPORT_MARK
from allocsim.sim.output.report_input import load_results
from allocsim.sim.output.results_dir import holders_at_peak, write_comparisons
from allocsim.sim.questions.compare import compare
from allocsim.traces.bundled import bundled_path, load_default_trace


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    assert main(["compare", str(bundled_path()), "--policies", "bfc", "best-fit", "offline",
                 "--out", str(out)]) == 0
    assert main(["min-capacity", "default", "--policies", "bfc", "on-demand",
                 "--out", str(out)]) == 0
    return out


def test_compare_out_writes_a_self_contained_page(results_dir: Path) -> None:
    page = (results_dir / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 3
    # nothing fetched from a network: the one web address is a link for the reader to follow
    addresses = re.findall(r"https?://[^\s\"<]+", page)
    assert set(addresses) == {MEMORY_VIZ_URL}
    assert not re.search(r'(src|href)="(?!data:|https://pytorch\.org/memory_viz")', page)
    assert "winner: best-fit" in page and "offline" in page


def test_every_figure_has_a_real_description(results_dir: Path) -> None:
    page = (results_dir / "report.html").read_text()
    alts = [html.unescape(a) for a in re.findall(r'<img alt="([^"]*)" src=', page)]
    assert len(alts) == 3 and 'alt="figure"' not in page
    assert alts[0].startswith("memory over time — ") and "bfc peaks at " in alts[0]
    assert alts[1].startswith("free share of reserved memory — ") and "best-fit " in alts[1]
    assert alts[2].startswith("peak reserved vs allocated — ") and "log scale" in alts[2]
    assert all(len(a) > 80 for a in alts)


def test_the_page_names_the_version_explains_the_columns_and_points_to_memory_viz(
        results_dir: Path) -> None:
    page = (results_dir / "report.html").read_text()
    assert f"{REPORT_MARK} {__version__}," in page          # still recognised as a report
    legend = re.search(r"<p class=legend>(.*?)</p>", page)
    assert legend
    for column in ("peak reserved", "peak allocated", "util", "frag", "dev mallocs",
                   "dev frees", "alloc time", "slowdown"):
        assert f"<b>{column}" in legend.group(1) or f"/ {column}</b>" in legend.group(1), column
    assert "1 − utilization" in html.unescape(legend.group(1))
    assert "allocsim export-snapshot " in page and "--policy bfc -o run.pickle" in page
    assert f'<a href="{MEMORY_VIZ_URL}">' in page


def test_the_folder_names_who_holds_memory_at_the_peak_when_the_trace_is_given(
        tmp_path: Path) -> None:
    trace = load_default_trace()
    comparison = compare(trace, ["bfc", "on-demand"], resolve_device())
    write_comparisons([comparison], tmp_path, traces=[trace])
    page = (tmp_path / "report.html").read_text()
    rows = holders_at_peak(trace)
    assert rows and sum(r[1] for r in rows) == trace.peak_live()[0]
    assert "Who holds memory at the trace" in page and html.escape(rows[0][0]) in page
    write_comparisons([comparison], tmp_path)                    # no trace: no such table
    assert "Who holds memory" not in (tmp_path / "report.html").read_text()


def test_one_colour_per_policy_and_units_from_the_data() -> None:
    colors = policy_colors(["zeta", "bfc", "alpha", "on-demand"])
    assert colors["bfc"] == POLICY_COLORS["bfc"]
    assert colors == policy_colors(["zeta", "bfc", "alpha", "on-demand"])
    assert len(set(colors.values())) == 4
    assert size_unit(25 << 20) == ("MiB", 1 << 20) and size_unit(60 << 30)[0] == "GiB"
    assert size_unit(512)[0] == "B" and size_unit(3 << 10)[0] == "KiB"


def test_report_combines_comparisons_and_capacity_answers(results_dir: Path, capsys) -> None:
    out = results_dir / "all.html"
    assert main(["report", str(results_dir / "results.json"),
                 str(results_dir / "min_capacity.json"), "-o", str(out), "--title", "nightly"]) == 0
    page = out.read_text()
    assert "<title>nightly</title>" in page and "minimum capacity" in page
    assert page.count("data:image/png;base64,") == 4


def test_compare_out_with_several_traces_writes_one_array_and_one_page(tmp_path: Path) -> None:
    # all bundled traces
    assert main(["compare", "--policies", "bfc", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    from allocsim.traces.bundled import bundled_names
    traces = len(bundled_names())
    assert isinstance(data, list) and len(data) == traces
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 * traces
    assert (tmp_path / "01-sample-jax-cpu-train-peaks.png").exists()


def test_a_file_that_is_not_results_is_one_clear_error(tmp_path: Path, capsys) -> None:
    bogus = tmp_path / "x.json"
    bogus.write_text(json.dumps({"hello": 1}))
    assert main(["report", str(bogus)]) == 2
    assert "not an allocsim results file" in capsys.readouterr().err


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="Chromium not installed (.ci/run installs it)")
def test_the_page_renders_in_headless_chromium_with_every_figure_and_no_console_error(
        results_dir: Path, tmp_path: Path) -> None:
    page = results_dir / "all.html"
    page.write_text(render_report(load_results([results_dir / "results.json",
                                                results_dir / "min_capacity.json"])))
    run = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    loaded = re.search(r'data-figures-loaded="(\d+)"', run.stdout)
    total = re.search(r'data-figures-total="(\d+)"', run.stdout)
    assert loaded and total, "the page's load handler did not run"
    assert int(loaded.group(1)) == int(total.group(1)) == 4
    console_errors = [line for line in run.stderr.splitlines()
                      if "CONSOLE" in line and ("Error" in line or "Uncaught" in line)]
    assert not console_errors, console_errors
