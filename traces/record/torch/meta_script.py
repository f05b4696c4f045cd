"""Run a PyTorch script under the meta recorder (``allocsim record --framework pytorch``).

:func:`record_script` runs ``[python] script.py args`` (or ``-m module``) as ``__main__``
inside a :class:`~allocsim.traces.record.torch.meta.TorchMetaRecorder` and saves the trace
whatever happens: the script's own failure (an exception, ``sys.exit(n)``), a value read on
the meta device (:class:`~allocsim.traces.record.torch.meta.ValueReadError`), an op with no
meta kernel (a CUDA-only extension), Ctrl-C, or SIGTERM (a handler turns it into an
exception at the next bytecode, so the recorder's exit runs and the partial trace is written;
the exit status is then 143, as a process killed by SIGTERM reports it to a shell). A script
that puts nothing on "cuda" is refused after it ran (nothing is written): a recording of
nothing answers no question, and it usually means the script chose its device some other way.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from allocsim.atomic_files import OutputClaim
from allocsim.errors import UserInputError
from allocsim.interrupts import exit_status
from allocsim.traces.model import Trace
from allocsim.traces.record.abrupt_end import AbruptEnd, partial_reason
from allocsim.traces.record.recording_end import claimed, leave_if_forked
from allocsim.traces.record.script_args import as_main, run_as_main, script_metadata, split_argv
from allocsim.traces.record.torch.meta import TorchMetaRecorder, ValueReadError

__all__ = ["ScriptRun", "Terminated", "record_script"]


class Terminated(BaseException):
    """SIGTERM arrived while the script ran (a BaseException: ``except Exception`` in the
    script does not swallow it)."""


@dataclass
class ScriptRun:
    """What :func:`record_script` ran: the trace (saved), the exit status, and the error the
    script ended with (None when it finished), with a one-line explanation when allocsim has
    one (a value read, an op without a meta kernel, SIGTERM)."""

    trace: Trace
    exit_status: int
    error: BaseException | None
    explanation: str | None = None


def _no_meta_kernel(error: BaseException) -> str | None:
    """The op an error says has no meta kernel: "Could not run 'ns::op' with arguments from
    the 'Meta' backend" (an ATen-registered op) or "ns::op: attempted to run this operator
    with Meta tensors, but there was no fake impl or Meta kernel" (a torch.library op)."""
    text = str(error)
    if "'Meta' backend" in text and "Could not run" in text:
        start = text.find("'") + 1
        return text[start:text.find("'", start)]
    if "attempted to run this operator with Meta tensors" in text:
        return text.split(": attempted to run", 1)[0].strip()
    return None


def _script_line(error: BaseException) -> str:
    """``file:line`` of the innermost traceback frame in the script (not torch, not allocsim)."""
    where = "<script>"
    tb = error.__traceback__
    here = os.path.dirname(os.path.abspath(__file__))
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if os.sep + "torch" + os.sep not in name and not name.startswith(here) \
                and "runpy" not in name and "<frozen" not in name:
            where = f"{name}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def record_script(argv: list[str], output: str | os.PathLike[str], *,
                  on_abrupt_end: Callable[[Trace, str], None] | None = None,
                  **options: Any) -> ScriptRun:
    """Run a script under a :class:`TorchMetaRecorder` (``options`` go to it) and save its
    trace to ``output``, whether or not the script fails (see the module docstring).

    ``output`` is claimed before the script runs (an absolute path; a file the script writes
    there is not replaced, the trace is kept beside it). A script that ends by ``os._exit(n)``
    saves its partial trace and calls ``on_abrupt_end(trace, reason)`` before the process ends; a
    process the script forked ends at the script's end, writing nothing.

    Refused before anything runs (one line): no script, torch not installed.
    """
    target = claimed(output)
    assert target is not None
    recording_pid = os.getpid()
    script, module, args = split_argv(argv)
    if script is not None and not Path(script).is_file():
        raise FileNotFoundError(errno.ENOENT, "no such script", script)
    try:
        import torch  # noqa: F401  (imported here so a missing torch is refused up front)
    except ImportError:
        raise UserInputError("record --framework pytorch needs PyTorch 2.13 or 2.14: pip "
                             "install 'torch>=2.13,<2.15' (the CPU build is enough; the CUDA "
                             "build needs no GPU)") from None
    meta = script_metadata(script, module, argv, options.pop("metadata", None))
    status = 0
    error: BaseException | None = None
    explanation: str | None = None
    namespace: dict[str, Any] | None = None  # kept to the end: its tensors are not freed early

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise Terminated()

    def save_abruptly(reason: str) -> None:
        """``os._exit(n)``: the with-block will not be left; save what was recorded."""
        recorder.stop()
        trace = _saved(recorder.build_trace(), target, reason)
        if on_abrupt_end is not None:
            on_abrupt_end(trace, reason)

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminate) if in_main else None
    abrupt = AbruptEnd(save_abruptly)   # SIGTERM is ours (above): it covers os._exit only
    try:
        with as_main(script, module, args), TorchMetaRecorder(None, metadata=meta,
                                                              **options) as recorder:
            abrupt.install()
            try:
                namespace = run_as_main(script, module)
            except SystemExit as stop:
                if stop.code not in (None, 0):
                    status = stop.code if isinstance(stop.code, int) else 1
                    error = stop
            except Terminated as stop:
                status, error = 128 + signal.SIGTERM, stop
                explanation = "terminated by SIGTERM"
            except ValueReadError as failure:
                status, error, explanation = 1, failure, str(failure)
            except KeyboardInterrupt as interrupt:   # Ctrl-C, or SIGTERM (the command line)
                status, error = exit_status(interrupt), interrupt
                explanation = partial_reason(interrupt)
            except BaseException as failure:  # the script's own error, reported by the caller
                status, error = 1, failure
                op = _no_meta_kernel(failure)
                if op is not None:
                    explanation = (f"{_script_line(failure)}: op '{op}' has no meta kernel (a "
                                   "CUDA-only extension?): register one with "
                                   "torch.library.register_fake, or record on a GPU")
            finally:
                abrupt.uninstall()
            recorder.stop()
            del namespace
    finally:
        if in_main:  # None: the handler was not set from Python; the default then
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    leave_if_forked(recording_pid, status)
    trace = recorder.trace
    assert trace is not None
    if error is None and len(trace) == 0:
        raise UserInputError(f"{meta['script']}: the program put nothing on 'cuda' (0 "
                             "allocations recorded); it must create its tensors on \"cuda\" "
                             "(nothing was written)")
    partial = None if error is None else \
        explanation or f"the script failed: {type(error).__name__}"
    return ScriptRun(_saved(trace, target, partial), status, error, explanation)


def _saved(trace: Trace, target: OutputClaim, partial: str | None) -> Trace:
    """``trace`` named after its file, marked ``partial`` when the script did not finish, and
    saved to ``target``."""
    from allocsim.traces.formats import save
    trace.metadata["source"] = os.fspath(target)
    trace.metadata["name"] = target.path.name.split(".")[0]
    if partial is not None:
        trace.metadata["partial"] = partial
    save(trace, target)
    return trace
