"""One colour per policy, the same in every figure, the HTML report and the experiments.

Every drawing of allocsim takes its policy colours from :func:`policy_colours`; nothing else
picks a colour for a policy. The palette is drawn from Okabe & Ito's colour-blind-safe set and
Paul Tol's qualitative sets (muted, bright, dark), keeping only colours dark enough to read on
white (CIELAB L* ≤ 78), and chosen farthest-point first so that the colours are as far apart
as the set allows under normal vision and under simulated protanopia, deuteranopia and
tritanopia (Machado, Oliveira & Fernandes 2009, full severity; CIE76 ΔE):

- the ten base policies are at least ΔE 22 apart under every one of the four;
- every named entry (the base policies and the settings the experiments compare) at least 11;
- a policy spec not named here (``bfc:fraction=0.5``) takes a colour of the spare list, which
  shares none with the named ones (so a spec never borrows a named policy's colour), chosen by
  a stable hash of the spec (the same spec has the same colour in every figure) and moved to
  the next free spare only when two specs of one figure collide.

tests/test_colours.py recomputes those distances, so an edit that brings two colours together
fails there.

Colour is not enough at a glance: blues such as pytorch's, best-fit's and on-demand's are
apart by the numbers yet read as "blue" in a thin line. So each line also has a dash pattern
(:func:`policy_dashes`): in one drawing, two policies whose colours are closer than
:data:`NEAR_DELTA_E` (CIE76, normal vision) never share one.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

POLICY_COLOURS: dict[str, str] = {
    # the base policies
    "offline": "#000000", "preallocate": "#E69F00", "on-demand": "#66CCEE", "cupy": "#666633",
    "pytorch": "#0072B2", "buddy": "#882255", "best-fit": "#332288", "bfc": "#EE6677",
    "first-fit": "#997700", "cuda-async": "#BBBBBB",
    # the settings the experiments and the docs compare, under their own names
    "jax": "#009E73", "jax:preallocate=false": "#CC79A7", "jax:allocator=platform": "#661100",
    "jax:allocator=cuda_async": "#6699CC", "jax:fraction=0.9": "#004488",
    "jax:fraction=0.45": "#AA3377", "pytorch:expandable_segments=true": "#663333",
    "preallocate:fraction=1.0": "#999933", "pytorch:max_split_size_mb=128": "#EE8866",
}

# For specs not named above, farthest from the named colours first; none of them is named.
SPARE_COLOURS: tuple[str, ...] = (
    "#222255", "#994455", "#44BB99", "#225522", "#CCBB44", "#56B4E9", "#AA4499", "#228833",
    "#EE3377", "#EE7733")

# What the figures draw that is not a policy: the trace's live bytes, the device's capacity,
# an OOM. Greys and a red kept apart from the policies' by their role (fill, dashed rule).
LIVE_COLOUR = "#777777"
CAPACITY_COLOUR = "#444444"
OOM_COLOUR = "#CC0000"


# Line patterns as on/off lengths in points (matplotlib's dash tuple, uPlot's ``dash``):
# solid, dashed, dotted, dash-dot.
DASH_PATTERNS: tuple[tuple[int, ...], ...] = ((), (6, 3), (1, 2), (6, 2, 1, 2))
NEAR_DELTA_E = 45.0     # colours closer than this (normal vision) read as one in a thin line
NEAR_HUE_DEGREES = 50.0  # two saturated colours whose hues are this close read as "blue" both
SATURATED_CHROMA = 20.0


def _lab(colour: str) -> tuple[float, float, float]:
    """CIELAB (D65) of an sRGB ``#RRGGBB``."""
    linear = [((c / 255 + 0.055) / 1.055) ** 2.4 if c / 255 > 0.04045 else c / 255 / 12.92
              for c in (int(colour[i:i + 2], 16) for i in (1, 3, 5))]
    rows = ((0.4124, 0.3576, 0.1805), (0.2126, 0.7152, 0.0722), (0.0193, 0.1192, 0.9505))
    white = (0.95047, 1.0, 1.08883)
    f = []
    for row, w in zip(rows, white):
        t = sum(m * c for m, c in zip(row, linear)) / w
        f.append(t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116)
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def delta_e(a: str, b: str) -> float:
    """CIE76 colour difference of two ``#RRGGBB`` colours under normal vision."""
    return float(sum((x - y) ** 2 for x, y in zip(_lab(a), _lab(b))) ** 0.5)


def near_colours(a: str, b: str) -> bool:
    """Whether two colours would be mistaken for each other in a thin line: closer than
    :data:`NEAR_DELTA_E`, or both saturated with hues within :data:`NEAR_HUE_DEGREES`."""
    if delta_e(a, b) < NEAR_DELTA_E:
        return True
    (_, a1, b1), (_, a2, b2) = _lab(a), _lab(b)
    if min(math.hypot(a1, b1), math.hypot(a2, b2)) < SATURATED_CHROMA:
        return False
    turn = abs(math.degrees(math.atan2(b1, a1) - math.atan2(b2, a2))) % 360
    return min(turn, 360 - turn) < NEAR_HUE_DEGREES


def policy_dashes(policies: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """The dash pattern of each policy of one drawing: the first of :data:`DASH_PATTERNS`
    that no earlier policy of a near colour (:func:`near_colours`) took (solid for most)."""
    colours = policy_colours(policies)
    dashes: dict[str, tuple[int, ...]] = {}
    for policy in policies:
        if policy in dashes:
            continue
        near = {dashes[other] for other in dashes
                if near_colours(colours[policy], colours[other])}
        free = [d for d in DASH_PATTERNS if d not in near]
        dashes[policy] = free[0] if free else DASH_PATTERNS[len(dashes) % len(DASH_PATTERNS)]
    return dashes


def policy_colours(policies: Sequence[str]) -> dict[str, str]:
    """The colour of each policy of ``policies``: its named one, else a spare one by hash
    (moved to the next unused spare when another spec of this list already has it)."""
    colours = {p: POLICY_COLOURS[p] for p in policies if p in POLICY_COLOURS}
    taken = set(colours.values())
    for policy in policies:
        if policy in colours:
            continue
        start = zlib.crc32(policy.encode("utf-8")) % len(SPARE_COLOURS)
        for step in range(len(SPARE_COLOURS)):
            colour = SPARE_COLOURS[(start + step) % len(SPARE_COLOURS)]
            if colour not in taken:
                break
        else:               # more unnamed specs than spares: the hash's colour again
            colour = SPARE_COLOURS[start]
        colours[policy] = colour
        taken.add(colour)
    return colours
