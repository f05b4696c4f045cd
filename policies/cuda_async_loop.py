"""cuda-async's own segment loop under ``sync=free``: the engine's per-event loop with the pool's
hot pair written into it (issue 17; :meth:`~allocsim.policies.base.Policy.segment_loop`).

Why: under ``sync=free`` an event of the pool is a few dozen list and dict operations, and the
engine's call into :meth:`~allocsim.policies.cuda_async.CudaAsyncAllocator._malloc_shared` or
:meth:`~allocsim.policies.cuda_async.CudaAsyncAllocator._free_shared` and the pool's attribute
loads around them are a large share of it (on the 1M-event training trace the loop here takes
15% off JAX's cuda_async setting, fraction=0.75, and 8% off release at every free).

What: :func:`replay_segment` is ``ProcessReplay._run``'s inner loop (sim/kernel/engine.py) with
those two methods' bodies in place of the calls, the pool's counters and its free index's
bitmap of non-empty bins in locals, written back before anything else reads them. Per event it
keeps what the engine's loop keeps (:class:`~allocsim.policies.base.SegmentReplay`): the live
table, allocated bytes and their peak (with the event and the pool's bytes in use there),
skipped frees, OOMs (through the replay's ``note_out_of_memory``), and, at each event that made
device calls, the timeline bucket's most reserved bytes and the run's peak of them. It reads
the device's call counter only where the pool called the device: a miss (map, or the refusal
path), the release of a wholly free region and the release threshold's trim.

The rare paths are the pool's own general methods (``_preallocate`` — the segment is declined
while one is pending —, ``_after_refusal``, ``_trim``), entered with the locals written back.

Held to the engine's loop over the hot pair (and so to the general pair) on random workloads,
OOMs, skipped frees and stopping runs included, by tests/test_segment_loop.py; and, because
the engine takes this loop wherever it may, to the results recorded before it by
tests/test_fast_paths.py and the replay-memory references.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Protocol

from allocsim.policies.base import DeviceMemory, SegmentReplay
from allocsim.policies.chunk_records import (
    ADDRESS,
    ADDRESS_MASK,
    KEY,
    NEXT,
    NONE,
    PREV,
    REQUESTED,
    SIZE,
)
from allocsim.policies.chunks import BIN, KEY_SHIFT, FreeIndex
from allocsim.policies.segment_events import OP_ALLOC


class SharedPool(Protocol):
    """What the loop reads and writes of the pool (a
    :class:`~allocsim.policies.cuda_async.CudaAsyncAllocator` under ``sync=free``; named here
    rather than imported, which would make an import circle)."""

    device: DeviceMemory
    alignment: int
    chunk: int
    threshold: int
    shared: FreeIndex
    regions: dict[int, int]
    free_regions: set[int]
    mapped: int
    peak_mapped: int
    bytes_in_use: int
    peak_bytes_in_use: int
    num_allocs: int
    num_frees: int
    num_ooms: int
    _preallocate_pending: bool
    _record: dict[int, list]
    _ring: dict[int, list]
    _bins: list[list[int]]

    def _after_refusal(self, rounded: int, stream: int) -> int | None: ...

    def _trim(self, keep: int) -> bool: ...


def replay_segment(pool: SharedPool, replay: SegmentReplay, ops: list[int],
                   ids: list[int], sizes: list[int], streams: list[int], lo: int, hi: int,
                   first: int, allocated: int, peak: int,
                   top: int) -> tuple[int, int, int, int] | None:
    """Replay events ``first``, ``first + 1``, … (``ops[lo:hi]`` and the other columns'
    slices) through ``pool`` as the engine would; returns the last event replayed (a stopping
    OOM's if one stopped the replay), allocated bytes, their peak and the bucket's top. None
    (nothing replayed) while a preallocation is pending: the engine's loop runs that segment."""
    if pool._preallocate_pending:
        return None
    live = replay.live
    view = replay.view
    calls = view.calls
    reserved_at_peak = replay.reserved_at_peak
    record = pool._record
    bins = pool._bins
    index = pool.shared
    regions = pool.regions
    rings = pool._ring
    free_regions = pool.free_regions
    device = pool.device
    address_range, map_pages, unmap_pages = device.address_range, device.map, device.unmap
    alignment = pool.alignment
    granule = pool.chunk
    threshold = pool.threshold
    # The pool's counters and the index's bitmap, in locals (written back below and before
    # any general method or the replay reads them).
    nonempty = index.nonempty
    mapped = pool.mapped
    peak_mapped = pool.peak_mapped
    in_use = pool.bytes_in_use
    peak_in_use = pool.peak_bytes_in_use
    allocs = pool.num_allocs
    frees = pool.num_frees
    i = first
    for i, op, buffer, size, stream in zip(range(first, first + hi - lo), ops[lo:hi],
                                           ids[lo:hi], sizes[lo:hi], streams[lo:hi]):
        if op == OP_ALLOC:
            if size <= 0:
                continue
            # -- _malloc_shared ----------------------------------------------------------
            rounded = -(-size // alignment) * alignment
            # FreeIndex.best_fit + remove: in bin(rounded), the first key ≥ (rounded, 0);
            # else the first key of the next non-empty bin above it.
            number = BIN[rounded.bit_length()]
            keys = bins[number]
            position = bisect_left(keys, rounded << KEY_SHIFT) if keys else 0
            key = 0
            if position < len(keys):
                key = keys.pop(position)
            else:
                above = nonempty >> (number + 1)
                if above:
                    number += (above & -above).bit_length()
                    keys = bins[number]
                    key = keys.pop(0)
            found = key
            if found:
                if not keys:
                    nonempty &= ~(1 << number)
                # _take: in use; a region that was one free chunk no longer is.
                address = key & ADDRESS_MASK
                chunk = record[address]
                chunk[KEY] = 0
                chunk[REQUESTED] = size
                handed = chunk[SIZE]
                after = chunk[NEXT]
                if after is chunk[PREV]:                    # both its ring: wholly free
                    free_regions.discard(address)
            else:
                # A miss: _map_chunk written out, its one chunk in use.
                nbytes = -(-rounded // granule) * granule
                address = address_range(nbytes)
                if map_pages(address, nbytes):
                    mapped += nbytes
                    if mapped > peak_mapped:
                        peak_mapped = mapped
                    regions[address] = nbytes
                    ring: list = [0, None, None, 0, NONE, 0]
                    rings[address] = ring
                    ring[PREV] = ring[NEXT] = record[address] = chunk = [
                        nbytes, ring, ring, 0, address, size]
                    handed, after = nbytes, ring
                else:
                    # Refused: the general way (_after_refusal hands out the chunk it finds or
                    # maps, split already), the locals written back around it.
                    index.nonempty = nonempty
                    pool.mapped, pool.peak_mapped = mapped, peak_mapped
                    grown = pool._after_refusal(rounded, stream)
                    nonempty = index.nonempty
                    mapped, peak_mapped = pool.mapped, pool.peak_mapped
                    if grown is None:
                        pool.num_ooms += 1
                        pool.bytes_in_use, pool.peak_bytes_in_use = in_use, peak_in_use
                        pool.num_allocs, pool.num_frees = allocs, frees
                        replay.note_out_of_memory(i, size, allocated)
                        # Its device calls are noted below; a stopping OOM ends the segment.
                        address = None
                    else:
                        address = grown
                        chunk = record[address]
                        chunk[KEY] = 0
                        chunk[REQUESTED] = size
                        handed = rounded
                        after = chunk[NEXT]
            if address is not None:
                if handed != rounded:
                    # _take's and _carve's split: the caller keeps the low end, the rest is
                    # shared free memory (the chunk after a free chunk is never free).
                    rest, rest_size = address + rounded, handed - rounded
                    chunk[SIZE] = rounded
                    key = rest_size << KEY_SHIFT | rest
                    record[rest] = chunk[NEXT] = after[PREV] = [
                        rest_size, chunk, after, key, rest, 0]
                    number = BIN[rest_size.bit_length()]    # FreeIndex.add, written out
                    keys = bins[number]
                    if not keys:
                        nonempty |= 1 << number
                        keys.append(key)
                    elif key > keys[-1]:
                        keys.append(key)
                    else:
                        insort(keys, key)
                in_use += rounded
                if in_use > peak_in_use:
                    peak_in_use = in_use
                allocs += 1
                # -- the engine: the buffer is live -------------------------------------
                live[buffer] = address
                allocated += size
                if allocated > peak:
                    peak = allocated
                    replay.peak_allocated_event = i
                    replay.in_use_at_peak_allocated = in_use
            if found:
                continue                                    # a hit calls no device
        else:
            # -- the engine: a free of a live buffer, else skipped ----------------------
            address = live.pop(buffer, None)
            if address is None:
                if size:
                    replay.skipped_events.append(i)
                continue
            allocated -= size
            # -- _free_shared ------------------------------------------------------------
            chunk = record[address]
            chunk_size, before, after, key, _, _ = chunk
            if key:
                raise KeyError(f"chunk {address:#x} is not in use")
            in_use -= chunk_size
            frees += 1
            key = after[KEY]
            if key:                                         # merge the next chunk into it
                merged = after[SIZE]
                number = BIN[merged.bit_length()]           # FreeIndex.remove, written out
                keys = bins[number]
                del keys[bisect_left(keys, key)]
                if not keys:
                    nonempty &= ~(1 << number)
                del record[after[ADDRESS]]
                chunk_size += merged
                after = chunk[NEXT] = after[NEXT]
                after[PREV] = chunk
            key = before[KEY]
            if key:                                         # merge it into the previous
                merged = before[SIZE]
                number = BIN[merged.bit_length()]
                keys = bins[number]
                del keys[bisect_left(keys, key)]
                if not keys:
                    nonempty &= ~(1 << number)
                del record[address]
                chunk_size += merged
                chunk, address = before, before[ADDRESS]
                chunk[NEXT] = after
                after[PREV] = chunk
                before = chunk[PREV]
            if after is before and not free_regions and mapped - chunk_size >= threshold:
                # A wholly free region, the only one, and the pool stays at or above the
                # threshold without it: released at once, never indexed.
                del regions[address], rings[address], record[address]
                # The region's ring and its one chunk point at each other: cut the loop so
                # that both go when the last reference does, not at the next cyclic garbage
                # collection (a tenth of this setting's time, issue 17).
                after[PREV] = after[NEXT] = None
                mapped -= chunk_size
                unmap_pages(address, chunk_size)
            else:
                if after is before:                         # both its ring: wholly free
                    free_regions.add(address)
                chunk[SIZE] = chunk_size
                key = chunk[KEY] = chunk_size << KEY_SHIFT | address
                number = BIN[chunk_size.bit_length()]       # FreeIndex.add, written out
                keys = bins[number]
                if not keys:
                    nonempty |= 1 << number
                    keys.append(key)
                elif key > keys[-1]:
                    keys.append(key)
                else:
                    insort(keys, key)
                if not (free_regions and mapped > threshold):
                    continue
                # The synchronisation after the free applies the release threshold.
                index.nonempty = nonempty
                pool.mapped = mapped
                pool._trim(threshold)
                nonempty = index.nonempty
                mapped = pool.mapped
        # -- the engine: an event that may have made device calls ----------------------
        if view.calls != calls:
            calls = view.calls
            reserved = view.reserved
            if reserved > top:                              # the bucket's most (-1: none yet)
                if top < 0:
                    replay.buckets.first_call = i
                top = reserved
                if reserved > reserved_at_peak:             # never above the run's peak else
                    reserved_at_peak = replay.reserved_at_peak = reserved
                    replay.peak_reserved_event = i
                    replay.in_use_at_peak_reserved = in_use
        if address is None and replay.stopped:              # a stopping OOM
            break
    index.nonempty = nonempty
    pool.mapped, pool.peak_mapped = mapped, peak_mapped
    pool.bytes_in_use, pool.peak_bytes_in_use = in_use, peak_in_use
    pool.num_allocs, pool.num_frees = allocs, frees
    return i, allocated, peak, top
