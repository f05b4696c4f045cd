"""When nothing fits: who holds the peak, and what a smaller batch, remat or bf16 would need.

No allocator setting makes a job fit a card whose memory (less the device's own share, the
context) is below the job's peak live bytes: the job itself must hold less. This answers the
next question from the same recording, one line each, and says how each number is made:

- the largest holders at the peak (:mod:`allocsim.sim.output.holders`: the blocks live at the
  peak by kind of allocation);
- what stays and what scales. A block live at the peak is taken to *stay* whatever the batch
  (parameters, optimizer state: blocks of a kind never freed in the recording, or tagged as
  parameters, weights, gradients or optimizer state) or to *scale* with the batch
  (activations and temporaries: kinds whose blocks come and go). This is an assumption from
  lifetimes and tags, not from shapes, and the lines say so;
- a smaller batch: the largest share ``b`` of today's batch with stay + b × scale within the
  card's memory;
- remat (activation checkpointing per layer): stay + what scales outside the layers + the
  largest layer's share, when the tags name layers (one layer's activations are recomputed at
  a time; the checkpoints kept at the layer boundaries are not in the recording and are
  assumed small); not estimated when the tags name no layers;
- bf16: every byte halved (the recording assumed f32 throughout), and mixed precision (f32
  parameters and optimizer state kept, what scales halved).

Every estimate is of peak live bytes: an allocator needs some memory on top (compare's
``frag`` column on a card that fits says how much), so an estimate just under the card is a
reason to try, not a promise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocsim.policies import format_size
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.output.display_text import shown
from allocsim.sim.output.holders import group_by_kind, live_at_peak, split_layer
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace

HOLDERS_SHOWN = 5
# Tags of blocks that stay whatever the batch: parameters, gradients, optimizer state.
_STAYS = re.compile(r"param|weight|optim|(?<!act_)grad|state|momentum|exp_avg",
                    re.IGNORECASE)


@dataclass
class Estimate:
    """One way to hold less, as one line: what it would need and whether that fits."""

    what: str              # "batch", "remat", "bf16", "mixed precision"
    peak_live: int | None  # the estimated peak live bytes (None: not estimated)
    line: str

    def to_json_dict(self) -> dict[str, Any]:
        return {"what": self.what, "peak_live": self.peak_live, "line": self.line}


@dataclass
class NextStep:
    """What holds the peak and what would fit, for a job over a card's memory."""

    peak_live: int
    memory: int                      # the card's memory for allocators (capacity − context)
    capacity: int
    context: int
    holders: list[tuple[str, int]]   # (kind, bytes), largest first
    stays: int                       # bytes live at the peak taken not to scale with batch
    scales: int                      # bytes live at the peak taken to scale with it
    estimates: list[Estimate] = field(default_factory=list)

    @property
    def over(self) -> int:
        return self.peak_live - self.memory

    def lines(self) -> list[str]:
        """The next step as text, holders first."""
        context = (f" ({format_size(self.capacity)} less the {format_size(self.context)} "
                   "context)" if self.context else "")
        out = [f"nothing fits: peak live {format_size(self.peak_live)} is more than the card's "
               f"{format_size(self.memory)}{context}, by {format_size(self.over)}; no "
               "allocator setting changes peak live: the job must hold less.",
               "  largest holders at the peak (live blocks by kind):"]
        for kind, size in self.holders:
            out.append(f"    {format_size(size):>10}  {size / self.peak_live:6.1%}  "
                       f"{shown(kind)}")
        out.append(f"  stays whatever the batch: {format_size(self.stays)} (kinds never freed "
                   "in the recording, or tagged as parameters, gradients or optimizer state); "
                   f"scales with it: {format_size(self.scales)} (kinds that come and go: "
                   "activations, temporaries) — assumed from lifetimes and tags, not shapes")
        out += [f"  {e.line}" for e in self.estimates]
        out.append("  (estimates of peak live; the allocator needs some memory on top)")
        return out

    def to_json_dict(self) -> dict[str, Any]:
        return {"peak_live": self.peak_live, "memory": self.memory, "over": self.over,
                "holders": [{"kind": k, "bytes": b} for k, b in self.holders],
                "stays": self.stays, "scales": self.scales,
                "estimates": [e.to_json_dict() for e in self.estimates]}


def memory_for_allocators(device: DeviceProfile) -> int:
    """What a card leaves the allocators: its capacity less its own share."""
    return max(0, device.capacity - device.context_bytes)


def does_not_fit(trace: Trace, device: DeviceProfile) -> bool:
    """Peak live exceeds what the card leaves the allocators: no setting can fit it."""
    return trace.peak_live()[0] > memory_for_allocators(device)


def _live_at_peak(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sizes, tag codes, comes-and-goes flags) of the blocks live at the peak. A block comes
    and goes when blocks of its tag are freed somewhere in the recording (per-step
    activations and temporaries); one whose tag is never freed is kept (parameters,
    optimizer state)."""
    _, index = trace.peak_live()
    ids = np.asarray(trace.id)
    op = np.asarray(trace.op)
    tag = np.asarray(trace.tag)
    upto = ids[: index + 1]
    _, last_reversed = np.unique(upto[::-1], return_index=True)
    last = index - last_reversed
    live = last[op[last] == OP_ALLOC]
    # A free carries no tag of its own in every format: take the tag of its id's alloc.
    alloc = op == OP_ALLOC
    tag_of = dict(zip(ids[alloc].tolist(), tag[alloc].tolist()))
    freed_tags = {tag_of.get(i) for i in ids[op == OP_FREE].tolist()}
    comes_and_goes = np.array([t in freed_tags for t in tag[live].tolist()], dtype=bool)
    return np.asarray(trace.size)[live], tag[live], comes_and_goes


def _fits(size: int, memory: int) -> str:
    return ("fits" if size <= memory else f"still {format_size(size - memory)} over")


def next_step(trace: Trace, device: DeviceProfile) -> NextStep:
    """Who holds the peak of ``trace`` and what would fit ``device``'s memory."""
    peak = int(trace.peak_live()[0])
    memory = memory_for_allocators(device)
    groups = group_by_kind(live_at_peak(trace))
    holders = [(g.kind, g.bytes) for g in groups[:HOLDERS_SHOWN]]
    sizes, tags, transient = _live_at_peak(trace)
    names = [trace.tag_name(int(c)) or "" for c in tags]
    stays_mask = np.array([not t or bool(_STAYS.search(n)) for t, n in zip(transient, names)],
                          dtype=bool)
    stays = int(sizes[stays_mask].sum())
    scales = int(sizes[~stays_mask].sum())
    estimates = []
    if scales <= 0:
        estimates.append(Estimate("batch", None, "smaller batch: no kind live at the peak "
                                  "comes and goes, so none of it is taken to scale with the "
                                  "batch: not estimated"))
    elif stays >= memory:
        estimates.append(Estimate("batch", stays, f"smaller batch: what stays alone, "
                                  f"{format_size(stays)}, is over the card: no batch fits"))
    else:
        share = (memory - stays) / scales
        estimates.append(Estimate(
            "batch", int(stays + share * scales),
            f"smaller batch: at most {share:.2f}× today's batch (stays {format_size(stays)} + "
            f"{share:.2f} × {format_size(scales)} = {format_size(memory)}); half the batch: "
            f"{format_size(int(stays + scales / 2))}, "
            f"{_fits(int(stays + scales / 2), memory)}"))
    layered: dict[str, int] = {}
    outside = 0
    for size, name, stay in zip(sizes.tolist(), names, stays_mask.tolist()):
        if stay:
            continue
        layer = split_layer(name)[1]
        if layer is None:
            outside += int(size)
        else:
            layered[layer] = layered.get(layer, 0) + int(size)
    if layered and len(layered) > 1:
        largest = max(layered.values())
        remat = stays + outside + largest
        estimates.append(Estimate(
            "remat", remat,
            f"remat (checkpoint each of the {len(layered)} layers the tags name): stays + "
            f"what scales outside layers ({format_size(outside)}) + the largest layer's "
            f"({format_size(largest)}) = {format_size(remat)}, {_fits(remat, memory)} "
            "(the checkpoints at layer boundaries are not in the recording: assumed small)"))
    else:
        estimates.append(Estimate(
            "remat", None, "remat: not estimated (the tags of what scales name no layers); "
            "record again with jax.checkpoint / torch.utils.checkpoint per layer"))
    half = peak // 2
    mixed = stays + scales // 2
    estimates.append(Estimate(
        "bf16", half, f"bf16 throughout: {format_size(half)}, {_fits(half, memory)}; mixed "
        f"precision (f32 parameters and optimizer state kept, what scales halved): "
        f"{format_size(mixed)}, {_fits(mixed, memory)} — assumes the recording is f32 "
        "throughout (16-bit tensors already gain nothing)"))
    return NextStep(peak, memory, device.capacity, device.context_bytes, holders, stays, scales,
                    estimates)


__all__ = ["Estimate", "NextStep", "does_not_fit", "memory_for_allocators", "next_step"]
