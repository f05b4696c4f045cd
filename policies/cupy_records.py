"""A CuPy pool chunk's record and the mapping views over a pool's records (policies/cupy_pool.py).

:class:`~allocsim.policies.cupy_pool.CuPyPoolAllocator` keeps each chunk as one list (the slots
below), one dict address → record, and its malloc and free read and write those slots. The
views here let everything else — its ``check()``, the tests that corrupt a state on purpose and
expect check() to name it, min-capacity's repeat check — see the chunks as the plain dicts they
were before the records: address → size, → the neighbour's address (NONE at a block's ends),
→ creation id, the chunks in use → their arena, address in use → requested bytes (that
last view is chunk_records.RequestedView: the slots it reads sit where ChunkMap's do). Writes
through a view change the records, and keep a free chunk's KEY its arena key.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Protocol

from allocsim.policies import chunk_records
from allocsim.policies.chunk_records import RequestedView

__all__ = ["RequestedView"]         # the in-use → request view, shared with ChunkMap's records

NONE = -1

# A free chunk's key orders by (size, creation id), the model of CuPy's (size, id(chunk)); the
# device address rides in the low bits so a key decodes without a lookup: size = key >>
# SIZE_SHIFT, creation id = key >> CID_SHIFT & ADDRESS_MASK, address = key & ADDRESS_MASK.
# Device addresses and creation ids stay below 2**52.
SIZE_SHIFT = 104
CID_SHIFT = 52
ADDRESS_MASK = (1 << CID_SHIFT) - 1

# A chunk's record, CuPy's _Chunk as one list (its slots are read and written on the hot path
# as list items, several times cheaper than the dict entries they replace). KEY and REQUESTED
# sit where ChunkMap's records have them, so chunk_records.RequestedView serves both:
SIZE = 0        # bytes (a multiple of 512)
PREV = 1        # the record of the chunk before it in its block, or the pool's end record
NEXT = 2        # the record of the chunk after it in its block, or the pool's end record
KEY = chunk_records.KEY     # 3: while free, its arena key SIZE << SIZE_SHIFT | TIE; 0 in use
ADDRESS = 4     # its device address (the end record's: NONE)
REQUESTED = chunk_records.REQUESTED     # 5: while in use, the bytes its caller asked for
                                        # (stale once free)
ARENA = 6       # the _Arena of the stream whose allocation made its block, for life
TIE = 7         # creation id << CID_SHIFT | ADDRESS: the low bits of its key, fixed for life
                # (kept whole so that a key is one shift and one or); None: no creation id
                # (a chunk a view made)
# One end record per pool ([0, None, None, 0, NONE, 0, None, None]) stands where CuPy's links
# are None: the first chunk's PREV and the last one's NEXT, so a neighbour is always a record
# and, "in use" (KEY 0) for ever, the end is never merged with. Its own links are scratch
# (free writes there instead of testing for the end) and never read.


def end_record() -> list:
    """A pool's end record (see the slots above)."""
    return [0, None, None, 0, NONE, 0, None, None]


def tie(cid: int, address: int) -> int:
    """A chunk's TIE slot: its creation id above its address."""
    return cid << CID_SHIFT | address


def arena_key(chunk: list) -> int:
    """The key ``chunk`` has in its arena while free (a chunk without a creation id keys as
    id 0)."""
    return chunk[SIZE] << SIZE_SHIFT | (chunk[ADDRESS] if chunk[TIE] is None else chunk[TIE])


def refresh_key(chunk: list) -> None:
    """Make a free chunk's KEY its arena key again after its size or creation id changed."""
    if chunk[KEY]:
        chunk[KEY] = arena_key(chunk)


class Records(Protocol):
    """What the views read of a :class:`~allocsim.policies.cupy_pool.CuPyPoolAllocator`."""

    record: dict[int, list]
    end: list
    held: dict[int, int]
    strays: dict[int, object]


class SlotView(MutableMapping[int, int]):
    """Chunk address → one slot of its record: SIZE as it is, PREV/NEXT as the neighbour's
    address (NONE at the block's ends), TIE as the creation id (a chunk without one is absent).
    Writing a size at a new address makes a free chunk there, unlinked (its links NONE until
    written), without a creation id, of the arena of the held block it lies in (None if none)."""

    def __init__(self, pool: Records, slot: int) -> None:
        self.pool, self.slot = pool, slot

    def __getitem__(self, address: int) -> int:
        value = self.pool.record[address][self.slot]
        if self.slot == SIZE:
            return int(value)
        if self.slot != TIE:
            return int(value[ADDRESS])
        if value is None:
            raise KeyError(address)
        return int(value) >> CID_SHIFT

    def __setitem__(self, address: int, value: int) -> None:
        pool, slot = self.pool, self.slot
        chunk = pool.record.get(address)
        if chunk is None:
            if slot != SIZE:
                raise KeyError(address)
            arena = None
            for base, nbytes in pool.held.items():
                if base <= address < base + nbytes and base in pool.record:
                    arena = pool.record[base][ARENA]
                    break
            chunk = pool.record[address] = [value, pool.end, pool.end, 0, address, 0, arena, None]
            chunk[KEY] = arena_key(chunk)
        elif slot == SIZE:
            chunk[SIZE] = value
            refresh_key(chunk)
        elif slot == TIE:
            chunk[TIE] = tie(value, address)
            refresh_key(chunk)
        else:
            chunk[slot] = pool.end if value == NONE else pool.record[value]

    def __delitem__(self, address: int) -> None:
        if self.slot == SIZE:
            del self.pool.record[address]
        elif self.slot == TIE:
            self[address]                               # KeyError unless it is there
            self.pool.record[address][TIE] = None
        else:
            raise TypeError("a chunk's links are written, not deleted")

    def __iter__(self) -> Iterator[int]:
        if self.slot == TIE:
            return (a for a, chunk in self.pool.record.items() if chunk[TIE] is not None)
        return iter(self.pool.record)

    def __len__(self) -> int:
        if self.slot == TIE:
            return sum(1 for _ in self)
        return len(self.pool.record)


class InUseView(MutableMapping[int, object]):
    """Chunk address in use (KEY 0) → its arena (ARENA). Writing marks a chunk in use in that
    arena; an address that is no chunk is kept in :attr:`Records.strays`, for check() to name.
    Deleting marks the chunk free (under its key; it enters no arena)."""

    def __init__(self, pool: Records) -> None:
        self.pool = pool

    def __getitem__(self, address: int) -> object:
        chunk = self.pool.record.get(address)
        if chunk is not None and not chunk[KEY]:
            return chunk[ARENA]
        return self.pool.strays[address]

    def __setitem__(self, address: int, arena: object) -> None:
        chunk = self.pool.record.get(address)
        if chunk is None:
            self.pool.strays[address] = arena
        else:
            chunk[KEY], chunk[ARENA] = 0, arena

    def __delitem__(self, address: int) -> None:
        if address in self.pool.strays:
            del self.pool.strays[address]
            return
        chunk = self.pool.record.get(address)
        if chunk is None or chunk[KEY]:
            raise KeyError(address)
        chunk[KEY] = arena_key(chunk)

    def __iter__(self) -> Iterator[int]:
        yield from (a for a, chunk in self.pool.record.items() if not chunk[KEY])
        yield from self.pool.strays

    def __len__(self) -> int:
        return sum(1 for _ in self)
