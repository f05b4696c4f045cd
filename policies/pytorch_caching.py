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
  (``set_fraction`` gates it). ``per_process_memory_fraction=0`` (the default) means "never
  set" — the whole device, no GC; any value in (0, 1], 1.0 included, counts as set.
- roundup_power2_divisions follows the current parser: ``>`` fills the intervals after the last
  one named (older releases filled from the last named one, overwriting it). Lists may use
  ``;`` between entries as well as ``,``, because registry specs split on commas:
  ``pytorch:roundup_power2_divisions=[256:1;512:2;>:8]``.
- one ``device.map`` call per map_block (PyTorch creates one handle per page; the cost model
  therefore under-counts page-by-page mapping cost), one ``device.unmap`` per unmapped range.

Starting mid-run: :meth:`PyTorchCachingAllocator.seed` lays out a recorded segment list
(memory_snapshot()'s shape) before the first malloc, so a replay of a snapshot recorded
mid-run starts from the state the recording started in (allocsim.sim.questions.fidelity uses it).

Not modelled: record_stream / cross-stream frees (every free is complete at once, so
process_events and the event queues are empty), CUDA graph private pools and MemPools,
free-memory callbacks, cudaMallocAsync, IPC, release_lock_on_cudamalloc, toggling
expandable_segments during a run (all segments are one kind), and requested_size of inactive
blocks in :meth:`segments` (reported as 0; PyTorch reports stale values there). Stats kept per
pool only as current values (computed on demand), peaks are kept for the aggregate ("all").

Which statistics are kept: everything by default. A caller that will not read memory_stats()
says so before the first malloc with :meth:`PyTorchCachingAllocator.keep_memory_stats`
(False) — the replay engine does, as it reads only ``bytes_in_use`` and ``stats()`` — and the
counters only memory_stats() reads (pytorch_blocks.MEMORY_STATS_ONLY) are then not counted:
memory_stats() raises and those attributes are absent, so nothing reads a stale number.

Layout: the class is built in layers, one module each, each layer a subclass of the one before:
pytorch_settings (configuration and size rules, functions) → pytorch_blocks (the state, the
free lists, check()) → pytorch_expandable (expandable segments) → pytorch_oom (the miss path
and release steps) → pytorch_snapshot (seed, segments, memory_stats) → this module (the
parameters, malloc and free: one of each for every setting, each rule in it written once —
should_split in pytorch_settings, get_free_block's expandable walk in pytorch_expandable,
free_block's merges here; memory_stats()'s own counters are counted only while kept, and
tests/test_fast_path_equivalence.py holds a lean and a kept allocator to the same decisions).
Each block is one
record (a list: size, the records before and after it, pool key, requested bytes, address;
policies/pytorch_records.py), found by address in ``block_map.record``; the address-keyed
tables ``_size``, ``_prev``, ``_next``, ``_home``, ``_req`` and ``_unmapped`` are views of the
records. Costs: malloc is an O(log k) bisection in the (stream, pool) free list plus O(k) list
deletion and, for a split, insertion (k = free blocks of that pool); free is O(1) link updates
plus one O(log k + k) update per merged neighbour and one for the joined block; a miss adds
the steps in pytorch_oom.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from typing import Any, ClassVar

from allocsim.policies.base import DeviceMemory, Param, params_of
from allocsim.policies.pytorch_blocks import MASK, SHIFT
from allocsim.policies.pytorch_records import ADDRESS, NEXT, PREV, REQ, SIZE
from allocsim.policies.pytorch_settings import (
    K_LARGE_BUFFER,
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
from allocsim.policies.pytorch_snapshot import Snapshots

# Importable from here as before the split (sim/questions and the tests use them); their home
# is policies/pytorch_settings.py.
__all__ = [
    "MiB", "PyTorchCachingAllocator", "divisions_index", "get_allocation_size",
    "parse_alloc_conf", "parse_roundup_power2_divisions", "round_size",
    "roundup_power2_next_division",
]


class PyTorchCachingAllocator(Snapshots):
    """See the module docstring. Each block is one record (a list, pytorch_records.py's
    slots), its neighbours linked as records; malloc and free find it with one dict lookup
    by address and then read and write list slots — a split adds one dict entry (the rest's
    record), a merge drops one — plus one ``bisect`` and one ``insort`` in the free list."""

    name = "pytorch"
    capacity_use = "limit; unless per_process_memory_fraction, expandable_segments"
    description = ("PyTorch CUDA caching allocator: small/large pools per stream, best fit, "
                   "splits, 2/20 MiB segments, OOM retries; expandable segments optional")

    def __init__(self, device: DeviceMemory, max_split_size_mb: int = 0,
                 roundup_power2_divisions: str | int = "",
                 garbage_collection_threshold: float = 0.0, expandable_segments: bool = False,
                 max_non_split_rounding_mb: int = 20,
                 per_process_memory_fraction: float = 0.0) -> None:
        super().__init__(device)
        validate(max_split_size_mb, garbage_collection_threshold, max_non_split_rounding_mb,
                 per_process_memory_fraction)
        table = parse_roundup_power2_divisions(roundup_power2_divisions)
        self.divisions = table
        self._divisions = table if any(d > 1 for d in table) else None
        self.max_split_size = max_split_size_mb * MiB if max_split_size_mb else NO_LIMIT
        self.max_non_split_rounding = max_non_split_rounding_mb * MiB
        self.gc_threshold = float(garbage_collection_threshold)
        self.expandable = bool(expandable_segments)
        self.set_fraction = per_process_memory_fraction > 0.0
        self.allowed_memory_maximum = (int(per_process_memory_fraction * device.capacity)
                                       if self.set_fraction else device.capacity)
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
                                              "allocations fail beyond this share of capacity; "
                                              "0 = never set (whole device)"),
    )

    def rounded_size(self, size: int) -> int:
        """round_size with this allocator's roundup_power2_divisions: the bytes a request of
        ``size`` asks of its pool (public for the fidelity tools and explain-oom)."""
        return round_size(size, self._divisions)

    # -- which statistics are kept --------------------------------------------------------
    def keep_memory_stats(self, keep: bool) -> None:
        """Say whether :meth:`memory_stats` will be read (default: yes, everything is kept).

        With ``False`` the allocator may leave out the counters only that report reads
        (MEMORY_STATS_ONLY in pytorch_blocks.py: inactive splits, requested-bytes totals and
        peak, allocated total, peak allocation count): with PyTorch's default settings
        (expandable segments or not) malloc and free then skip them, memory_stats()
        raises RuntimeError and a read of one of those counters AttributeError — never a
        stale number. stats(), bytes_in_use, segments(), blocks(), seed() and check() stay
        exact. With other settings they are kept anyway (``memory_stats_kept`` says which).
        The replay engine says ``False`` (sim/kernel/engine.py, ProcessReplay's
        ``memory_stats``). Only before the first malloc or seed(): a peak missed cannot be
        recounted later."""
        keep = bool(keep) or not self._default_settings
        if keep == self.memory_stats_kept:
            return
        if self.num_allocs or self.segment_map:
            raise ValueError("keep_memory_stats() must come before the first malloc or seed(): "
                             "peaks and totals missed until then cannot be recounted")
        self._keep_memory_stats_only(keep)

    def memory_stats(self) -> dict[str, int]:
        """Snapshots.memory_stats, refused (RuntimeError) when it was said not to be read."""
        if not self.memory_stats_kept:
            raise RuntimeError("pytorch: memory_stats() was not kept: this allocator was told it "
                               "would not be read (keep_memory_stats(False), as the replay "
                               "engine does unless ProcessReplay(..., memory_stats=True))")
        return super().memory_stats()

    def seed(self, segments: Iterable[dict[str, Any]]) -> dict[int, int]:
        """Snapshots.seed, with or without the counters of memory_stats() kept."""
        if self.memory_stats_kept:
            return super().seed(segments)
        # Snapshots.seed counts every counter; the ones not kept are dropped again after it.
        self._keep_memory_stats_only(True)
        try:
            return super().seed(segments)
        finally:
            self._keep_memory_stats_only(False)

    # -- malloc and free ---------------------------------------------------------------
    # Over the block records (pytorch_records.py's slots; invariants: pytorch_blocks.py's
    # docstring and BlockPools.check): a free list holds exactly the free mapped blocks of its
    # pool, keyed size << 52 | address; a block is free and mapped exactly when its REQ slot is
    # 0 (allocated: its request, > 0; unmapped: UNMAPPED), so the merge test is one slot read;
    # links are records or None at a segment's ends; no two neighbours are both free and mapped.
    def malloc(self, size: int, stream: int = 0) -> int | None:
        if size <= 0:
            return None
        rounded = round_size(size, self._divisions)
        small = rounded <= K_SMALL_SIZE
        pool_key = stream << 1 | small
        keys = self._free.get(pool_key)
        if keys is None:
            keys = self._free[pool_key] = []
        if self._gc_on:
            self._gc_calls[small] += 1
        # get_free_block: the smallest block of this stream and pool that fits, or none.
        block = self._get_free_block(keys, rounded)
        if block is None:
            block = self._malloc_miss(rounded, small, stream, pool_key)
            if block is None:
                return None
        # should_split, then alloc_found_block (the caller keeps the low end; the block after
        # a free block is never free, so the rest needs no merge).
        block_size = block[SIZE]
        remaining = block_size - rounded
        split = should_split(remaining, rounded, small or self.expandable, self.max_split_size)
        counts_splits = self.memory_stats_kept and not self.expandable
        if counts_splits:
            self._count_inactive_split_on_alloc(block, split, rounded, remaining)
        if split:
            address = block[ADDRESS]
            rest = address + rounded
            after = block[NEXT]
            block[SIZE] = rounded
            self.block_map.record[rest] = block[NEXT] = piece = [
                remaining, block, after, pool_key, 0, rest]
            if after is not None:
                after[PREV] = piece
            insort(keys, remaining << SHIFT | rest)
            if self._gc_on:
                self._gc_base[rest] = self._gc_calls[small]
            block_size = rounded
        block[REQ] = size
        in_use = self.bytes_in_use + block_size
        self.bytes_in_use = in_use
        if in_use > self.peak_bytes_in_use:
            self.peak_bytes_in_use = in_use
        self.requested += size
        self.num_allocs += 1
        if self.memory_stats_kept:
            self._count_alloc(block_size, size)
        if block_size >= self.max_split_size:
            self._oversize_allocation()
        return block[ADDRESS]

    def _get_free_block(self, keys: list[int], rounded: int) -> list | None:
        """get_free_block: the first block of the pool's free list with size ≥ ``rounded``
        (smallest, lowest address on ties), moved on by the expandable walk with expandable
        segments; None when there is none or the max_split_size rules reject it (no search
        beyond it). The block found leaves the free list."""
        position = bisect_left(keys, rounded << SHIFT)
        if position == len(keys):
            return None
        if self.expandable:
            position = self._expandable_best_fit(keys, position)
        key = keys[position]
        block_size = key >> SHIFT
        max_split = self.max_split_size
        if rounded < max_split:
            if block_size >= max_split:
                return None
        elif block_size >= rounded + self.max_non_split_rounding:
            return None
        del keys[position]
        return self.block_map.record[key & MASK]

    def _count_inactive_split_on_alloc(self, block: list, split: bool, rounded: int,
                                       remaining: int) -> None:
        """alloc_found_block's change of inactive_split(_bytes) (memory_stats() only; not kept
        for expandable segments)."""
        already_split = block[PREV] is not None or block[NEXT] is not None
        if split:
            if already_split:
                self.inactive_split_bytes -= rounded
            else:
                count = self.inactive_split + 1
                self.inactive_split = count
                self.inactive_split_total += 1
                if count > self.peak_inactive_split:
                    self.peak_inactive_split = count
                nbytes = self.inactive_split_bytes + remaining
                self.inactive_split_bytes = nbytes
                self.inactive_split_bytes_total += remaining
                if nbytes > self.peak_inactive_split_bytes:
                    self.peak_inactive_split_bytes = nbytes
        elif already_split:
            self.inactive_split -= 1
            self.inactive_split_bytes -= block[SIZE]

    def _count_alloc(self, block_size: int, size: int) -> None:
        """The totals and peaks only memory_stats() reads, after an allocation."""
        self.allocated_total += block_size
        if self.requested > self.peak_requested:
            self.peak_requested = self.requested
        self.requested_total += size
        live = self.num_allocs - self.num_frees
        if live > self.peak_allocations:
            self.peak_allocations = live

    def free(self, address: int) -> None:
        record = self.block_map.record
        block = record[address]
        size, before, after, pool_key, requested, _ = block
        if requested <= 0:
            raise KeyError(f"pytorch: block {address:#x} is not allocated")
        block[REQ] = 0
        self.bytes_in_use -= size
        self.requested -= requested
        self.num_frees += 1
        if size >= self.max_split_size:
            self.oversize_allocations -= 1
        keys = self._free[pool_key]
        # free_block: try_merge_blocks with the previous block, then with the next one, each
        # when free and mapped (REQ 0: an allocated neighbour's is its request, an unmapped
        # one's UNMAPPED, so unmapped pages never join a mapped free block).
        total = size
        subsumed_count = 0
        subsumed_bytes = 0
        if before is not None and not before[REQ]:
            before_size = before[SIZE]
            del keys[bisect_left(keys, before_size << SHIFT | before[ADDRESS])]
            del record[address]
            before[NEXT] = after
            if after is not None:
                after[PREV] = before
            block = before
            total += before_size
            subsumed_count = 1
            subsumed_bytes = before_size
        if after is not None and not after[REQ]:
            after_size = after[SIZE]
            del keys[bisect_left(keys, after_size << SHIFT | after[ADDRESS])]
            del record[after[ADDRESS]]
            beyond = block[NEXT] = after[NEXT]
            if beyond is not None:
                beyond[PREV] = block
            total += after_size
            subsumed_count += 1
            subsumed_bytes += after_size
        block[SIZE] = total
        insort(keys, total << SHIFT | block[ADDRESS])
        if self._gc_on:
            # The freed block's stamp and the next block's (merged or not) go; the joined
            # block is stamped anew.
            gc_base = self._gc_base
            gc_base.pop(address, None)
            gc_base.pop(0 if after is None else after[ADDRESS], None)
            gc_base[block[ADDRESS]] = self._gc_calls[pool_key & 1]
        if self.memory_stats_kept and not self.expandable:
            self._count_inactive_split_on_free(block, size, subsumed_count, subsumed_bytes)

    def _count_inactive_split_on_free(self, block: list, size: int, subsumed_count: int,
                                      subsumed_bytes: int) -> None:
        """free_block's net change of inactive_split(_bytes) (memory_stats() only): the
        neighbours it swallowed stop counting; the joined block counts while its segment is
        still split."""
        if block[PREV] is not None or block[NEXT] is not None:
            nbytes = self.inactive_split_bytes + size
            self.inactive_split_bytes = nbytes
            self.inactive_split_bytes_total += size
            if nbytes > self.peak_inactive_split_bytes:
                self.peak_inactive_split_bytes = nbytes
            if not subsumed_count:
                count = self.inactive_split + 1
                self.inactive_split = count
                self.inactive_split_total += 1
                if count > self.peak_inactive_split:
                    self.peak_inactive_split = count
            elif subsumed_count == 2:
                self.inactive_split -= 1
        elif subsumed_count:
            self.inactive_split -= subsumed_count
            self.inactive_split_bytes -= subsumed_bytes
