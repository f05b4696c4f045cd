"""The HTML report: self-contained, every figure embedded, and it renders in a real browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from allocsim.sim.cli import main
from allocsim.sim.output.html_report import load_results, render_report
from allocsim.traces.bundled import bundled_path


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
    assert page.count('<img alt="figure" src="data:image/png;base64,') == 3
    assert "http://" not in page and "https://" not in page      # nothing fetched from a network
    assert "winner: best-fit" in page and "offline" in page


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
