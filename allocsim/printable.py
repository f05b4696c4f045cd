"""Names as a terminal may safely show them: one line, no control codes.

A file name may hold a newline, a carriage return or an escape sequence (``\\x1b[2J`` clears a
terminal); printed raw it splits allocsim's one-line message in two, or acts on the terminal
of whoever reads it. :func:`printable` writes such characters as Python's ``repr`` does
(``\\n``, ``\\x1b``, ``\\udcff`` for a byte that was not UTF-8), and leaves everything else —
letters of any script, spaces, punctuation — as it is, so ordinary names print unchanged.

Every name a display shows goes through :func:`printable` — the tables' cells
(``format_table``), the figures' titles and labels (``sim/output/display_text.shown``, which
also bounds a name's length with ``most``), headings and one-line messages — and the command
line writes its standard output through :class:`PrintableStream`, the same rule over every
line it prints (newlines and tabs kept), so a name no display escaped still reaches no terminal
raw.

This module imports nothing of allocsim, so every room may use it.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterable
from typing import Any

__all__ = ["PrintableStream", "printable"]

# Unicode categories never shown raw: controls (C0, C1, DEL), format characters (bidi
# overrides that reorder a line), surrogates (undecodable bytes), unassigned and private use,
# line and paragraph separators.
_HIDDEN = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def _shown(char: str) -> str:
    if unicodedata.category(char) not in _HIDDEN:
        return char
    code = ord(char)
    if code < 0x100:
        return repr(char)[1:-1]     # \n, \t, \x1b, \x85
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(value: object, most: int | None = None) -> str:
    """``value`` (a path, a name, a whole message) as text safe to print on one line; with
    ``most``, at most that many characters of it: its first ``most`` − 1 and an ellipsis."""
    text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    if not text.isprintable():
        text = "".join(_shown(char) for char in text)
    if most is not None and len(text) > most:
        text = text[:max(most - 1, 0)] + "…"
    return text


def _lines_shown(text: str) -> str:
    """``text`` with every line :func:`printable`; its newlines and tabs kept."""
    if text.isprintable() or text.replace("\n", "").replace("\t", "").isprintable():
        return text
    return "\n".join("\t".join(printable(part) for part in line.split("\t"))
                     for line in text.split("\n"))


class PrintableStream:
    """A text stream (standard output) that writes what it is given with :func:`printable`'s
    rule applied line by line: newlines and tabs as they are, every other control or format
    character (an escape sequence, a bell, a bidi override) escaped. Everything else (``fileno``,
    ``isatty``, ``buffer``, ``flush``) is the stream's own."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    @property
    def wrapped(self) -> Any:
        """The stream written to."""
        return self._stream

    def write(self, text: str) -> int:
        self._stream.write(_lines_shown(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
