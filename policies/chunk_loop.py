"""ChunkPolicy's own segment loop (BFC, preallocate, best-fit): the engine's per-event loop with
the hot pair written into it (issue 17; :meth:`~allocsim.policies.base.Policy.segment_loop`).

Why: a malloc or free of these policies is a bisection and a few list slots, and the engine's
call into :meth:`~allocsim.policies.chunk_policy.ChunkPolicy._malloc_fast` or
:meth:`~allocsim.policies.chunk_policy.ChunkPolicy.free` with the attribute loads around it is a
large share of each event.

What: :func:`replay_segment` is ``ProcessReplay._run``'s inner loop (sim/kernel/engine.py)
with those two methods' bodies in place of the calls, the policy's counters and the free
index's bitmap of non-empty bins in locals. Per event it keeps what the engine's loop keeps
(:class:`~allocsim.policies.base.SegmentReplay`): the live table, allocated bytes and their
peak (with the event and the policy's bytes in use there), skipped frees, OOMs (through the
replay's ``note_out_of_memory``), and the timeline's figures at an event that made device
calls. Only a malloc that finds no free chunk can call the device (the subclass's growth rule,
``_make_room``): that one runs :meth:`_malloc_fast` itself, with the locals written back
around it — search, growth, search again, or an OOM — noted as the engine would by
policies/segment_events.py, and only there is the device's call
counter read. A free never calls the device (best-fit's ``trim`` binds a free of its own, and
the loop is then not offered).

Held to the engine's loop over the hot pair on random workloads, OOMs, skipped frees and
stopping runs included, by tests/test_segment_loop.py; and, since the engine takes the loop
wherever it may, to the results recorded before it by tests/test_fast_paths.py and the
replay-memory references.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Protocol

from allocsim.policies.base import SegmentReplay
from allocsim.policies.chunk_records import ADDRESS, ADDRESS_MASK, KEY, NEXT, PREV, REQUESTED, SIZE
from allocsim.policies.chunks import BIN, KEY_SHIFT, FreeIndex
from allocsim.policies.segment_events import OP_ALLOC, note_general_alloc


class ChunkHeap(Protocol):
    """What the loop reads and writes of the policy (a ChunkPolicy; named here rather than
    imported, which would make an import circle)."""

    max_slack: int
    bytes_in_use: int
    peak_bytes_in_use: int
    num_allocs: int
    num_frees: int
    _record: dict[int, list]
    _index: FreeIndex
    _bins: list[list[int]]
    _round_add: int
    _round_mask: int

    def _malloc_fast(self, size: int, stream: int = 0) -> int | None: ...


def replay_segment(heap: ChunkHeap, replay: SegmentReplay, ops: list[int], ids: list[int],
                   sizes: list[int], streams: list[int], lo: int, hi: int, first: int,
                   allocated: int, peak: int, top: int) -> tuple[int, int, int, int] | None:
    """Replay events ``first``, ``first + 1``, … (``ops[lo:hi]`` and the other columns'
    slices) through ``heap`` as the engine would; returns the last event replayed (a stopping
    OOM's if one stopped the replay), allocated bytes, their peak and the bucket's top."""
    live = replay.live
    view = replay.view
    calls = view.calls
    record = heap._record
    index = heap._index
    bins = heap._bins
    round_add, round_mask = heap._round_add, heap._round_mask
    max_slack = heap.max_slack
    # The policy's counters and the index's bitmap, in locals (written back below and around
    # the one general call).
    nonempty = index.nonempty
    in_use = heap.bytes_in_use
    peak_in_use = heap.peak_bytes_in_use
    allocs = heap.num_allocs
    frees = heap.num_frees
    i = first
    for i, op, buffer, size, stream in zip(range(first, first + hi - lo), ops[lo:hi],
                                           ids[lo:hi], sizes[lo:hi], streams[lo:hi]):
        if op == OP_ALLOC:
            if size <= 0:
                continue
            # -- _malloc_fast --------------------------------------------------------------
            rounded = (size + round_add) & round_mask
            # FreeIndex.pop_best_fit: in bin(rounded), the first key ≥ (rounded, 0); else
            # the first key of the next non-empty bin above it.
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
            if key:
                if not keys:
                    nonempty &= ~(1 << number)
                # ChunkMap.hand_out: in use, with its request; the split rule.
                address = key & ADDRESS_MASK
                chunk = record[address]
                chunk[KEY] = 0
                chunk[REQUESTED] = size
                handed = chunk[SIZE]
                rest_size = handed - rounded
                if rest_size and (handed >= 2 * rounded or rest_size >= max_slack):
                    rest = address + rounded
                    after = chunk[NEXT]
                    chunk[SIZE] = handed = rounded
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
                in_use += handed
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
                continue                                    # a hit calls no device
            # Nothing free fits: _malloc_fast itself (growth, or an OOM), locals written back.
            index.nonempty = nonempty
            heap.bytes_in_use, heap.peak_bytes_in_use = in_use, peak_in_use
            heap.num_allocs, heap.num_frees = allocs, frees
            grown = heap._malloc_fast(size, stream)
            nonempty = index.nonempty
            in_use, peak_in_use = heap.bytes_in_use, heap.peak_bytes_in_use
            allocs = heap.num_allocs
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
            address = held
            # -- ChunkPolicy.free ----------------------------------------------------------
            chunk = record[address]
            freed, before, after, key, _, _ = chunk
            if key:
                raise KeyError(f"chunk {address:#x} is not in use")
            chunk_size = freed
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
            chunk[SIZE] = chunk_size
            number = BIN[chunk_size.bit_length()]           # FreeIndex.add, written out
            keys = bins[number]
            chunk[KEY] = key = chunk_size << KEY_SHIFT | address
            if not keys:
                nonempty |= 1 << number
                keys.append(key)
            elif key > keys[-1]:
                keys.append(key)
            else:
                insort(keys, key)
            in_use -= freed
            frees += 1
    index.nonempty = nonempty
    heap.bytes_in_use, heap.peak_bytes_in_use = in_use, peak_in_use
    heap.num_allocs, heap.num_frees = allocs, frees
    return i, allocated, peak, top
