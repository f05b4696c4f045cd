"""An independent, deliberately plain model of Johnstone & Wilson's reference policy, to hold
allocsim's ``best-fit`` to (tests/test_best_fit_reference.py).

Johnstone & Wilson, "The memory fragmentation problem: solved?" (ISMM 1998): address-ordered
best fit with immediate coalescing on a heap that grows at its top (sbrk): take the smallest
free block that fits, the lowest address among equals; split it, the caller keeping the low
end; merge a freed block with its free neighbours at once; when nothing fits, extend the heap
by what the request needs beyond a free block at the top (which it then uses). Sizes are
rounded up to the alignment (16 bytes: their measurements and CS:APP's malloc lab), with no
per-block header, so the heap measured is the policy's alone.

Written from that description only, with a Python list of blocks scanned in full for every
request (O(n) a call, obviously correct): it shares no code with policies/best_fit.py or
policies/chunks.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Block:
    address: int
    size: int
    free: bool


@dataclass
class ReferenceBestFit:
    alignment: int = 16
    blocks: list[Block] = field(default_factory=list)   # in address order, tiling [0, top)
    top: int = 0
    peak_top: int = 0

    def malloc(self, size: int) -> int | None:
        """The block's offset from the heap's start; None for a request of 0 bytes."""
        if size <= 0:
            return None
        need = -(-size // self.alignment) * self.alignment
        best: int | None = None
        for index, block in enumerate(self.blocks):
            if block.free and block.size >= need and (
                    best is None or block.size < self.blocks[best].size):
                best = index          # strict <: the lowest address wins among equal sizes
        if best is None:
            last = self.blocks[-1] if self.blocks else None
            if last is not None and last.free:
                last.size, best = need, len(self.blocks) - 1
                self.top = last.address + need
            else:
                self.blocks.append(Block(self.top, need, True))
                best = len(self.blocks) - 1
                self.top += need
            self.peak_top = max(self.peak_top, self.top)
        block = self.blocks[best]
        if block.size > need:
            self.blocks.insert(best + 1, Block(block.address + need, block.size - need, True))
            block.size = need
        block.free = False
        return block.address

    def free(self, address: int) -> None:
        index = next(i for i, b in enumerate(self.blocks) if b.address == address)
        block = self.blocks[index]
        assert not block.free, f"double free at {address}"
        block.free = True
        if index + 1 < len(self.blocks) and self.blocks[index + 1].free:
            block.size += self.blocks.pop(index + 1).size
        if index > 0 and self.blocks[index - 1].free:
            self.blocks[index - 1].size += self.blocks.pop(index).size
