"""What BFC, preallocate and best-fit share: a policy over one
:class:`~allocsim.policies.chunks.ChunkMap`, with a general path, a hot pair written out and a
segment loop (policies/chunk_loop.py) for the engine.

Its own module (it was the end of chunks.py) so that the segment loop, which reads chunks.py's
bins, can be bound here without an import circle.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, MutableMapping
from functools import partial

from allocsim.policies import chunk_loop
from allocsim.policies.base import DeviceMemory, Policy, SegmentLoop
from allocsim.policies.chunk_records import (
    ADDRESS,
    ADDRESS_MASK,
    KEY,
    KEY_SHIFT,
    NEXT,
    PREV,
    REQUESTED,
    SIZE,
)
from allocsim.policies.chunks import BIN, ChunkMap


class ChunkPolicy(Policy):
    """What BFC, preallocate and best-fit share: one :class:`ChunkMap`; malloc rounds the
    request up to ``alignment``, takes the smallest free chunk that fits (lowest address on
    ties) and splits it when it is ≥ 2·rounded or its slack ≥ ``max_slack`` (BFC's
    ShouldSplitChunk; 0 splits always), else makes room (:meth:`_make_room`, the subclass's
    growth rule) and searches again; free coalesces with free neighbours at once.

    Two paths, the same decisions and the same state. The general one, :meth:`malloc` and
    :meth:`free_general`, takes one step at a time through ChunkMap's and FreeIndex's own
    methods (and through the seams min-capacity's region watch wraps: ``_pop_best_fit`` and the
    subclass's growth). The hot one, :meth:`_malloc_fast` (bound in place of malloc on the
    instance, where the alignment is a power of two and the subclass keeps the class's
    malloc) and :meth:`free`, writes those steps out in one body each over the chunk records
    (slots above) and FreeIndex's bins, keys and bitmask: one Python call per malloc and per
    free, no dict entry written but the record of a split's rest. tests/test_chunk_fast_path.py
    holds the two paths together after every step of random workloads, and
    tests/test_fast_paths.py both to results recorded before they were split. The engine
    replays with a third copy where it may: :meth:`segment_loop` (policies/chunk_loop.py), the
    hot pair written into the engine's per-event loop, held to the engine's loop over the pair
    by tests/test_segment_loop.py.

    Costs (k = free chunks in the FreeIndex bin touched): malloc O(log k) bisection + an O(1)
    jump between bins, + O(log k + k) to index a split's rest; free O(1) link updates plus one
    O(log k + k) index update per merged neighbour and one for the freed chunk."""

    def __init__(self, device: DeviceMemory, alignment: int, max_slack: int) -> None:
        super().__init__(device)
        if alignment <= 0:  # every request is rounded up to a multiple of it
            raise ValueError(f"alignment must be a positive number of bytes, got {alignment}")
        self.alignment = alignment
        self.max_slack = max_slack
        self.chunks = ChunkMap()
        self.peak_bytes_in_use = 0
        # Bound once. The general path's seams (min-capacity's region watch replaces them on
        # the instance and drops the instance's malloc, so that the general one runs):
        self._pop_best_fit = self.chunks.free_index.pop_best_fit
        self._hand_out = self.chunks.hand_out
        # The hot path's structures, and its rounding (alignment a power of two).
        self._record = self.chunks.record
        self._index = self.chunks.free_index
        self._bins = self._index.bins
        self._round_add, self._round_mask = alignment - 1, -alignment
        if type(self).malloc is ChunkPolicy.malloc and alignment > 0 == alignment & (alignment - 1):
            self.malloc = self._malloc_fast             # type: ignore[method-assign]

    def _make_room(self, rounded: int) -> bool:
        """Grow so that a free chunk of ``rounded`` bytes exists; False when it cannot."""
        raise NotImplementedError

    @property
    def requested(self) -> MutableMapping[int, int]:
        """Address in use → the bytes its caller asked for (each chunk's record keeps it, as
        BFC's Chunk keeps requested_size)."""
        return self.chunks.requested

    # -- the general path ------------------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> int | None:
        if size <= 0:
            return None
        rounded = -(-size // self.alignment) * self.alignment
        found = self._pop_best_fit(rounded)
        if found is None and self._make_room(rounded):
            found = self._pop_best_fit(rounded)
        if found is None:
            self.num_ooms += 1
            return None
        address, chunk_size = found
        split = chunk_size >= 2 * rounded or chunk_size - rounded >= self.max_slack
        in_use = self.bytes_in_use + self._hand_out(address, chunk_size, rounded, split, size)
        self.bytes_in_use = in_use
        if in_use > self.peak_bytes_in_use:
            self.peak_bytes_in_use = in_use
        self.num_allocs += 1
        return address

    def free_general(self, address: int) -> None:
        """:meth:`free` through ChunkMap.give_back_general."""
        self.bytes_in_use -= self.chunks.give_back_general(address)
        self.num_frees += 1

    # -- the hot path, written out ----------------------------------------------------
    def _malloc_fast(self, size: int, stream: int = 0) -> int | None:
        """:meth:`malloc`: FreeIndex.pop_best_fit, the split rule and ChunkMap.hand_out
        written out (invariants: the module docstring's, and the record slots')."""
        if size <= 0:
            return None
        rounded = (size + self._round_add) & self._round_mask
        index = self._index
        bins = self._bins
        # FreeIndex.pop_best_fit: in bin(rounded), the first key ≥ (rounded, 0); else the first
        # key of the next non-empty bin above it (the bitmask's lowest set bit above).
        number = BIN[rounded.bit_length()]
        keys = bins[number]
        position = bisect_left(keys, rounded << KEY_SHIFT) if keys else 0
        if position < len(keys):
            key = keys.pop(position)
        else:
            above = index.nonempty >> (number + 1)
            if not above:
                if self._make_room(rounded):
                    return self._malloc_fast(size, stream)      # found at once now
                self.num_ooms += 1
                return None
            number += (above & -above).bit_length()
            keys = bins[number]
            key = keys.pop(0)
        if not keys:
            index.nonempty &= ~(1 << number)
        # ChunkMap.hand_out: in use (KEY 0), with its request; split off the rest if the rule
        # says so — the caller keeps the low end, the rest becomes a free chunk (the chunk
        # after a free one is never free: no merge).
        address = key & ADDRESS_MASK
        chunk = self._record[address]
        chunk[KEY] = 0
        chunk[REQUESTED] = size
        handed = chunk[SIZE]
        rest_size = handed - rounded
        if rest_size and (handed >= 2 * rounded or rest_size >= self.max_slack):
            rest = address + rounded
            after = chunk[NEXT]
            chunk[SIZE] = handed = rounded
            key = rest_size << KEY_SHIFT | rest
            self._record[rest] = chunk[NEXT] = after[PREV] = [
                rest_size, chunk, after, key, rest, 0]
            # FreeIndex.add(rest_size, rest)
            number = BIN[rest_size.bit_length()]
            keys = bins[number]
            if not keys:
                index.nonempty |= 1 << number
                keys.append(key)
            elif key > keys[-1]:
                keys.append(key)
            else:
                insort(keys, key)
        in_use = self.bytes_in_use + handed
        self.bytes_in_use = in_use
        if in_use > self.peak_bytes_in_use:
            self.peak_bytes_in_use = in_use
        self.num_allocs += 1
        return address

    def free(self, address: int) -> None:
        """:meth:`free_general`: ChunkMap.give_back_general written out, each free
        neighbour's key read from its record rather than rebuilt."""
        record = self._record
        chunk = record[address]
        freed, before, after, key, _, _ = chunk
        if key:
            raise KeyError(f"chunk {address:#x} is not in use")
        index = self._index
        bins = self._bins
        size = freed
        key = after[KEY]
        if key:                                         # merge the next chunk into this one
            merged = after[SIZE]
            # FreeIndex.remove(merged, after's address): its key is there (a free chunk).
            number = BIN[merged.bit_length()]
            keys = bins[number]
            del keys[bisect_left(keys, key)]
            if not keys:
                index.nonempty &= ~(1 << number)
            del record[after[ADDRESS]]
            size += merged
            after = chunk[NEXT] = after[NEXT]
            after[PREV] = chunk
        key = before[KEY]
        if key:                                         # merge this one into the previous
            merged = before[SIZE]
            number = BIN[merged.bit_length()]
            keys = bins[number]
            del keys[bisect_left(keys, key)]
            if not keys:
                index.nonempty &= ~(1 << number)
            del record[address]
            size += merged
            chunk, address = before, before[ADDRESS]
            chunk[NEXT] = after
            after[PREV] = chunk
        chunk[SIZE] = size
        # FreeIndex.add(size, address)
        number = BIN[size.bit_length()]
        keys = bins[number]
        chunk[KEY] = key = size << KEY_SHIFT | address
        if not keys:
            index.nonempty |= 1 << number
            keys.append(key)
        elif key > keys[-1]:
            keys.append(key)
        else:
            insort(keys, key)
        self.bytes_in_use -= freed
        self.num_frees += 1

    def segment_loop(self) -> SegmentLoop | None:
        """The engine's loop with the hot pair written in
        (:func:`~allocsim.policies.chunk_loop.replay_segment`), while the hot pair is what runs:
        the written-out malloc bound on the instance and the class's free (not best-fit's trim,
        nor a general path or wrapper put on the instance); else None."""
        bound = vars(self)
        if (bound.get("malloc") != self._malloc_fast or "free" in bound
                or type(self).free is not ChunkPolicy.free):
            return None
        return partial(chunk_loop.replay_segment, self)

    # -- views -----------------------------------------------------------------------
    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        return self.chunks.chunks()
