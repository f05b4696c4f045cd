"""The end every recorder shares: its trace's header and name, time that never goes back, a
lenient check, and the file written once.

A recorder (CuPy hook, PyTorch meta, JAX) keeps its own events and builds its own
:class:`~allocsim.traces.model.Trace` from them (:meth:`SavedOnce.build_trace`); what comes
before and after that is the same for all of them and lives here:

- :func:`recorder_header`: the metadata every recording opens with — the recorder, the
  framework's version, Python's, and when (UTC, seconds);
- :func:`trace_name`: the trace is named after its file (``run.npz`` -> ``run``), or the
  recorder's own name when it is kept in memory;
- :func:`finished`: times made non-decreasing (threads sharing a hook, or a clock read twice,
  can append slightly out of order) and the lenient recording check
  (:func:`~allocsim.traces.validate.validate_recording`, which repairs what it can);
- :class:`SavedOnce`: ``close()`` builds the trace and writes ``output`` once, however often
  it is called (a with-block's exit, a signal handler, an interpreter's exit can all ask), and
  only in the process that started recording (a forked child that runs on to the script's
  end writes nothing; :func:`leave_if_forked` ends it there);
- :func:`claimed`: the output claimed when the recorder is made, before the program runs
  (:func:`~allocsim.atomic_files.claim_output`: a path made absolute, so a program that
  changes its working folder cannot move it, and a file written there meanwhile is not
  replaced).
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.atomic_files import OutputClaim, claim_output
from allocsim.traces.formats import save
from allocsim.traces.model import Trace
from allocsim.traces.validate import validate_recording

__all__ = ["SavedOnce", "claimed", "finished", "leave_if_forked", "recorder_header",
           "trace_name"]


def claimed(output: str | os.PathLike[str] | None) -> OutputClaim | None:
    """``output`` claimed now (None stays None: a recording kept in memory). A recording cannot
    simply be made again, so one that may not replace the file is kept beside it."""
    return None if output is None else claim_output(output, keep_refused=True)


def leave_if_forked(recording_pid: int, status: int) -> None:
    """In a process forked by the recorded program (not ``recording_pid``), which ran on to
    the program's end: end it now with ``status``, as the program's own end would, before
    allocsim writes or prints anything a second time."""
    if os.getpid() == recording_pid:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def recorder_header(recorder: str, **versions: Any) -> dict[str, Any]:
    """``{"recorder": ..., <framework>: <version>, "python": ..., "recorded_at": ...}``."""
    return {"recorder": recorder, **versions, "python": platform.python_version(),
            "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds")}


def trace_name(output: str | None, fallback: str) -> str:
    """The trace's name: its file's name up to the first dot, else ``fallback``."""
    return Path(output).name.split(".")[0] if output else fallback


def finished(trace: Trace) -> Trace:
    """``trace`` with times that never go backwards, validated leniently."""
    if len(trace):
        trace.time_ns = np.maximum.accumulate(trace.time_ns)
    trace, _ = validate_recording(trace)
    return trace


class SavedOnce:
    """A recorder's ``close()``: the trace built and ``output`` written once.

    The recorder calls :meth:`claim` with its output (a path, or None to keep the
    trace in memory only), sets ``trace = None`` and ``_closed = False`` and implements
    :meth:`build_trace`; :meth:`save_more` writes anything else it keeps (CuPy's raw hook log).
    Only the process that made the recorder writes.
    """

    output: str | None
    output_claim: OutputClaim | None
    trace: Trace | None
    _closed: bool
    _recording_pid: int

    def claim(self, output: str | os.PathLike[str] | None) -> None:
        """Claim ``output`` now (:func:`claimed`); ``output`` is then its absolute path."""
        self.output_claim = claimed(output)
        self.output = None if self.output_claim is None else os.fspath(self.output_claim)
        self._recording_pid = os.getpid()

    def in_recording_process(self) -> bool:
        return os.getpid() == getattr(self, "_recording_pid", os.getpid())

    def build_trace(self) -> Trace:
        raise NotImplementedError

    def save_more(self, trace: Trace) -> None:
        """Files besides ``output`` (none by default)."""

    def close(self) -> Trace:
        """Build the trace and write ``output`` once; returns the trace."""
        if self._closed and self.trace is not None:
            return self.trace
        self._closed = True
        self.trace = self.build_trace()
        if not self.in_recording_process():
            return self.trace       # a forked child: the recording process writes
        if self.output_claim is not None:
            save(self.trace, self.output_claim)
        self.save_more(self.trace)
        return self.trace
