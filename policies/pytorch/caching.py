"""PyTorch's CUDA caching allocator (the "native" backend), rule for rule.

Followed, in pytorch/pytorch: c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator::malloc,
round_size, roundup_power2_next_division, get_pool, get_allocation_size, get_free_block,
should_split, alloc_found_block, alloc_block, release_available_cached_blocks,
release_cached_blocks, release_blocks, release_block, free, free_block, try_merge_blocks,
garbage_collect_cached_blocks, find_expandable_block, try_allocate_expandable_block, map_block,
unmap_block, release_expandable_segment, ExpandableSegment::map/unmap, snapshot, emptyCache,
setMemoryFraction); the newer generic copy of the same code in c10/core/CachingDeviceAllocator.h;
and the configuration in c10/core/AllocatorConfig.{h,cpp} (ConfigTokenizer,
AcceleratorAllocatorConfig::parseArgs, parseMaxSplitSize, parseMaxNonSplitRoundingSize,
parseGarbageCollectionThreshold, parseRoundUpPower2Divisions, roundup_power2_divisions) and
c10/cuda/CUDAAllocatorConfig.cpp (the CUDA-only keys).

Versions: the rules are the same in the CUDACachingAllocator.cpp read (commit 001074d2) and the
newer generic header, except where the newer code is followed here: the non-split rounding limit
is max_non_split_rounding_mb (older code: the constant kLargeBuffer = 20 MiB, the same default);
release_available_cached_blocks and garbage collection never release expandable-segment blocks;
roundup_power2_divisions' ``>`` entry (see below). The generic header orders a pool by
(size, stream, address) while the CUDA file orders by (stream, size, address); the CUDA order
is modelled (a per-stream search).

Rules:

- round_size: < 512 B → 512; else with d = divisions for the size's interval (16 intervals,
  index = clamp(floor(log2 size) − 20, 0, 15)), if d > 1 and size > 512·d: a power of two stays,
  else round up to a multiple of floor_pow2(size) >> floor(log2 d); otherwise up to 512 B.
- pool: rounded ≤ 1 MiB → small pool, else large; each pool's free blocks are ordered by
  (stream, size, address) — here one sorted list of ``size << 52 | address`` per (stream, pool).
- get_free_block: the first block on the SAME stream with size ≥ rounded (smallest, lowest
  address on ties); no search beyond it: rejected if rounded < max_split_size ≤ block, or if
  rounded ≥ max_split_size and block ≥ rounded + max_non_split_rounding (20 MiB by default).
  With expandable segments, from that block it moves on to bigger blocks while their
  "expandable size" (size + the unmapped space behind them) is smaller.
- segment size on a miss (get_allocation_size): ≤ 1 MiB → 2 MiB; < 10 MiB → 20 MiB; else
  rounded up to 2 MiB.
- should_split: small pool or expandable segments → remaining ≥ 512; large pool → rounded <
  max_split_size and remaining > 1 MiB. The caller keeps the low end.
- malloc: search → (garbage collection, only when a memory fraction is set and
  garbage_collection_threshold > 0) → alloc_block → release_available_cached_blocks (only with
  max_split_size) and alloc_block → release_cached_blocks (every unsplit free block, = empty
  cache; num_sync_all_streams += 1) and alloc_block as a retry (num_alloc_retries += 1) → OOM
  (num_ooms += 1).
- alloc_block fails without a device call when a fraction is set and reserved + segment size >
  fraction × capacity (the segment size is checked even when expandable segments map less).
- free_block: merge with the previous then the next block of the same segment when free (and
  equally mapped); segments go back only through the OOM path, GC or empty_cache.
- garbage_collect_cached_blocks: threshold = garbage_collection_threshold × allowed bytes; above
  it, release unsplit large-pool blocks whose age (large-pool searches since the block entered
  the pool) ≥ the mean age, repeating with a new mean until enough is reclaimed or none goes.
- expandable segments: per (stream, pool) a virtual range of ceil(1.125 × capacity / page)
  pages, pages of 2 MiB (small pool) or 20 MiB (large pool); a miss maps whole pages at the
  lowest address where free + unmapped space covers the request (first unmapped block in
  address order, together with a free block just before it); release_cached_blocks unmaps the
  whole pages inside free blocks and forgets a range that is wholly unmapped.

Modelled but worth knowing:
- garbage collection runs only when a memory fraction is set, as in PyTorch
  (``set_fraction`` gates it). ``per_process_memory_fraction`` unset (the default) means
  "never set" — the whole device, no GC; any value in [0, 1], 1.0 included, counts as set, and
  0 is a limit of 0 bytes: every allocation fails, as in PyTorch (setMemoryFraction(0)).
- roundup_power2_divisions follows the current parser: ``>`` fills the intervals after the last
  one named (older releases filled from the last named one, overwriting it). Lists may use
  ``;`` between entries as well as ``,``, because registry specs split on commas:
  ``pytorch:roundup_power2_divisions=[256:1;512:2;>:8]``.
- one ``device.map`` call per map_block (PyTorch creates one handle per page; the cost model
  therefore under-counts page-by-page mapping cost), one ``device.unmap`` per unmapped range.

Starting mid-run: :meth:`PyTorchCachingAllocator.seed` lays out a recorded segment list
(memory_snapshot()'s shape) before the first malloc, so a replay of a snapshot recorded
mid-run starts from the state the recording started in (allocsim.sim.questions.fidelity.pytorch
uses it).

Not modelled: record_stream / cross-stream frees (every free is complete at once, so
process_events and the event queues are empty), CUDA graph private pools and MemPools,
free-memory callbacks, cudaMallocAsync, IPC, release_lock_on_cudamalloc, toggling
expandable_segments during a run (all segments are one kind), and requested_size of inactive
blocks in :meth:`segments` (reported as 0; PyTorch reports stale values there). Stats kept per
pool only as current values (computed on demand), peaks are kept for the aggregate ("all").

Which statistics are kept: everything by default. A caller that will not read memory_stats()
says so before the first malloc with :meth:`PyTorchCachingAllocator.keep_memory_stats`
(False) — the replay engine does, as it reads only ``bytes_in_use`` and ``stats()`` — and the
counters only memory_stats() reads (stats.MEMORY_STATS_ONLY) are then not counted:
memory_stats() raises and those attributes are absent from ``counters``, so nothing reads a
stale number.

Layout: one class, :class:`PyTorchCachingAllocator` (this module: the parameters, malloc and
free — one of each for every setting — get_free_block and free_block's merges), composed of
parts held as fields, one module each of this package, as DeviceCachingAllocator holds its
BlockPools and DeviceStats: ``pools`` (blocks.BlockPools: blocks, segments, free lists, GC stamps),
``counters`` (stats.DeviceStats: memory_stats()'s counters), ``expandable_segments``
(expandable.ExpandableSegments, or None without the setting), ``release``
(oom.ReleasePath: the miss path, the release steps, empty_cache) and ``snapshots``
(snapshot.Snapshots: seed, segments, memory_stats). The configuration and the size
rules are functions of settings.py; a block is records.Block (named fields: size,
prev, next, pool_key, requested, address), found by address in ``pools.record``. Each rule is
written once: should_split in settings.py, get_free_block here, its expandable walk in
expandable.py, free_block's merges here, try_merge_blocks (for map and unmap) in
expandable.py; memory_stats()'s own counters are counted only while kept, and
tests/test_fast_path_equivalence.py holds a lean and a kept allocator to the same decisions.
Costs: malloc is an O(log k) bisection in the (stream, pool) free list plus O(k) list
deletion and, for a split, insertion (k = free blocks of that pool); free is O(1) link updates
plus one O(log k + k) update per merged neighbour and one for the joined block; a miss adds
the steps in oom.py.
"""


from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from allocsim.policies.base import (
    DeviceMemory,
    NativeTwin,
    Param,
    Policy,
    PolicyStats,
    params_of,
)
from allocsim.policies.pytorch.blocks import MASK, SHIFT, BlockPools
from allocsim.policies.pytorch.expandable import ExpandableSegments, check_no_unmapped
from allocsim.policies.pytorch.oom import ReleasePath
from allocsim.policies.pytorch.records import Block
from allocsim.policies.pytorch.settings import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    NO_LIMIT,
    MiB,
    divisions_index,
    get_allocation_size,
    parse_alloc_conf,
    parse_roundup_power2_divisions,
    round_size,
    roundup_power2_next_division,
    should_split,
    validate,
)
from allocsim.policies.pytorch.snapshot import Snapshots
from allocsim.policies.pytorch.stats import DeviceStats

# Importable from here as before the split (sim/questions and the tests use them); their home
# is policies/pytorch/settings.py.
__all__ = [
    "MiB", "PyTorchCachingAllocator", "divisions_index", "get_allocation_size",
    "parse_alloc_conf", "parse_roundup_power2_divisions", "round_size",
    "roundup_power2_next_division",
]


class PyTorchCachingAllocator(Policy):
    """See the module docstring. Each block is one :class:`Block`, its neighbours linked as
    blocks; malloc and free find it with one dict lookup by address and then read and write
    its fields — a split adds one dict entry (the rest's block), a merge drops one — plus one
    ``bisect`` and one ``insort`` in the free list."""

    name = "pytorch"
    capacity_use = "limit; unless per_process_memory_fraction, expandable_segments"
    native = NativeTwin("pytorch", "pytorch.hpp",
                        "every setting (expandable_segments included)")
    description = ("PyTorch CUDA caching allocator: small/large pools per stream, best fit, "
                   "splits, 2/20 MiB segments, OOM retries; expandable segments optional")

    def __init__(self, device: DeviceMemory, max_split_size_mb: int = 0,
                 roundup_power2_divisions: str | int = "",
                 garbage_collection_threshold: float = 0.0, expandable_segments: bool = False,
                 max_non_split_rounding_mb: int = 20,
                 per_process_memory_fraction: float | None = None) -> None:
        super().__init__(device)
        validate(max_split_size_mb, garbage_collection_threshold, max_non_split_rounding_mb,
                 per_process_memory_fraction)
        # -- the settings (read by the native core's bridge and the questions too) --
        table = parse_roundup_power2_divisions(roundup_power2_divisions)
        self.divisions = table                            # roundup_power2_divisions, 16 entries
        self._divisions = table if any(d > 1 for d in table) else None   # None: none rounds
        self.max_split_size = max_split_size_mb * MiB if max_split_size_mb else NO_LIMIT
        self.max_non_split_rounding = max_non_split_rounding_mb * MiB
        self.gc_threshold = float(garbage_collection_threshold)
        self.expandable = bool(expandable_segments)
        self.set_fraction = per_process_memory_fraction is not None   # a fraction was set
        self.allowed_memory_maximum = (int(per_process_memory_fraction * device.capacity)
                                       if per_process_memory_fraction is not None
                                       else device.capacity)
        self._gc_on = self.set_fraction and self.gc_threshold > 0.0
        if self.expandable:
            granularity = getattr(device, "map_granularity", K_SMALL_BUFFER)
            if K_SMALL_BUFFER % granularity or K_LARGE_BUFFER % granularity:
                raise ValueError(f"expandable segments map 2 and 20 MiB pages; this device maps in "
                                 f"multiples of {granularity} bytes")
        # PyTorch's defaults, with or without expandable segments: memory_stats()'s own
        # counters may be left out (keep_memory_stats).
        self._default_settings = (self._divisions is None and not self._gc_on
                                  and self.max_split_size == NO_LIMIT)
        # -- the allocator's own counters (Policy's four, and these) --
        self.peak_bytes_in_use = 0                # allocated_bytes.all.peak
        self.requested = 0                        # requested_bytes.all.current
        # -- the parts --
        self.pools = BlockPools(self._gc_on)
        self.counters = DeviceStats()
        self.expandable_segments = (ExpandableSegments(self.pools, self.counters, device)
                                    if self.expandable else None)
        self.release = ReleasePath(
            self.pools, self.counters, device, self.expandable_segments,
            max_split_size=self.max_split_size, set_fraction=self.set_fraction,
            allowed_memory_maximum=self.allowed_memory_maximum, gc_threshold=self.gc_threshold)
        self.snapshots = Snapshots(self.pools, self.counters, device, self.expandable_segments,
                                   self.max_split_size)
        # Bound once, for malloc and free.
        self._record = self.pools.record
        self._free_lists = self.pools.free_lists
        self._gc_searches = self.pools.gc_searches
        self._gc_stamps = self.pools.gc_stamps
        # Blocks free's merges dropped, for malloc's splits to reuse: a class instantiation
        # costs more than writing six fields (as ChunkMap.spare).
        self._spare: list[Block] = []

    PARAMS: ClassVar[dict[str, Param]] = params_of(
        __init__,
        max_split_size_mb=("int", "blocks this large (MiB) are never split; 0 = unlimited, "
                                  "else >= 20"),
        roundup_power2_divisions=("str", "PyTorch's roundup_power2_divisions: '4' or "
                                         "'[256:1;512:2;>:8]' (';' or ','); empty = off"),
        garbage_collection_threshold=("float", "reclaim old cached blocks above this share of "
                                               "the allowed memory; 0 = off, else in (0,1); "
                                               "acts only when per_process_memory_fraction is "
                                               "set"),
        expandable_segments=("bool", "one growing virtual segment per stream and pool "
                                     "(2/20 MiB pages)"),
        max_non_split_rounding_mb=("int", "a request >= max_split_size may take a block up to "
                                          "this many MiB bigger; >= 20"),
        per_process_memory_fraction=("float", "set_per_process_memory_fraction: device "
                                              "allocations fail beyond this share of capacity, "
                                              "in [0, 1]; unset = never set (whole device); 0 "
                                              "= every allocation fails"),
    )

    def rounded_size(self, size: int) -> int:
        """round_size with this allocator's roundup_power2_divisions: the bytes a request of
        ``size`` asks of its pool (public for the fidelity tools and explain-oom)."""
        return round_size(size, self._divisions)

    @property
    def pool_bytes(self) -> int:
        """Bytes reserved from the device (reserved_bytes.all.current)."""
        return self.counters.pool_bytes

    @property
    def segment_map(self) -> dict:
        """Segment base → its :class:`~allocsim.policies.pytorch.blocks.Segment`."""
        return self.pools.segment_map

    # -- which statistics are kept --------------------------------------------------------
    @property
    def memory_stats_kept(self) -> bool:
        """Whether memory_stats() may be read (:meth:`keep_memory_stats`)."""
        return self.counters.kept

    def keep_memory_stats(self, keep: bool) -> None:
        """Say whether :meth:`memory_stats` will be read (default: yes, everything is kept).

        With ``False`` the allocator may leave out the counters only that report reads
        (MEMORY_STATS_ONLY in pytorch/stats.py: inactive splits, requested-bytes totals and
        peak, allocated total, peak allocation count): with PyTorch's default settings
        (expandable segments or not) malloc and free then skip them, memory_stats()
        raises RuntimeError and a read of one of those counters (on ``counters``)
        AttributeError — never a stale number. stats(), bytes_in_use, segments(), blocks(),
        seed() and check() stay exact. With other settings they are kept anyway
        (``memory_stats_kept`` says which). The replay engine says ``False``
        (sim/kernel/engine.py, ProcessReplay's ``memory_stats``). Only before the first malloc
        or seed(): a peak missed cannot be recounted later."""
        keep = bool(keep) or not self._default_settings
        if keep == self.memory_stats_kept:
            return
        if self.num_allocs or self.pools.segment_map:
            raise ValueError("keep_memory_stats() must come before the first malloc or seed(): "
                             "peaks and totals missed until then cannot be recounted")
        self.counters.keep_report_only(keep)

    # -- the state in and out (pytorch/snapshot.py) --------------------------------------
    def memory_stats(self) -> dict[str, int]:
        """torch.cuda.memory_stats()-style names (Snapshots.memory_stats), refused
        (RuntimeError) when it was said not to be read."""
        if not self.memory_stats_kept:
            raise RuntimeError("pytorch: memory_stats() was not kept: this allocator was told it "
                               "would not be read (keep_memory_stats(False), as the replay "
                               "engine does unless ProcessReplay(..., memory_stats=True))")
        return self.snapshots.memory_stats(self)

    def seed(self, segments: Iterable[dict[str, Any]]) -> dict[int, int]:
        """Start from a recorded state (Snapshots.seed: its docstring says how), with or
        without the counters of memory_stats() kept. Returns {recorded block address: this
        model's address} of the active blocks."""
        if self.memory_stats_kept:
            return self.snapshots.seed(segments, self)
        # Seeding counts every counter; the ones not kept are dropped again after it.
        self.counters.keep_report_only(True)
        try:
            return self.snapshots.seed(segments, self)
        finally:
            self.counters.keep_report_only(False)

    def segments(self) -> list[dict[str, Any]]:
        """Like torch.cuda.memory_snapshot()'s segments (Snapshots.segments)."""
        return self.snapshots.segments()

    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        return self.snapshots.blocks()

    def native_numbers(self) -> dict[str, Any] | None:
        """PyTorchConfig (native/src/pytorch.hpp): PyTorch's constants and every setting,
        with the virtual ranges' sizes under expandable segments."""
        segments = self.expandable_segments
        ranges = ({"range_small": segments.range_size(K_SMALL_BUFFER),
                   "range_large": segments.range_size(K_LARGE_BUFFER)}
                  if segments is not None else {})
        return {"min_block_size": K_MIN_BLOCK_SIZE, "small_size": K_SMALL_SIZE,
                "small_buffer": K_SMALL_BUFFER, "large_buffer": K_LARGE_BUFFER,
                "min_large_alloc": K_MIN_LARGE_ALLOC, "round_large": K_ROUND_LARGE,
                "set_fraction": bool(self.set_fraction),
                "allowed_memory_maximum": self.allowed_memory_maximum,
                "divisions": (list(self.divisions) if any(d > 1 for d in self.divisions)
                              else []),
                "max_split_size": self.max_split_size, "no_limit": NO_LIMIT,
                "max_non_split_rounding": self.max_non_split_rounding,
                "gc_on": bool(self.set_fraction and self.gc_threshold > 0.0),
                "gc_threshold": float(self.gc_threshold), "expandable": bool(self.expandable),
                **ranges}

    def stats(self) -> PolicyStats:
        largest = 0
        count = 0
        for keys in self._free_lists.values():
            if keys:
                count += len(keys)
                largest = max(largest, keys[-1] >> SHIFT)
        return PolicyStats(
            num_allocs=self.num_allocs, num_frees=self.num_frees, num_ooms=self.num_ooms,
            bytes_in_use=self.bytes_in_use, peak_bytes_in_use=self.peak_bytes_in_use,
            bytes_requested=self.requested, pool_bytes=self.counters.pool_bytes,
            peak_pool_bytes=self.counters.peak_pool_bytes, largest_free_block=largest,
            free_blocks=count)

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): release_cached_blocks."""
        self.release.release_cached_blocks()

    def check(self) -> None:
        """Assert the invariants of every part: the blocks and free lists
        (BlockPools.check), unmapped space (ExpandableSegments.check; without expandable
        segments, none: every segment mapped whole) and every counter against a recount
        (DeviceStats.check). O(n log n)."""
        self.pools.check()
        if self.expandable_segments is not None:
            self.expandable_segments.check()
        else:
            check_no_unmapped(self.pools)
        self.counters.check(self.pools, self.bytes_in_use, self.peak_bytes_in_use,
                            self.requested, self.num_allocs - self.num_frees,
                            self.max_split_size)

    # -- malloc and free ---------------------------------------------------------------
    # Over the blocks (invariants: BlockPools.check): a free list holds exactly the free
    # mapped blocks of its pool, keyed size << 52 | address; a block is free and mapped
    # exactly when its ``requested`` is 0 (allocated: its request, > 0; unmapped: UNMAPPED),
    # so the merge test is one field read; links are blocks or None at a segment's ends; no
    # two neighbours are both free and mapped.
    def malloc(self, size: int, stream: int = 0) -> int | None:
        if size <= 0:
            return None
        rounded = round_size(size, self._divisions)
        small = rounded <= K_SMALL_SIZE
        pool_key = stream << 1 | small
        keys = self._free_lists.get(pool_key)
        if keys is None:
            keys = self._free_lists[pool_key] = []
        if self._gc_on:
            self._gc_searches[small] += 1
        # get_free_block: the smallest block of this stream and pool that fits, or none.
        block = self._get_free_block(keys, rounded)
        if block is None:
            block = self.release.miss(rounded, small, stream, pool_key)
            if block is None:
                self.num_ooms += 1
                return None
        # should_split, then alloc_found_block (the caller keeps the low end; the block after
        # a free block is never free, so the rest needs no merge).
        block_size = block.size
        remaining = block_size - rounded
        split = should_split(remaining, rounded, small or self.expandable, self.max_split_size)
        kept = self.counters.kept
        if kept and not self.expandable:
            self.counters.split_on_alloc(block, split, rounded, remaining)
        if split:
            rest = block.address + rounded
            after = block.next
            block.size = rounded
            spare = self._spare
            if spare:
                piece = spare.pop()
                piece.size = remaining
                piece.prev = block
                piece.next = after
                piece.pool_key = pool_key
                piece.requested = 0
                piece.address = rest
            else:
                piece = Block(remaining, block, after, pool_key, 0, rest)
            self._record[rest] = block.next = piece
            if after is not None:
                after.prev = piece
            insort(keys, remaining << SHIFT | rest)
            if self._gc_on:
                self._gc_stamps[rest] = self._gc_searches[small]
            block_size = rounded
        block.requested = size
        in_use = self.bytes_in_use + block_size
        self.bytes_in_use = in_use
        if in_use > self.peak_bytes_in_use:
            self.peak_bytes_in_use = in_use
        self.requested += size
        self.num_allocs += 1
        if kept:
            self.counters.count_alloc(block_size, size, self.requested,
                                      self.num_allocs - self.num_frees)
        if block_size >= self.max_split_size:
            self.counters.oversize_allocation()
        return block.address

    def _get_free_block(self, keys: list[int], rounded: int) -> Block | None:
        """get_free_block: the first block of the pool's free list with size ≥ ``rounded``
        (smallest, lowest address on ties), moved on by the expandable walk with expandable
        segments; None when there is none or the max_split_size rules reject it (no search
        beyond it). The block found leaves the free list."""
        position = bisect_left(keys, rounded << SHIFT)
        if position == len(keys):
            return None
        if self.expandable_segments is not None:
            position = self.expandable_segments.best_fit(keys, position)
        key = keys[position]
        block_size = key >> SHIFT
        max_split = self.max_split_size
        if rounded < max_split:
            if block_size >= max_split:
                return None
        elif block_size >= rounded + self.max_non_split_rounding:
            return None
        del keys[position]
        return self._record[key & MASK]

    def free(self, address: int) -> None:
        record = self._record
        block = record[address]
        size = block.size
        requested = block.requested
        if requested <= 0:
            raise KeyError(f"pytorch: block {address:#x} is not allocated")
        block.requested = 0
        self.bytes_in_use -= size
        self.requested -= requested
        self.num_frees += 1
        if size >= self.max_split_size:
            self.counters.oversize_allocations -= 1
        keys = self._free_lists[block.pool_key]
        # free_block: try_merge_blocks with the previous block, then with the next one, each
        # when free and mapped (``requested`` 0: an allocated neighbour's is its request, an
        # unmapped one's UNMAPPED, so unmapped pages never join a mapped free block).
        before = block.prev
        after = block.next
        total = size
        subsumed_count = 0
        subsumed_bytes = 0
        if before is not None and not before.requested:
            before_size = before.size
            del keys[bisect_left(keys, before_size << SHIFT | before.address)]
            del record[address]
            self._spare.append(block)
            before.next = after
            if after is not None:
                after.prev = before
            block = before
            total += before_size
            subsumed_count = 1
            subsumed_bytes = before_size
        if after is not None and not after.requested:
            after_size = after.size
            del keys[bisect_left(keys, after_size << SHIFT | after.address)]
            del record[after.address]
            self._spare.append(after)
            beyond = block.next = after.next
            if beyond is not None:
                beyond.prev = block
            total += after_size
            subsumed_count += 1
            subsumed_bytes += after_size
        block.size = total
        insort(keys, total << SHIFT | block.address)
        if self._gc_on:
            # The freed block's stamp and the next block's (merged or not) go; the joined
            # block is stamped anew.
            gc_stamps = self._gc_stamps
            gc_stamps.pop(address, None)
            gc_stamps.pop(0 if after is None else after.address, None)
            gc_stamps[block.address] = self._gc_searches[block.pool_key & 1]
        if self.counters.kept and not self.expandable:
            self.counters.split_on_free(block, size, subsumed_count, subsumed_bytes)
