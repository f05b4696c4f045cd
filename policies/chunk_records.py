"""A chunk (bfc_allocator.h's Chunk, named fields) and the mapping views over a map of them.

:class:`~allocsim.policies.chunks.ChunkMap` keeps each chunk as one :class:`Chunk` and the
policies read and write its fields. The views here let everything else — the invariant
checks, the tests that corrupt a state on purpose and expect check() to name it,
min-capacity's and bfc-fidelity's readers — see the chunks as plain dicts and sets: address →
size, → neighbour's address, the in-use set, region end → last chunk, address → requested
bytes. Writes through a view change the chunks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping, MutableSet
from typing import Protocol

NONE = -1

# A free chunk's key: size << KEY_SHIFT | address, so that integer order is (size, address)
# order and a key decodes without a lookup (size = key >> KEY_SHIFT, address = key &
# ADDRESS_MASK). Device addresses stay below 2**52. FreeIndex packs keys (add returns the key,
# pop_best_fit hands one back); its users unpack them.
KEY_SHIFT = 52
ADDRESS_MASK = (1 << KEY_SHIFT) - 1


class Chunk:
    """bfc_allocator.h's Chunk with named fields. Each region's chunks and one sentinel, its
    ring (``Chunk(0, last, first, 0, NONE, 0)``), form a circle: the first chunk's ``prev`` and
    the last one's ``next`` are the ring, so a neighbour is always a chunk, the ring's ``prev``
    is always the region's last chunk, and, "in use" (``key`` 0) for ever, the ring is never
    merged with."""

    __slots__ = ("address", "key", "next", "prev", "requested", "size")

    def __init__(self, size: int, prev: Chunk, next: Chunk,
                 key: int, address: int, requested: int) -> None:
        self.size = size            # bytes
        self.prev = prev            # the chunk before it in its region, or the region's ring
        self.next = next            # the chunk after it, or the region's ring
        self.key = key              # while free: its FreeIndex key (size << KEY_SHIFT |
                                    # address); 0 while in use
        self.address = address      # its address (the ring's: NONE)
        self.requested = requested  # while in use: the bytes its caller asked for (BFC's
                                    # requested_size), or 0; read only while in use (stale
                                    # once free)

    def __repr__(self) -> str:
        return f"Chunk({self.address:#x}, size={self.size}, key={self.key:#x})"


def ring_of(nbytes: int, base: int, spare: list[Chunk] | None = None) -> Chunk:
    """A new region's ring around its one free chunk of ``nbytes`` at ``base``; returns the
    chunk. Made of two chunks from ``spare`` (chunks a map dropped) when it holds two: the
    stream-ordered pool maps and releases a region at nearly every event with its default
    threshold, and a class instantiation costs more than writing the fields."""
    if spare is not None and len(spare) >= 2:
        ring, chunk = spare.pop(), spare.pop()
        ring.size, ring.key, ring.address, ring.requested = 0, 0, NONE, 0
        chunk.size, chunk.key, chunk.address, chunk.requested = (
            nbytes, nbytes << KEY_SHIFT | base, base, 0)
        chunk.prev = chunk.next = ring
    else:
        ring = Chunk(0, None, None, 0, NONE, 0)                      # type: ignore[arg-type]
        chunk = Chunk(nbytes, ring, ring, nbytes << KEY_SHIFT | base, base, 0)
    ring.prev = ring.next = chunk
    return chunk


class HasRecords(Protocol):
    """Chunks keyed by address (ChunkMap's; CuPy's pool's chunks are Chunks too): what
    :class:`RequestedView` reads."""

    @property
    def record(self) -> Mapping[int, Chunk]: ...


class Chunks(Protocol):
    """What the views read of a :class:`~allocsim.policies.chunks.ChunkMap`."""

    record: dict[int, Chunk]
    ring: dict[int, Chunk]
    regions: dict[int, int]
    strays: set[int]

    def region_of(self, address: int) -> int | None: ...


class SlotView(MutableMapping[int, int]):
    """Chunk address → one field of its chunk: ``size``, or ``prev``/``next`` as the
    neighbour's address (NONE at the region's ends). Writing a size at a new address makes a
    free chunk there, unlinked until its links are written."""

    def __init__(self, chunks: Chunks, field: str) -> None:
        if field not in ("size", "prev", "next"):
            raise ValueError(f"no view of a chunk's {field!r}")
        self.chunks, self.field = chunks, field

    def __getitem__(self, address: int) -> int:
        value = getattr(self.chunks.record[address], self.field)
        return int(value if self.field == "size" else value.address)

    def __setitem__(self, address: int, value: int) -> None:
        record = self.chunks.record
        if self.field == "size":
            chunk = record.get(address)
            if chunk is None:
                record[address] = Chunk(value, _UNLINKED, _UNLINKED,
                                        value << KEY_SHIFT | address, address, 0)
            else:
                chunk.size = value
        elif value != NONE:
            setattr(record[address], self.field, record[value])
        else:
            base = self.chunks.region_of(address)
            setattr(record[address], self.field,
                    _UNLINKED if base is None else self.chunks.ring[base])

    def __delitem__(self, address: int) -> None:
        if self.field != "size":
            raise TypeError("a chunk's links are written, not deleted")
        del self.chunks.record[address]

    def __iter__(self) -> Iterator[int]:
        return iter(self.chunks.record)

    def __len__(self) -> int:
        return len(self.chunks.record)


# The neighbour of a chunk made by SlotView.
_UNLINKED = Chunk(0, None, None, 0, NONE, 0)                          # type: ignore[arg-type]


class InUseView(MutableSet[int]):
    """The addresses of the chunks in use (``key`` 0). Marking an address that is no chunk keeps it
    in :attr:`Chunks.strays`, for check() to name."""

    def __init__(self, chunks: Chunks) -> None:
        self.chunks = chunks

    def __contains__(self, address: object) -> bool:
        chunk = self.chunks.record.get(address)     # type: ignore[call-overload]
        return (chunk is not None and not chunk.key) or address in self.chunks.strays

    def __iter__(self) -> Iterator[int]:
        yield from (a for a, chunk in self.chunks.record.items() if not chunk.key)
        yield from self.chunks.strays

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def add(self, address: int) -> None:
        chunk = self.chunks.record.get(address)
        if chunk is None:
            self.chunks.strays.add(address)
        else:
            chunk.key = 0

    def discard(self, address: int) -> None:
        self.chunks.strays.discard(address)
        chunk = self.chunks.record.get(address)
        if chunk is not None and not chunk.key:
            chunk.key = chunk.size << KEY_SHIFT | address


class TailView(MutableMapping[int, int]):
    """Region end → the address of the region's last chunk (its ring's ``prev``)."""

    def __init__(self, chunks: Chunks) -> None:
        self.chunks = chunks

    def _ring(self, end: int) -> Chunk:
        for base, nbytes in self.chunks.regions.items():
            if base + nbytes == end:
                return self.chunks.ring[base]
        raise KeyError(end)

    def __getitem__(self, end: int) -> int:
        return int(self._ring(end).prev.address)

    def __setitem__(self, end: int, address: int) -> None:
        self._ring(end).prev = self.chunks.record[address]

    def __delitem__(self, end: int) -> None:
        raise TypeError("a region's tail is written, not deleted")

    def __iter__(self) -> Iterator[int]:
        return (base + nbytes for base, nbytes in self.chunks.regions.items())

    def __len__(self) -> int:
        return len(self.chunks.regions)


class RequestedView(MutableMapping[int, int]):
    """In-use chunk address → the bytes its caller asked for (``requested``; a chunk handed out
    without a request, or whose request was deleted here, is absent)."""

    def __init__(self, chunks: HasRecords) -> None:
        self.chunks = chunks

    def __getitem__(self, address: int) -> int:
        chunk = self.chunks.record[address]
        if chunk.key or not chunk.requested:
            raise KeyError(address)
        return int(chunk.requested)

    def __setitem__(self, address: int, nbytes: int) -> None:
        self.chunks.record[address].requested = nbytes

    def __delitem__(self, address: int) -> None:
        self[address]                                   # KeyError unless it is there
        self.chunks.record[address].requested = 0

    def __iter__(self) -> Iterator[int]:
        return (a for a, chunk in self.chunks.record.items()
                if not chunk.key and chunk.requested)

    def __len__(self) -> int:
        return sum(1 for _ in self)
