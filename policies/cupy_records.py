"""A CuPy pool chunk (named fields) and the mapping views over a pool's chunks (cupy_pool.py).

:class:`~allocsim.policies.cupy_pool.CuPyPoolAllocator` keeps each chunk as one
:class:`CuPyChunk`, one dict address → chunk, and its malloc and free read and write its
fields. The
views here let everything else — its ``check()``, the tests that corrupt a state on purpose and
expect check() to name it, min-capacity's repeat check — see the chunks as the plain dicts they
were before the records: address → size, → the neighbour's address (NONE at a block's ends),
→ creation id, the chunks in use → their arena, address in use → requested bytes (that
last view is chunk_records.RequestedView: a CuPyChunk is a Chunk). Writes through a view
change the chunks, and keep a free chunk's ``key`` its arena key.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any, Protocol

from allocsim.policies.chunk_records import Chunk, RequestedView

__all__ = ["RequestedView"]         # the in-use → request view, shared with ChunkMap's records

NONE = -1

# A free chunk's key orders by (size, creation id), the model of CuPy's (size, id(chunk)); the
# device address rides in the low bits so a key decodes without a lookup: size = key >>
# SIZE_SHIFT, creation id = key >> CID_SHIFT & ADDRESS_MASK, address = key & ADDRESS_MASK.
# Device addresses and creation ids stay below 2**52.
SIZE_SHIFT = 104
CID_SHIFT = 52
ADDRESS_MASK = (1 << CID_SHIFT) - 1

class CuPyChunk(Chunk):
    """CuPy's _Chunk with named fields: a Chunk (so chunk_records.RequestedView serves both)
    with its arena and its tie. One end chunk per pool (:func:`end_chunk`) stands where CuPy's
    links are None: the first chunk's ``prev`` and the last one's ``next``, so a neighbour is
    always a chunk and, "in use" (``key`` 0) for ever, the end is never merged with. Its own
    links are scratch (free writes there instead of testing for the end) and never read."""

    __slots__ = ("arena", "tie")
    prev: CuPyChunk
    next: CuPyChunk

    def __init__(self, size: int, prev: CuPyChunk, next: CuPyChunk,
                 key: int, address: int, requested: int, arena: Any, tie: int) -> None:
        self.size = size            # bytes (a multiple of 512)
        self.prev = prev            # the chunk before it in its block, or the pool's end chunk
        self.next = next            # the chunk after it in its block, or the pool's end chunk
        self.key = key              # while free, its arena key size << SIZE_SHIFT | tie; 0 in
                                    # use
        self.address = address      # its device address (the end chunk's: NONE)
        self.requested = requested  # while in use, the bytes its caller asked for (stale
                                    # once free)
        self.arena = arena          # the arena of the stream whose allocation made its block,
                                    # for life
        self.tie = tie              # creation id << CID_SHIFT | address: the low bits of its
                                    # key, fixed for life (kept whole so that a key is one
                                    # shift and one or); None: no creation id (a chunk a view
                                    # made)


def end_chunk() -> CuPyChunk:
    """A pool's end chunk (see :class:`CuPyChunk`)."""
    return CuPyChunk(0, None, None, 0, NONE, 0, None, None)      # type: ignore[arg-type]


def tie(cid: int, address: int) -> int:
    """A chunk's ``tie``: its creation id above its address."""
    return cid << CID_SHIFT | address


def arena_key(chunk: CuPyChunk) -> int:
    """The key ``chunk`` has in its arena while free (a chunk without a creation id keys as
    id 0)."""
    return chunk.size << SIZE_SHIFT | (chunk.address if chunk.tie is None else chunk.tie)


def refresh_key(chunk: CuPyChunk) -> None:
    """Make a free chunk's ``key`` its arena key again after its size or creation id changed."""
    if chunk.key:
        chunk.key = arena_key(chunk)


class Records(Protocol):
    """What the views read of a :class:`~allocsim.policies.cupy_pool.CuPyPoolAllocator`."""

    record: dict[int, CuPyChunk]
    end: CuPyChunk
    held: dict[int, int]
    strays: dict[int, object]


class SlotView(MutableMapping[int, int]):
    """Chunk address → one field of its chunk: ``size`` as it is, ``prev``/``next`` as the
    neighbour's address (NONE at the block's ends), ``tie`` as the creation id (a chunk without
    one is absent). Writing a size at a new address makes a free chunk there, unlinked (its
    links NONE until written), without a creation id, of the arena of the held block it lies
    in (None if none)."""

    def __init__(self, pool: Records, field: str) -> None:
        if field not in ("size", "prev", "next", "tie"):
            raise ValueError(f"no view of a chunk's {field!r}")
        self.pool, self.field = pool, field

    def __getitem__(self, address: int) -> int:
        value = getattr(self.pool.record[address], self.field)
        if self.field == "size":
            return int(value)
        if self.field != "tie":
            return int(value.address)
        if value is None:
            raise KeyError(address)
        return int(value) >> CID_SHIFT

    def __setitem__(self, address: int, value: int) -> None:
        pool, field = self.pool, self.field
        chunk = pool.record.get(address)
        if chunk is None:
            if field != "size":
                raise KeyError(address)
            arena = None
            for base, nbytes in pool.held.items():
                if base <= address < base + nbytes and base in pool.record:
                    arena = pool.record[base].arena
                    break
            chunk = pool.record[address] = CuPyChunk(value, pool.end, pool.end, 0, address, 0,
                                                     arena, None)  # type: ignore[arg-type]
            chunk.key = arena_key(chunk)
        elif field == "size":
            chunk.size = value
            refresh_key(chunk)
        elif field == "tie":
            chunk.tie = tie(value, address)
            refresh_key(chunk)
        else:
            setattr(chunk, field, pool.end if value == NONE else pool.record[value])

    def __delitem__(self, address: int) -> None:
        if self.field == "size":
            del self.pool.record[address]
        elif self.field == "tie":
            self[address]                               # KeyError unless it is there
            self.pool.record[address].tie = None  # type: ignore[assignment]
        else:
            raise TypeError("a chunk's links are written, not deleted")

    def __iter__(self) -> Iterator[int]:
        if self.field == "tie":
            return (a for a, chunk in self.pool.record.items() if chunk.tie is not None)
        return iter(self.pool.record)

    def __len__(self) -> int:
        if self.field == "tie":
            return sum(1 for _ in self)
        return len(self.pool.record)


class InUseView(MutableMapping[int, object]):
    """Chunk address in use (``key`` 0) → its arena (``arena``). Writing marks a chunk in use
    in that arena; an address that is no chunk is kept in :attr:`Records.strays`, for check()
    to name. Deleting marks the chunk free (under its key; it enters no arena)."""

    def __init__(self, pool: Records) -> None:
        self.pool = pool

    def __getitem__(self, address: int) -> object:
        chunk = self.pool.record.get(address)
        if chunk is not None and not chunk.key:
            return chunk.arena
        return self.pool.strays[address]

    def __setitem__(self, address: int, arena: object) -> None:
        chunk = self.pool.record.get(address)
        if chunk is None:
            self.pool.strays[address] = arena
        else:
            chunk.key, chunk.arena = 0, arena

    def __delitem__(self, address: int) -> None:
        if address in self.pool.strays:
            del self.pool.strays[address]
            return
        chunk = self.pool.record.get(address)
        if chunk is None or chunk.key:
            raise KeyError(address)
        chunk.key = arena_key(chunk)

    def __iter__(self) -> Iterator[int]:
        yield from (a for a, chunk in self.pool.record.items() if not chunk.key)
        yield from self.pool.strays

    def __len__(self) -> int:
        return sum(1 for _ in self)
