"""The byte pattern every live block carries during a replay on real memory.

A block filled with its allocation's pattern when handed out and checked when freed (and at the
end) shows any overlapping or out-of-region placement as corrupted data. These are the host
(numpy) forms; :mod:`allocsim.sim.validation.cuda_device` writes the same pattern with a CUDA
kernel.
"""

from __future__ import annotations

import numpy as np

# Byte b (0..3, position in the block modulo 4) of allocation k is (b << 6) | (6 bits of k).
# The top two bits name the position, so a block shifted against another by anything but a
# multiple of 4 never matches; at a multiple of 4 the low bits differ for any two of the first
# 2**24 allocations. Any overlap of 4 bytes or more is therefore caught.
PATTERN_KEYS = 1 << 24


def pattern_word(key: int, phase: int = 0) -> np.ndarray:
    """The 4 pattern bytes of allocation ``key``, starting at block offset ``phase`` (mod 4)."""
    key %= PATTERN_KEYS
    word = np.array([(b << 6) | ((key >> (6 * b)) & 0x3F) for b in range(4)], dtype=np.uint8)
    return np.roll(word, -(phase % 4))


def fill_pattern(view: np.ndarray, key: int, phase: int = 0) -> None:
    """Write allocation ``key``'s pattern into the uint8 ``view`` (block offset ``phase``)."""
    word = pattern_word(key, phase)
    whole = len(view) // 4 * 4
    if whole:
        # One 32-bit fill instead of a tiled temporary as large as the block.
        view[:whole].view("<u4").fill(int.from_bytes(word.tobytes(), "little"))
    if len(view) > whole:
        view[whole:] = word[:len(view) - whole]


def count_pattern_errors(view: np.ndarray, key: int, phase: int = 0) -> int:
    """How many 4-byte words (and tail bytes) of ``view`` differ from the pattern."""
    word = pattern_word(key, phase)
    whole = len(view) // 4 * 4
    bad = 0
    if whole:
        bad += int(np.count_nonzero(view[:whole].view("<u4")
                                    != int.from_bytes(word.tobytes(), "little")))
    if len(view) > whole:
        bad += int(np.count_nonzero(view[whole:] != word[:len(view) - whole]))
    return bad
