"""The report in a real browser (headless Chromium): it loads with no script error, every
section is there, the chart's controls respond, and screenshots at fixed sizes are kept
(build/report-screenshots/, gitignored, or $ALLOCSIM_SCREENSHOTS) for a person to look at."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from report_browser import chromium, dump_dom, screenshot

from allocsim.sim.cli import main
from allocsim.traces.bundled import bundled_names

pytestmark = pytest.mark.skipif(chromium() is None,
                                reason="Chromium not installed (.ci/run installs it)")

SIZES = {"desktop": (1280, 1000), "desktop-tall": (1280, 6000), "phone": (390, 1600)}


def _shots() -> Path:
    folder = os.environ.get("ALLOCSIM_SCREENSHOTS")
    return Path(folder) if folder else Path(__file__).resolve().parents[1] / "build" / \
        "report-screenshots"


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("browser")
    assert main(["compare", "--policies", "on-demand", "preallocate", "best-fit", "bfc",
                 "pytorch", "offline", "-o", str(out), "--figures"]) == 0
    assert main(["min-capacity", "default", "--policies", "best-fit", "bfc", "pytorch",
                 "-o", str(out)]) == 0
    report = out / "all.html"
    assert main(["report", str(out / "results.json"), str(out / "min_capacity.json"),
                 "-o", str(report), "--figures"]) == 0
    return out


def _attr(dom: str, name: str) -> str | None:
    found = re.search(rf'{name}="([^"]*)"', dom)
    return found.group(1) if found else None


def test_the_page_loads_with_no_error_and_every_section(page: Path, tmp_path: Path) -> None:
    dom, console = dump_dom(page / "report.html", tmp_path)
    assert not console, console
    assert _attr(dom, "data-report-ready") == "1"
    assert _attr(dom, "data-js-errors") == "0"
    traces = len(bundled_names())
    assert _attr(dom, "data-charts") == str(traces)
    assert _attr(dom, "data-figures-loaded") == _attr(dom, "data-figures-total") == str(3 * traces)
    assert 'id="summary"' in dom
    for index in range(1, traces + 1):
        assert re.search(rf'<h2 id="trace-{index}-[a-z0-9-]+">', dom), index
    assert dom.count('class="tl"') == traces and dom.count("uplot u-hz") == traces
    assert dom.count('class="holders"') == traces        # the traces were at hand


def test_the_charts_controls_respond(page: Path, tmp_path: Path) -> None:
    from report_browser import _run
    run = _run(["--virtual-time-budget=5000", "--enable-logging=stderr", "--v=0", "--dump-dom",
                (page / "report.html").resolve().as_uri() + "#selftest"], tmp_path / "p")
    assert run.returncode == 0, run.stderr[-2000:]
    seen = (_attr(run.stdout, "data-selftest") or "").split()
    assert seen == ["zoom-in", "pan", "reset", "steady", "toggle", "hover"]
    assert _attr(run.stdout, "data-js-errors") == "0"


def test_screenshots_at_fixed_sizes_are_kept(page: Path, tmp_path: Path) -> None:
    from PIL import Image
    folder = _shots()
    for report, sizes in (("report.html", SIZES), ("all.html", {"desktop": SIZES["desktop"]})):
        for name, (width, height) in sizes.items():
            png = screenshot(page / report, folder / f"{Path(report).stem}-{name}.png",
                             tmp_path, width, height, "#selftest")
            with Image.open(png) as image:
                assert image.size == (width, height)
                # not a blank page: many distinct colours were drawn
                assert len(image.convert("RGB").getcolors(1 << 20) or []) > 50


def test_no_table_scrolls_sideways_at_1400_pixels_with_long_settings(tmp_path: Path) -> None:
    """tune's settings are long specs; the table hid its "slowdown" column behind a sideways
    scroll at 1,400 px (issue 37): names wrap now, and the page counts wide tables."""
    out = tmp_path / "o"
    confs = ["expandable_segments:True,roundup_power2_divisions:16,max_split_size_mb:256,"
             "garbage_collection_threshold:0.8",
             "max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"]
    argv = ["compare", "default", "--policies", "pytorch"]
    for conf in confs:
        argv += ["--alloc-conf", conf]
    assert main([*argv, "-o", str(out)]) == 0
    dom, errors = dump_dom(out / "report.html", tmp_path, width=1400)
    assert not errors
    assert _attr(dom, "data-wide-tables") == "0"
