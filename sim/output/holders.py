"""Who holds memory at the trace's peak live bytes, grouped so the top rows explain the peak.

The blocks live at the peak (requested bytes: the same under every policy, what PyTorch's
memory_viz and TensorBoard's memory profile show first) are grouped by the kind of
allocation — the tag with its layer taken out, so ``optimizer/state/layer7`` and
``optimizer/state/layer11`` are both ``optimizer/state`` — and, inside each kind, by layer in
natural order (``layer2`` before ``layer10``). Kinds come largest first with their running
share of the peak, so the first two or three rows usually account for most of it; each opens
to its layers or tags, the streams their blocks are on and, where the trace kept them, the
stack frames of the call site. A second view sums each layer over every kind.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocsim.ascii_numbers import is_whole_number
from allocsim.policies.units import format_size
from allocsim.traces.model import OP_ALLOC, Trace

NO_TAG_LABEL = "(no tag)"
MAX_FRAMES = 12
# A layer in a tag: layer3, layers.3, block_3, blocks/3, h.3 (GPT-2's transformer.h.3).
_LAYER = re.compile(r"(?<![A-Za-z0-9])((?:layers?|blocks?|h)[._/-]?(\d+))(?![A-Za-z0-9])")


@dataclass
class Holding:
    """The live blocks of one tag at the peak."""

    tag: str
    bytes: int
    blocks: int
    streams: list[int]
    frames: list[str] = field(default_factory=list)


@dataclass
class KindGroup:
    """The live blocks of one kind of allocation; ``members`` by layer (natural order) or,
    for a kind without layers, its one tag."""

    kind: str
    bytes: int
    blocks: int
    members: list[tuple[str, Holding]]


def natural_key(text: str) -> list[Any]:
    """``layer2`` before ``layer10``: digits compare as numbers."""
    return [(0, int(part), "") if is_whole_number(part) else (1, 0, part.lower())
            for part in re.split(r"([0-9]{1,40})", text) if part]


def split_layer(tag: str) -> tuple[str, str | None]:
    """``(kind, layer)`` of a tag: ``backward/layer1/grad`` → ``("backward/grad", "layer1")``;
    a tag without a layer is its own kind."""
    match = _LAYER.search(tag)
    if not match:
        return tag, None
    kind = (tag[:match.start()] + tag[match.end():])
    kind = re.sub(r"([/._:-])[/._:-]+", r"\1", kind).strip("/._:- ") or tag
    return kind, match.group(1)


def live_at_peak(trace: Trace) -> list[Holding]:
    """Per tag, the blocks live at the trace's peak live bytes (largest first)."""
    peak, index = trace.peak_live()
    if index < 0 or peak <= 0:
        return []
    ids = np.asarray(trace.id[: index + 1])
    op = np.asarray(trace.op[: index + 1])
    # The last event of each id up to the peak decides whether it is live (ids may be reused).
    _, last_reversed = np.unique(ids[::-1], return_index=True)
    last = index - last_reversed
    live = last[op[last] == OP_ALLOC]
    sizes = np.asarray(trace.size)[live]
    tags = np.asarray(trace.tag)[live]
    streams = np.asarray(trace.stream)[live]
    stacks = trace.metadata.get("tag_stacks")
    stacks = stacks if isinstance(stacks, dict) else {}
    rows: list[Holding] = []
    for code in np.unique(tags).tolist():
        mask = tags == code
        name = trace.tag_name(int(code)) or NO_TAG_LABEL
        stack = stacks.get(name)
        frames = ([str(f) for f in stack[:MAX_FRAMES]] if isinstance(stack, list) else [])
        rows.append(Holding(name, int(sizes[mask].sum()), int(mask.sum()),
                            sorted(set(streams[mask].tolist())), frames))
    return sorted(rows, key=lambda r: (-r.bytes, natural_key(r.tag)))


def group_by_kind(holdings: Sequence[Holding]) -> list[KindGroup]:
    kinds: dict[str, list[tuple[str, Holding]]] = {}
    for holding in holdings:
        kind, layer = split_layer(holding.tag)
        kinds.setdefault(kind, []).append((layer or holding.tag, holding))
    groups = [KindGroup(kind, sum(h.bytes for _, h in members), sum(h.blocks for _, h in members),
                        sorted(members, key=lambda m: natural_key(m[0])))
              for kind, members in kinds.items()]
    return sorted(groups, key=lambda g: (-g.bytes, natural_key(g.kind)))


def by_layer(holdings: Sequence[Holding]) -> list[tuple[str, int, int]]:
    """``(layer, bytes, blocks)`` summed over every kind, in natural order; blocks of no layer
    last."""
    layers: dict[str, list[int]] = {}
    for holding in holdings:
        layer = split_layer(holding.tag)[1] or "(no layer)"
        entry = layers.setdefault(layer, [0, 0])
        entry[0] += holding.bytes
        entry[1] += holding.blocks
    return sorted(((name, b, n) for name, (b, n) in layers.items()),
                  key=lambda r: (r[0] == "(no layer)", natural_key(r[0])))


def _share(size: int, peak: int) -> str:
    return f"{size / peak:.1%}" if peak else "-"


def _bar(size: int, peak: int) -> str:
    width = 100 * size / peak if peak else 0
    return f'<span class=hbar><span style="width:{width:.1f}%"></span></span>'


def _streams(streams: Sequence[int]) -> str:
    return ("stream " if len(streams) == 1 else "streams ") + ", ".join(map(str, streams[:8])) \
        + (" …" if len(streams) > 8 else "")


def _member_row(label: str, holding: Holding, peak: int) -> str:
    frames = ""
    if holding.frames:
        frames = ("<details class=frames><summary>stack</summary><pre>"
                  + html.escape("\n".join(holding.frames)) + "</pre></details>")
    return (f"<tr><td>{html.escape(label)}</td><td>{format_size(holding.bytes)}</td>"
            f"<td>{_share(holding.bytes, peak)}</td><td>{holding.blocks:,}</td>"
            f"<td>{html.escape(_streams(holding.streams))}</td>"
            f"<td class=tagcell>{html.escape(holding.tag)}{frames}</td></tr>")


def holders_section(holdings: Sequence[Holding], peak_live: int, anchor: str = "") -> str:
    """The collapsible "who holds memory" view; empty for no holdings."""
    if not holdings:
        return ""
    groups = group_by_kind(holdings)
    running = 0
    kinds = []
    for group in groups:
        running += group.bytes
        layered = split_layer(group.members[0][1].tag)[1] is not None
        count = len(group.members)
        what = (f"{count} layer{'s' * (count != 1)}" if layered else
                f"{count} tag{'s' * (count != 1)}")
        rows = "".join(_member_row(label, h, peak_live) for label, h in group.members)
        kinds.append(
            "<details class=kind><summary>"
            f"<span class=kname>{html.escape(group.kind)}</span>"
            f"<span class=num>{format_size(group.bytes)}</span>"
            f"<span class=num>{_share(group.bytes, peak_live)}</span>"
            f"<span class=num>{_share(running, peak_live)}</span>"
            f"{_bar(group.bytes, peak_live)}<span class=kwhat>{what}, {group.blocks:,} "
            f"block{'s' * (group.blocks != 1)}"
            "</span></summary><table class=members><tr><th>layer or tag</th><th>live</th>"
            "<th>share</th><th>blocks</th><th>streams</th><th>tag</th></tr>"
            f"{rows}</table></details>")
    layers = by_layer(holdings)
    layer_rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{format_size(size)}</td>"
        f"<td>{_share(size, peak_live)}</td><td>{count:,}</td></tr>"
        for name, size, count in layers)
    layer_view = ("" if len(layers) < 2 else
                  "<details class=layers><summary>by layer, over every kind</summary>"
                  "<table><tr><th>layer</th><th>live</th><th>share</th><th>blocks</th></tr>"
                  f"{layer_rows}</table></details>")
    return (f"<div class=holders{' id=' + anchor if anchor else ''}>"
            f"<h3>Who holds memory at the peak ({format_size(peak_live)} live)</h3>"
            "<p class=meta>The blocks live at the trace's peak, the same requests under every "
            "policy, by kind of allocation (largest first, with the running share of the "
            "peak); open a kind for its layers or tags, streams and stack frames.</p>"
            "<div class=kinds><div class=khead><span class=kname>kind</span>"
            "<span class=num>live</span><span class=num>share</span>"
            "<span class=num>running</span><span></span><span class=kwhat>what</span></div>"
            + "".join(kinds) + "</div>" + layer_view + "</div>")
