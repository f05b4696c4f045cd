"""The HBM an array takes on a TPU: XLA's shape notation in, the tiled layout and its bytes out.

Arrays on a TPU are not ``nbytes`` long: the runtime lays each one out in tiles and hands out
whole 512-byte granules. libtpu's layout choice is closed source, so the rule below is read
off the chip (tests/data/tpu/sizes.json: ``on_device_size_in_bytes`` and the layout of 416
arrays of ten dtypes and 39-65 shapes each, recorded by experiments/tpu/chip_probe.py on a
v5e with JAX 0.10.2 and libtpu 0.0.42.1; all 416 are this rule's):

- **Rank 0 and 1**: one-dimensional tiles of ``T`` elements, ``T`` the smallest power of two
  that holds the array, at least 512 bytes' worth (128 f32, 256 bf16, 512 s8, 1024 s4) and at
  most 1024 elements (s4: exactly 1024). ``u8[1500]`` is two 1024-element tiles: 2048 bytes.
- **Rank 2 and up**: two dimensions are tiled, the most minor in 128 lanes and the second
  most minor in ``h`` rows; the other dimensions stay in their order, most major first. The
  runtime takes the pair of dimensions and the row count that take the fewest bytes: ``h`` is
  the smallest power of two that holds the second-minor dimension, at least the type's
  packing (1 for 32-bit, 2 for 16-bit, 4 for 8-bit, 8 for 4-bit) and at most 8; 8-bit types
  may also take 32 rows and 4-bit types 64 (one 4 KiB tile). Among layouts of equal size the
  arrays' own dimension order wins, then the taller tile.
- The total is rounded up to whole 512-byte granules (:data:`GRANULE`).

A plain trace's buffer of ``n`` bytes is a ``u8[n]`` array (as ``allocsim validate --backend
jax`` allocates it on the chip): :func:`u8_buffer_bytes`. Only 4-, 8-, 16- and 32-bit types
were measured; 64-bit and complex types are refused rather than guessed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from allocsim.errors import UserInputError

__all__ = ["GRANULE", "TpuLayout", "parse_shape", "tpu_layout", "u8_buffer_bytes",
           "u8_buffer_sizes"]

GRANULE = 512          # bytes: the runtime's allocation unit
LANES = 128            # the minor dimension's tile width
MAX_ROWS = 8           # the tallest ordinary tile
MAX_DIMENSION = 1 << 40
# The most digits a byte count may have: CPython prints no longer int (its int-to-text limit),
# so a shape taking more bytes (rank 400 of 2^40-element dimensions) is refused in one line.
MAX_DIGITS = 4300
_TOO_MANY_BYTES = 10 ** MAX_DIGITS
# XLA's primitive type names (xla_data.proto, PrimitiveType; the text form of a shape) and
# their bits. Only these were measured on the chip.
TYPE_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "f8e4m3fn": 8, "f8e5m2": 8,
             "s16": 16, "u16": 16, "f16": 16, "bf16": 16, "s32": 32, "u32": 32, "f32": 32}
UNMEASURED = ("s64", "u64", "f64", "c64", "c128")
# Rows per tile a packed type needs (sub-32-bit values pack 32 bits per row pair/quad/...).
PACKING_ROWS = {32: 1, 16: 2, 8: 4, 4: 8}
# The one taller tile the narrow types may take: 4 KiB, as 8 x 128 x 32-bit.
TALL_ROWS = {8: 32, 4: 64}
_SHAPE = re.compile(r"\s*([a-z][a-z0-9]*)\[([^\]]*)\](\{[^}]*\})?\s*")


@dataclass(frozen=True)
class TpuLayout:
    """One array's layout on a TPU: its shape as given, the bytes it takes, XLA's layout."""

    shape: str                       # as the user wrote it
    dtype: str
    dims: tuple[int, ...]
    minor_to_major: tuple[int, ...]
    tile: tuple[int, ...]
    nbytes: int                      # the array's own bytes (elements x bits / 8, rounded up)
    bytes: int                       # what the runtime allocates

    @property
    def layout(self) -> str:
        """XLA's text form, as the runtime's profile records it: ``f32[3,5]{1,0:T(4,128)}``,
        ``s8[1000]{0:T(1024)(128)(4,1)}`` (narrow types add their packing tiles)."""
        order = ",".join(str(d) for d in self.minor_to_major)
        tiles = "(" + ",".join(str(t) for t in self.tile) + ")"
        bits = TYPE_BITS[self.dtype]
        if bits < 32 and self.dims:   # a narrow array packs 32 // bits values per word
            tiles += ("" if len(self.dims) >= 2 else f"({LANES})") + f"({32 // bits},1)"
        dims = ",".join(str(d) for d in self.dims)
        return f"{self.dtype}[{dims}]{{{order}:T{tiles}}}"

    def as_dict(self) -> dict[str, object]:
        return {"shape": self.shape, "bytes": self.bytes, "layout": self.layout,
                "nbytes": self.nbytes}


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``"f32[17,129]"`` → ``("f32", (17, 129))``; a layout suffix ``{1,0}`` is allowed and
    ignored (the TPU picks its own). Anything else raises :class:`UserInputError`, one line."""
    match = _SHAPE.fullmatch(text)
    if match is None:
        raise UserInputError(f"shape {text!r}: not XLA's notation (TYPE[D0,D1,...], e.g. "
                             f"f32[17,129], bf16[3,5,7], pred[100], s8[1000])")
    dtype, body = match.group(1), match.group(2).strip()
    if dtype in UNMEASURED:
        raise UserInputError(f"shape {text!r}: {dtype} on a TPU was not measured (the rule "
                             f"covers 4-, 8-, 16- and 32-bit types)")
    if dtype not in TYPE_BITS:
        raise UserInputError(f"shape {text!r}: unknown element type {dtype!r} (known: "
                             f"{', '.join(TYPE_BITS)})")
    dims: list[int] = []
    for part in (body.split(",") if body else []):
        part = part.strip()
        if not (part.isascii() and part.isdigit()):
            raise UserInputError(f"shape {text!r}: dimension {part!r} is not a whole number")
        value = int(part)
        if value > MAX_DIMENSION:
            raise UserInputError(f"shape {text!r}: dimension {value} is larger than "
                                 f"{MAX_DIMENSION:,}")
        dims.append(value)
    return dtype, tuple(dims)


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _vector_tile(elements: int, bits: int) -> int:
    """The one-dimensional tile: a power of two from 512 bytes' worth to 1024 elements."""
    least = GRANULE * 8 // bits
    most = max(1024, least)
    return min(most, max(least, 1 << max(0, elements - 1).bit_length()))


def _vector_bytes(elements: int, bits: int) -> tuple[int, int]:
    """(bytes, tile) of a rank-0 or rank-1 array of ``elements``: whole tiles, whole granules."""
    tile = _vector_tile(elements, bits)
    return _round_up(_round_up(elements, tile) * bits // 8, GRANULE), tile


def _row_choices(rows: int, bits: int) -> list[int]:
    """The tile heights the runtime weighs for a second-minor dimension of ``rows``."""
    ordinary = min(MAX_ROWS, max(PACKING_ROWS[bits], 1 << max(0, rows - 1).bit_length()))
    tall = TALL_ROWS.get(bits)
    return [ordinary] if tall is None else [ordinary, tall]


def _tiled_pair(dims: tuple[int, ...], bits: int) -> tuple[tuple[int, ...], int, int]:
    """(order major to minor, rows, bytes) of a rank-2-or-more array: of every pair of
    dimensions (second minor, minor) and row count, the fewest bytes; ties to the array's own
    order, then the taller tile, then the first pair (second minor first, then minor, in index
    order). The bytes depend only on the sizes of the pair (the others multiply out), so this
    is worked out in time linear in the rank, not by trying each of its rank² pairs."""
    rank = len(dims)
    own = tuple(range(rank))
    if 0 in dims:   # every layout holds no tile: the own order and the taller tile win
        return own, max(_row_choices(dims[-2], bits)), 0
    total = math.prod(dims)
    sizes: dict[tuple[int, int, int], int] = {}

    def size(second: int, minor: int, rows: int) -> int:   # by the pair's sizes, not indices
        key = (second, minor, rows)
        if key not in sizes:
            tiles = total // (second * minor) * -(-second // rows) * -(-minor // LANES)
            sizes[key] = _round_up(tiles * rows * LANES * bits // 8, GRANULE)
        return sizes[key]

    # For a given second-minor dimension the bytes grow with the minor one's lane padding per
    # element, ceil(d / 128) / d: the two dimensions padding least cover every second minor.
    waste = {d: Fraction(-(-d // LANES), d) for d in set(dims)}
    best = min(range(rank), key=lambda d: waste[dims[d]])
    runner_up = min((d for d in range(rank) if d != best), key=lambda d: waste[dims[d]])

    def least(second: int, rows: int) -> int:
        minor = runner_up if second == best else best
        return size(dims[second], dims[minor], rows)

    choices = {d: _row_choices(d, bits) for d in set(dims)}
    fewest = min(least(s, rows) for s in range(rank) for rows in choices[dims[s]])
    for rows in sorted(choices[dims[-2]], reverse=True):       # the array's own order first
        if size(dims[-2], dims[-1], rows) == fewest:
            return own, rows, fewest
    for rows in sorted({r for held in choices.values() for r in held}, reverse=True):
        for second in range(rank):
            if rows in choices[dims[second]] and least(second, rows) == fewest:
                minor = next(m for m in range(rank) if m != second
                             and size(dims[second], dims[m], rows) == fewest)
                majors = [d for d in range(rank) if d not in (second, minor)]
                return (*majors, second, minor), rows, fewest
    raise AssertionError("no layout takes the fewest bytes")   # unreachable: one takes them


def _refuse_past_printing(text: str, size: int) -> None:
    if size >= _TOO_MANY_BYTES:
        raise UserInputError(f"shape {text!r}: takes a byte count of more than "
                             f"{MAX_DIGITS:,} digits, past any memory (and what allocsim "
                             "prints)")


def tpu_layout(text: str) -> TpuLayout:
    """The layout and HBM bytes of the array ``text`` (XLA notation) on a TPU (rule: module
    docstring)."""
    dtype, dims = parse_shape(text)
    bits = TYPE_BITS[dtype]
    nbytes = -(-math.prod(dims) * bits // 8)
    _refuse_past_printing(text, nbytes)   # before tiling: the padded bytes are no fewer
    if len(dims) <= 1:
        size, tile = _vector_bytes(dims[0] if dims else 1, bits)
        return TpuLayout(text, dtype, dims, tuple(range(len(dims))), (tile,), nbytes, size)
    order, rows, size = _tiled_pair(dims, bits)
    _refuse_past_printing(text, size)
    return TpuLayout(text, dtype, dims, tuple(reversed(order)), (rows, LANES), nbytes, size)


def u8_buffer_bytes(n: int) -> int:
    """The HBM a plain buffer of ``n`` bytes takes on a TPU: ``u8[n]``'s size (512 B up to
    512 bytes, then whole 1024-element tiles)."""
    return _vector_bytes(n, 8)[0] if n > 0 else 0


def u8_buffer_sizes(sizes: np.ndarray) -> np.ndarray:
    """:func:`u8_buffer_bytes` of every size in a column (non-positive sizes kept as they are):
    the same rule in closed form for a whole column (512 B up to 512, then 1024-byte tiles),
    held to it by tests/test_tpu_layout.py."""
    sizes = np.asarray(sizes, dtype=np.int64)
    rounded = np.where(sizes <= GRANULE, GRANULE, -(-sizes // 1024) * 1024)
    return np.where(sizes <= 0, sizes, rounded)
