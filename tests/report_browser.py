"""Opening a report in headless Chromium for the tests: its DOM after the page's scripts ran,
the console errors it logged, and screenshots at fixed sizes.

The page itself records what a test needs on ``<html>``: ``data-report-ready`` once its
script ran to the end, ``data-js-errors`` with the count of uncaught errors (a handler
installed before any other script), so a test reads them from ``--dump-dom`` without a
debugging protocol client.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run(args: list[str], profile: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    browser = chromium()
    assert browser is not None
    return subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=timeout)


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if "CONSOLE" in line and ("Error" in line or "Uncaught" in line)]


def dump_dom(page: Path, scratch: Path, budget_ms: int = 5000,
             width: int = 1280) -> tuple[str, list[str]]:
    """The page's DOM once its scripts ran (virtual time ``budget_ms``) in a window ``width``
    pixels wide, and the console errors Chromium logged."""
    run = _run(["--enable-logging=stderr", "--v=0", f"--virtual-time-budget={budget_ms}",
                f"--window-size={width},1200",
                "--dump-dom", page.resolve().as_uri()], scratch / "profile-dom")
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout, console_errors(run.stderr)


def screenshot(page: Path, png: Path, scratch: Path, width: int = 1280, height: int = 2400,
               fragment: str = "") -> Path:
    """A PNG of the page's top ``width`` × ``height`` pixels (``#fragment`` to scroll)."""
    png.parent.mkdir(parents=True, exist_ok=True)
    run = _run([f"--window-size={width},{height}", "--virtual-time-budget=5000",
                f"--screenshot={png}", page.resolve().as_uri() + fragment],
               scratch / f"profile-shot-{png.stem}")
    assert run.returncode == 0 and png.exists(), run.stderr[-2000:]
    return png
