"""Run a Python script under the JAX recorder (``allocsim record --framework jax``).

:func:`record_script` runs ``[python] script.py args`` (or ``-m module``) as ``__main__`` inside
a :class:`~allocsim.traces.record.jax_recorder.recorder.JaxRecorder` and saves the trace however the
script ends: normally, by its own exception or ``sys.exit(n)``, by Ctrl-C or SIGTERM (the
command line turns SIGTERM into an exception, :mod:`allocsim.interrupts`; without it the
recorder's own handler saves, :mod:`~allocsim.traces.record.abrupt_end`), or by ``os._exit(n)``.
A trace the script did not finish says why in its metadata, ``partial``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocsim.interrupts import exit_status
from allocsim.traces.model import Trace
from allocsim.traces.record.abrupt_end import partial_reason
from allocsim.traces.record.jax_recorder import internals as jax_internals
from allocsim.traces.record.jax_recorder.recorder import JaxRecorder
from allocsim.traces.record.jax_recorder.target import TargetRecorder
from allocsim.traces.record.recording_end import leave_if_forked
from allocsim.traces.record.script_args import as_main, run_as_main, script_metadata, split_argv

__all__ = ["ScriptRun", "record_script", "run_script"]


@dataclass
class ScriptRun:
    """What :func:`record_script` ran: the trace (saved), the script's exit status and, when
    it did not finish, the exception it ended with and why the trace is partial."""

    trace: Trace
    exit_status: int
    error: BaseException | None
    partial: str | None = None


def record_script(argv: list[str], output: str | os.PathLike[str], *, device: int = 0,
                  metadata: dict[str, Any] | None = None,
                  on_abrupt_end: Callable[[Trace, str], None] | None = None,
                  target: str | None = None) -> ScriptRun:
    """Run a Python script (``runpy``, as ``__main__``, with ``sys.argv`` set) under a
    :class:`JaxRecorder` and save its trace to ``output``, whether or not it finishes.

    Refused before anything runs or is written (:class:`UserInputError`, one line): no
    script, JAX not installed, a JAX version the hooks were not tested against. A Ctrl-C or
    SIGTERM ends the run with status 130 or 143 and its error; ``os._exit(n)`` ends the
    process after saving and calling ``on_abrupt_end(trace, reason)``.

    ``target`` (a TPU, ``tpu-v5e``): the script runs here on the CPU and the trace is what
    that TPU's runtime would hold (:class:`~allocsim.traces.record.jax_recorder.target.
    TargetRecorder`; ``os._exit`` is not followed there).
    """
    recording_pid = os.getpid()
    script, module, args = split_argv(argv)
    if script is not None and not Path(script).is_file():
        raise FileNotFoundError(errno.ENOENT, "no such script", script)
    jax_internals.check_version()
    meta = script_metadata(script, module, argv, metadata)
    status: int = 0
    error: BaseException | None = None
    with as_main(script, module, args):
        recorder: JaxRecorder | TargetRecorder
        if target is None:
            recorder = JaxRecorder(output, device=device, metadata=meta,
                                   on_abrupt_end=on_abrupt_end)
        else:
            recorder = TargetRecorder(output, target, metadata=meta)
        with recorder:
            try:
                run_as_main(script, module)
            except SystemExit as stop:
                if stop.code not in (None, 0):
                    status = stop.code if isinstance(stop.code, int) else 1
                    error = stop
            except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM (the command line)
                status, error = exit_status(interrupt), interrupt
            except BaseException as failure:  # the script's own error, reported by the caller
                status, error = 1, failure
            if error is not None:
                recorder.metadata["partial"] = partial_reason(error) or "ended early"
    leave_if_forked(recording_pid, status)     # a child the script forked wrote nothing
    assert recorder.trace is not None
    return ScriptRun(recorder.trace, status, error, recorder.metadata.get("partial"))


def run_script(argv: list[str], output: str | os.PathLike[str], *, device: int = 0,
               metadata: dict[str, Any] | None = None) -> Trace:
    """:func:`record_script`, then, as the CuPy recorder's ``run_script`` does, re-raise the
    script's failure (an exception, ``SystemExit`` with a nonzero code, the interrupt) after
    saving."""
    run = record_script(argv, output, device=device, metadata=metadata)
    if run.error is not None:
        raise run.error
    return run.trace

