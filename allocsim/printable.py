"""Names as a terminal may safely show them: one line, no control codes.

A file name may hold a newline, a carriage return or an escape sequence (``\\x1b[2J`` clears a
terminal); printed raw it splits allocsim's one-line message in two, or acts on the terminal
of whoever reads it. :func:`printable` writes such characters as Python's ``repr`` does
(``\\n``, ``\\x1b``, ``\\udcff`` for a byte that was not UTF-8), and leaves everything else —
letters of any script, spaces, punctuation — as it is, so ordinary names print unchanged.

This module imports nothing of allocsim, so every room may use it.
"""

from __future__ import annotations

import os
import unicodedata

__all__ = ["printable"]

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


def printable(value: object) -> str:
    """``value`` (a path, a name, a whole message) as text safe to print on one line."""
    text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    if text.isprintable():
        return text
    return "".join(_shown(char) for char in text)
