"""The frameworks' names: one vocabulary for every command and every file.

Each framework has one canonical name — the one ``--help`` lists, traces and JSON carry, and
every command takes (``record --framework pytorch`` as ``tune --framework pytorch``). The
other spelling people type for it (``torch``, ``tf``) is taken as an alias, without a word:
it means the same thing, so there is nothing to warn about. Case and surrounding blanks do
not matter.
"""

from __future__ import annotations

FRAMEWORKS = ("pytorch", "jax", "tensorflow", "cupy")

# The other spelling of a framework's name (its import name, its usual short form).
ALIASES = {"torch": "pytorch", "tf": "tensorflow"}


def canonical_framework(text: str) -> str | None:
    """The canonical name ``text`` spells (``"Torch"`` → ``"pytorch"``), None if it names no
    framework."""
    name = text.strip().lower()
    name = ALIASES.get(name, name)
    return name if name in FRAMEWORKS else None


__all__ = ["ALIASES", "FRAMEWORKS", "canonical_framework"]
