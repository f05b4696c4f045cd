"""Progress of a running sweep on stderr: cells done/total, errors, elapsed and ETA.

tqdm draws the bar when it is installed; otherwise one line is redrawn in place on a terminal,
or written every 10 s into a log. The Python API (``run_sweep(progress=True)``) and the CLI
show the same thing, so it lives here rather than beside the command's parser.
"""

from __future__ import annotations

import importlib
import math
import sys
import time
from typing import Any

__all__ = ["Progress"]


def _seconds(value: float) -> str:
    if not math.isfinite(value):
        return "?"
    value = round(value)
    return f"{value // 3600}:{value // 60 % 60:02d}:{value % 60:02d}" if value >= 3600 else \
        f"{value // 60}:{value % 60:02d}"


class Progress:
    """Cells done/total, errors, elapsed and ETA on stderr: tqdm when installed, else one line
    redrawn in place on a terminal (a line every 10 s in a log)."""

    def __init__(self, total: int, name: str, enabled: bool) -> None:
        self.total = total
        self.name = name
        self.enabled = enabled and total > 0
        self.done = 0
        self.errors = 0
        self.start = time.monotonic()
        self.last_draw = 0.0
        self.bar: Any = None
        self.tty = sys.stderr.isatty()
        if not self.enabled:
            return
        try:
            tqdm = importlib.import_module("tqdm").tqdm   # optional, untyped: looked up by name
        except ModuleNotFoundError:
            self._draw(force=True)
        else:
            self.bar = tqdm(total=total, desc=name, unit="cell", file=sys.stderr,
                            dynamic_ncols=True)

    def advance(self, ok: bool) -> None:
        self.done += 1
        self.errors += not ok
        if not self.enabled:
            return
        if self.bar is not None:
            if not ok:
                self.bar.set_postfix(errors=self.errors, refresh=False)
            self.bar.update(1)
        else:
            self._draw(force=self.done == self.total)

    def note(self, text: str) -> None:
        if not self.enabled:
            print(text, file=sys.stderr)
        elif self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            sys.stderr.write(("\r\x1b[K" if self.tty else "") + text + "\n")
            self._draw(force=True)

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_draw < (0.1 if self.tty else 10.0):
            return
        self.last_draw = now
        elapsed = now - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else math.inf
        line = (f"{self.name}: {self.done:,}/{self.total:,} cells "
                f"({self.done / self.total:.0%}), {self.errors:,} error"
                f"{'s' if self.errors != 1 else ''}, {_seconds(elapsed)} elapsed, "
                f"ETA {_seconds(eta)}")
        if self.tty:
            sys.stderr.write("\r\x1b[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        elif self.tty:
            self._draw(force=True)
            sys.stderr.write("\n")
            sys.stderr.flush()
