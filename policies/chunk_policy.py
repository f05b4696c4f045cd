"""What BFC, preallocate and best-fit share: a policy over one
:class:`~allocsim.policies.chunks.ChunkMap` — best fit, BFC's split rule, coalescing — with the
growth rule left to the subclass, and the observer hooks through which min-capacity's region
watch follows a replay without touching the policy's internals.

Each rule is written once here (the Python model is the specification; speed is the native
core's business): the best fit is :meth:`FreeIndex.pop_best_fit`, the split rule
:meth:`ChunkPolicy.smallest_split`, the split itself :meth:`ChunkMap.split` and the coalescing
:meth:`ChunkMap.give_back`.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any, Protocol

from allocsim.policies.base import DeviceMemory, Policy
from allocsim.policies.chunk_records import ADDRESS_MASK, KEY_SHIFT
from allocsim.policies.chunks import ChunkMap


class ChunkObserver(Protocol):
    """What a watcher of a :class:`ChunkPolicy` is told, in the order it happens (public hooks:
    min-capacity's region watch, sim/questions/capacity/regions.py, is one). A policy calls
    these only when an observer is set (:meth:`ChunkPolicy.observe`); they must not change the
    policy.

    - ``on_best_fit(rounded, key)``: a best-fit search for ``rounded`` bytes took the chunk of
      free-index key ``key`` (``size << KEY_SHIFT | address``: out of the index, not yet handed
      out), or found nothing (0); called for the search before growth and the one after it.
    - ``on_extend_start(rounded)`` and ``on_extend(rounded, nbytes)``: BFC's Extend for
      ``rounded`` bytes begins, and ends having added a region of ``nbytes`` (None: it failed).
    """

    def on_best_fit(self, rounded: int, key: int) -> None: ...

    def on_extend_start(self, rounded: int) -> None: ...

    def on_extend(self, rounded: int, nbytes: int | None) -> None: ...


class ChunkPolicy(Policy):
    """What BFC, preallocate and best-fit share: one :class:`ChunkMap`; malloc rounds the
    request up to ``alignment``, takes the smallest free chunk that fits (lowest address on
    ties) and splits it when it is at least :meth:`smallest_split` (BFC's ShouldSplitChunk: ≥
    2·rounded, or slack ≥ ``max_slack``; 0 splits always), else makes room (:meth:`_make_room`,
    the subclass's growth rule) and searches again; free coalesces with free neighbours at once.

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
        self.observer: ChunkObserver | None = None
        self.trim = False           # unmap wholly free space at the top after each free
                                    # (best-fit's option; :meth:`_trim`)
        self._record = self.chunks.record                           # bound once
        self._pop_best_fit = self.chunks.free_index.pop_best_fit
        self._split = self.chunks.split
        self._give_back = self.chunks.give_back

    def observe(self, observer: ChunkObserver | None) -> None:
        """Tell ``observer`` of every search and growth from now on (None: stop)."""
        self.observer = observer

    def _make_room(self, rounded: int) -> bool:
        """Grow so that a free chunk of ``rounded`` bytes exists; False when it cannot."""
        raise NotImplementedError

    @property
    def requested(self) -> MutableMapping[int, int]:
        """Address in use → the bytes its caller asked for (each chunk's record keeps it, as
        BFC's Chunk keeps requested_size)."""
        return self.chunks.requested

    def smallest_split(self, rounded: int) -> int:
        """The split rule, BFC's ShouldSplitChunk (bfc_allocator.cc, FindChunkPtr: split when
        ``chunk->size >= rounded_bytes * 2 || chunk->size - rounded_bytes >=
        max_internal_fragmentation_bytes_``) as the smallest chunk that a request of
        ``rounded`` bytes splits: a chunk splits exactly when it is at least this. The one copy
        of the rule; min-capacity's region watch reads it too."""
        twice, slack_edge = 2 * rounded, rounded + self.max_slack
        return twice if twice < slack_edge else slack_edge

    def chunk_numbers(self) -> dict[str, Any]:
        """ChunkConfig's shared fields (native/src/chunk_policy.hpp): the alignment and the
        split slack; each growth rule's :meth:`native_numbers` adds its own."""
        return {"alignment": self.alignment, "max_slack": self.max_slack}

    # -- the interface -----------------------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> int | None:
        if size <= 0:
            return None
        alignment = self.alignment
        rounded = -(-size // alignment) * alignment
        key = self._pop_best_fit(rounded)
        observer = self.observer
        if observer is not None:
            observer.on_best_fit(rounded, key)
        if not key:
            if not self._make_room(rounded):
                self.num_ooms += 1
                return None
            key = self._pop_best_fit(rounded)               # found at once now
            if observer is not None:
                observer.on_best_fit(rounded, key)
            if not key:
                raise AssertionError(f"{self.name}: growth for {rounded} bytes left no chunk "
                                     "that fits")
        # Hand the chunk out (in use: key 0, with its request), split by the rule.
        address = key & ADDRESS_MASK
        chunk = self._record[address]
        chunk.key = 0
        chunk.requested = size
        if key >> KEY_SHIFT >= self.smallest_split(rounded):        # ShouldSplitChunk
            self._split(chunk, rounded)
        in_use = self.bytes_in_use + chunk.size
        self.bytes_in_use = in_use
        if in_use > self.peak_bytes_in_use:
            self.peak_bytes_in_use = in_use
        self.num_allocs += 1
        return address

    def free(self, address: int) -> None:
        self.bytes_in_use -= self._give_back(address)
        self.num_frees += 1
        if self.trim:
            self._trim()

    def _trim(self) -> None:
        """Give back wholly free memory at the top after a free (with ``trim``)."""
        raise NotImplementedError

    # -- views -----------------------------------------------------------------------
    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        return self.chunks.chunks()
