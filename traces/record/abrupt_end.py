"""Save a recording when its process ends without unwinding the recorder's with-block.

Two ends skip every ``finally`` and ``__exit__``: ``os._exit(n)`` (a program's hard exit,
multiprocessing's workers) and SIGTERM under its default action (a job scheduler's kill, a
container stopping: the process dies on the spot). While a recorder runs, :class:`AbruptEnd`

- replaces ``os._exit`` with a function that calls ``save("os._exit(n)")`` first, then the real
  ``os._exit(n)`` (the exit status is the program's);
- sets a SIGTERM handler, only where the main thread has the default action (a handler the
  program or allocsim's command line set is left alone: it decides, and the with-block's exit
  saves when it unwinds), that calls ``save("terminated by SIGTERM")`` and then dies of SIGTERM
  as the default action would (exit status 143 in a shell).

A forked child inherits both and saves nothing: only the process that started recording
saves. What no handler can catch (SIGKILL, the kernel's OOM killer, a crash in native code)
still loses the recording.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from allocsim.printable import printable

__all__ = ["AbruptEnd", "partial_reason"]


class AbruptEnd:
    """Calls ``save(reason)`` once if the process ends by ``os._exit`` or SIGTERM between
    :meth:`install` and :meth:`uninstall`."""

    def __init__(self, save: Callable[[str], None]) -> None:
        self._save = save
        self._pid = -1
        self._saved = False
        self._real_exit: Callable[[int], Any] | None = None
        self._exit: Callable[[int], Any] | None = None
        self._handler: Callable[[int, FrameType | None], None] | None = None

    def _fire(self, reason: str) -> None:
        if self._saved or os.getpid() != self._pid:
            return
        self._saved = True
        try:
            self._save(reason)
        except Exception as err:   # the process ends next: say, in one line, why nothing is saved
            print(f"allocsim: error: {printable(err)}", file=sys.stderr, flush=True)

    def install(self) -> None:
        self._pid = os.getpid()
        real_exit = self._real_exit = os._exit

        def exit_after_saving(status: int) -> Any:
            try:
                self._fire(f"os._exit({status})")
            finally:
                real_exit(status)

        self._exit = exit_after_saving
        setattr(os, "_exit", exit_after_saving)  # noqa: B010 (mypy: _exit is NoReturn)
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

            def die_after_saving(signum: int, frame: FrameType | None) -> None:
                try:
                    self._fire(f"terminated by {signal.Signals(signum).name}")
                finally:
                    signal.signal(signum, signal.SIG_DFL)
                    os.kill(os.getpid(), signum)

            self._handler = die_after_saving
            signal.signal(signal.SIGTERM, die_after_saving)

    def uninstall(self) -> None:
        """Put back what :meth:`install` replaced, where nobody replaced it since."""
        if self._exit is not None and os._exit is self._exit and self._real_exit is not None:
            setattr(os, "_exit", self._real_exit)  # noqa: B010
        self._exit = None
        if self._handler is not None and \
                threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is self._handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._handler = None


def partial_reason(error: BaseException) -> str | None:
    """Why a recording that ``error`` ended is partial (None: ``sys.exit(0)``, a normal end)."""
    if isinstance(error, SystemExit):
        return None if error.code in (None, 0) else f"sys.exit({error.code!r})"
    if isinstance(error, KeyboardInterrupt):
        signum = int(getattr(error, "signum", signal.SIGINT))
        return f"{'terminated' if signum == signal.SIGTERM else 'interrupted'} by " \
               f"{signal.Signals(signum).name}"
    return f"the program failed: {type(error).__name__}"
