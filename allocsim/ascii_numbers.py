"""Numbers written as text, read one way everywhere: ASCII digits only.

Python's ``int()`` and ``float()`` take any Unicode decimal digit ("١٢٨" is 128) and
``str.isdigit()`` is true for digits ``int()`` refuses ("²"), so a check with one and a
conversion with the other let "²" through to a traceback and "١٢٨" through as a number no tool
allocsim models would read (PyTorch's PYTORCH_CUDA_ALLOC_CONF parser, XLA's dumps and the
environment take ASCII). Every option, environment variable and file field that holds a whole
number goes through :func:`whole_number` (or :func:`is_whole_number` to tell a number from a
name); a real number through :func:`decimal_number`. Regular expressions over text use
``[0-9]`` (or ``re.ASCII``), not a bare ``\\d``, for the same reason.

This module imports nothing of the project, so every room may use it.
"""

from __future__ import annotations

# More digits than any count or size allocsim holds (int64 has 19); far below CPython's own
# limit on converting text to int (4,300 digits), past which int() raises.
MAX_DIGITS = 40


def is_whole_number(text: str) -> bool:
    """Whether ``text`` is ASCII digits and nothing else ("12"; not "", "+1", " 1", "²"), at
    most :data:`MAX_DIGITS` of them: where it is true, ``int(text)`` is safe."""
    return 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()


def whole_number(text: str, *, signed: bool = False) -> int:
    """The whole number ``text`` spells in ASCII digits (with ``signed``, after an optional
    "-"). Raises ValueError with one short line for anything else: other digits, a sign,
    spaces, "_" separators, or more than :data:`MAX_DIGITS` digits."""
    digits = text[1:] if signed and text.startswith("-") else text
    if len(digits) > MAX_DIGITS and digits.isascii() and digits.isdigit():
        raise ValueError(f"a number of {len(digits):,} digits is too large")
    if not is_whole_number(digits):
        raise ValueError(f"expected a whole number in ASCII digits, got {_shown(text)}")
    return int(text)


def decimal_number(text: str) -> float:
    """The real number ``text`` spells in ASCII as ``float()`` reads it ("0.5", "1e-3", "-2",
    "nan"; the caller judges the range); ValueError for anything else."""
    if not text.isascii():
        raise ValueError(f"expected a number in ASCII digits, got {_shown(text)}")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {_shown(text)}") from None


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:40]) + f"... ({len(text):,} characters)"
