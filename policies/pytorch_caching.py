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
c10/cuda/CUDAAllocatorConfig.cpp (the CUDA-only keys). reference/allocators.md §3 summarises it.

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
mid-run starts from the state the recording started in (sim/fidelity.py uses it).

Not modelled: record_stream / cross-stream frees (every free is complete at once, so
process_events and the event queues are empty), CUDA graph private pools and MemPools,
free-memory callbacks, cudaMallocAsync, IPC, release_lock_on_cudamalloc, toggling
expandable_segments during a run (all segments are one kind), and requested_size of inactive
blocks in :meth:`segments` (reported as 0; PyTorch reports stale values there). Stats kept per
pool only as current values (computed on demand), peaks are kept for the aggregate ("all").
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from typing import Any

from allocsim.policies.base import DeviceMemory, Param, Policy, PolicyStats

MiB = 1 << 20
K_MIN_BLOCK_SIZE = 512               # all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MiB               # largest "small" allocation
K_SMALL_BUFFER = 2 * MiB             # small allocations are packed in 2 MiB segments
K_LARGE_BUFFER = 20 * MiB            # 1–10 MiB requests get a 20 MiB segment
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB              # larger segments round up to 2 MiB
ROUNDUP_INTERVALS = 16               # roundup_power2_divisions: 1 MiB .. 64 GiB
NO_LIMIT = 1 << 62                   # SIZE_MAX: max_split_size when unset

SHIFT = 52                           # free-list key = size << 52 | address (addresses < 2**52)
MASK = (1 << SHIFT) - 1

# Keys of PYTORCH_CUDA_ALLOC_CONF that do not change device-memory placement (host/pinned
# allocator, locking): accepted and dropped by parse_alloc_conf.
_IGNORED_KEYS = {
    "release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register", "pinned_num_register_threads",
    "pinned_use_background_threads", "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
}
_MODELLED_KEYS = ("max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
                  "roundup_power2_divisions", "expandable_segments")


# -- configuration -------------------------------------------------------------------------
def tokenize(text: str) -> list[str]:
    """ConfigTokenizer: ',', ':', '[' and ']' are tokens of their own; whitespace is dropped."""
    tokens: list[str] = []
    buffer = ""
    for ch in text:
        if ch in ",:[]":
            if buffer:
                tokens.append(buffer)
                buffer = ""
            tokens.append(ch)
        elif not ch.isspace():
            buffer += ch
    if buffer:
        tokens.append(buffer)
    return tokens


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _to_int(token: str, what: str) -> int:
    try:
        value = int(token)
    except ValueError:
        raise ValueError(f"{what}: expected a whole number, got {token!r}") from None
    if value < 0:
        raise ValueError(f"{what}: expected a non-negative number, got {token!r}")
    return value


def parse_roundup_power2_divisions(text: str | int) -> list[int]:
    """The 16-entry divisions table from ``"4"`` or ``"[256:1,512:2,>:8]"`` (parseRoundUpPower2Divisions).

    A single value must be a power of two and applies to every interval. In a list, each
    ``boundary:divisions`` names an interval by its lower bound in MiB (a power of two; interval
    index = log2(boundary), clamped to 0..15); the first entry also fills every interval below
    it; ``>:d`` fills every interval after the last one named; divisions are 0 or a power of
    two. ``;`` may stand for ``,`` inside the brackets. Empty text means all 0 (no rounding).
    """
    text = str(text).strip()
    table = [0] * ROUNDUP_INTERVALS
    if not text:
        return table
    tokens = tokenize(text.replace(";", ","))
    if tokens[0] != "[":
        if len(tokens) != 1:
            raise ValueError("roundup_power2_divisions: expected a number or a [..] list, "
                             f"got {text!r}")
        value = _to_int(tokens[0], "roundup_power2_divisions")
        if not _is_power_of_two(value):
            raise ValueError("roundup_power2_divisions: the divisions have to be a power of 2, "
                             f"got {value}")
        return [value] * ROUNDUP_INTERVALS
    if tokens[-1] != "]":
        raise ValueError(f"roundup_power2_divisions: expected a closing ']' in {text!r}")
    first = True
    last_index = 0
    i = 1
    while i < len(tokens) - 1:
        if i + 2 >= len(tokens) or tokens[i + 1] != ":":
            raise ValueError(f"roundup_power2_divisions: expected boundary:divisions in {text!r}")
        boundary, value = tokens[i], _to_int(tokens[i + 2], "roundup_power2_divisions")
        if value and not _is_power_of_two(value):
            raise ValueError("roundup_power2_divisions: the divisions have to be a power of 2 or 0, "
                             f"got {value}")
        if boundary == ">":
            for index in range(last_index + 1, ROUNDUP_INTERVALS):
                table[index] = value
        else:
            bound = _to_int(boundary, "roundup_power2_divisions")
            if not _is_power_of_two(bound):
                raise ValueError("roundup_power2_divisions: the interval boundaries (MiB) have to be "
                                 f"powers of 2, got {bound}")
            index = min(bound.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:
                for below in range(index):
                    table[below] = value
                first = False
            table[index] = value
            last_index = index
        i += 3
        if i < len(tokens) - 1:
            if tokens[i] != ",":
                raise ValueError("roundup_power2_divisions: expected ',' between entries in "
                                 f"{text!r}")
            i += 1
    return table


def parse_alloc_conf(text: str) -> dict[str, str]:
    """A PYTORCH_CUDA_ALLOC_CONF string as-is → this policy's parameters as registry strings.

    ``"max_split_size_mb:128,expandable_segments:True,roundup_power2_divisions:[256:1,>:4]"`` →
    ``{"max_split_size_mb": "128", "expandable_segments": "true",
    "roundup_power2_divisions": "[256:1;>:4]"}`` (lists use ``;`` so the result can be joined into
    a registry spec). Validation is PyTorch's: unknown keys, ``true`` instead of ``True``, a
    max_split_size_mb below 20 … raise ValueError with one line. Keys that do not affect device
    memory (pinned-memory and locking options, ``backend:native``) are accepted and dropped;
    ``backend:cudaMallocAsync`` is a different allocator and is refused.
    """
    text = text.strip()
    for prefix in ("PYTORCH_CUDA_ALLOC_CONF=", "PYTORCH_ALLOC_CONF=", "PYTORCH_HIP_ALLOC_CONF="):
        if text.startswith(prefix):
            text = text[len(prefix):].strip().strip("'\"")
    tokens = tokenize(text)
    result: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if i + 2 >= len(tokens) or tokens[i + 1] != ":":
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: expected {key}:value in {text!r}")
        value_start = i + 2
        if tokens[value_start] == "[":
            try:
                end = tokens.index("]", value_start)
            except ValueError:
                raise ValueError("PYTORCH_CUDA_ALLOC_CONF: expected a closing ']' after "
                                 f"{key}") from None
        else:
            end = value_start
        value = "".join(tokens[value_start:end + 1])
        if key in _MODELLED_KEYS:
            result[key] = _check_conf_value(key, value)
        elif key == "backend":
            if value == "cudaMallocAsync":
                raise ValueError("PYTORCH_CUDA_ALLOC_CONF: backend:cudaMallocAsync is a different "
                                 "allocator, not modelled by 'pytorch'")
            if value != "native":
                raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: unknown allocator backend {value!r}; "
                                 "options are native and cudaMallocAsync")
        elif key not in _IGNORED_KEYS:
            known = ", ".join(_MODELLED_KEYS + ("backend",) + tuple(sorted(_IGNORED_KEYS)))
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: unrecognized key {key!r}; "
                             f"known keys: {known}")
        i = end + 1
        if i < len(tokens):
            if tokens[i] != ",":
                raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: expected ',' after {key}:{value}")
            i += 1
    return result


def _check_conf_value(key: str, value: str) -> str:
    """Validate one modelled PYTORCH_CUDA_ALLOC_CONF value; return its registry form."""
    if key == "expandable_segments":
        if value not in ("True", "False"):
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: expected True or False for {key}, "
                             f"got {value!r}")
        return value.lower()
    if key == "roundup_power2_divisions":
        parse_roundup_power2_divisions(value)
        return value.replace(",", ";")
    if key == "garbage_collection_threshold":
        try:
            threshold = float(value)
        except ValueError:
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: {key} expects a number, "
                             f"got {value!r}") from None
        _check_gc_threshold(threshold)
        return value
    megabytes = _to_int(value, key)
    _check_mb(key, megabytes)
    return str(megabytes)


def _check_mb(key: str, megabytes: int) -> None:
    if megabytes < K_LARGE_BUFFER // MiB:
        raise ValueError(f"{key} too small, must be >= {K_LARGE_BUFFER // MiB}, got {megabytes}")


def _check_gc_threshold(threshold: float) -> None:
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"garbage_collection_threshold must be in (0.0, 1.0), got {threshold}")


# -- sizes ---------------------------------------------------------------------------------
def roundup_power2_next_division(size: int, divisions: int) -> int:
    """Round ``size`` up to the next of ``divisions`` equal steps between two powers of two."""
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def divisions_index(size: int) -> int:
    """Which of the 16 roundup intervals ``size`` falls in: clamp(floor(log2 size) − 20, 0, 15)."""
    return min(max(size.bit_length() - 1 - 20, 0), ROUNDUP_INTERVALS - 1)


def round_size(size: int, divisions: list[int] | None = None) -> int:
    """DeviceCachingAllocator::round_size with the given divisions table (default: all 0)."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions:
        d = divisions[divisions_index(size)]
        if d > 1 and size > K_MIN_BLOCK_SIZE * d:
            return roundup_power2_next_division(size, d)
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def get_allocation_size(size: int) -> int:
    """Segment size for a rounded request that missed the cache."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


class _Segment:
    """One cudaMalloc'd segment, or the whole virtual range of one expandable segment."""

    __slots__ = ("base", "expandable", "page", "pool_key", "size", "small", "stream")

    def __init__(self, base: int, size: int, stream: int, small: bool, expandable: bool,
                 page: int = 0) -> None:
        self.base = base
        self.size = size
        self.stream = stream
        self.small = small
        self.expandable = expandable
        self.page = page
        self.pool_key = stream << 1 | small


class PyTorchCachingAllocator(Policy):
    """See the module docstring. Blocks are addresses; their fields live in dicts keyed by
    address (size, prev, next, pool key, requested bytes if allocated), which is what keeps
    malloc/free at a few dict operations and one ``bisect`` each."""

    name = "pytorch"
    description = ("PyTorch CUDA caching allocator: small/large pools per stream, best fit, "
                   "splits, 2/20 MiB segments, OOM retries; expandable segments optional")
    PARAMS = {
        "max_split_size_mb": Param("int", 0, "blocks this large (MiB) are never split; 0 = unlimited, "
                                   "else >= 20"),
        "roundup_power2_divisions": Param("str", "", "PyTorch's roundup_power2_divisions: '4' or "
                                          "'[256:1;512:2;>:8]' (';' or ','); empty = off"),
        "garbage_collection_threshold": Param("float", 0.0, "reclaim old cached blocks above this "
                                              "share of the allowed memory; 0 = off, else in (0,1); "
                                              "acts only when per_process_memory_fraction is set"),
        "expandable_segments": Param("bool", False, "one growing virtual segment per stream and pool "
                                     "(2/20 MiB pages)"),
        "max_non_split_rounding_mb": Param("int", 20, "a request >= max_split_size may take a block up "
                                           "to this many MiB bigger; >= 20"),
        "per_process_memory_fraction": Param("float", 0.0, "set_per_process_memory_fraction: device "
                                             "allocations fail beyond this share of capacity; "
                                             "0 = never set (whole device)"),
    }

    def __init__(self, device: DeviceMemory, max_split_size_mb: int = 0,
                 roundup_power2_divisions: str | int = "", garbage_collection_threshold: float = 0.0,
                 expandable_segments: bool = False, max_non_split_rounding_mb: int = 20,
                 per_process_memory_fraction: float = 0.0) -> None:
        super().__init__(device)
        if max_split_size_mb < 0:
            raise ValueError("max_split_size_mb must be 0 (unlimited) or >= 20, "
                             f"got {max_split_size_mb}")
        if max_split_size_mb:
            _check_mb("max_split_size_mb", max_split_size_mb)
        _check_mb("max_non_split_rounding_mb", max_non_split_rounding_mb)
        if garbage_collection_threshold:
            _check_gc_threshold(garbage_collection_threshold)
        if not 0.0 <= per_process_memory_fraction <= 1.0:
            raise ValueError("per_process_memory_fraction must be in [0, 1], got "
                             f"{per_process_memory_fraction}")
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

        # Blocks, keyed by address: every block (allocated, free, unmapped) has size/prev/next/home.
        self._size: dict[int, int] = {}
        self._prev: dict[int, int] = {}          # 0 = none (first block of its segment)
        self._next: dict[int, int] = {}          # 0 = none (last block of its segment)
        self._home: dict[int, int] = {}          # pool key = stream << 1 | small
        self._req: dict[int, int] = {}           # allocated blocks -> requested bytes
        self._unmapped: set[int] = set()         # unmapped blocks (expandable segments only)
        self._gc_base: dict[int, int] = {}       # free block -> pool's search count at insertion
        # Free mapped blocks per pool key, as sorted keys size << 52 | address.
        self._free: dict[int, list[int]] = {}
        self._unmapped_lists: dict[int, list[int]] = {}   # pool key -> sorted unmapped addresses
        self.segment_map: dict[int, _Segment] = {}        # base -> segment
        self._es_bases: list[int] = []                    # sorted bases of expandable segments
        self._gc_calls = [0, 0]                           # get_free_block calls: [large, small]

        # Counters for memory_stats() (PyTorch's names in comments).
        self.peak_bytes_in_use = 0                # allocated_bytes.all.peak
        self.allocated_total = 0                  # allocated_bytes.all.allocated
        self.requested = 0                        # requested_bytes.all.current
        self.peak_requested = 0
        self.requested_total = 0
        self.peak_allocations = 0                 # allocation.all.peak
        self.pool_bytes = 0                       # reserved_bytes.all.current
        self.peak_pool_bytes = 0
        self.reserved_total = 0
        self.num_segments = 0                     # segment.all.current (cudaMalloc'd segments)
        self.peak_segments = 0
        self.segments_total = 0
        self.inactive_split = 0                   # free blocks of split segments (not expandable)
        self.peak_inactive_split = 0
        self.inactive_split_total = 0
        self.inactive_split_bytes = 0
        self.peak_inactive_split_bytes = 0
        self.inactive_split_bytes_total = 0
        self.oversize_allocations = 0
        self.peak_oversize_allocations = 0
        self.oversize_allocations_total = 0
        self.oversize_segments = 0
        self.peak_oversize_segments = 0
        self.oversize_segments_total = 0
        self.num_alloc_retries = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

    # -- the hot path ------------------------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> int | None:
        if size <= 0:
            return None
        if size < 512:
            rounded = 512
        elif self._divisions is None:
            rounded = (size + 511) & -512
        else:
            rounded = round_size(size, self._divisions)
        small = rounded <= K_SMALL_SIZE
        pool_key = stream << 1 | small
        keys = self._free.get(pool_key)
        if keys is None:
            keys = self._free[pool_key] = []
        if self._gc_on:
            self._gc_calls[small] += 1
        # get_free_block: the smallest block of this stream and pool that fits, or none.
        block = 0
        position = bisect_left(keys, rounded << SHIFT)
        if position < len(keys):
            if self.expandable:
                position = self._expandable_best_fit(keys, position)
            key = keys[position]
            block_size = key >> SHIFT
            max_split = self.max_split_size
            if rounded < max_split:
                if block_size < max_split:
                    block = key & MASK
            elif block_size < rounded + self.max_non_split_rounding:
                block = key & MASK
            if block:
                del keys[position]
        if not block:
            found = self._malloc_miss(rounded, small, stream, pool_key)
            if found is None:
                return None
            block, block_size = found
        # should_split, then alloc_found_block.
        remaining = block_size - rounded
        if small or self.expandable:
            split = remaining >= K_MIN_BLOCK_SIZE
        else:
            split = rounded < self.max_split_size and remaining > K_SMALL_SIZE
        next_of = self._next
        already_split = self._prev[block] or next_of[block]
        if split:
            size_of = self._size
            rest = block + rounded
            after = next_of[block]
            size_of[block] = rounded
            size_of[rest] = remaining
            self._prev[rest] = block
            next_of[rest] = after
            next_of[block] = rest
            if after:
                self._prev[after] = rest
            self._home[rest] = pool_key
            insort(keys, remaining << SHIFT | rest)
            if self._gc_on:
                self._gc_base[rest] = self._gc_calls[small]
            if not self.expandable:
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
            block_size = rounded
        elif already_split and not self.expandable:
            self.inactive_split -= 1
            self.inactive_split_bytes -= block_size
        self._req[block] = size
        in_use = self.bytes_in_use + block_size
        self.bytes_in_use = in_use
        if in_use > self.peak_bytes_in_use:
            self.peak_bytes_in_use = in_use
        self.allocated_total += block_size
        requested = self.requested + size
        self.requested = requested
        if requested > self.peak_requested:
            self.peak_requested = requested
        self.requested_total += size
        self.num_allocs += 1
        live = self.num_allocs - self.num_frees
        if live > self.peak_allocations:
            self.peak_allocations = live
        if block_size >= self.max_split_size:
            self._oversize_allocation()
        return block

    def free(self, address: int) -> None:
        req = self._req
        requested = req.pop(address)
        size_of, prev_of, next_of, home = self._size, self._prev, self._next, self._home
        size = size_of[address]
        self.bytes_in_use -= size
        self.requested -= requested
        self.num_frees += 1
        if size >= self.max_split_size:
            self.oversize_allocations -= 1
        pool_key = home[address]
        keys = self._free[pool_key]
        unmapped = self._unmapped
        # free_block: try_merge_blocks with the previous block, then with the next one.
        block = address
        total = size
        subsumed_count = 0
        subsumed_bytes = 0
        before = prev_of[address]
        if before and before not in req and before not in unmapped:
            before_size = size_of[before]
            del keys[bisect_left(keys, before_size << SHIFT | before)]
            after = next_of.pop(address)
            del size_of[address], prev_of[address], home[address]
            next_of[before] = after
            if after:
                prev_of[after] = before
            block = before
            total += before_size
            subsumed_count = 1
            subsumed_bytes = before_size
        after = next_of[block]
        if after and after not in req and after not in unmapped:
            after_size = size_of.pop(after)
            del keys[bisect_left(keys, after_size << SHIFT | after)]
            beyond = next_of.pop(after)
            del prev_of[after], home[after]
            next_of[block] = beyond
            if beyond:
                prev_of[beyond] = block
            total += after_size
            subsumed_count += 1
            subsumed_bytes += after_size
        size_of[block] = total
        insort(keys, total << SHIFT | block)
        if self._gc_on:
            gc_base = self._gc_base
            gc_base.pop(address, None)
            gc_base.pop(after, None)
            gc_base[block] = self._gc_calls[pool_key & 1]
        if not self.expandable:
            # free_block's net change of inactive_split(_bytes): the neighbours it swallowed
            # stop counting; the joined block counts while its segment is still split.
            if prev_of[block] or next_of[block]:
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

    def _oversize_allocation(self) -> None:
        self.oversize_allocations += 1
        self.oversize_allocations_total += 1
        if self.oversize_allocations > self.peak_oversize_allocations:
            self.peak_oversize_allocations = self.oversize_allocations

    # -- block bookkeeping (off the hot path) ------------------------------------------
    def _remove_free(self, address: int) -> None:
        keys = self._free[self._home[address]]
        del keys[bisect_left(keys, self._size[address] << SHIFT | address)]

    def _insert_free(self, address: int) -> None:
        """BlockPool::insert_into_blocks: into the free list, stamped with the search count."""
        pool_key = self._home[address]
        insort(self._free.setdefault(pool_key, []), self._size[address] << SHIFT | address)
        if self._gc_on:
            self._gc_base[address] = self._gc_calls[pool_key & 1]

    def _forget(self, address: int) -> None:
        del self._size[address], self._prev[address], self._next[address], self._home[address]
        self._gc_base.pop(address, None)

    def _new_segment(self, segment: _Segment) -> None:
        base = segment.base
        self.segment_map[base] = segment
        self._size[base] = segment.size
        self._prev[base] = 0
        self._next[base] = 0
        self._home[base] = segment.pool_key

    # -- the miss path -----------------------------------------------------------------
    def _malloc_miss(self, rounded: int, small: bool, stream: int,
                     pool_key: int) -> tuple[int, int] | None:
        """Everything after a failed search: GC, alloc_block, then the two release-and-retry
        steps; an OOM when all fail. Returns a block in no free list, as get_free_block would."""
        alloc_size = get_allocation_size(rounded)
        if self._gc_on:
            self._garbage_collect_cached_blocks()
        found = self._alloc_block(rounded, small, stream, alloc_size, False)
        if found is None and self._release_available_cached_blocks(rounded, pool_key):
            found = self._alloc_block(rounded, small, stream, alloc_size, False)
        if found is None:
            self._release_cached_blocks()
            found = self._alloc_block(rounded, small, stream, alloc_size, True)
        if found is None:
            self.num_ooms += 1
        return found

    def _alloc_block(self, rounded: int, small: bool, stream: int, alloc_size: int,
                     is_retry: bool) -> tuple[int, int] | None:
        """alloc_block: a new segment of ``alloc_size`` (cudaMalloc), or mapped pages."""
        if is_retry:
            self.num_alloc_retries += 1
        if self.set_fraction and self.pool_bytes + alloc_size > self.allowed_memory_maximum:
            return None
        if self.expandable:
            return self._try_allocate_expandable_block(stream, small, rounded)
        base = self.device.reserve(alloc_size)
        if base is None:
            return None
        self._new_segment(_Segment(base, alloc_size, stream, small, False))
        self._reserved_change(alloc_size)
        self.num_segments += 1
        self.segments_total += 1
        if self.num_segments > self.peak_segments:
            self.peak_segments = self.num_segments
        if alloc_size >= self.max_split_size:
            self.oversize_segments += 1
            self.oversize_segments_total += 1
            if self.oversize_segments > self.peak_oversize_segments:
                self.peak_oversize_segments = self.oversize_segments
        self.num_device_alloc += 1
        return base, alloc_size

    def _reserved_change(self, nbytes: int) -> None:
        self.pool_bytes += nbytes
        if nbytes > 0:
            self.reserved_total += nbytes
            if self.pool_bytes > self.peak_pool_bytes:
                self.peak_pool_bytes = self.pool_bytes

    def _release_block(self, address: int) -> None:
        """release_block: cudaFree a free whole-segment block (it is in its free list)."""
        segment = self.segment_map.pop(address)
        size = self._size[address]
        if segment.size != size or self._prev[address] or self._next[address]:
            raise AssertionError(f"release_block of {address:#x}, which is not a whole segment")
        self._remove_free(address)
        self._forget(address)
        self.device.release(address)
        self._reserved_change(-size)
        self.num_segments -= 1
        if size >= self.max_split_size:
            self.oversize_segments -= 1
        self.num_device_free += 1

    def _release_available_cached_blocks(self, rounded: int, pool_key: int) -> bool:
        """With max_split_size set: free the smallest block ≥ max(rounded, max_split_size) of
        this stream and pool; else oversize blocks from the largest down until that many bytes
        went (those freed stay freed even if it was not enough). Never expandable blocks."""
        max_split = self.max_split_size
        if max_split == NO_LIMIT or self.expandable:
            return False
        keys = self._free[pool_key]
        target = max(rounded, max_split)
        position = bisect_left(keys, target << SHIFT)
        if position < len(keys):
            self._release_block(keys[position] & MASK)
            return True
        released = 0
        index = position - 1
        while released < target and index >= 0 and keys[index] >> SHIFT >= max_split:
            key = keys[index]
            self._release_block(key & MASK)
            released += key >> SHIFT
            index -= 1
        return released >= target

    def _release_cached_blocks(self) -> None:
        """release_cached_blocks: synchronise (counted), then release every unsplit free block
        of the large pool, then of the small pool; expandable segments unmap the whole pages of
        every free block instead, and forget a virtual range left wholly unmapped."""
        self.num_sync_all_streams += 1
        pool_keys = sorted(self._free, key=lambda k: (k & 1, k))    # large pools first
        if not self.expandable:
            for pool_key in pool_keys:
                for key in list(self._free[pool_key]):
                    address = key & MASK
                    if not self._prev[address] and not self._next[address]:
                        self._release_block(address)
            return
        to_unmap = [key & MASK for pool_key in pool_keys for key in self._free[pool_key]]
        for address in to_unmap:
            unmapped = self._unmap_block(address)
            if unmapped is not None and not self._prev[unmapped] and not self._next[unmapped]:
                self._release_expandable_segment(unmapped)

    def _garbage_collect_cached_blocks(self) -> None:
        """garbage_collect_cached_blocks: above garbage_collection_threshold × allowed memory,
        release unsplit large-pool blocks whose age ≥ the mean age of such blocks, again with
        the new mean, until the excess is reclaimed or a pass frees nothing."""
        threshold = int(self.gc_threshold * self.allowed_memory_maximum)
        if self.pool_bytes <= threshold or self.expandable:
            return
        target = self.pool_bytes - threshold
        now = self._gc_calls[0]
        candidates = [key & MASK for pool_key, keys in self._free.items() if not pool_key & 1
                      for key in keys
                      if not self._prev[key & MASK] and not self._next[key & MASK]]
        age = {address: now - self._gc_base[address] for address in candidates}
        total_age = sum(age.values())
        count = len(candidates)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            kept = []
            for address in candidates:
                if age[address] >= age_threshold:
                    freed = True
                    reclaimed += self._size[address]
                    total_age -= age[address]
                    count -= 1
                    self._release_block(address)
                else:
                    kept.append(address)
            candidates = kept

    # -- expandable segments -----------------------------------------------------------
    def _segment_of(self, address: int) -> _Segment:
        """The expandable segment whose virtual range holds ``address``."""
        bases = self._es_bases
        return self.segment_map[bases[bisect_left(bases, address + 1) - 1]]

    def _expandable_best_fit(self, keys: list[int], position: int) -> int:
        """get_free_block's walk: from the first fitting block, move on to bigger blocks while
        their size plus the unmapped space right behind them is smaller."""
        size_of, next_of, unmapped = self._size, self._next, self._unmapped

        def expandable_size(address: int) -> int:
            after = next_of[address]
            return size_of[address] + (size_of[after] if after in unmapped else 0)

        current = expandable_size(keys[position] & MASK)
        while position + 1 < len(keys):
            following = expandable_size(keys[position + 1] & MASK)
            if following >= current:
                break
            position += 1
            current = following
        return position

    def _find_expandable_block(self, stream: int, small: bool, size: int) -> int:
        """find_expandable_block: over this stream's unmapped blocks of this pool in address
        order, the first where a free block just before it plus the free and unmapped space
        from there holds ``size``; else a new virtual range of ceil(1.125 × capacity) pages."""
        pool_key = stream << 1 | small
        req, size_of, next_of = self._req, self._size, self._next
        for candidate in self._unmapped_lists.get(pool_key, ()):
            before = self._prev[candidate]
            if before and before not in req:
                candidate = before
            nbytes = 0
            address = candidate
            while nbytes < size and address and address not in req:
                nbytes += size_of[address]
                address = next_of[address]
            if nbytes >= size:
                return candidate
        page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        capacity = self.device.capacity
        nbytes = -(-(capacity + capacity // 8) // page) * page
        base = self.device.address_range(nbytes)
        self._new_segment(_Segment(base, nbytes, stream, small, True, page))
        insort(self._es_bases, base)
        self._add_unmapped(base)
        return base

    def _add_unmapped(self, address: int) -> None:
        self._unmapped.add(address)
        insort(self._unmapped_lists.setdefault(self._home[address], []), address)

    def _drop_unmapped(self, address: int) -> None:
        self._unmapped.remove(address)
        addresses = self._unmapped_lists[self._home[address]]
        del addresses[bisect_left(addresses, address)]

    def _try_merge(self, dst: int, src: int, dst_mapped: bool) -> int:
        """try_merge_blocks: join ``dst`` (in no index) with its neighbour ``src`` if that is
        not allocated and equally mapped; ``src`` leaves its index. Returns the joined block's
        address (the lower of the two), or ``dst`` when they do not join."""
        if not src or src in self._req or (src not in self._unmapped) != dst_mapped:
            return dst
        if dst_mapped:
            self._remove_free(src)
        else:
            self._drop_unmapped(src)
        low, high = (src, dst) if src < dst else (dst, src)
        size_of, prev_of, next_of = self._size, self._prev, self._next
        beyond = next_of[high]
        size_of[low] += size_of[high]
        next_of[low] = beyond
        if beyond:
            prev_of[beyond] = low
        self._forget(high)
        return low

    def _map_block(self, address: int, size: int) -> int | None:
        """map_block: map the whole pages covering [address, address + size) of unmapped block
        ``address`` (one device call); what is left stays unmapped; the mapped block joins its
        free neighbours and the free list. Returns its address, or None if the device refused."""
        page = self._segment_of(address).page
        nbytes = -(-size // page) * page
        if not self.device.map(address, nbytes):
            return None
        self._drop_unmapped(address)
        size_of, next_of = self._size, self._next
        if nbytes < size_of[address]:
            rest = address + nbytes
            after = next_of[address]
            size_of[rest] = size_of[address] - nbytes
            self._prev[rest] = address
            next_of[rest] = after
            if after:
                self._prev[after] = rest
            next_of[address] = rest
            self._home[rest] = self._home[address]
            self._add_unmapped(rest)
            size_of[address] = nbytes
        address = self._try_merge(address, self._prev[address], True)
        address = self._try_merge(address, next_of[address], True)
        self._insert_free(address)
        self._reserved_change(nbytes)
        self.num_device_alloc += 1
        return address

    def _try_allocate_expandable_block(self, stream: int, small: bool,
                                       size: int) -> tuple[int, int] | None:
        """try_allocate_expandable_block: map pages from the block find_expandable_block chose
        until it holds ``size``. Pages mapped before a refusal stay mapped, as free blocks."""
        candidate = self._find_expandable_block(stream, small, size)
        if candidate in self._unmapped:
            mapped = self._map_block(candidate, min(self._size[candidate], size))
            if mapped is None:
                return None
            candidate = mapped
        while self._size[candidate] < size:
            following = self._next[candidate]
            mapped = self._map_block(following,
                                     min(size - self._size[candidate], self._size[following]))
            if mapped is None:
                return None
            candidate = mapped
        self._remove_free(candidate)
        return candidate, self._size[candidate]

    def _unmap_block(self, address: int) -> int | None:
        """unmap_block: unmap the whole pages inside free block ``address`` (one device call);
        the parts before and after them stay free; the unmapped range joins unmapped
        neighbours. Returns the unmapped block, or None when no whole page lies inside."""
        segment = self._segment_of(address)
        page, base = segment.page, segment.base
        size_of, prev_of, next_of, home = self._size, self._prev, self._next, self._home
        size = size_of[address]
        begin = -(-(address - base) // page)
        end = (address + size - base) // page
        if begin >= end:
            return None
        self._remove_free(address)
        self._gc_base.pop(address, None)
        start = base + begin * page
        length = (end - begin) * page
        before_size = start - address
        after_size = size - before_size - length
        pool_key = home[address]
        pieces = [(start, length)]
        if before_size:
            pieces.insert(0, (address, before_size))
        if after_size:
            pieces.append((start + length, after_size))
        previous, following = prev_of[address], next_of[address]
        for piece, piece_size in pieces:
            size_of[piece] = piece_size
            prev_of[piece] = previous
            home[piece] = pool_key
            if previous:
                next_of[previous] = piece
            previous = piece
        next_of[previous] = following
        if following:
            prev_of[following] = previous
        if before_size:
            self._insert_free(address)
        if after_size:
            self._insert_free(start + length)
        unmapped = self._try_merge(start, prev_of[start], False)
        unmapped = self._try_merge(unmapped, next_of[unmapped], False)
        self._add_unmapped(unmapped)
        self.device.unmap(start, length)
        self._reserved_change(-length)
        self.num_device_free += 1
        return unmapped

    def _release_expandable_segment(self, address: int) -> None:
        """release_expandable_segment: forget a virtual range that is one unmapped block."""
        segment = self.segment_map.pop(address)
        if self._size[address] != segment.size or address not in self._unmapped:
            raise AssertionError(f"expandable segment {address:#x} is not wholly unmapped")
        self._drop_unmapped(address)
        self._forget(address)
        del self._es_bases[bisect_left(self._es_bases, address)]

    # -- the rest of the interface -----------------------------------------------------
    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): release_cached_blocks."""
        self._release_cached_blocks()

    def seed(self, segments: Iterable[dict[str, Any]]) -> dict[int, int]:
        """Start from a recorded state instead of an empty cache (a snapshot recorded mid-run).

        ``segments`` have the shape of :meth:`segments` (and of memory_snapshot()'s, as the
        snapshot importer writes them to ``metadata["initial_segments"]``): ``address``,
        ``total_size``, ``stream`` (small id), ``segment_type``, ``blocks`` of ``{address, size,
        requested_size, state}`` tiling the segment. Each segment is taken from the device with
        one ``reserve`` (so the device counts it; its address is the device's), its blocks are
        laid out at the same offsets: ``active_*`` blocks become allocated blocks (requested
        bytes = requested_size, or size when that is 0), ``inactive`` ones cached free blocks,
        touching ones joined as free_block would have. Returns ``{recorded block address: this
        model's address}`` of the active blocks, so a caller can ``free`` them later.

        Only on a fresh allocator; expandable segments (and an expandable-segments model) are
        refused with ValueError, as are blocks that do not tile their segment and segments the
        device cannot hold.
        """
        if self.num_allocs or self.segment_map:
            raise ValueError("seed() needs a fresh allocator (no malloc before it)")
        if self.expandable:
            raise ValueError("seeding an expandable-segments allocator is not modelled")
        mapping: dict[int, int] = {}
        for seg in sorted(segments, key=lambda s: int(s["address"])):
            if seg.get("is_expandable"):
                raise ValueError(f"segment {int(seg['address']):#x} is an expandable segment; "
                                 "seeding those is not modelled")
            recorded = int(seg["address"])
            total = int(seg["total_size"])
            pieces: list[list[int]] = []        # [offset, size, requested or -1 when free]
            cursor = recorded
            for block in seg.get("blocks") or [{"size": total, "state": "inactive"}]:
                address = int(block.get("address", cursor))
                size = int(block["size"])
                if address != cursor or size <= 0:
                    raise ValueError(f"segment {recorded:#x}: its blocks do not tile it "
                                     f"(block at {address:#x}, expected {cursor:#x})")
                cursor += size
                if str(block.get("state", "inactive")).startswith("active"):
                    pieces.append([address - recorded, size,
                                   int(block.get("requested_size") or 0) or size])
                elif pieces and pieces[-1][2] < 0:
                    pieces[-1][1] += size
                else:
                    pieces.append([address - recorded, size, -1])
            if cursor != recorded + total:
                raise ValueError(f"segment {recorded:#x}: its blocks cover {cursor - recorded} "
                                 f"of its {total} bytes")
            kind = seg.get("segment_type")
            small = kind == "small" if kind in ("small", "large") else total <= K_SMALL_BUFFER
            base = self.device.reserve(total)
            if base is None:
                raise ValueError(f"the device cannot hold the recorded segment {recorded:#x} "
                                 f"({total} bytes)")
            self._seed_segment(_Segment(base, total, int(seg.get("stream", 0)), small, False),
                               pieces, recorded, mapping)
        return mapping

    def _seed_segment(self, segment: _Segment, pieces: list[list[int]], recorded: int,
                      mapping: dict[int, int]) -> None:
        """Lay out one seeded segment's blocks and count them as malloc/free would have."""
        self._new_segment(segment)
        base, pool_key = segment.base, segment.pool_key
        split = len(pieces) > 1
        previous = 0
        for offset, size, requested in pieces:
            address = base + offset
            self._size[address] = size
            self._prev[address] = previous
            self._next[address] = 0
            self._home[address] = pool_key
            if previous:
                self._next[previous] = address
            previous = address
        for offset, size, requested in pieces:
            address = base + offset
            if requested < 0:
                self._insert_free(address)
                if split:
                    self.inactive_split += 1
                    self.inactive_split_total += 1
                    self.inactive_split_bytes += size
                    self.inactive_split_bytes_total += size
                continue
            mapping[recorded + offset] = address
            self._req[address] = requested
            self.bytes_in_use += size
            self.allocated_total += size
            self.requested += requested
            self.requested_total += requested
            self.num_allocs += 1
            if size >= self.max_split_size:
                self._oversize_allocation()
        self.peak_bytes_in_use = max(self.peak_bytes_in_use, self.bytes_in_use)
        self.peak_requested = max(self.peak_requested, self.requested)
        self.peak_allocations = max(self.peak_allocations, self.num_allocs - self.num_frees)
        self.peak_inactive_split = max(self.peak_inactive_split, self.inactive_split)
        self.peak_inactive_split_bytes = max(self.peak_inactive_split_bytes,
                                             self.inactive_split_bytes)
        self._reserved_change(segment.size)
        self.num_segments += 1
        self.segments_total += 1
        self.peak_segments = max(self.peak_segments, self.num_segments)
        if segment.size >= self.max_split_size:
            self.oversize_segments += 1
            self.oversize_segments_total += 1
            self.peak_oversize_segments = max(self.peak_oversize_segments,
                                              self.oversize_segments)
        self.num_device_alloc += 1

    def _chain(self, base: int) -> Iterator[int]:
        address = base
        while address:
            yield address
            address = self._next[address]

    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        """Every block of memory held from the device, in address order. Unmapped address
        space of expandable segments is not memory held, so it is left out."""
        unmapped = self._unmapped
        for base in sorted(self.segment_map):
            for address in self._chain(base):
                if address not in unmapped:
                    yield address, self._size[address], address in self._req

    def stats(self) -> PolicyStats:
        largest = 0
        count = 0
        for keys in self._free.values():
            if keys:
                count += len(keys)
                largest = max(largest, keys[-1] >> SHIFT)
        return PolicyStats(
            num_allocs=self.num_allocs, num_frees=self.num_frees, num_ooms=self.num_ooms,
            bytes_in_use=self.bytes_in_use, peak_bytes_in_use=self.peak_bytes_in_use,
            bytes_requested=self.requested, pool_bytes=self.pool_bytes,
            peak_pool_bytes=self.peak_pool_bytes, largest_free_block=largest, free_blocks=count)

    def segments(self) -> list[dict[str, Any]]:
        """Like torch.cuda.memory_snapshot()'s segments: one per cudaMalloc'd segment, or per
        contiguous mapped range of an expandable segment, sorted by address. Inactive blocks
        report requested_size 0."""
        result: list[dict[str, Any]] = []
        for base in sorted(self.segment_map):
            segment = self.segment_map[base]
            current: dict[str, Any] | None = None
            for address in self._chain(base):
                if address in self._unmapped:
                    current = None
                    continue
                if current is None:
                    current = {"address": address, "total_size": 0, "allocated_size": 0,
                               "active_size": 0, "requested_size": 0, "stream": segment.stream,
                               "segment_type": "small" if segment.small else "large",
                               "is_expandable": segment.expandable, "blocks": []}
                    result.append(current)
                size = self._size[address]
                requested = self._req.get(address)
                current["total_size"] += size
                if requested is not None:
                    current["allocated_size"] += size
                    current["active_size"] += size
                    current["requested_size"] += requested
                current["blocks"].append({
                    "address": address, "size": size,
                    "requested_size": requested if requested is not None else 0,
                    "state": "active_allocated" if requested is not None else "inactive"})
        result.sort(key=lambda s: s["address"])
        return result

    def memory_stats(self) -> dict[str, int]:
        """torch.cuda.memory_stats()-style names. The ".all" stats carry current, peak,
        allocated and freed; ".small_pool"/".large_pool" only current (counted from the blocks)."""
        stats: dict[str, int] = {}

        def put(name: str, current: int, peak: int, allocated: int) -> None:
            stats[f"{name}.all.current"] = current
            stats[f"{name}.all.peak"] = peak
            stats[f"{name}.all.allocated"] = allocated
            stats[f"{name}.all.freed"] = allocated - current

        live = self.num_allocs - self.num_frees
        put("allocation", live, self.peak_allocations, self.num_allocs)
        put("active", live, self.peak_allocations, self.num_allocs)
        put("allocated_bytes", self.bytes_in_use, self.peak_bytes_in_use, self.allocated_total)
        put("active_bytes", self.bytes_in_use, self.peak_bytes_in_use, self.allocated_total)
        put("requested_bytes", self.requested, self.peak_requested, self.requested_total)
        put("reserved_bytes", self.pool_bytes, self.peak_pool_bytes, self.reserved_total)
        put("segment", self.num_segments, self.peak_segments, self.segments_total)
        put("inactive_split", self.inactive_split, self.peak_inactive_split,
            self.inactive_split_total)
        put("inactive_split_bytes", self.inactive_split_bytes, self.peak_inactive_split_bytes,
            self.inactive_split_bytes_total)
        names = ("allocation", "allocated_bytes", "requested_bytes", "reserved_bytes", "segment",
                 "inactive_split", "inactive_split_bytes")
        per_pool = {pool: dict.fromkeys(names, 0) for pool in ("small_pool", "large_pool")}
        for segment in self.segment_map.values():
            counts = per_pool["small_pool" if segment.small else "large_pool"]
            if not segment.expandable:
                counts["segment"] += 1
            split = not segment.expandable and self._next[segment.base] != 0
            for address in self._chain(segment.base):
                if address in self._unmapped:
                    continue
                size = self._size[address]
                counts["reserved_bytes"] += size
                if address in self._req:
                    counts["allocation"] += 1
                    counts["allocated_bytes"] += size
                    counts["requested_bytes"] += self._req[address]
                elif split:
                    counts["inactive_split"] += 1
                    counts["inactive_split_bytes"] += size
        for pool, counts in per_pool.items():
            for name, value in counts.items():
                stats[f"{name}.{pool}.current"] = value
            stats[f"active.{pool}.current"] = counts["allocation"]
            stats[f"active_bytes.{pool}.current"] = counts["allocated_bytes"]
        for name, current, peak, total in (
                ("oversize_allocations", self.oversize_allocations,
                 self.peak_oversize_allocations, self.oversize_allocations_total),
                ("oversize_segments", self.oversize_segments, self.peak_oversize_segments,
                 self.oversize_segments_total)):
            stats[f"{name}.current"] = current
            stats[f"{name}.peak"] = peak
            stats[f"{name}.allocated"] = total
            stats[f"{name}.freed"] = total - current
        stats["num_alloc_retries"] = self.num_alloc_retries
        stats["num_ooms"] = self.num_ooms
        stats["num_sync_all_streams"] = self.num_sync_all_streams
        stats["num_device_alloc"] = self.num_device_alloc
        stats["num_device_free"] = self.num_device_free
        stats["max_split_size"] = -1 if self.max_split_size == NO_LIMIT else self.max_split_size
        return stats
