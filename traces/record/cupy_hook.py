"""A CuPy memory hook that records an allocation trace of the program it runs in.

Follows CuPy's cupy/cuda/memory_hook.pyx and cupy/cuda/memory.pyx: CuPy calls a memory hook's
keyword callbacks ``malloc_postprocess(device_id, size, mem_size, mem_ptr, pmem_id)`` after
every request to its memory pool, ``free_postprocess(device_id, mem_size, mem_ptr, pmem_id)``
after a buffer goes back to the pool, and ``alloc_postprocess(device_id, mem_size, mem_ptr)``
after a pool miss (cudaMalloc). CuPy gives neither time nor stream, so
:class:`TraceRecorderHook` adds ``time.perf_counter_ns()`` (from the start of recording), the
current stream (``cupy.cuda.get_current_stream().ptr``; 0 without CuPy) and the Python call site
(``file:line:function`` of the first frame outside CuPy and outside this package) itself.

Events are kept in memory as compact ``array('q')`` columns (about 80 bytes per event) and,
when recording ends, turned into a :class:`~allocsim.traces.model.Trace` by the same code that
imports CuPy hook logs (:func:`allocsim.traces.formats.cupy_log.hook_events_to_trace`), so a
recorded trace and the import of its log agree. The trace is saved with
:func:`allocsim.traces.formats.save` (format from the extension: ``.npz``, ``.csv``,
``.jsonl``, ...) and, if asked, the raw hook calls as a CuPy JSON-lines log (format (a) of
:mod:`allocsim.traces.formats.cupy_log`).

When CuPy is importable the class subclasses ``cupy.cuda.memory_hook.MemoryHook``, and ``with
hook:`` registers it the way CuPy does (per thread: only the thread that entered is recorded).
Without CuPy it is a plain object with the same callbacks, so it can be driven directly
(tests, or a program that reports its own allocations).
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time
import warnings
from array import array
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType, ModuleType
from typing import Any

from allocsim.atomic_files import atomic_output
from allocsim.errors import UserInputError
from allocsim.traces.formats.cupy_log import (
    HOOK_ALLOC,
    HOOK_FREE,
    HOOK_MALLOC,
    HookEvents,
    hook_events_to_trace,
    write_hook_log,
)
from allocsim.traces.model import NO_TAG, Trace
from allocsim.traces.record.recording_end import (
    SavedOnce,
    claimed,
    finished,
    leave_if_forked,
    recorder_header,
    trace_name,
)
from allocsim.traces.record.script_args import as_main, run_as_main, script_metadata, split_argv

__all__ = ["CUPY_AVAILABLE", "TraceRecorderHook", "active_recorder", "run_script"]

RECORDER = "allocsim TraceRecorderHook (CuPy memory hooks)"
_COLUMNS = ("hook", "t", "device", "size", "mem_size", "ptr", "pmem_id", "stream", "tag")


def _import_cupy() -> tuple[type, ModuleType | None]:
    """``(MemoryHook base class, cupy module)``, or ``(object, None)`` without CuPy."""
    try:
        import cupy
        from cupy.cuda import memory_hook
        return memory_hook.MemoryHook, cupy
    except Exception:  # not installed, or installed without a usable CUDA library
        return object, None


_MemoryHook, _cupy = _import_cupy()
CUPY_AVAILABLE = _cupy is not None
_ACTIVE: list[TraceRecorderHook] = []  # recorders inside their with-block, innermost last


def active_recorder() -> TraceRecorderHook | None:
    """The innermost recorder whose with-block is running (e.g. the one :func:`run_script`
    installed), or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def _default_stream() -> Callable[[], int]:
    if _cupy is None:
        return lambda: 0
    get_stream = _cupy.cuda.get_current_stream

    def current() -> int:
        try:
            return int(get_stream().ptr)
        except Exception:  # no CUDA context yet (e.g. callbacks driven without a device)
            return 0
    return current


def _skipped_dirs() -> tuple[str, ...]:
    """Directories whose frames are not call sites: this package and CuPy's packages."""
    dirs = [str(Path(__file__).resolve().parent)]
    cupy_file = getattr(_cupy, "__file__", None) if _cupy is not None else None
    if cupy_file:
        site = Path(cupy_file).resolve().parent.parent
        dirs += [str(site / name) for name in ("cupy", "cupyx", "cupy_backends")]
    return tuple(d + os.sep for d in dirs)


class TraceRecorderHook(SavedOnce, _MemoryHook):  # type: ignore[misc, valid-type]
    """Records CuPy memory-pool hooks; saves a trace (and optionally a hook log) on close.

    ``output``: trace file written by :meth:`close` (None: keep in memory only); ``log``: also
    write the hook calls as a CuPy JSON-lines log; ``device_index``: device whose events form
    the trace (default: the busiest); ``call_sites``: tag events with the Python call site;
    ``stream``: a function returning the current stream handle (default: CuPy's current
    stream, or 0 without CuPy); ``metadata``: added to the trace's metadata.
    """

    name = "allocsim-trace-recorder"  # CuPy's key for the hook in its per-thread registry

    def __init__(self, output: str | os.PathLike[str] | None = None, *,
                 log: str | os.PathLike[str] | None = None, device_index: object = None,
                 call_sites: bool = True, stream: Callable[[], int] | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        self.claim(output)  # now: before the program runs (it may change folder)
        self.log = claimed(log)
        self.device_index = device_index
        self.call_sites = call_sites
        self.metadata = dict(metadata or {})
        self.trace: Trace | None = None  # set by close()
        self._stream = stream or _default_stream()
        self._cols = {name: array("q") for name in _COLUMNS}
        self._tags: list[str] = []
        self._tag_of: dict[tuple[CodeType, int], int] = {}
        self._skip = _skipped_dirs()
        self._cwd = os.getcwd() + os.sep
        self._lock = threading.Lock()
        self._t0 = time.perf_counter_ns()
        self._started = False
        self._closed = False

    # ------------------------------------------------------------------ with-block
    def __enter__(self) -> TraceRecorderHook:
        if not self._started and not len(self):
            self._t0 = time.perf_counter_ns()  # times count from the start of recording
        self._started = True
        if _MemoryHook is not object:
            super().__enter__()  # CuPy registers the hook for this thread
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            if _MemoryHook is not object:
                super().__exit__(*exc_info)
        finally:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            self.close()

    # ------------------------------------------------------------------ CuPy callbacks
    def alloc_postprocess(self, **kwargs: Any) -> None:
        """A pool miss: CuPy cudaMalloc'ed ``mem_size`` bytes."""
        self._record(HOOK_ALLOC, kwargs.get("device_id", 0), -1, kwargs.get("mem_size", 0),
                     kwargs.get("mem_ptr", 0), -1)

    def malloc_postprocess(self, **kwargs: Any) -> None:
        """A request of ``size`` bytes, served at ``mem_ptr`` (0 if it failed)."""
        self._record(HOOK_MALLOC, kwargs.get("device_id", 0), kwargs.get("size", 0),
                     kwargs.get("mem_size", 0), kwargs.get("mem_ptr", 0),
                     kwargs.get("pmem_id", 0))

    def free_postprocess(self, **kwargs: Any) -> None:
        """The buffer at ``mem_ptr`` went back to the pool."""
        self._record(HOOK_FREE, kwargs.get("device_id", 0), -1, kwargs.get("mem_size", 0),
                     kwargs.get("mem_ptr", 0), kwargs.get("pmem_id", 0))

    def _record(self, hook: int, device: int, size: int, mem_size: int, ptr: int,
                pmem_id: int) -> None:
        t = time.perf_counter_ns() - self._t0
        stream = self._stream()
        tag = self._call_site() if self.call_sites else NO_TAG
        values = (hook, t, device, size, mem_size, ptr, pmem_id, stream, tag)
        with self._lock:  # one event's columns stay aligned if threads share the hook
            for column, value in zip(self._cols.values(), values):
                column.append(value)

    def _call_site(self) -> int:
        """Tag index of the first frame outside CuPy and this package (cached per line)."""
        try:
            frame: FrameType | None = sys._getframe(3)  # _call_site, _record, the callback
        except ValueError:  # called from a shallower stack than CuPy's callbacks
            frame = None
        skip = self._skip
        while frame is not None and frame.f_code.co_filename.startswith(skip):
            frame = frame.f_back
        if frame is None:
            return NO_TAG
        key = (frame.f_code, frame.f_lineno)
        tag = self._tag_of.get(key)
        if tag is None:
            code = frame.f_code
            filename = code.co_filename
            if filename.startswith(self._cwd):
                filename = filename[len(self._cwd):]
            tag = self._tag_of[key] = len(self._tags)
            self._tags.append(f"{filename}:{frame.f_lineno}:{code.co_name}")
        return tag

    # ------------------------------------------------------------------ results
    def __len__(self) -> int:
        return len(self._cols["hook"])

    def events(self) -> HookEvents:
        """The hook calls so far, as columns."""
        c = {name: column.tolist() for name, column in self._cols.items()}
        return HookEvents(hook=c["hook"], device=c["device"], size=c["size"],
                          mem_size=c["mem_size"], ptr=c["ptr"], pmem_id=c["pmem_id"],
                          stream=c["stream"], tag=c["tag"], tags=list(self._tags), t=c["t"])

    def build_trace(self) -> Trace:
        """The trace of the hook calls so far (validated leniently, times never backwards)."""
        meta = recorder_header(RECORDER, cupy=getattr(_cupy, "__version__", None))
        meta.update(self.metadata)
        # Threads sharing one hook may append slightly out of time order: finished() keeps
        # time from going back.
        return finished(hook_events_to_trace(
            self.events(), source=self.output or "<cupy recorder>",
            name=trace_name(self.output, "cupy-recording"), device_index=self.device_index,
            metadata=meta))

    def save_more(self, trace: Trace) -> None:
        """The raw hook calls as a CuPy JSON-lines log, when ``log`` is given."""
        if self.log is not None:
            with atomic_output(self.log) as stream:
                meta = {k: v for k, v in trace.metadata.items()
                        if k in ("recorder", "cupy", "python", "recorded_at")
                        or k in self.metadata}
                write_hook_log(self.events(), stream, meta)


# ====================================================================== run a script
CUPY_MISSING = ("record: CuPy is not installed (pip install cupy-cuda12x); the recorder hooks "
                "CuPy's allocator")


def _require_cupy() -> None:
    """Refuse (one line) unless CuPy was importable when this module loaded and still is."""
    if _cupy is None:
        raise UserInputError(CUPY_MISSING)
    try:
        import cupy  # noqa: F401  (sys.modules['cupy'] = None makes it unimportable)
    except ImportError:
        raise UserInputError(CUPY_MISSING) from None


def run_script(argv: list[str], output: str | os.PathLike[str], *,
               log: str | os.PathLike[str] | None = None, device_index: object = None,
               metadata: dict[str, Any] | None = None, require_cupy: bool = False) -> Trace:
    """Run a Python script (``runpy``, as ``__main__``, with ``sys.argv`` set) under a
    :class:`TraceRecorderHook`, save its trace to ``output`` and return it.

    ``argv`` is ``[python] script.py args...`` or ``[python] -m module args...``. The trace is
    saved even when the script fails; a failure (an exception, or ``SystemExit`` with a
    nonzero code) is then re-raised. Inside the script :func:`active_recorder` is the
    recorder. Without CuPy nothing calls the hook, so a RuntimeWarning says so; with
    ``require_cupy`` (the command line) a :class:`UserInputError` refuses before the script
    runs or anything is written.
    """
    script, module, args = split_argv(argv)
    if script is not None and not Path(script).is_file():
        # errno, strerror, filename: the command line prints "SCRIPT: no such script".
        raise FileNotFoundError(errno.ENOENT, "no such script", script)
    if require_cupy:
        _require_cupy()
    if _cupy is None:
        warnings.warn("CuPy is not importable: only allocations reported to the recorder "
                      "directly will be recorded", RuntimeWarning, stacklevel=2)
    meta = script_metadata(script, module, argv, metadata)
    recording_pid = os.getpid()
    with as_main(script, module, args):
        hook = TraceRecorderHook(output, log=log, device_index=device_index, metadata=meta)
        try:
            with hook:
                run_as_main(script, module)
        except SystemExit as stop:
            leave_if_forked(recording_pid, stop.code if isinstance(stop.code, int)
                            else 0 if stop.code is None else 1)
            if stop.code not in (None, 0):
                raise
        except BaseException:
            leave_if_forked(recording_pid, 1)
            raise
    leave_if_forked(recording_pid, 0)      # a child the script forked wrote nothing
    assert hook.trace is not None
    return hook.trace
