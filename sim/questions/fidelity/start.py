"""The size of each block live when a PyTorch snapshot's recording started, by the model's rules.

What it is for
    The snapshot importer (:mod:`allocsim.traces.formats.torch_snapshot.start_state`) rebuilds the
    segments at the start, but a block live then and freed during the recording has no size in
    the file, only its requested bytes. The importer lays it out at the smallest size it can
    have (the request rounded to 512 B), marks it ``size_inferred`` and hands over what the
    recording proves (``carved_at``). How much more the block took is the allocator's own
    rule, so it is decided here, where the model is, with the model's own functions
    (``rounded_size`` with the recorded roundup_power2_divisions, and
    :func:`~allocsim.policies.pytorch.settings.should_split` with its max_split_size): the
    importer may not import a policy (traces/ knows nothing of policies/), and a copy of the
    rule there drifted from the settings (it knew neither max_split_size nor the divisions).

How a size is chosen (the first that the split rule allows: a block of ``size`` serving
``rounded`` keeps ``size - rounded`` only when should_split says no)
    1. ``carved_at``: PyTorch carves a request from the front of a free block (the caller
       keeps the low end), so the first address handed out in the free space after the block
       while it is live is where the block ends. This holds when the block that bounded it
       was freed before recording, which nothing live at the start shows.
    2. The room up to the next block live at the start (or the segment's end): a rest the
       rule would not split off was kept.
    3. The rounded request.

Cost: one pass over the start segments' blocks.
"""

from __future__ import annotations

from typing import Any

from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.policies.pytorch.settings import should_split
from allocsim.policies.pytorch.snapshot import segment_is_small

__all__ = ["sized_start_segments"]


def sized_start_segments(initial: list[dict[str, Any]], policy: PyTorchCachingAllocator
                         ) -> list[dict[str, Any]]:
    """``initial`` (the importer's ``initial_segments``) with every ``size_inferred`` block
    resized as ``policy`` would have cut it, the inactive space after it shrunk to match.
    Segments without such blocks are returned as they are; nothing given is changed."""
    return [_sized(seg, policy) if any(b.get("size_inferred") for b in seg.get("blocks") or [])
            else seg for seg in initial]


def _sized(seg: dict[str, Any], policy: PyTorchCachingAllocator) -> dict[str, Any]:
    blocks = list(seg["blocks"])
    end = int(seg["address"]) + int(seg["total_size"])
    small_or_expandable = segment_is_small(seg) or bool(seg.get("is_expandable"))
    out: list[dict[str, Any]] = []
    cursor = int(seg["address"])
    for k, block in enumerate(blocks):
        if str(block.get("state", "")).startswith("active"):
            address = int(block["address"])
            if address > cursor:
                out.append(_inactive(cursor, address - cursor))
            size = int(block["size"])
            if block.get("size_inferred"):
                room = next((int(b["address"]) for b in blocks[k + 1:]
                             if str(b.get("state", "")).startswith("active")), end) - address
                size = _chosen_size(block, room, small_or_expandable, policy)
            out.append(dict(block, size=size))
            cursor = address + size
    if cursor < end:
        out.append(_inactive(cursor, end - cursor))
    return dict(seg, blocks=out)


def _chosen_size(block: dict[str, Any], room: int, small_or_expandable: bool,
                 policy: PyTorchCachingAllocator) -> int:
    """The block's size by the order in the module docstring, never past ``room``."""
    address = int(block["address"])
    rounded = min(policy.rounded_size(int(block.get("requested_size") or 0)), room)
    candidates = [room]
    if block.get("carved_at") is not None:
        candidates.insert(0, int(block["carved_at"]) - address)
    for size in candidates:
        if rounded <= size <= room and not should_split(size - rounded, rounded,
                                                         small_or_expandable,
                                                         policy.max_split_size):
            return size
    return rounded


def _inactive(address: int, size: int) -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": 0, "state": "inactive"}
