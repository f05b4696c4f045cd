"""Tags for the allocations of a PyTorch memory snapshot, read off their stacks.

Each alloc is tagged with the first frame of its stack that is in user code, as
``file:line:name`` (base name of the file, as ``torch/cuda/_memory_viz.py``'s ``_frame_fmt``),
with the frames ``_memory_viz._frame_filter`` / MemoryViz.js's ``frameFilter`` omit left out.
C++-only stacks of the backward pass are tagged by their autograd node or ATen op. The stack
itself is kept once per tag (at most :data:`MAX_STACK_FRAMES` frames). The snapshot writer
reads tags back into frames with :func:`tag_text` as the check that they re-import the same.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from allocsim.traces.formats.torch_snapshot.shape import is_int
from allocsim.traces.model import NO_TAG

__all__ = ["MAX_STACK_FRAMES", "TAG_FILENAME", "Tagger", "frame_parts", "tag_text"]

MAX_STACK_FRAMES = 64
# The file name of a frame that carries a bare tag, not a call site (writer.py's
# _frames_of_tags writes them; tag_text reads them back).
TAG_FILENAME = "<tag>"


@cache
def _frame_filter(name: str, filename: str) -> bool:
    """_memory_viz._frame_filter / MemoryViz.js frameFilter: drop the allocator's own,
    dispatcher and interpreter frames."""
    omit_functions = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp",
                      "_start", "__libc_start_main", "PyEval_", "PyObject_", "PyFunction_")
    omit_filenames = ("core/boxing", "/Register", "/Redispatch", "pythonrun.c",
                      "Modules/main.c", "Objects/call.c", "Objects/methodobject.c",
                      "pycore_ceval.h", "ceval.c", "cpython/abstract.h")
    return not (any(f in name for f in omit_functions)
                or any(f in filename for f in omit_filenames))


_STDLIB = re.compile(r"[\\/]lib[\\/]python\d")
_LIBRARY_PARTS = ("/torch/", "\\torch\\", "site-packages", "dist-packages", "<frozen ")


@cache
def _is_python(filename: str) -> bool:
    """A Python source frame (C++ frames are '??', '' or a .cpp/.h file, with line 0)."""
    return filename.endswith((".py", ".pyx")) or (
        filename.startswith("<") and filename.endswith(">") and len(filename) > 2)


@cache
def _is_user(name: str, filename: str) -> bool:
    """A Python frame outside torch, installed packages and the standard library."""
    if not _is_python(filename) or not _frame_filter(name, filename):
        return False
    if filename.startswith("torch/") or any(p in filename for p in _LIBRARY_PARTS):
        return False
    return not _STDLIB.search(filename)


MAX_LINE = (1 << 31) - 1


def frame_parts(frame: Any) -> tuple[str, int, str] | None:
    if not isinstance(frame, dict):
        return None
    filename, line, name = frame.get("filename", ""), frame.get("line", 0), frame.get("name", "")
    # A line number is a C int in CPython: anything else (a 5,000-digit one, which str() cannot
    # even print) is no line, as a non-integer one is.
    return (filename if isinstance(filename, str) else str(filename),
            int(line) if is_int(line) and 0 <= line <= MAX_LINE else 0,
            name if isinstance(name, str) else str(name))


def _basename(filename: str) -> str:
    return re.split(r"[\\/]", filename)[-1]


_AUTOGRAD_NODE = re.compile(r"torch::autograd::generated::(\w+)::apply\b")
_ATEN_OP = re.compile(r"^at::_ops::(\w+)::call\b")


def tag_text(parts: list[tuple[str, int, str]]) -> str | None:
    """The tag of a stack: its first user frame as ``file:line:name`` (base name, as
    _memory_viz._frame_fmt), else its first kept Python frame (a torch call site).

    Stacks recorded on the autograd engine's thread (the backward pass) have no Python
    frame at all; they are tagged by their autograd node (``autograd:MulBackward0``), else by
    their ATen op (``aten::mul``). None when there is nothing to go by. A single ``<tag>``
    frame is a bare tag written by
    :func:`~allocsim.traces.formats.torch_snapshot.writer.snapshot_of_run`.
    """
    if len(parts) == 1 and parts[0][0] == TAG_FILENAME:
        return parts[0][2]
    chosen = (next((p for p in parts if _is_user(p[2], p[0])), None)
              or next((p for p in parts if _is_python(p[0]) and _frame_filter(p[2], p[0])),
                      None))
    if chosen is not None:
        return f"{_basename(chosen[0])}:{chosen[1]}:{chosen[2]}"
    for pattern, prefix in ((_AUTOGRAD_NODE, "autograd:"), (_ATEN_OP, "aten::")):
        match = next((m for m in (pattern.search(p[2]) for p in parts) if m), None)
        if match:
            return prefix + match[1]
    return None


class Tagger:
    """Tags allocations by call site and keeps one stack per tag.

    The frame lists of a snapshot are shared objects (PyTorch dedups identical tracebacks),
    so results are cached by the list's identity while the unpickled data is alive.
    """

    def __init__(self) -> None:
        self.tags: list[str] = []
        self.index: dict[str, int] = {}
        self.stacks: dict[str, list[str]] = {}
        self._by_list: dict[int, int] = {}

    def intern(self, tag: str) -> int:
        code = self.index.get(tag)
        if code is None:
            code = self.index[tag] = len(self.tags)
            self.tags.append(tag)
        return code

    def __call__(self, frames: Any) -> int:
        if not isinstance(frames, list) or not frames:
            return NO_TAG
        key = id(frames)
        code = self._by_list.get(key)
        if code is None:
            code = self._by_list[key] = self._tag_of(frames)
        return code

    def _tag_of(self, frames: list[Any]) -> int:
        parts = [p for p in map(frame_parts, frames) if p is not None]
        tag = tag_text(parts)
        if tag is None:
            return NO_TAG
        if tag not in self.stacks:
            self.stacks[tag] = [f"{f}:{line}:{n}" for f, line, n in parts
                                if _frame_filter(n, f)][:MAX_STACK_FRAMES]
        return self.intern(tag)
