"""A chunk's record and the mapping views over a map of them (policies/chunks.py's layout).

:class:`~allocsim.policies.chunks.ChunkMap` keeps each chunk as one list (the slots below) and
the policies' hot paths read and write those slots. The views here let everything else — the
invariant checks, the tests that corrupt a state on purpose and expect check() to name it,
min-capacity's and bfc-fidelity's readers — see the chunks as the plain dicts and sets they
were before the records: address → size, → neighbour's address, the in-use set, region end →
last chunk, address → requested bytes. Writes through a view change the records.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping, MutableSet
from typing import Protocol

NONE = -1

# A free chunk's key: size << KEY_SHIFT | address, so that integer order is (size, address)
# order and a key decodes without a lookup (size = key >> KEY_SHIFT, address = key &
# ADDRESS_MASK). Device addresses stay below 2**52. FreeIndex packs keys (add returns the key,
# pop_best_fit hands one back); its users unpack them.
KEY_SHIFT = 52
ADDRESS_MASK = (1 << KEY_SHIFT) - 1

# A chunk's record, bfc_allocator.h's Chunk as one list (its slots are read and written on the
# hot path as list items, several times cheaper than the dict entries they replace):
SIZE = 0        # bytes
PREV = 1        # the record of the chunk before it in its region, or the region's ring
NEXT = 2        # the record of the chunk after it, or the region's ring
KEY = 3         # while free: its FreeIndex key (size << KEY_SHIFT | address); 0 while in use
ADDRESS = 4     # its address (the ring's: NONE)
REQUESTED = 5   # while in use: the bytes its caller asked for (BFC's requested_size), or 0;
                # read only while in use (stale once free)
# Each region's chunks and one sentinel record, its ring ([0, last, first, 0, NONE, 0]), form a
# circle: the first chunk's PREV and the last one's NEXT are the ring, so a neighbour is always
# a record, the ring's PREV is always the region's last chunk, and, "in use" (KEY 0) for ever,
# the ring is never merged with.


class HasRecords(Protocol):
    """Records keyed by address whose KEY and REQUESTED slots are the ones above (ChunkMap's;
    CuPy's pool lays its records out with the same two): what :class:`RequestedView` reads."""

    record: dict[int, list]


class Chunks(Protocol):
    """What the views read of a :class:`~allocsim.policies.chunks.ChunkMap`."""

    record: dict[int, list]
    ring: dict[int, list]
    regions: dict[int, int]
    strays: set[int]

    def region_of(self, address: int) -> int | None: ...


class SlotView(MutableMapping[int, int]):
    """Chunk address → one slot of its record: SIZE, or PREV/NEXT as the neighbour's address
    (NONE at the region's ends). Writing a size at a new address makes a free chunk there,
    unlinked until its links are written."""

    def __init__(self, chunks: Chunks, slot: int) -> None:
        self.chunks, self.slot = chunks, slot

    def __getitem__(self, address: int) -> int:
        value = self.chunks.record[address][self.slot]
        return value if self.slot == SIZE else value[ADDRESS]

    def __setitem__(self, address: int, value: int) -> None:
        record = self.chunks.record
        if self.slot == SIZE:
            chunk = record.get(address)
            if chunk is None:
                record[address] = [value, _UNLINKED, _UNLINKED, value << KEY_SHIFT | address,
                                   address, 0]
            else:
                chunk[SIZE] = value
        elif value != NONE:
            record[address][self.slot] = record[value]
        else:
            base = self.chunks.region_of(address)
            record[address][self.slot] = _UNLINKED if base is None else self.chunks.ring[base]

    def __delitem__(self, address: int) -> None:
        if self.slot != SIZE:
            raise TypeError("a chunk's links are written, not deleted")
        del self.chunks.record[address]

    def __iter__(self) -> Iterator[int]:
        return iter(self.chunks.record)

    def __len__(self) -> int:
        return len(self.chunks.record)


_UNLINKED: list = [0, None, None, 0, NONE, 0]     # the neighbour of a chunk made by SlotView


class InUseView(MutableSet[int]):
    """The addresses of the chunks in use (KEY 0). Marking an address that is no chunk keeps it
    in :attr:`Chunks.strays`, for check() to name."""

    def __init__(self, chunks: Chunks) -> None:
        self.chunks = chunks

    def __contains__(self, address: object) -> bool:
        chunk = self.chunks.record.get(address)     # type: ignore[call-overload]
        return (chunk is not None and not chunk[KEY]) or address in self.chunks.strays

    def __iter__(self) -> Iterator[int]:
        yield from (a for a, chunk in self.chunks.record.items() if not chunk[KEY])
        yield from self.chunks.strays

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def add(self, address: int) -> None:
        chunk = self.chunks.record.get(address)
        if chunk is None:
            self.chunks.strays.add(address)
        else:
            chunk[KEY] = 0

    def discard(self, address: int) -> None:
        self.chunks.strays.discard(address)
        chunk = self.chunks.record.get(address)
        if chunk is not None and not chunk[KEY]:
            chunk[KEY] = chunk[SIZE] << KEY_SHIFT | address


class TailView(MutableMapping[int, int]):
    """Region end → the address of the region's last chunk (its ring's PREV)."""

    def __init__(self, chunks: Chunks) -> None:
        self.chunks = chunks

    def _ring(self, end: int) -> list:
        for base, nbytes in self.chunks.regions.items():
            if base + nbytes == end:
                return self.chunks.ring[base]
        raise KeyError(end)

    def __getitem__(self, end: int) -> int:
        return int(self._ring(end)[PREV][ADDRESS])

    def __setitem__(self, end: int, address: int) -> None:
        self._ring(end)[PREV] = self.chunks.record[address]

    def __delitem__(self, end: int) -> None:
        raise TypeError("a region's tail is written, not deleted")

    def __iter__(self) -> Iterator[int]:
        return (base + nbytes for base, nbytes in self.chunks.regions.items())

    def __len__(self) -> int:
        return len(self.chunks.regions)


class RequestedView(MutableMapping[int, int]):
    """In-use chunk address → the bytes its caller asked for (REQUESTED; a chunk handed out
    without a request, or whose request was deleted here, is absent)."""

    def __init__(self, chunks: HasRecords) -> None:
        self.chunks = chunks

    def __getitem__(self, address: int) -> int:
        chunk = self.chunks.record[address]
        if chunk[KEY] or not chunk[REQUESTED]:
            raise KeyError(address)
        return int(chunk[REQUESTED])

    def __setitem__(self, address: int, nbytes: int) -> None:
        self.chunks.record[address][REQUESTED] = nbytes

    def __delitem__(self, address: int) -> None:
        self[address]                                   # KeyError unless it is there
        self.chunks.record[address][REQUESTED] = 0

    def __iter__(self) -> Iterator[int]:
        return (a for a, chunk in self.chunks.record.items()
                if not chunk[KEY] and chunk[REQUESTED])

    def __len__(self) -> int:
        return sum(1 for _ in self)
