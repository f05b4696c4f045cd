"""A real Ctrl-C in the middle of a sweep, for the tests that interrupt one and resume it."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from allocsim.sim.sweeps import store as store_module


def ctrl_c_after_first_record(output: Path) -> Callable[[Any, Any], None]:
    """A stand-in for ``ResultsFile.append`` that appends as before, then, once ``output``
    holds its first record, sends this process a real SIGINT — while run_sweep surely runs,
    its handler installed. The caller puts it in place and takes it out again."""
    append = store_module.ResultsFile.append

    def append_then_ctrl_c(self: Any, record: Any) -> None:
        append(self, record)
        if output.read_bytes().count(b"\n") == 1:
            os.kill(os.getpid(), signal.SIGINT)

    return append_then_ctrl_c
