"""Replaying a trace on real memory: what every backend of the validator shares.

The one-line errors (:class:`ValidatorError`, :class:`NoGPUError`), the byte pattern each live
block carries so that overlapping placements show up as corrupted data, the log of device calls
and what a replay measured (:class:`Measured`), and :class:`HostDevice` — numpy buffers behind
fake addresses, so the whole validator runs (and is tested) without a GPU.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocsim.errors import UserInputError
from allocsim.policies import format_size
from allocsim.policies.units import round_up
from allocsim.sim.kernel.device import ADDRESS_BASE, RANGE_ALIGN, DeviceProfile

MiB = 1 << 20

class ValidatorError(UserInputError):
    """A mistake in what the user asked the validator to do; ``str()`` is one line.

    A ValueError so that the allocsim CLI prints it as ``allocsim: error: ...`` and exits 2.
    """


class NoGPUError(ValidatorError):
    """No CUDA device is visible to CuPy (or torch): only ``--backend host`` can run."""


def _one_line(err: BaseException | str) -> str:
    """An error's message on one line (the CLI's convention), its type if it has none."""
    text = str(err).strip()
    if not text and isinstance(err, BaseException):
        text = type(err).__name__
    return " ".join(text.split())


def _require_gpu(command: str = "allocsim validate",
                 hint: str = " except with --backend host") -> Any:
    """CuPy, once it has been seen to reach a CUDA device; else NoGPUError (one line)."""
    try:
        import cupy
    except Exception as err:   # ImportError, or a broken CUDA install failing at import
        why = ("cupy is not installed" if isinstance(err, ImportError)
               else f"cupy failed to import: {_one_line(err)}")
        raise NoGPUError(f"no CUDA GPU visible ({why}): {command} needs one{hint}") from None
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as err:
        raise NoGPUError(f"no CUDA GPU visible (cupy {getattr(cupy, '__version__', '?')}: "
                         f"{_one_line(err)}): {command} needs one{hint}") from None
    if count < 1:
        raise NoGPUError(f"no CUDA GPU visible (cupy {getattr(cupy, '__version__', '?')} sees "
                         f"0 devices): {command} needs one{hint}")
    return cupy


# -- the pattern every live block carries --------------------------------------------------
# Byte b (0..3, position in the block modulo 4) of allocation k is (b << 6) | (6 bits of k).
# The top two bits name the position, so a block shifted against another by anything but a
# multiple of 4 never matches; at a multiple of 4 the low bits differ for any two of the first
# 2**24 allocations. Any overlap of 4 bytes or more is therefore caught.
PATTERN_KEYS = 1 << 24


def pattern_word(key: int, phase: int = 0) -> np.ndarray:
    """The 4 pattern bytes of allocation ``key``, starting at block offset ``phase`` (mod 4)."""
    key %= PATTERN_KEYS
    word = np.array([(b << 6) | ((key >> (6 * b)) & 0x3F) for b in range(4)], dtype=np.uint8)
    return np.roll(word, -(phase % 4))


def fill_pattern(view: np.ndarray, key: int, phase: int = 0) -> None:
    """Write allocation ``key``'s pattern into the uint8 ``view`` (block offset ``phase``)."""
    word = pattern_word(key, phase)
    whole = len(view) // 4 * 4
    if whole:
        # One 32-bit fill instead of a tiled temporary as large as the block.
        view[:whole].view("<u4").fill(int.from_bytes(word.tobytes(), "little"))
    if len(view) > whole:
        view[whole:] = word[:len(view) - whole]


def count_pattern_errors(view: np.ndarray, key: int, phase: int = 0) -> int:
    """How many 4-byte words (and tail bytes) of ``view`` differ from the pattern."""
    word = pattern_word(key, phase)
    whole = len(view) // 4 * 4
    bad = 0
    if whole:
        bad += int(np.count_nonzero(view[:whole].view("<u4")
                                    != int.from_bytes(word.tobytes(), "little")))
    if len(view) > whole:
        bad += int(np.count_nonzero(view[whole:] != word[:len(view) - whole]))
    return bad


# -- what a replay measures ----------------------------------------------------------------


@dataclass
class Corruption:
    """A placement the pattern check caught: which allocation, where, what was wrong."""

    event: int
    allocation: int          # the trace's buffer id
    address: int
    size: int
    kind: str                # overwritten | out of region | device misuse
    detail: str = ""

    def __str__(self) -> str:
        return (f"event {self.event}: buffer {self.allocation} ({format_size(self.size)} at "
                f"0x{self.address:x}): {self.kind}{': ' + self.detail if self.detail else ''}")


class CallLog:
    """Every device call of a measured replay: event, kind, bytes, success, wall time."""

    def __init__(self) -> None:
        self.event: list[int] = []
        self.kind: list[str] = []
        self.nbytes: list[int] = []
        self.ok: list[bool] = []
        self.wall_ns: list[int] = []

    def add(self, event: int, kind: str, nbytes: int, ok: bool, wall_ns: int) -> None:
        self.event.append(event)
        self.kind.append(kind)
        self.nbytes.append(nbytes)
        self.ok.append(ok)
        self.wall_ns.append(wall_ns)

    def __len__(self) -> int:
        return len(self.event)

    def head(self, count: int) -> CallLog:
        """The first ``count`` calls (those of the replay, not of the clean-up after it)."""
        log = CallLog()
        log.event, log.kind, log.nbytes = self.event[:count], self.kind[:count], self.nbytes[:count]
        log.ok, log.wall_ns = self.ok[:count], self.wall_ns[:count]
        return log

    def before(self, event: int) -> CallLog:
        """The calls made while replaying events before ``event`` (not the clean-up after)."""
        return self.head(sum(1 for e in self.event if e < event))

    @property
    def succeeded(self) -> int:
        return sum(self.ok)

    @property
    def failed(self) -> int:
        return len(self.ok) - sum(self.ok)

    @property
    def total_s(self) -> float:
        return sum(self.wall_ns) / 1e9

    def summary(self) -> dict[str, Any]:
        """Counts per kind and the distribution of wall time per successful call."""
        times = np.asarray([t for t, ok in zip(self.wall_ns, self.ok) if ok], dtype=np.float64)
        kinds: dict[str, int] = {}
        for kind, ok in zip(self.kind, self.ok):
            if ok:
                kinds[kind] = kinds.get(kind, 0) + 1
        return {
            "calls": self.succeeded, "failed": self.failed, "by_kind": kinds,
            "total_s": round(self.total_s, 9),
            "median_us": round(float(np.median(times)) / 1e3, 3) if len(times) else None,
            "p90_us": round(float(np.percentile(times, 90)) / 1e3, 3) if len(times) else None,
            "max_us": round(float(times.max()) / 1e3, 3) if len(times) else None,
        }


@dataclass
class Measured:
    """What one backend measured, per event and in total."""

    reserved: np.ndarray                     # bytes held from the device after each event
    used: np.ndarray | None = None           # bytes handed out (pool backends) after each event
    device_used: np.ndarray | None = None    # cudaMemGetInfo: device bytes in use (delta)
    first_oom_event: int | None = None
    ooms: int = 0
    calls: CallLog = field(default_factory=CallLog)
    calls_exact: bool = True                 # False: counted or timed indirectly (see notes)
    call_count: int | None = None            # successful calls, when known better than the log
    pattern_checked: bool = False
    blocks_checked: int = 0
    corruptions: list[Corruption] = field(default_factory=list)
    device_name: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    granularity: int | None = None           # the device's allocation quantum, as measured
    notes: list[str] = field(default_factory=list)


# -- the devices a policy object can drive -------------------------------------------------


class _Spans:
    """Non-overlapping spans ``[start, start + length)`` the device has handed out, each with
    a payload (a host buffer, a GPU handle). Answers: which spans cover a block?

    A sorted list of starts beside a dict (start → (length, payload)): lookups are
    O(log n) by bisection; ``add`` and ``pop`` are O(n) list moves, which at the few thousand
    spans of a validation run cost less than a tree (and need no extra dependency)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._spans: dict[int, tuple[int, Any]] = {}

    def __len__(self) -> int:
        return len(self._starts)

    def __contains__(self, start: int) -> bool:
        return start in self._spans

    def add(self, start: int, length: int, payload: Any) -> None:
        if start not in self._spans:
            insort(self._starts, start)
        self._spans[start] = (length, payload)

    def pop(self, start: int) -> tuple[int, Any] | None:
        span = self._spans.pop(start, None)
        if span is not None:
            del self._starts[bisect_left(self._starts, start)]
        return span

    def items(self) -> list[tuple[int, tuple[int, Any]]]:
        return [(start, self._spans[start]) for start in self._starts]

    def containing(self, address: int) -> tuple[int, int, Any] | None:
        index = bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        start = self._starts[index]
        length, payload = self._spans[start]
        return (start, length, payload) if address < start + length else None

    def pieces(self, address: int, size: int, *, span_across: bool
               ) -> list[tuple[int, int, Any]] | None:
        """``(offset in span, length, payload)`` pieces covering ``[address, address+size)``;
        None if any byte is not held (or, unless ``span_across``, if it takes two spans)."""
        index = bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        out: list[tuple[int, int, Any]] = []
        cursor, end = address, address + size
        while cursor < end:
            if index >= len(self._starts):
                return None
            start = self._starts[index]
            length, payload = self._spans[start]
            if not start <= cursor < start + length:
                return None
            take = min(end, start + length) - cursor
            out.append((cursor - start, take, payload))
            cursor += take
            index += 1
            if cursor < end and not span_across:
                return None
        return out


class HostDevice:
    """The policies' ``DeviceMemory`` on host memory, for the ``host`` backend.

    ``reserve(n)`` allocates a numpy buffer of n bytes rounded up to the profile's granularity
    (the bytes the simulated device counts) behind a fake address from a bump counter laid out
    like :class:`~allocsim.sim.kernel.device.SimulatedDevice`'s; ``map`` allocates one buffer per page of
    ``map_granularity``. Reserved bytes are the sizes of the buffers held, measured, not
    modelled. Misuse the real driver would refuse (mapping a page twice, unmapping one never
    mapped, releasing an unknown base) is recorded in ``problems``.
    """

    def __init__(self, profile: DeviceProfile, clock: Callable[[], int] = time.perf_counter_ns
                 ) -> None:
        self.profile = profile
        self.capacity = profile.capacity
        self.map_granularity = profile.map_granularity
        self.granularity = profile.granularity
        self._clock = clock
        self._next_address = ADDRESS_BASE
        self.ranges = _Spans()     # reserve()d: base -> (requested bytes, buffer)
        self.pages = _Spans()      # mapped: page address -> (page bytes, buffer)
        self.vranges = _Spans()    # address_range()d: base -> (bytes, None)
        self.reserved = 0
        self.peak_reserved = 0
        self.calls = 0             # every call, failed ones too (the engine's "a call happened")
        self.log = CallLog()
        self.event = -1            # the event being replayed, for the call log
        self.problems: list[str] = []

    # -- bookkeeping -----------------------------------------------------------------
    def _bump(self, nbytes: int) -> int:
        base = self._next_address
        self._next_address = base + round_up(max(nbytes, 1), RANGE_ALIGN) + RANGE_ALIGN
        return base

    def _buffer(self, nbytes: int) -> np.ndarray:
        try:
            # np.zeros: calloc'd, so untouched pages of a big region cost no host memory.
            return np.zeros(nbytes, dtype=np.uint8)
        except MemoryError:
            raise ValidatorError(f"host backend: cannot hold a {format_size(nbytes)} region in "
                                 f"host memory; give a smaller --capacity") from None

    def _called(self, kind: str, nbytes: int, ok: bool, start_ns: int) -> None:
        self.calls += 1
        self.log.add(self.event, kind, nbytes, ok, self._clock() - start_ns)

    def _grew(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    # -- cudaMalloc / cudaFree -------------------------------------------------------
    def reserve(self, nbytes: int) -> int | None:
        start = self._clock()
        taken = round_up(nbytes, self.granularity)
        if self.reserved + taken > self.capacity:
            self._called("malloc", nbytes, False, start)
            return None
        buffer = self._buffer(taken)
        base = self._bump(taken)
        self.ranges.add(base, nbytes, buffer)   # usable extent: what was asked, not the rounding
        self._grew(buffer.nbytes)
        self._called("malloc", nbytes, True, start)
        return base

    def release(self, base: int) -> None:
        start = self._clock()
        held = self.ranges.pop(base)
        if held is None:
            self.problems.append(f"release of 0x{base:x}, which is not a reserved base")
            self._called("free", 0, False, start)
            return
        self.reserved -= held[1].nbytes
        self._called("free", held[1].nbytes, True, start)

    # -- virtual memory --------------------------------------------------------------
    def address_range(self, nbytes: int) -> int:
        base = self._bump(nbytes)
        self.vranges.add(base, round_up(max(nbytes, 1), self.map_granularity), None)
        return base

    def map(self, address: int, nbytes: int) -> bool:
        if nbytes % self.map_granularity:
            raise ValueError(f"map of {nbytes} bytes is not a multiple of the mapping "
                             f"granularity {self.map_granularity}")
        start = self._clock()
        if self.reserved + nbytes > self.capacity:
            self._called("map", nbytes, False, start)
            return False
        if self.vranges.pieces(address, nbytes, span_across=False) is None:
            self.problems.append(f"map of {format_size(nbytes)} at 0x{address:x} outside any "
                                 f"reserved address range")
        for page in range(address, address + nbytes, self.map_granularity):
            if self.pages.containing(page) is not None:
                self.problems.append(f"page 0x{page:x} mapped twice")
                continue
            buffer = self._buffer(self.map_granularity)
            self.pages.add(page, self.map_granularity, buffer)
            self._grew(buffer.nbytes)
        self._called("map", nbytes, True, start)
        return True

    def unmap(self, address: int, nbytes: int) -> None:
        start = self._clock()
        for page in range(address, address + nbytes, self.map_granularity):
            held = self.pages.pop(page)
            if held is None:
                self.problems.append(f"unmap of page 0x{page:x}, which is not mapped")
                continue
            self.reserved -= held[1].nbytes
        self._called("unmap", nbytes, True, start)

    # -- what the validator asks -----------------------------------------------------
    def _pieces(self, address: int, size: int) -> list[tuple[int, int, Any]] | None:
        # A block lies inside one reserve()d range, or across contiguous mapped pages.
        return (self.ranges.pieces(address, size, span_across=False)
                or self.pages.pieces(address, size, span_across=True))

    def fill(self, address: int, size: int, key: int) -> bool:
        """Write allocation ``key``'s pattern over the block; False if not wholly held."""
        pieces = self._pieces(address, size)
        if pieces is None:
            return False
        phase = 0
        for offset, length, buffer in pieces:
            fill_pattern(buffer[offset:offset + length], key, phase)
            phase += length
        return True

    def check(self, address: int, size: int, key: int) -> int:
        """Words of the block that lost the pattern (-1 if the block is not wholly held)."""
        pieces = self._pieces(address, size)
        if pieces is None:
            return -1
        bad = 0
        phase = 0
        for offset, length, buffer in pieces:
            bad += count_pattern_errors(buffer[offset:offset + length], key, phase)
            phase += length
        return bad

    def measured_reserved(self) -> int:
        return self.reserved

    def close(self) -> None:
        self.ranges = _Spans()
        self.pages = _Spans()
