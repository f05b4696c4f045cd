"""Replay traces through policies on a simulated device — the hot loop of allocsim.

One process (the common case) needs no event scheduler: allocation decisions do not depend on
time, so the engine runs a plain loop and adds the modelled cost of device calls to the
process's clock arithmetically (:func:`replay`). Several processes sharing a device do race
(who takes memory first matters), so :func:`run_shared` makes each a simpy process that waits
until its next event's timestamp, issues every event of that instant, and is held for the
modelled cost of each device call — allocator time shows up as slowdown and shifts the race.
It pays one simpy step per distinct timestamp or device call, never one per event.

Both paths share :class:`ProcessReplay`, whose inner loop is the per-event path: no per-event
object allocation, no logging, locals only; timelines are rebuilt afterwards with numpy.
The engine counts allocated bytes (from the trace) and reads reserved bytes from the device;
it never trusts a policy's own counters for headline figures.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import simpy

from allocsim.errors import UserInputError
from allocsim.policies import PolicySpec, parse_policy
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.kernel.device_buffers import buffers_on_device
from allocsim.sim.kernel.native import native_replay
from allocsim.sim.kernel.results import CallLog, RunResult, Timeline
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace

CHUNK_EVENTS = 1 << 16      # events converted to Python lists at a time (bounds memory)
TIMELINE_POINTS = 2048      # buckets of the downsampled timeline
TIMELINE_BLOCK_EVENTS = 1 << 16     # events per block of the timeline's allocated bytes
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class FirstOOM:
    """A process's first failed request and the state it met, after the policy's own release
    path ran (what :class:`~allocsim.sim.kernel.results.RunResult`'s ``first_oom_*`` fields
    report). Made once per run, off the per-event path."""

    event: int                  # index of the failing alloc in the trace
    size: int                   # bytes asked for
    allocated: int              # live requested bytes then (the engine's count)
    reserved: int               # bytes this process held from the device then
    largest_free: int           # the policy's largest free block then
    others: dict[int, int]      # other processes on the device → bytes they held (shared runs)


class BucketSummary:
    """The reserved timeline and the clock of a replay, a bucket of events at a time, kept as
    the replay goes: per bucket of ``bucket`` consecutive events (the last may be short), the
    most bytes reserved after any of its events and the cumulative modelled cost after its last
    (what :meth:`CallLog.per_bucket` gives from the full log, without the log).

    The engine raises :attr:`top` at each event that made device calls (``first_call`` notes
    where the bucket's first came) and calls :meth:`close` after the bucket's last event. The
    bytes reserved before the bucket count unless a call at its first event replaced them."""

    def __init__(self, n: int, bucket: int) -> None:
        self.n = n
        self.bucket = bucket
        self.first_event = 0
        self.last_event = min(n, bucket) - 1    # -1 for an empty trace: never reached
        self.top = -1                   # most reserved after a call in this bucket; -1: none
        self.first_call = -1            # the event of the bucket's first call
        self.carried = 0                # reserved after the last call before this bucket
        self.reserved: list[int] = []
        self.cost: list[float] = []

    def close(self, top: int, reserved: int, cost_s: float) -> None:
        """The bucket ends with its last event: ``top`` the most reserved after its calls (-1
        if none), ``reserved`` and ``cost_s`` the device's now."""
        if top < 0:
            most = self.carried
        elif self.first_call == self.first_event:
            most = top
        else:
            most = max(top, self.carried)
        self.reserved.append(most)
        self.cost.append(cost_s)
        self.carried = reserved
        self.top = -1
        self.first_event += self.bucket
        self.last_event = min(self.n, self.first_event + self.bucket) - 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(most reserved, cost at end) per closed bucket."""
        return (np.asarray(self.reserved, dtype=np.int64),
                np.asarray(self.cost, dtype=np.float64))


class ProcessReplay:
    """One process's events through one policy; its state survives between batches.

    Costs: :meth:`advance` is O(events) engine work — per event at most one policy call,
    O(1) dict and counter updates, a sample every ``n // TIMELINE_POINTS`` events — plus
    whatever the policy's ``malloc``/``free`` cost, and O(1) per device call (a comparison;
    with the call log, list appends packed between chunks); traces are converted to lists
    :data:`CHUNK_EVENTS` at a time.
    :meth:`result` is O(events) numpy work (the timeline).

    Memory (issue 17.4): besides the trace's columns as held (packed, see
    :mod:`allocsim.traces.model`), O(live buffers) for the live dict and the policy, one chunk
    of Python lists, the timeline's buckets as they close (:class:`BucketSummary`), 8 bytes
    per skipped event, and the timeline's temporaries of :data:`TIMELINE_BLOCK_EVENTS` events —
    no array per event of the trace. A run that keeps the device-call log (``stop_on_oom``, or
    ``call_log=True``) adds it, packed between chunks (:class:`CallLog`: ~3 bytes a call for a
    policy calling at every event)."""

    def __init__(self, trace: Trace, policy: PolicySpec, device: SimulatedDevice, process: int = 0,
                 *, start_ns: int = 0, stop_on_oom: bool = False,
                 memory_stats: bool = False, call_log: bool | None = None) -> None:
        trace = buffers_on_device(trace, device.profile)   # a TPU holds u8[n] buffers
        self.trace = trace
        self.spec = policy
        self.view = device.view(process)
        self.policy = policy.build(self.view)
        # What the replay reads of the policy: bytes_in_use and stats(). A policy with a report
        # of its own beyond those (PyTorch's memory_stats()) is told whether it will be read
        # (``memory_stats``: a caller reading run.policy.memory_stats() afterwards), so it can
        # leave that report's counters off the hot path (issue 17).
        keep_memory_stats = getattr(self.policy, "keep_memory_stats", None)
        if keep_memory_stats is not None:
            keep_memory_stats(memory_stats)
        self.process = process
        self.start_ns = start_ns
        self.stop_on_oom = stop_on_oom
        self.n = len(trace)
        # In the dtype the size column is held in; the size column itself where every size
        # is known (no copy).
        self.sizes = trace.matched_sizes(packed=True)
        self.next_index = 0
        self.stopped = False
        # Running state of the hot loop.
        self.live: dict[int, int] = {}
        self.allocated = 0
        self.peak_allocated = 0
        self.peak_allocated_event = -1
        self.in_use_at_peak_allocated = 0
        self.reserved_at_peak = 0
        self.peak_reserved_event = -1
        self.in_use_at_peak_reserved = 0
        # Failed allocs and the frees that match them, in event order (a typed array: 8
        # bytes each however many OOMs).
        self.skipped_events = array("q")
        self.ooms = 0
        self.first_oom: FirstOOM | None = None
        # The reserved timeline and the clock, a bucket of events at a time as the replay goes
        # (:class:`BucketSummary`): the most bytes reserved after any event of the bucket and
        # the cumulative cost after its last. Per call that is one comparison; a run to the end
        # of its trace needs nothing more.
        self.buckets = BucketSummary(self.n, max(1, -(-self.n // TIMELINE_POINTS)))
        # The full device-call log, (event index, reserved after, cumulative cost) per event
        # that made calls: kept for a run that may stop early (``stop_on_oom``: its timeline's
        # buckets follow where it stopped) or when asked (``call_log``: the validator reads the
        # reserved bytes after every event). Appended through plain lists' appends (on-demand
        # makes a call per event), packed between chunks; np.asarray(self.call_events) etc.
        # give every entry.
        self.keeps_call_log = stop_on_oom if call_log is None else call_log
        self.call_log = CallLog()
        self.call_events = self.call_log.events
        self.call_reserved = self.call_log.reserved
        self.call_cost = self.call_log.cost
        self.sample_every = max(1, self.n // TIMELINE_POINTS)
        self.next_sample = 0
        self.samples: list[tuple[int, int]] = []  # (event index, policy bytes in use)
        self._base = 0
        self._lists: tuple[list, list, list, list] = ([], [], [], [])

    # -- running ---------------------------------------------------------------------
    def advance(self, end: int, *, stop_on_call: bool = False) -> int:
        """Replay events up to ``end`` (exclusive); with ``stop_on_call``, stop right after an
        event that made a device call so the caller can charge its cost. Returns the next index."""
        i = self.next_index
        while i < end and not self.stopped:
            if not self._base <= i < self._base + len(self._lists[0]):
                self._load(i)
            stop = min(end, self._base + len(self._lists[0]))
            i, called = self._run(i, stop, stop_on_call)
            if called and stop_on_call:
                break
        self.next_index = i
        return i

    def _load(self, start: int) -> None:
        stop = min(self.n, start + CHUNK_EVENTS)
        trace = self.trace
        self._base = start
        self._lists = ([], [], [], [])      # the previous chunk's lists go before the next's
        if self.keeps_call_log:
            self.call_log.pack()            # between events: every call so far is logged
        # The columns as held (a packed column stays packed; tolist() gives the same ints).
        self._lists = (trace.column("op")[start:stop].tolist(),
                       trace.column("id")[start:stop].tolist(),
                       self.sizes[start:stop].tolist(),
                       trace.column("stream")[start:stop].tolist())

    def _run(self, i: int, stop: int, stop_on_call: bool) -> tuple[int, bool]:
        """The per-event loop over events [i, stop) of the loaded chunk: O(stop − i) plus the
        policy's calls. Returns the next index and whether it stopped right after a device
        call (``stop_on_call``).

        The events run in segments that end at the next sampled event or the end of the
        timeline's bucket, so the loop itself checks neither the sample point, the bucket nor
        the end: per event it is one policy call, the live-dict update, the running sum and
        one comparison of the device's call counter. It allocates nothing beyond the live
        dict's entry for a new buffer; an event that made device calls raises the bucket's
        most reserved bytes and appends to the call log if one is kept
        (:meth:`_device_called`); OOMs leave the loop through :meth:`note_out_of_memory`.
        A stopping OOM (``stop_on_oom``) or, with ``stop_on_call``, a device call ends the
        segment early; the event's own device calls, sample and bucket are still recorded,
        as for every other event.

        This is the one per-event loop: every policy is driven through its own ``malloc`` and
        ``free`` (the Python models are the specification; speed comes from the native core,
        not from copies of this loop inside policies)."""
        ops, ids, sizes, streams = self._lists
        base = self._base
        live = self.live
        policy = self.policy
        malloc, free = policy.malloc, policy.free
        view = self.view
        calls = view.calls
        allocated = self.allocated
        peak = self.peak_allocated
        next_sample = self.next_sample
        keeps_log = self.keeps_call_log
        buckets = self.buckets
        top = buckets.top
        bucket_last = buckets.last_event
        called = False
        while i < stop:
            # Through the next sampled event or the bucket's last, whichever comes first.
            end = min(stop, next_sample + 1, bucket_last + 1)
            lo, hi = i - base, end - base
            broke = True
            events = range(i, end)
            for i, op, buffer, size, stream in zip(events, ops[lo:hi], ids[lo:hi],
                                                   sizes[lo:hi], streams[lo:hi]):
                if op == OP_ALLOC:
                    if size > 0:
                        address = malloc(size, stream)
                        if address is None:
                            self.note_out_of_memory(i, size, allocated)
                            if self.stopped:
                                break               # its device calls are logged below
                        else:
                            live[buffer] = address
                            allocated += size
                            if allocated > peak:
                                peak = allocated
                                self.peak_allocated_event = i
                                self.in_use_at_peak_allocated = policy.bytes_in_use
                else:
                    address = live.pop(buffer, None)
                    if address is None:
                        if size:
                            self.skipped_events.append(i)
                    else:
                        free(address)
                        allocated -= size
                if view.calls != calls:
                    calls = view.calls
                    if keeps_log or view.reserved > top:    # else nothing to note
                        top = self._device_called(i, top)
                    if stop_on_call:
                        called = True
                        break
            else:
                broke = False
            if view.calls != calls:                 # a stopping OOM's own device calls
                calls = view.calls
                top = self._device_called(i, top)
                called = True
            if i == next_sample:
                self.samples.append((i, policy.bytes_in_use))
                next_sample += self.sample_every
            if i == bucket_last:
                buckets.close(top, view.reserved, view.cost_s)
                top = -1
                bucket_last = buckets.last_event
            i += 1
            if broke:
                break
        buckets.top = top
        self.allocated = allocated
        self.peak_allocated = peak
        self.next_sample = next_sample
        return i, called

    def _device_called(self, i: int, top: int) -> int:
        """Note the device calls of event ``i``, the one place they are noted: the call log (if
        kept) and, when the bytes reserved now pass ``top`` (the bucket's most so far, -1:
        none yet), the bucket's first call and the run's peak of reserved bytes. Returns the
        bucket's new top. O(1)."""
        view = self.view
        reserved = view.reserved
        if self.keeps_call_log:
            self.call_events.append(i)
            self.call_reserved.append(reserved)
            self.call_cost.append(view.cost_s)
        if reserved > top:
            if top < 0:
                self.buckets.first_call = i
            top = reserved
            if reserved > self.reserved_at_peak:    # never above the run's peak else
                self.reserved_at_peak = reserved
                self.peak_reserved_event = i
                self.in_use_at_peak_reserved = self.policy.bytes_in_use
        return top

    def note_out_of_memory(self, i: int, size: int, allocated: int) -> None:
        """Event ``i``, an alloc of ``size`` bytes, failed with ``allocated`` live bytes."""
        self.ooms += 1
        self.skipped_events.append(i)
        if self.first_oom is None:
            # What the other processes on the device held at that moment (shared runs).
            others = {view.process: view.reserved for view in self.view.device.views.values()
                      if view.process != self.process}
            self.first_oom = FirstOOM(i, size, allocated, self.view.reserved,
                                      self.policy.stats().largest_free_block, others)
        if self.stop_on_oom:
            self.stopped = True

    # -- results ---------------------------------------------------------------------
    def result(self, device_name: str) -> RunResult:
        view = self.view
        trace = self.trace
        oom = self.first_oom
        timeline = self._timeline()
        reserved = timeline.reserved.astype(np.float64)
        in_use = timeline.in_use.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(reserved > 0, (reserved - in_use) / reserved, 0.0)
        return RunResult(
            policy=str(self.spec), trace=trace.name, device=device_name, process=self.process,
            events=self.n, allocs=trace.n_allocs,
            completed=self.ooms == 0 and not self.stopped,
            ooms=self.ooms, first_oom_event=oom.event if oom else None,
            first_oom_size=oom.size if oom else None,
            first_oom_allocated=oom.allocated if oom else None,
            first_oom_reserved=oom.reserved if oom else None,
            first_oom_largest_free=oom.largest_free if oom else None,
            peak_allocated=self.peak_allocated, peak_allocated_event=self.peak_allocated_event,
            peak_reserved=view.peak_reserved, peak_reserved_event=self.peak_reserved_event,
            final_reserved=view.reserved,
            internal_fragmentation=max(0, self.in_use_at_peak_allocated - self.peak_allocated),
            external_fragmentation=max(0, self.reserved_at_peak - self.in_use_at_peak_reserved),
            external_fragmentation_mean=float(share.mean()) if len(share) else 0.0,
            device_mallocs=view.mallocs, device_frees=view.frees,
            failed_device_mallocs=view.failed_mallocs, alloc_time_s=view.cost_s,
            trace_duration_s=trace.duration_ns / 1e9,
            policy_stats=self.policy.stats().as_dict(), timeline=timeline,
            first_oom_others=(oom.others or None) if oom else None,
        )

    def _timeline(self) -> Timeline:
        """Allocated (exact, from the trace), reserved (exact, from the device-call log) and
        in-use (sampled), reduced to at most TIMELINE_POINTS buckets of equal event count; the
        max per bucket keeps every peak visible. Allocated is built block by block and
        reserved and the clock from the call log a chunk at a time
        (:meth:`CallLog.per_bucket`), so the temporaries stay a few MB whatever the trace's
        length."""
        n = self.next_index
        bucket = max(1, -(-n // TIMELINE_POINTS))
        starts = np.arange(0, n, bucket, dtype=np.int64)
        last = np.minimum(starts + bucket, n) - 1
        allocated = self._allocated_per_bucket(starts, last, bucket)
        if n == self.n:                         # ran to the end: the buckets as they closed
            reserved, cost = self.buckets.arrays()
        elif self.keeps_call_log:               # stopped early: buckets of the events run
            reserved, cost = self.call_log.per_bucket(n, bucket)
        else:
            raise RuntimeError(f"the replay stopped at event {n} of {self.n} without a call "
                               "log: a run that may stop early needs ProcessReplay(..., "
                               "call_log=True) for its timeline")
        time_ns = self.trace.column("time_ns")
        t0 = int(time_ns[0]) if n else 0
        delay_ns = np.rint(cost * 1e9).astype(np.int64)
        trace_times = time_ns[last].astype(np.int64) - t0 + self.start_ns
        times = trace_times + delay_ns
        sample_events = np.asarray([s[0] for s in self.samples], dtype=np.int64)
        sample_values = np.asarray([s[1] for s in self.samples], dtype=np.int64)
        if len(sample_values):
            at = np.clip(np.searchsorted(sample_events, last, side="right") - 1, 0, None)
            in_use = sample_values[at]
        else:
            in_use = np.zeros(len(last), dtype=np.int64)
        return Timeline(event=last, time_ns=times, allocated=allocated, reserved=reserved,
                        in_use=in_use, trace_time_ns=trace_times)

    def _allocated_per_bucket(self, starts: np.ndarray, last: np.ndarray,
                              bucket: int) -> np.ndarray:
        """The most live requested bytes after any event of each bucket (skipped events
        count nothing), a block of :data:`TIMELINE_BLOCK_EVENTS` events at a time."""
        allocated = np.zeros(len(starts), dtype=np.int64)
        skipped = (np.frombuffer(self.skipped_events, dtype=np.int64) if self.skipped_events
                   else np.zeros(0, np.int64))          # in event order
        op = self.trace.column("op")
        running = 0
        per_block = max(1, TIMELINE_BLOCK_EVENTS // bucket)      # buckets per block
        for first in range(0, len(starts), per_block):
            chosen = slice(first, first + per_block)
            lo = int(starts[first])
            hi = int(last[chosen][-1]) + 1
            sizes = self.sizes[lo:hi].astype(np.int64)
            signed = np.where(op[lo:hi] == OP_ALLOC, sizes, -sizes)
            below, above = np.searchsorted(skipped, (lo, hi))
            signed[skipped[below:above] - lo] = 0
            live = np.cumsum(signed) + running
            running = int(live[-1])
            allocated[chosen] = np.maximum.reduceat(live, starts[chosen] - lo)
        return allocated


def _as_spec(policy: str | PolicySpec) -> PolicySpec:
    return parse_policy(policy)


def replay(trace: Trace, policy: str | PolicySpec, device: DeviceProfile, *,
           stop_on_oom: bool = False, progress: Progress | None = None) -> RunResult:
    """Replay a single-process trace through ``policy`` on a fresh ``device``.

    A trace with several processes is refused (one result could not describe them): run them
    together with :func:`run_shared` (``allocsim share``), or one at a time with
    ``trace.for_process(p)``.
    """
    processes = trace.processes()
    if len(processes) > 1:
        raise UserInputError(f"{trace.metadata.get('source', trace.name)}: the trace holds "
                             f"{len(processes)} processes ({', '.join(map(str, processes))}); "
                             "replay them together with `allocsim share` / run_shared, or one "
                             "at a time with trace.for_process(p)")
    spec = _as_spec(policy)
    step = CHUNK_EVENTS * 4
    # The native core replays the run when it has the policy and the run needs no Python
    # objects (sim/kernel/native.py); else the Python models below, with the same answers.
    native = native_replay(trace, spec, device, stop_on_oom=stop_on_oom, progress=progress,
                           timeline_points=TIMELINE_POINTS, step=step)
    if native is not None:
        return native
    run = ProcessReplay(trace, spec, SimulatedDevice(device), stop_on_oom=stop_on_oom)
    total = run.n
    while run.next_index < total and not run.stopped:
        run.advance(min(total, run.next_index + step))
        if progress is not None:
            progress(run.next_index, total)
    return run.result(device.label)


@dataclass
class SharedProcess:
    """One process on a shared device: its trace, its policy, when it starts (simulated ns)."""

    trace: Trace
    policy: str | PolicySpec
    start_ns: int = 0
    process: int | None = None


@dataclass
class SharedRun:
    """Results of several processes on one device, and the device's total over time."""

    results: list[RunResult]
    device_time_ns: np.ndarray
    device_used: np.ndarray
    device_peak: int
    # Each process's (first event, exit) in simulated ns, in the order given; a process with
    # no events has (start, start).
    spans_ns: list[tuple[int, int]] = field(default_factory=list)

    def ran_together(self) -> bool:
        """Whether any two processes were on the device at the same time (their spans
        overlap); when not, nothing was shared and "all complete" says nothing about sharing."""
        spans = sorted(self.spans_ns)
        return any(later[0] < earlier[1] for earlier, later in pairwise(spans))


def batch_ends(times: np.ndarray, window: int = CHUNK_EVENTS) -> Iterator[int]:
    """The index where each distinct timestamp's batch of events ends (the next event with a
    later time, or ``len(times)`` for the last), in order, worked out ``window`` events at a
    time: a trace of 10M distinct times never becomes 10M Python ints at once."""
    n = len(times)
    for start in range(0, n, window):
        # Event k in (start, start + window] ends a batch where its time differs from event
        # k − 1's: the window reaches one event past its end to see whether the batch goes on.
        reach = min(n, start + window + 1)
        changes = np.flatnonzero(times[start + 1:reach] != times[start:reach - 1])
        yield from (changes + start + 1).tolist()
    yield n


def run_shared(processes: list[SharedProcess], device: DeviceProfile, *,
               stop_on_oom: bool = False) -> SharedRun:
    """Run several processes concurrently against one device in simpy simulated time.

    A process that reaches the end of its trace (or stops at its first OOM with
    ``stop_on_oom``) exits, and its memory goes back to the device."""
    env = simpy.Environment()
    shared = SimulatedDevice(device)
    runs: list[ProcessReplay] = []
    device_times: list[int] = [0]
    device_used: list[int] = [0]
    final_reserved: dict[int, int] = {}
    spans: dict[int, tuple[int, int]] = {}

    def process_body(run: ProcessReplay) -> Generator[simpy.Event, None, None]:
        times = run.trace.column("time_ns")         # as held: no unpacked copy
        if run.n == 0:
            spans[run.process] = (run.start_ns, run.start_ns)
            return
        t0 = int(times[0])
        ends = batch_ends(times)
        batch_end = next(ends)
        delay_ns = 0
        while run.next_index < run.n and not run.stopped:
            i = run.next_index
            while batch_end <= i:
                batch_end = next(ends)
            due = run.start_ns + int(times[i]) - t0 + delay_ns
            if due > env.now:
                yield env.timeout(due - env.now)
            calls = run.view.calls
            run.advance(batch_end, stop_on_call=True)
            if run.view.calls != calls:
                device_times.append(int(env.now))
                device_used.append(shared.used)
                cost_ns = round(run.view.pending_cost_s * 1e9)
                run.view.pending_cost_s = 0.0
                if cost_ns:
                    delay_ns += cost_ns
                    yield env.timeout(cost_ns)
        # The process exits (or dies of its OOM): the driver frees whatever it still held, so
        # a process that starts later can have it.
        spans[run.process] = (run.start_ns, int(env.now))
        final_reserved[run.process] = run.view.reserved
        if run.view.exit():
            device_times.append(int(env.now))
            device_used.append(shared.used)

    for index, spec in enumerate(processes):
        process = index if spec.process is None else spec.process
        run = ProcessReplay(spec.trace, _as_spec(spec.policy), shared, process,
                            start_ns=spec.start_ns, stop_on_oom=stop_on_oom)
        runs.append(run)
        env.process(process_body(run))
    env.run()
    results = [run.result(device.label) for run in runs]
    for run, result in zip(runs, results):
        result.final_reserved = final_reserved.get(run.process, result.final_reserved)
    return SharedRun(
        results=results,
        device_time_ns=np.asarray(device_times, dtype=np.int64),
        device_used=np.asarray(device_used, dtype=np.int64),
        device_peak=shared.peak_used,
        spans_ns=[spans[run.process] for run in runs],
    )


__all__ = ["OP_FREE", "FirstOOM", "ProcessReplay", "SharedProcess", "SharedRun", "replay",
           "run_shared"]
