"""docs/contributing.md's "What a change touches" is read off the code, and held to it: every
file it names exists, and every name of code it gives (``NATIVE_SPECS``, ``kFamilies``,
``native_numbers()``) occurs in one of the files its own section names. A move or a rename
that leaves the page behind fails here (the page once sent a new policy to a ``PYTHON_ONLY``
list no test file had)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "contributing.md"
# Placeholders the page writes in paths and names (policies/NAME.py).
PLACEHOLDERS = re.compile(r"NAME|FMT|(?<![A-Za-z])X(?=[./]|$)")
PATH = re.compile(r"^[\w./-]+/[\w.-]+\.(py|hpp|cpp|md|toml|txt)$|^[\w/-]+/$")
CODE_NAME = re.compile(r"^[A-Za-z_]\w*(\(\))?$")


def sections() -> dict[str, str]:
    """The page's "What a change touches" sections, by heading."""
    text = PAGE.read_text()
    touches = text[text.index("## What a change touches"):]
    touches = touches[:touches.find("\n## ", 1)] if "\n## " in touches[1:] else touches
    parts = re.split(r"^### (.+)$", touches, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def quoted(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def test_the_page_walks_the_three_common_changes() -> None:
    assert list(sections()) == ["A new allocator policy", "A rule in both twins",
                                "A new trace format"]


@pytest.mark.parametrize("heading", sorted(sections()))
def test_every_file_the_page_names_exists(heading: str) -> None:
    paths = [q for q in quoted(sections()[heading])
             if PATH.match(q) and not PLACEHOLDERS.search(q)]
    assert paths, heading
    missing = [path for path in paths if not (ROOT / path).exists()]
    assert not missing, f"{heading}: docs/contributing.md names missing files {missing}"


@pytest.mark.parametrize("heading", sorted(sections()))
def test_every_name_the_page_gives_is_in_a_file_it_names(heading: str) -> None:
    text = sections()[heading]
    files = [ROOT / q for q in quoted(text) if PATH.match(q) and not PLACEHOLDERS.search(q)]
    sources = "\n".join(path.read_text() for path in files if path.is_file())
    names = {q.removesuffix("()") for q in quoted(text)
             if CODE_NAME.match(q) and ("_" in q or re.search(r"[a-z][A-Z]|^[A-Z]{2}", q))
             and not PLACEHOLDERS.search(q)}
    assert names, heading
    absent = sorted(name for name in names if not re.search(rf"\b{re.escape(name)}\b", sources))
    assert not absent, f"{heading}: names found in none of the section's files: {absent}"
