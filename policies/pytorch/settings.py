"""PyTorch caching allocator: its settings and its size rules (layout: pytorch/caching.py).

PYTORCH_CUDA_ALLOC_CONF as PyTorch parses it (c10/core/AllocatorConfig.cpp's ConfigTokenizer and
parse* functions, c10/cuda/CUDAAllocatorConfig.cpp), the validation of the policy's parameters,
and the two size rules every request meets: round_size (with roundup_power2_divisions) and
get_allocation_size (the segment size of a miss). Pure functions; the rules themselves are
listed in policies/pytorch/caching.py's docstring.
"""

from __future__ import annotations

from allocsim.ascii_numbers import decimal_number, whole_number

MiB = 1 << 20
K_MIN_BLOCK_SIZE = 512               # all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MiB               # largest "small" allocation
K_SMALL_BUFFER = 2 * MiB             # small allocations are packed in 2 MiB segments
K_LARGE_BUFFER = 20 * MiB            # 1–10 MiB requests get a 20 MiB segment
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB              # larger segments round up to 2 MiB
ROUNDUP_INTERVALS = 16               # roundup_power2_divisions: 1 MiB .. 64 GiB
NO_LIMIT = 1 << 62                   # SIZE_MAX: max_split_size when unset
# The largest settings the model holds. PyTorch keeps them in size_t (max_split_size_mb clamped
# to SIZE_MAX / 1 MiB); this model and its native twin keep sizes in int64, below NO_LIMIT. A
# larger value is refused by name rather than wrapped. Past 2**53 divisions, kMinBlockSize ×
# divisions (round_size's test) no longer fits the 64-bit arithmetic; no size the model holds
# is rounded by a division count above 2**51 anyway.
MAX_SETTING_MB = (NO_LIMIT >> 20) - 1
MAX_DIVISIONS = 1 << 53

# Keys of PYTORCH_CUDA_ALLOC_CONF that do not change device-memory placement (host/pinned
# allocator, locking, graph capture): validated as PyTorch validates them, then dropped by
# parse_alloc_conf. Each maps to the check PyTorch applies to its value
# (c10/cuda/CUDAAllocatorConfig.cpp parseArgs and c10/core/AllocatorConfig.cpp): "bool" is
# ConfigTokenizer::toBool (exactly True or False), "threads" parsePinnedNumRegisterThreads (a
# power of two no larger than pinned_max_register_threads(), 128), "positive"
# parsePinnedReserveSegmentSize (a whole number > 0).
_IGNORED_KEYS: dict[str, str] = {
    "release_lock_on_cudamalloc": "bool", "release_lock_on_hipmalloc": "bool",
    "pinned_use_cuda_host_register": "bool", "pinned_use_hip_host_register": "bool",
    "pinned_use_background_threads": "bool", "pinned_free_catch_all": "bool",
    "graph_capture_record_stream_reuse": "bool",
    "pinned_num_register_threads": "threads", "pinned_reserve_segment_size_mb": "positive",
}
PINNED_MAX_REGISTER_THREADS = 128    # CUDAAllocatorConfig::pinned_max_register_threads()
# Keys current PyTorch knows that can change where or whether device memory is handed out, and
# that this model does not follow: refused by name rather than dropped, so a run never reports
# numbers for a setting it ignored. throw_on_cudamalloc_oom rejects requests before cudaMalloc
# under a fraction (no cache flush and retry); the expandable-segment reserves bound how far a
# segment's virtual range can grow.
_UNMODELLED_KEYS = ("throw_on_cudamalloc_oom", "expandable_segments_reserve",
                    "expandable_segments_reserve_by_class")
ASYNC_BACKEND_REFUSED = ("PYTORCH_CUDA_ALLOC_CONF: backend:cudaMallocAsync is a different "
                         "allocator, not modelled by 'pytorch'")
_MODELLED_KEYS = ("max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
                  "roundup_power2_divisions", "expandable_segments", "per_process_memory_fraction")


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
    """A whole number >= 0 in ASCII digits, as PyTorch's ConfigTokenizer::toSizeT reads one."""
    try:
        return whole_number(token)
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from None


def _to_float(token: str, what: str) -> float:
    try:
        return decimal_number(token)
    except ValueError as err:
        raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: {what}: {err}") from None


def _divisions(token: str) -> int:
    value = _to_int(token, "roundup_power2_divisions")
    if value > MAX_DIVISIONS:
        raise ValueError(f"roundup_power2_divisions: at most 2**53 ({MAX_DIVISIONS:,}) "
                         f"divisions, got {value:,}")
    return value


def parse_roundup_power2_divisions(text: str | int) -> list[int]:
    """The 16-entry divisions table from ``"4"`` or ``"[256:1,512:2,>:8]"``
    (parseRoundUpPower2Divisions).

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
        value = _divisions(tokens[0])
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
        boundary, value = tokens[i], _divisions(tokens[i + 2])
        if value and not _is_power_of_two(value):
            raise ValueError("roundup_power2_divisions: the divisions have to be a power of 2 "
                             "or 0, "
                             f"got {value}")
        if boundary == ">":
            for index in range(last_index + 1, ROUNDUP_INTERVALS):
                table[index] = value
        else:
            bound = _to_int(boundary, "roundup_power2_divisions")
            if not _is_power_of_two(bound):
                raise ValueError("roundup_power2_divisions: the interval boundaries (MiB) have "
                                 "to be "
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


def parse_alloc_conf(text: str, *, any_backend: bool = False) -> dict[str, str]:
    """A PYTORCH_CUDA_ALLOC_CONF string as-is → this policy's parameters as registry strings.

    ``"max_split_size_mb:128,expandable_segments:True,roundup_power2_divisions:[256:1,>:4]"`` →
    ``{"max_split_size_mb": "128", "expandable_segments": "true",
    "roundup_power2_divisions": "[256:1;>:4]"}`` (lists use ``;`` so the result can be joined into
    a registry spec). Validation is PyTorch's: unknown keys, ``true`` instead of ``True``, a
    max_split_size_mb below 20 … raise ValueError with one line. Keys that do not affect device
    memory (pinned-memory and locking options, ``backend:native``) are accepted and dropped;
    ``backend:cudaMallocAsync`` is a different allocator: refused, unless ``any_backend``
    (then it is ``result["backend"]``, for the settings value that stands for either).
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
            registry_value = _check_conf_value(key, value)
            if registry_value is not None:
                result[key] = registry_value
        elif key == "backend":
            if value == "cudaMallocAsync" and any_backend:
                result[key] = value
            elif value == "cudaMallocAsync":
                raise ValueError(ASYNC_BACKEND_REFUSED)
            elif value != "native":
                raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: unknown allocator backend {value!r}; "
                                 "options are native and cudaMallocAsync")
        elif key in _IGNORED_KEYS:
            _check_ignored_value(key, value, _IGNORED_KEYS[key])
        elif key in _UNMODELLED_KEYS:
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: {key} is a PyTorch setting that the "
                             "'pytorch' model does not follow; remove it to simulate the rest")
        else:
            known = ", ".join((*_MODELLED_KEYS, "backend", *sorted(_IGNORED_KEYS),
                               *_UNMODELLED_KEYS))
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: unrecognized key {key!r}; "
                             f"known keys: {known}")
        i = end + 1
        if i < len(tokens):
            if tokens[i] != ",":
                raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: expected ',' after {key}:{value}")
            i += 1
    return result


def _check_ignored_value(key: str, value: str, kind: str) -> None:
    """Validate the value of a key that does not change device memory, as PyTorch does."""
    if kind == "bool":
        if value not in ("True", "False"):
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: expected True or False for {key}, "
                             f"got {value!r}")
        return
    number = _to_int(value, f"PYTORCH_CUDA_ALLOC_CONF: {key}")
    if kind == "positive" and number == 0:
        raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: {key} has to be greater than 0")
    if kind == "threads":
        if not _is_power_of_two(number):
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: the number of register threads "
                             f"has to be a power of 2, got {number}")
        if number > PINNED_MAX_REGISTER_THREADS:
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: the number of register threads "
                             f"should be at most {PINNED_MAX_REGISTER_THREADS}, got {number}")


def _fraction_conf_value(value: str) -> str | None:
    """per_process_memory_fraction as CUDAAllocatorConfig::parsePerProcessMemoryFraction reads it
    (a number in [0, 1]) → the registry value, or None where it sets no limit.

    The allocator applies it at construction through setMemoryFraction, which keeps no limit at
    1.0 (``allowed_memory_maximum = nullopt`` unless fraction < 1.0,
    c10/cuda/CUDACachingAllocator.cpp). A fraction of 0 is a limit of 0 bytes there — every
    allocation fails — and so in the model.
    """
    fraction = _to_float(value, "per_process_memory_fraction")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError("PYTORCH_CUDA_ALLOC_CONF: per_process_memory_fraction is invalid, set "
                         f"it in [0.0, 1.0], got {value!r}")
    return None if fraction == 1.0 else value


def _check_conf_value(key: str, value: str) -> str | None:
    """Validate one modelled PYTORCH_CUDA_ALLOC_CONF value; return its registry form (None: the
    value is the default and sets nothing)."""
    if key == "per_process_memory_fraction":
        return _fraction_conf_value(value)
    if key == "expandable_segments":
        if value not in ("True", "False"):
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: expected True or False for {key}, "
                             f"got {value!r}")
        return value.lower()
    if key == "roundup_power2_divisions":
        parse_roundup_power2_divisions(value)
        return value.replace(",", ";")
    if key == "garbage_collection_threshold":
        validate_gc_threshold(_to_float(value, key))
        return value
    megabytes = _to_int(value, key)
    validate_mb(key, megabytes)
    return str(megabytes)


def validate_mb(key: str, megabytes: int) -> None:
    if megabytes < K_LARGE_BUFFER // MiB:
        raise ValueError(f"{key} too small, must be >= {K_LARGE_BUFFER // MiB}, got {megabytes}")
    if megabytes > MAX_SETTING_MB:
        raise ValueError(f"{key} too large, must be at most {MAX_SETTING_MB:,} (4 EiB), got "
                         f"{megabytes:,}")


def validate_gc_threshold(threshold: float) -> None:
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"garbage_collection_threshold must be in (0.0, 1.0), got {threshold}")



def validate(max_split_size_mb: int, garbage_collection_threshold: float,
             max_non_split_rounding_mb: int, per_process_memory_fraction: float | None) -> None:
    """The policy's parameters as PyTorch checks them; ValueError with one line if not."""
    if max_split_size_mb < 0:
        raise ValueError("max_split_size_mb must be 0 (unlimited) or >= 20, "
                         f"got {max_split_size_mb}")
    if max_split_size_mb:
        validate_mb("max_split_size_mb", max_split_size_mb)
    validate_mb("max_non_split_rounding_mb", max_non_split_rounding_mb)
    if garbage_collection_threshold:
        validate_gc_threshold(garbage_collection_threshold)
    if per_process_memory_fraction is not None and not 0.0 <= per_process_memory_fraction <= 1.0:
        raise ValueError("per_process_memory_fraction must be in [0, 1], got "
                         f"{per_process_memory_fraction}")


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


def should_split(remaining: int, rounded: int, small_or_expandable: bool,
                 max_split_size: int) -> bool:
    """DeviceCachingAllocator::should_split: a block of ``rounded + remaining`` bytes serving
    ``rounded`` splits off its rest when, in the small pool or with expandable segments,
    ``remaining >= kMinBlockSize`` (512 B); in the large pool when ``rounded <
    max_split_size`` and ``remaining > kSmallSize`` (1 MiB)."""
    if small_or_expandable:
        return remaining >= K_MIN_BLOCK_SIZE
    return rounded < max_split_size and remaining > K_SMALL_SIZE


def get_allocation_size(size: int) -> int:
    """Segment size for a rounded request that missed the cache."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE
