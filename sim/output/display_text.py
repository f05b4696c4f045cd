"""Text a user gave (a trace's name, a policy spec), bounded for display (issue 36.8).

Names are drawn into figures, headings and tables. A trace named with 400 KB of text took
matplotlib most of a minute per figure, glyph by glyph in its C++ (where a SIGTERM waits for
it), and padded every row of a terminal table to its width. Displays show a name's start and an
ellipsis; results.json, and every file meant for a program, keep it whole. A display shows a
name escaped as :func:`allocsim.printable.printable` escapes it (issue 56.13): an escape
sequence, a bell or a bidi override in a name reaches no terminal, figure or page raw.
"""

from __future__ import annotations

from allocsim.printable import printable

__all__ = ["MAX_SHOWN", "shown"]

MAX_SHOWN = 120     # characters of a name a display shows: a figure title's width at 10 pt


def shown(text: object, most: int = MAX_SHOWN) -> str:
    """``text`` as a display shows it: escaped (:func:`printable`), whole up to ``most``
    characters, else its first ``most`` − 1 and an ellipsis."""
    return printable(text, most)
