"""A PyTorch block's record, and the mapping views over the records (pytorch_blocks.py's layout).

:class:`~allocsim.policies.pytorch_blocks.BlockPools` keeps each block as one list (the slots
below) in :attr:`BlockMap.record`, keyed by address, and malloc and free read and write those
slots. The views here let everything else — the tests that corrupt a state on purpose and
expect check() to name it, and any reader of the old tables — see the blocks as the plain
dicts and set they were before the records: address → size, → the neighbour's address (0 =
none), → pool key; allocated address → requested bytes; the unmapped addresses. Writes
through a view change the records.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping, MutableSet

# A block's record, CUDACachingAllocator.cpp's Block as one list (its slots are read and
# written on the hot path as list items, several times cheaper than the dict entries they
# replace):
SIZE = 0        # bytes
PREV = 1        # the record of the block before it in its segment; None for the first
NEXT = 2        # the record of the block after it; None for the last
HOME = 3        # its pool key, stream << 1 | small (its segment's); None only for a block made
                # through the size view whose pool key is not written yet
REQ = 4         # allocated: the bytes its caller asked for (> 0); free and mapped: 0;
                # unmapped (expandable segments): UNMAPPED — so "free and mapped", the merge
                # test, is one slot read: ``not block[REQ]``
ADDRESS = 5     # its address

UNMAPPED = -1


class BlockMap:
    """The records of every block, keyed by address, and what the views keep that a record
    cannot say. A holder rather than a dict on the allocator: the records link to each other,
    so two record tables cannot be compared with ``==`` (it would recurse along the links)."""

    __slots__ = ("record", "strays")

    def __init__(self) -> None:
        self.record: dict[int, list] = {}
        # Requests written through the ``_req`` view for an address that is no mapped block
        # (unknown, or unmapped): a record cannot be allocated and unmapped at once, so they
        # wait here for check() to name them.
        self.strays: dict[int, int] = {}

    def chain(self, base: int) -> Iterator[list]:
        """The records of the segment at ``base`` in address order, unmapped ones included."""
        block: list | None = self.record[base]
        while block is not None:
            yield block
            block = block[NEXT]


class SlotView(MutableMapping[int, int]):
    """Block address → one slot of its record: SIZE or HOME, or PREV/NEXT as the neighbour's
    address (0 = none). Writing a size at a new address makes a free mapped block there,
    unlinked and in no pool until those are written; a block without a pool key is absent
    from the HOME view."""

    def __init__(self, blocks: BlockMap, slot: int) -> None:
        self.blocks, self.slot = blocks, slot

    def __getitem__(self, address: int) -> int:
        value = self.blocks.record[address][self.slot]
        if self.slot in (PREV, NEXT):
            return 0 if value is None else int(value[ADDRESS])
        if value is None:
            raise KeyError(address)
        return int(value)

    def __setitem__(self, address: int, value: int) -> None:
        record = self.blocks.record
        if self.slot == SIZE and address not in record:
            record[address] = [value, None, None, None, 0, address]
        elif self.slot in (PREV, NEXT):
            record[address][self.slot] = record[value] if value else None
        else:
            record[address][self.slot] = value

    def __delitem__(self, address: int) -> None:
        if self.slot != SIZE:
            raise TypeError("a block's links and pool key are written, not deleted")
        del self.blocks.record[address]

    def __iter__(self) -> Iterator[int]:
        if self.slot == HOME:
            return (a for a, block in self.blocks.record.items() if block[HOME] is not None)
        return iter(self.blocks.record)

    def __len__(self) -> int:
        if self.slot == HOME:
            return sum(1 for _ in self)
        return len(self.blocks.record)


class RequestedView(MutableMapping[int, int]):
    """Allocated block address → the bytes its caller asked for (REQ > 0), and the strays of
    :class:`BlockMap`. Deleting an entry makes the block free (REQ 0)."""

    def __init__(self, blocks: BlockMap) -> None:
        self.blocks = blocks

    def __getitem__(self, address: int) -> int:
        strays = self.blocks.strays
        if address in strays:
            return strays[address]
        block = self.blocks.record.get(address)
        if block is None or block[REQ] <= 0:
            raise KeyError(address)
        return int(block[REQ])

    def __setitem__(self, address: int, nbytes: int) -> None:
        block = self.blocks.record.get(address)
        if block is None or block[REQ] == UNMAPPED:
            self.blocks.strays[address] = nbytes
        else:
            block[REQ] = nbytes

    def __delitem__(self, address: int) -> None:
        if self.blocks.strays.pop(address, None) is not None:
            return
        self[address]                                   # KeyError unless it is there
        self.blocks.record[address][REQ] = 0

    def __iter__(self) -> Iterator[int]:
        yield from (a for a, block in self.blocks.record.items() if block[REQ] > 0)
        yield from self.blocks.strays

    def __len__(self) -> int:
        return sum(1 for _ in self)


class UnmappedView(MutableSet[int]):
    """The addresses of the unmapped blocks (REQ UNMAPPED). Marking an allocated block
    unmapped keeps its request among the strays; marking an address that is no block raises
    KeyError (a block's mapping is written, not made up)."""

    def __init__(self, blocks: BlockMap) -> None:
        self.blocks = blocks

    def __contains__(self, address: object) -> bool:
        block = self.blocks.record.get(address)     # type: ignore[call-overload]
        return block is not None and block[REQ] == UNMAPPED

    def __iter__(self) -> Iterator[int]:
        return (a for a, block in self.blocks.record.items() if block[REQ] == UNMAPPED)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def add(self, address: int) -> None:
        block = self.blocks.record[address]
        if block[REQ] > 0:
            self.blocks.strays[address] = block[REQ]
        block[REQ] = UNMAPPED

    def discard(self, address: int) -> None:
        block = self.blocks.record.get(address)
        if block is not None and block[REQ] == UNMAPPED:
            block[REQ] = self.blocks.strays.pop(address, 0)
