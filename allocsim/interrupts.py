"""Ctrl-C and SIGTERM end a command in one line, never a traceback.

Python turns SIGINT (Ctrl-C) into :class:`KeyboardInterrupt`; SIGTERM (``kill``, a job
scheduler, a container stopping) would end the process on the spot, with no word and no
clean-up. :func:`ending_on_signals` makes SIGTERM raise :class:`Terminated`, a
``KeyboardInterrupt`` that remembers its signal, so every ``except KeyboardInterrupt`` (the
sweep's resumable stop, the atomic writers' removal of their temporary file, the command line's
error boundary) handles both alike, and the command exits with ``128 + signal`` as a shell
reports a process killed by it (130 for SIGINT, 143 for SIGTERM).

This module imports nothing of allocsim, so the entry point installs it before the heavy
imports (numpy, the commands), where an early Ctrl-C would otherwise end in a traceback.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["Terminated", "ending_on_signals", "exit_status", "signal_name"]


class Terminated(KeyboardInterrupt):
    """The process was asked to end by ``signum`` (SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def exit_status(interrupt: BaseException) -> int:
    """The exit status of a process ended by this interrupt: ``128 + signal``."""
    return 128 + int(getattr(interrupt, "signum", signal.SIGINT))


def signal_name(interrupt: BaseException) -> str:
    """``SIGINT`` or ``SIGTERM``: which signal the interrupt came from."""
    return signal.Signals(int(getattr(interrupt, "signum", signal.SIGINT))).name


@contextmanager
def ending_on_signals() -> Iterator[None]:
    """While inside: SIGTERM raises :class:`Terminated` in the main thread (once; a second
    SIGTERM while it is being handled is ignored, so clean-up is not cut short). SIGINT is
    left as it is: Python's default raises ``KeyboardInterrupt``, and a job started with
    SIGINT ignored keeps ignoring it. The previous handler comes back on leaving. Outside
    the main thread (where Python allows no handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False
    owner = os.getpid()

    def terminate(signum: int, frame: FrameType | None) -> None:
        nonlocal raised
        if os.getpid() != owner:
            # A forked child (a sweep's worker) that has not yet set its own handlers: it
            # ends as SIGTERM's default ends it, with nothing printed, not with an exception.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if raised:
            return
        raised = True
        raise Terminated(signum)

    previous: Any = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
