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
"""

from __future__ import annotations

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
