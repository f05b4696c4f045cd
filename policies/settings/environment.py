"""Reading ``VAR=VALUE`` words, the form the frameworks' environment settings are given in."""

from __future__ import annotations


def env_words(text: str, framework: str) -> dict[str, str]:
    """``"A=1 B='x'"`` → ``{"A": "1", "B": "x"}`` (quotes dropped, the last of a name kept);
    ValueError naming ``framework`` for a word without ``=``."""
    seen: dict[str, str] = {}
    for word in text.split():
        name, equals, value = word.partition("=")
        if not equals:
            raise ValueError(f"{framework}: expected VAR=VALUE, got {word!r}")
        seen[name] = value.strip("'\"")
    return seen


def flag(value: bool) -> str:
    """A boolean as the environment variables take it: ``true`` / ``false``."""
    return "true" if value else "false"
