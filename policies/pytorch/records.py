"""A PyTorch block (CUDACachingAllocator.cpp's Block) and the mapping views over the blocks.

:class:`Block` is one block of a segment with named fields; :class:`BlockMap` keeps them by
address (policies/pytorch/blocks.py's :class:`~allocsim.policies.pytorch.blocks.BlockPools`
holds one). The views here let everything else — the tests that corrupt a state on purpose and
expect check() to name it, and any reader of the old tables — see the blocks as plain dicts
and a set: address → size, → the neighbour's address (0 = none), → pool key; allocated
address → requested bytes; the unmapped addresses. Writes through a view change the blocks.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping, MutableSet

UNMAPPED = -1           # Block.requested of unmapped space (expandable segments)

# The fields a SlotView can show, and those that are links to other blocks.
VIEWABLE = ("size", "prev", "next", "pool_key")
LINKS = ("prev", "next")


class Block:
    """One block of a segment, CUDACachingAllocator.cpp's Block. Invariants (held by the
    policy, asserted by BlockPools.check): blocks tile their segment through ``prev`` and
    ``next``; ``requested`` says the block's state — the caller's request while allocated
    (> 0), 0 while free and mapped, :data:`UNMAPPED` for unmapped space of an expandable
    segment — so "free and mapped", the merge test, is ``not block.requested``."""

    __slots__ = ("address", "next", "pool_key", "prev", "requested", "size")

    def __init__(self, size: int, prev: Block | None, next: Block | None,
                 pool_key: int, requested: int, address: int) -> None:
        self.size = size                # bytes
        self.prev = prev                # the block before it in its segment; None: first
        self.next = next                # the block after it; None: last
        self.pool_key = pool_key        # stream << 1 | small (its segment's); None only for a
                                        # block made through the size view, not yet in a pool
        self.requested = requested      # > 0 allocated, 0 free and mapped, UNMAPPED
        self.address = address

    def __repr__(self) -> str:
        return (f"Block({self.address:#x}, size={self.size}, requested={self.requested}, "
                f"pool_key={self.pool_key})")


class BlockMap:
    """Every block, keyed by address, and what the views keep that a block cannot say. A
    holder rather than a dict on the allocator: its blocks link to each other."""

    __slots__ = ("record", "strays")

    def __init__(self) -> None:
        self.record: dict[int, Block] = {}
        # Requests written through the ``requested`` view for an address that is no mapped
        # block (unknown, or unmapped): a block cannot be allocated and unmapped at once, so
        # they wait here for check() to name them.
        self.strays: dict[int, int] = {}

    def chain(self, base: int) -> Iterator[Block]:
        """The blocks of the segment at ``base`` in address order, unmapped ones included."""
        block: Block | None = self.record[base]
        while block is not None:
            yield block
            block = block.next


class SlotView(MutableMapping[int, int]):
    """Block address → one field of its block: ``size`` or ``pool_key``, or ``prev``/``next`` as
    the neighbour's address (0 = none). Writing a size at a new address makes a free mapped
    block there, unlinked and in no pool until those are written; a block without a pool key
    is absent from the ``pool_key`` view."""

    def __init__(self, blocks: BlockMap, field: str) -> None:
        if field not in VIEWABLE:
            raise ValueError(f"no view of a block's {field!r}")
        self.blocks, self.field = blocks, field

    def __getitem__(self, address: int) -> int:
        value = getattr(self.blocks.record[address], self.field)
        if self.field in LINKS:
            return 0 if value is None else int(value.address)
        if value is None:
            raise KeyError(address)
        return int(value)

    def __setitem__(self, address: int, value: int) -> None:
        record = self.blocks.record
        if self.field == "size" and address not in record:
            # No pool yet (None; only a view's writer makes such a block, check() names it).
            record[address] = Block(value, None, None, None, 0, address)  # type: ignore[arg-type]
        elif self.field in LINKS:
            setattr(record[address], self.field, record[value] if value else None)
        else:
            setattr(record[address], self.field, value)

    def __delitem__(self, address: int) -> None:
        if self.field != "size":
            raise TypeError("a block's links and pool key are written, not deleted")
        del self.blocks.record[address]

    def __iter__(self) -> Iterator[int]:
        if self.field == "pool_key":
            return (a for a, block in self.blocks.record.items() if block.pool_key is not None)
        return iter(self.blocks.record)

    def __len__(self) -> int:
        if self.field == "pool_key":
            return sum(1 for _ in self)
        return len(self.blocks.record)


class RequestedView(MutableMapping[int, int]):
    """Allocated block address → the bytes its caller asked for (``requested`` > 0), and the
    strays of :class:`BlockMap`. Deleting an entry makes the block free (``requested`` 0)."""

    def __init__(self, blocks: BlockMap) -> None:
        self.blocks = blocks

    def __getitem__(self, address: int) -> int:
        strays = self.blocks.strays
        if address in strays:
            return strays[address]
        block = self.blocks.record.get(address)
        if block is None or block.requested <= 0:
            raise KeyError(address)
        return int(block.requested)

    def __setitem__(self, address: int, nbytes: int) -> None:
        block = self.blocks.record.get(address)
        if block is None or block.requested == UNMAPPED:
            self.blocks.strays[address] = nbytes
        else:
            block.requested = nbytes

    def __delitem__(self, address: int) -> None:
        if self.blocks.strays.pop(address, None) is not None:
            return
        self[address]                                   # KeyError unless it is there
        self.blocks.record[address].requested = 0

    def __iter__(self) -> Iterator[int]:
        yield from (a for a, block in self.blocks.record.items() if block.requested > 0)
        yield from self.blocks.strays

    def __len__(self) -> int:
        return sum(1 for _ in self)


class UnmappedView(MutableSet[int]):
    """The addresses of the unmapped blocks (``requested`` UNMAPPED). Marking an allocated
    block unmapped keeps its request among the strays; marking an address that is no block
    raises KeyError (a block's mapping is written, not made up)."""

    def __init__(self, blocks: BlockMap) -> None:
        self.blocks = blocks

    def __contains__(self, address: object) -> bool:
        block = self.blocks.record.get(address)     # type: ignore[call-overload]
        return block is not None and block.requested == UNMAPPED

    def __iter__(self) -> Iterator[int]:
        return (a for a, block in self.blocks.record.items() if block.requested == UNMAPPED)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def add(self, address: int) -> None:
        block = self.blocks.record[address]
        if block.requested > 0:
            self.blocks.strays[address] = block.requested
        block.requested = UNMAPPED

    def discard(self, address: int) -> None:
        block = self.blocks.record.get(address)
        if block is not None and block.requested == UNMAPPED:
            block.requested = self.blocks.strays.pop(address, 0)
