"""A README's generated part: the text between two HTML-comment markers, read and replaced.

Every generated section (results, populations, sensitivity, the TPU findings) is written as
``START\\nBODY\\nEND`` and read back as BODY; a README without the markers gets them appended
under a heading, so hand-written text around them is never touched.
"""

from __future__ import annotations

from pathlib import Path

from allocsim.atomic_files import write_text


def between(text: str, start: str, end: str) -> str | None:
    """The body between the markers (the newline after ``start`` and before ``end`` left out),
    or None when either marker is missing."""
    if start not in text or end not in text:
        return None
    body = text.split(start, 1)[1].split(end, 1)[0]
    body = body[1:] if body.startswith("\n") else body
    return body[:-1] if body.endswith("\n") else body


def with_between(text: str, start: str, end: str, body: str, heading: str) -> str:
    """``text`` with ``body`` between the markers; without them, appended under ``heading``."""
    if start not in text or end not in text:
        text = text.rstrip() + f"\n\n{heading}\n\n{start}\n{end}\n"
    head, rest = text.split(start, 1)
    return f"{head}{start}\n{body}\n{end}{rest.split(end, 1)[1]}"


def write_between(path: Path, start: str, end: str, body: str, heading: str) -> None:
    """:func:`with_between` on the file at ``path``, written atomically."""
    write_text(path, with_between(path.read_text(), start, end, body, heading))
