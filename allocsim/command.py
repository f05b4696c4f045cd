"""The ``allocsim`` command's entry point (the console script and ``python -m allocsim``).

It stays light on purpose. While the command line and its commands are imported (numpy,
matplotlib: a second or more), a Ctrl-C or a SIGTERM prints one line and ends the process at
once: nothing has been written yet, so there is nothing to clean up, and an interrupt raised
inside an extension module's import would come out as some ImportError with a traceback (numpy
wraps it) or mark the process as killed by SIGINT whatever it returned. Once the command line
is loaded its error boundary (:mod:`allocsim.sim.cli.main`) handles both signals.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

STARTING_INTERRUPTED = ("interrupted ({signal}) while starting, before the command ran: "
                        "nothing was written; run the same command again")


def _end_at_once(signum: int, frame: FrameType | None) -> None:
    line = "allocsim: " + STARTING_INTERRUPTED.format(signal=signal.Signals(signum).name)
    os.write(2, (line + "\n").encode())
    os._exit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``allocsim`` command line; its exit status."""
    previous: dict[int, Any] = {}
    for asked in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(asked) is not signal.SIG_IGN:     # a job told to ignore it keeps to
            previous[asked] = signal.signal(asked, _end_at_once)
    try:
        from allocsim.sim.cli.main import main as command_line
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    status = command_line(argv)
    if status > 128:
        # Interrupted, and the command has cleaned up and said so. An interrupt that landed in
        # code an extension module ran leaves Python marked as killed by SIGINT, which would
        # turn this status into death by the signal at exit; end with the status itself.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status
