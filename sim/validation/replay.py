"""The replay driver: a trace replayed event by event on real memory, and through the simulator.

:func:`simulate` runs the trace exactly as ``allocsim compare`` does and keeps what it needs
after every event; :func:`drive` replays it with the policy object itself drawing from a
device (:class:`~allocsim.sim.validation.host_device.HostDevice` or
:class:`~allocsim.sim.validation.cuda_device.CupyDevice`), writing and checking every block's
pattern; :func:`replay_allocator` replays it through a real allocator (CuPy's pools, PyTorch's
caching allocator) given as two callables. Both measured replays follow the engine's semantics:
an allocation that fails is an OOM and its free is skipped; sizes <= 0 are skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from allocsim.policies import PolicySpec
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.kernel.engine import ProcessReplay
from allocsim.sim.kernel.results import RunResult
from allocsim.sim.validation.measured import CallLog, Corruption, Measured
from allocsim.traces.model import OP_ALLOC, Trace


@dataclass
class Simulated:
    """The simulator's side: the RunResult ``compare`` reports, and per-event arrays."""

    result: RunResult
    reserved: np.ndarray
    used: np.ndarray
    calls: int
    failed_calls: int
    cost_s: float
    call_events: np.ndarray


def after_each_event(events: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """A value logged at some events, carried forward: its value after every event 0..n-1."""
    if not len(events):
        return np.zeros(n, dtype=np.int64)
    position = np.searchsorted(events, np.arange(n), side="right") - 1
    return np.where(position >= 0, values[np.maximum(position, 0)], 0).astype(np.int64)


def simulate(trace: Trace, spec: PolicySpec, profile: DeviceProfile,
             device: SimulatedDevice | None = None) -> Simulated:
    """Replay ``trace`` through ``spec`` exactly as ``allocsim compare`` does, keeping the
    reserved bytes (from the device-call log) and bytes in use after every event. ``device``
    (of ``profile``) replaces the plain simulated device where the backend's host decides
    where ranges lie (:func:`allocsim.sim.validation.tensorflow_backend.host_placed_device`)."""
    run = ProcessReplay(trace, spec, device or SimulatedDevice(profile), call_log=True)
    # The engine samples bytes in use sparsely for its timeline; every event is wanted here.
    run.report.sample_every = 1
    run.advance(run.n)
    result = run.result(profile.label)
    events = np.asarray(run.report.call_events, dtype=np.int64)
    reserved = after_each_event(events, np.asarray(run.report.call_reserved, dtype=np.int64),
                                run.n)
    used = np.zeros(run.n, dtype=np.int64)
    samples = run.report.samples
    if samples:
        at = np.asarray([s[0] for s in samples], dtype=np.int64)
        used = after_each_event(at, np.asarray([s[1] for s in samples], dtype=np.int64), run.n)
    view = run.view
    return Simulated(result=result, reserved=reserved, used=used,
                     calls=view.mallocs + view.frees, failed_calls=view.failed_mallocs,
                     cost_s=view.cost_s, call_events=events)


def _event_columns(trace: Trace) -> tuple[list[int], list[int], list[int], list[int]]:
    """op, id, size (frees carry their alloc's) and stream of every event, as Python lists:
    the replay loops index them once per event, and list indexing is the fastest there is."""
    return (trace.op.tolist(), trace.id.tolist(), trace.matched_sizes().tolist(),
            trace.stream.tolist())


def drive(trace: Trace, spec: PolicySpec, device: Any, *, patterns: bool = True,
          device_used: Callable[[], int] | None = None) -> Measured:
    """Replay ``trace`` with the policy object of ``spec`` drawing from ``device`` (a
    :class:`HostDevice` or :class:`CupyDevice`), with the engine's semantics (an allocation
    that fails is an OOM and its free is skipped; sizes ≤ 0 are skipped), writing and
    checking patterns, and reading the device's reserved bytes after every event."""
    policy = spec.build(device)
    n = len(trace)
    ops, ids, sizes, streams = _event_columns(trace)
    reserved = np.zeros(n, dtype=np.int64)
    used_by_device = np.zeros(n, dtype=np.int64) if device_used is not None else None
    live: dict[int, tuple[int, int, int | None]] = {}   # id -> (address, size, pattern key)
    measured = Measured(reserved=reserved, device_used=used_by_device, pattern_checked=patterns)
    key = 0
    try:
        for i in range(n):
            device.event = i
            if ops[i] == OP_ALLOC:
                size = sizes[i]
                if size > 0:
                    address = policy.malloc(size, streams[i])
                    if address is None:
                        measured.ooms += 1
                        if measured.first_oom_event is None:
                            measured.first_oom_event = i
                    else:
                        key += 1
                        slot: int | None = key
                        if patterns and not device.fill(address, size, key):
                            measured.corruptions.append(Corruption(
                                i, ids[i], address, size, "out of region",
                                "the block is not wholly inside memory the policy holds"))
                            slot = None    # never written, so never checked
                        live[ids[i]] = (address, size, slot)
            else:
                entry = live.pop(ids[i], None)
                if entry is not None:
                    address, size, slot = entry
                    if patterns and slot is not None:
                        _check_block(device, measured, i, ids[i], address, size, slot)
                    policy.free(address)
            reserved[i] = device.measured_reserved()
            if used_by_device is not None and device_used is not None:
                used_by_device[i] = device_used()
        if patterns:
            for buffer_id, (address, size, slot) in live.items():
                if slot is not None:
                    _check_block(device, measured, n, buffer_id, address, size, slot)
    finally:
        # Calls made while cleaning up are not part of the replay: keep the log up to here.
        replayed = len(device.log)
        device.event = n
        _give_everything_back(policy, live)
    for problem in getattr(device, "problems", []):
        measured.corruptions.append(Corruption(-1, -1, 0, 0, "device misuse", problem))
    measured.calls = device.log.head(replayed)
    return measured


def _check_block(device: Any, measured: Measured, event: int, buffer_id: int, address: int,
                 size: int, key: int) -> None:
    measured.blocks_checked += 1
    bad = device.check(address, size, key)
    if bad:
        what = ("out of region" if bad < 0 else "overwritten")
        detail = ("the block is no longer inside memory the policy holds" if bad < 0 else
                  f"{bad:,} words of its pattern were overwritten (another block overlaps it)")
        measured.corruptions.append(Corruption(event, buffer_id, address, size, what, detail))


def _give_everything_back(policy: Any, live: dict[int, tuple[int, int, int | None]]) -> None:
    """Free what is still live and empty the policy's cache, so the device's memory goes back
    (a real GPU is shared by the next backend). A broken policy may fail here: ignored, the
    device's close() releases what it holds regardless."""
    try:
        for address, _, _ in live.values():
            policy.free(address)
        policy.empty_cache()
    except Exception:
        pass


def replay_allocator(trace: Trace, alloc: Callable[[int, int], Any],
                     free: Callable[[Any], None], *, reserved: Callable[[], int],
                     used: Callable[[], int] | None, device_used: Callable[[], int] | None,
                     state: dict[str, int], timed: bool = False,
                     before_cleanup: Callable[[], None] | None = None,
                     after_free: Callable[[], None] | None = None) -> Measured:
    """Replay ``trace`` through a real allocator: ``alloc(size, stream)`` returns a handle
    (None on OOM), dropping the handle (or ``free(handle)``) frees it. Reads reserved/used
    after every event. With ``timed``, the wall time of every event that moved reserved is
    logged as a call (for allocators whose device calls cannot be hooked). ``before_cleanup``
    runs once the replay is over, before what is still live is freed; ``after_free`` after
    every free of the replay. ``state["event"]`` is kept at the event being replayed (``n``
    during the clean-up), for the callers' own call logs."""
    n = len(trace)
    ops, ids, sizes, streams = _event_columns(trace)
    out_reserved = np.zeros(n, dtype=np.int64)
    out_used = np.zeros(n, dtype=np.int64) if used is not None else None
    out_device = np.zeros(n, dtype=np.int64) if device_used is not None else None
    measured = Measured(reserved=out_reserved, used=out_used, device_used=out_device)
    live: dict[int, Any] = {}
    log = CallLog()
    previous = 0
    try:
        for i in range(n):
            state["event"] = i
            start = time.perf_counter_ns()
            if ops[i] == OP_ALLOC:
                if sizes[i] > 0:
                    got = alloc(sizes[i], streams[i])
                    if got is None:
                        measured.ooms += 1
                        if measured.first_oom_event is None:
                            measured.first_oom_event = i
                    else:
                        live[ids[i]] = got
                    got = None    # no stray reference may keep a pooled block alive
            elif ids[i] in live:
                free(live[ids[i]])
                # Dropping the last reference is the free for CuPy's pools: it happens here.
                del live[ids[i]]
                if after_free is not None:
                    after_free()
            elapsed = time.perf_counter_ns() - start
            now = reserved()
            out_reserved[i] = now
            if timed and now != previous:
                log.add(i, "malloc" if now > previous else "free", abs(now - previous), True,
                        elapsed)
            previous = now
            if out_used is not None and used is not None:
                out_used[i] = used()
            if out_device is not None and device_used is not None:
                out_device[i] = device_used()
    finally:
        if before_cleanup is not None:
            before_cleanup()
        # The clean-up's device calls are logged as event n: callers keep those before it.
        state["event"] = n
        for handle in live.values():
            free(handle)
        live.clear()
    measured.calls = log
    return measured
