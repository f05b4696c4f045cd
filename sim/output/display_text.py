"""Text a user gave (a trace's name, a policy spec), bounded for display (issue 36.8).

Names are drawn into figures, headings and tables. A trace named with 400 KB of text took
matplotlib most of a minute per figure, glyph by glyph in its C++ (where a SIGTERM waits for
it), and padded every row of a terminal table to its width. Displays show a name's start and an
ellipsis; results.json, and every file meant for a program, keep it whole.
"""

from __future__ import annotations

__all__ = ["MAX_SHOWN", "shown"]

MAX_SHOWN = 120     # characters of a name a display shows: a figure title's width at 10 pt


def shown(text: object, most: int = MAX_SHOWN) -> str:
    """``text`` as a display shows it: whole up to ``most`` characters, else its first
    ``most`` − 1 and an ellipsis."""
    value = str(text)
    return value if len(value) <= most else value[:most - 1] + "…"
