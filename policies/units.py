"""Human-readable byte sizes in and out: ``24GiB`` ↔ 25769803776.

Lives in ``policies`` because that package imports nothing of the project; ``sim`` and the CLI
reuse it so every size a user types or reads goes through one parser and one formatter.
Binary units (KiB, MiB, GiB, TiB, PiB, EiB) are powers of 1024; decimal ones (KB, MB, GB, TB,
PB, EB) powers of 1000, as GPU vendors print them (an "80 GB" card).
"""

from __future__ import annotations

import re
from fractions import Fraction

from allocsim.ascii_numbers import MAX_DIGITS
from allocsim.errors import UserInputError

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gib": 1024**3, "gb": 1000**3,
    "t": 1024**4, "tib": 1024**4, "tb": 1000**4,
    "p": 1024**5, "pib": 1024**5, "pb": 1000**5,
    "e": 1024**6, "eib": 1024**6, "eb": 1000**6,
}
_SIZE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int | float) -> int:
    """Bytes in ``text`` ("24GiB", "512 MiB", "1.5GB", "4096", 4096). Raises UserInputError,
    also for a size that is not a whole number of bytes (see :func:`parse_size_floor`)."""
    nbytes, exact = parse_size_floor(text)
    if not exact:
        raise UserInputError(f"not a whole number of bytes: {text!r}")
    return nbytes


def parse_size_floor(text: str | int | float) -> tuple[int, bool]:
    """``(bytes rounded down, whether that is exact)`` for ``text``: "2.64GiB" is
    2,834,678,415.36 bytes → ``(2834678415, False)``. Computed in exact fractions, so a large
    size is not rounded through a float. Raises UserInputError for anything not a size."""
    if isinstance(text, bool):
        raise UserInputError(f"not a size: {text!r}")
    if isinstance(text, (int, float)):
        if not text >= 0 or text != int(text):
            raise UserInputError(f"not a size in bytes: {text!r}")
        return int(text), True
    match = _SIZE.match(str(text))
    if match:
        # Fraction() of more than 4,300 digits is a ValueError of Python's own (its limit on
        # converting text to int): refused here, in one line, long before that.
        digits = sum(c.isdigit() for c in match.group(1))
        if digits > MAX_DIGITS:
            raise UserInputError(f"not a size: a number of {digits:,} digits (a size has at "
                                 f"most {MAX_DIGITS})")
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise UserInputError(f"not a size: {text!r} (examples: 4096, 512MiB, 24GiB, 80GB)")
    value = Fraction(match.group(1).replace("_", "")) * _UNITS[unit]
    return int(value), value.denominator == 1


def format_size(nbytes: int | float, precision: int = 2) -> str:
    """``nbytes`` with the largest binary unit (up to EiB) that keeps the number ≥ 1:
    1536 → '1.50KiB', 2**63 → '8.00EiB'."""
    value = float(nbytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024 or unit == "EiB":
            if unit == "B":
                return f"{sign}{int(value)}B"
            return f"{sign}{value:.{precision}f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is ≥ ``value``."""
    return -(-value // multiple) * multiple
