"""The sizes and percentages a README writes ("+14%", "1.13 GiB", "2–20 MiB", "954 vs 855
MiB"), as numbers at the precision written (see readme_check.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
         "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "%": None}
_NUM = r"\d+(?:,\d{3})*(?:\.\d+)?"
_SEP = r"\s*(?:–|—|-|−|to|→|vs\.?|and|or)\s*[+\-−]?"
_UNIT = r"(?:%|[KMGT]i?B|B)(?![A-Za-z0-9])"
# A group of numbers sharing one unit: "1.13 GiB", "12–47%", "1.53 to 2.66 GiB". Not inside
# a word ("A100-80GB", "fp16"), where the number is part of a name.
GROUP = re.compile(rf"(?<![\w.\-−+])[+\-−±≈~]?({_NUM}(?:{_SEP}{_NUM})*)\s*({_UNIT})")


@dataclass(frozen=True)
class Quantity:
    """A number as written: its value in its unit, decimals written, the unit."""

    value: float
    decimals: int
    unit: str
    text: str

    def canonical(self) -> str:
        return f"{self.text}{self.unit}"

    def matches(self, other: Quantity) -> bool:
        """Whether ``other`` (a table's number) is this number at this one's precision."""
        if (self.unit == "%") != (other.unit == "%"):
            return False
        theirs = other.value
        if self.unit != "%":
            scale = UNITS[other.unit]
            mine = UNITS[self.unit]
            assert scale is not None and mine is not None
            theirs = other.value * scale / mine
        return abs(theirs - self.value) <= 0.5 * 10 ** -self.decimals + 1e-9


def quantities(text: str) -> list[Quantity]:
    """Every size or percentage in ``text`` (each number of a range or "X vs Y" group)."""
    out = []
    for match in GROUP.finditer(text):
        unit = match.group(2)
        for number in re.findall(_NUM, match.group(1)):
            plain = number.replace(",", "")
            if unit == "B" and "." in plain:
                continue    # "1.3B", "6.7B": a model's parameters; bytes are whole
            decimals = len(plain.split(".")[1]) if "." in plain else 0
            out.append(Quantity(float(plain), decimals, unit, number))
    return out
