"""PyTorch's own segment loop for its default settings (with or without expandable segments):
the engine's per-event loop with the hot pair written into it (issue 17;
:meth:`~allocsim.policies.base.Policy.segment_loop`).

Why: with PyTorch's defaults and memory_stats() not to be read, a malloc or free that the free
lists serve is a bisection and a few list slots, and the engine's call into
``_malloc_default`` / ``_free_default`` (``_malloc_expandable`` / ``_free_expandable``) with the
attribute loads around it is a large share of each event.

What: :func:`replay_segment` is ``ProcessReplay._run``'s inner loop (sim/kernel/engine.py)
with those methods' bodies in place of the calls (policies/pytorch_caching.py's hot path,
the same steps in the same order), the allocator's counters in locals. Per event it keeps what
the engine's loop keeps (:class:`~allocsim.policies.base.SegmentReplay`). Only a malloc that
the free lists cannot serve can call the device (pytorch_oom's miss path: alloc_block, the
release steps, an OOM): that one runs the bound hot malloc itself, with the locals written back
around it, noted as the engine would by policies/segment_events.py, and only there is the
device's call counter read. A free never calls the device
under these settings (segments go back only through the miss path, GC — off by default — or
empty_cache).

Held to the engine's loop over the hot pair on random workloads, OOMs, skipped frees and
stopping runs included, by tests/test_segment_loop.py; and, since the engine takes the loop
wherever it may, to the results recorded before it by tests/test_fast_paths.py and the
replay-memory references.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Protocol

from allocsim.policies.base import SegmentReplay
from allocsim.policies.pytorch_blocks import MASK, SHIFT
from allocsim.policies.pytorch_records import ADDRESS, NEXT, PREV, REQ, SIZE, UNMAPPED
from allocsim.policies.pytorch_settings import K_MIN_BLOCK_SIZE, K_SMALL_SIZE
from allocsim.policies.segment_events import OP_ALLOC, note_general_alloc


class CachingPools(Protocol):
    """What the loop reads and writes of the allocator (a PyTorchCachingAllocator with its
    default settings; named here rather than imported, which would make an import circle)."""

    expandable: bool
    bytes_in_use: int
    peak_bytes_in_use: int
    requested: int
    num_allocs: int
    num_frees: int
    _free: dict[int, list[int]]

    def malloc(self, size: int, stream: int = 0) -> int | None: ...


def replay_segment(pools: CachingPools, record: dict[int, list], replay: SegmentReplay,
                   ops: list[int], ids: list[int], sizes: list[int], streams: list[int],
                   lo: int, hi: int, first: int, allocated: int, peak: int,
                   top: int) -> tuple[int, int, int, int] | None:
    """Replay events ``first``, ``first + 1``, … (``ops[lo:hi]`` and the other columns'
    slices) through ``pools`` (its blocks' records: ``record``) as the engine would; returns
    the last event replayed (a stopping OOM's if one stopped the replay), allocated bytes,
    their peak and the bucket's top."""
    live = replay.live
    view = replay.view
    calls = view.calls
    free_lists = pools._free
    expandable = pools.expandable
    malloc = pools.malloc
    # The counters, in locals (written back below and around the one general call).
    in_use = pools.bytes_in_use
    peak_in_use = pools.peak_bytes_in_use
    requested = pools.requested
    allocs = pools.num_allocs
    frees = pools.num_frees
    i = first
    for i, op, buffer, size, stream in zip(range(first, first + hi - lo), ops[lo:hi],
                                           ids[lo:hi], sizes[lo:hi], streams[lo:hi]):
        if op == OP_ALLOC:
            if size <= 0:
                continue
            # -- _malloc_default / _malloc_expandable ------------------------------------
            rounded = 512 if size < 512 else (size + 511) & -512
            small = rounded <= K_SMALL_SIZE
            pool_key = stream << 1 | small
            keys = free_lists.get(pool_key)
            if keys is None:
                keys = free_lists[pool_key] = []
            # get_free_block: the smallest block of this stream and pool that fits.
            position = bisect_left(keys, rounded << SHIFT)
            if position < len(keys):
                if expandable:
                    # The expandable walk (see _malloc_expandable): on to bigger blocks while
                    # their size plus the unmapped block behind them is smaller.
                    block = record[keys[position] & MASK]
                    after = block[NEXT]
                    if after is not None and after[REQ] == UNMAPPED:
                        current = block[SIZE] + after[SIZE]
                        last = len(keys) - 1
                        while position < last:
                            candidate = record[keys[position + 1] & MASK]
                            after = candidate[NEXT]
                            following = candidate[SIZE] + (
                                after[SIZE] if after is not None and after[REQ] == UNMAPPED
                                else 0)
                            if following >= current:
                                break
                            position += 1
                            current = following
                            block = candidate
                    del keys[position]
                    address = block[ADDRESS]
                    block_size = block[SIZE]
                    remaining = block_size - rounded
                    split = remaining >= K_MIN_BLOCK_SIZE
                else:
                    key = keys.pop(position)
                    address = key & MASK
                    block_size = key >> SHIFT
                    block = record[address]
                    remaining = block_size - rounded
                    split = (remaining >= K_MIN_BLOCK_SIZE if small
                             else remaining > K_SMALL_SIZE)
                # should_split, then alloc_found_block (the caller keeps the low end).
                if split:
                    rest = address + rounded
                    after = block[NEXT]
                    block[SIZE] = rounded
                    record[rest] = block[NEXT] = piece = [remaining, block, after, pool_key, 0,
                                                          rest]
                    if after is not None:
                        after[PREV] = piece
                    insort(keys, remaining << SHIFT | rest)
                    block_size = rounded
                block[REQ] = size
                in_use += block_size
                if in_use > peak_in_use:
                    peak_in_use = in_use
                requested += size
                allocs += 1
                # -- the engine: the buffer is live -------------------------------------
                live[buffer] = address
                allocated += size
                if allocated > peak:
                    peak = allocated
                    replay.peak_allocated_event = i
                    replay.in_use_at_peak_allocated = in_use
                continue                                    # a hit calls no device
            # The free lists cannot serve it: the hot malloc itself (the miss path: a new
            # segment or pages, the release steps, or an OOM), the locals written back.
            pools.bytes_in_use, pools.peak_bytes_in_use = in_use, peak_in_use
            pools.requested, pools.num_allocs, pools.num_frees = requested, allocs, frees
            grown = malloc(size, stream)
            in_use, peak_in_use = pools.bytes_in_use, pools.peak_bytes_in_use
            requested, allocs = pools.requested, pools.num_allocs
            allocated, peak, top, calls = note_general_alloc(
                replay, i, buffer, size, grown, in_use, allocated, peak, top, calls)
            if grown is None and replay.stopped:            # a stopping OOM
                break
        else:
            # -- the engine: a free of a live buffer, else skipped ----------------------
            held = live.pop(buffer, None)
            if held is None:
                if size:
                    replay.skipped_events.append(i)
                continue
            allocated -= size
            # -- _free_default (= _free_expandable) ---------------------------------------
            block = record[held]
            block_size, before, after, pool_key, asked, _ = block
            if asked <= 0:
                raise KeyError(f"pytorch: block {held:#x} is not allocated")
            in_use -= block_size
            requested -= asked
            frees += 1
            keys = free_lists[pool_key]
            # free_block: merge with the previous block, then the next one, each when free and
            # mapped (REQ 0; an unmapped block's is UNMAPPED).
            address = held
            if before is not None and not before[REQ]:
                merged = before[SIZE]
                address = before[ADDRESS]
                del keys[bisect_left(keys, merged << SHIFT | address)]
                del record[block[ADDRESS]]
                before[NEXT] = after
                if after is not None:
                    after[PREV] = before
                block = before
                block_size += merged
            else:
                block[REQ] = 0
            if after is not None and not after[REQ]:
                merged = after[SIZE]
                after_address = after[ADDRESS]
                del keys[bisect_left(keys, merged << SHIFT | after_address)]
                del record[after_address]
                beyond = block[NEXT] = after[NEXT]
                if beyond is not None:
                    beyond[PREV] = block
                block_size += merged
            block[SIZE] = block_size
            insort(keys, block_size << SHIFT | address)
    pools.bytes_in_use, pools.peak_bytes_in_use = in_use, peak_in_use
    pools.requested, pools.num_allocs, pools.num_frees = requested, allocs, frees
    return i, allocated, peak, top
