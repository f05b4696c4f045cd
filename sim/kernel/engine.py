"""Replay traces through policies on a simulated device — the hot loop of allocsim.

One process (the common case) needs no event scheduler: allocation decisions do not depend on
time, so the engine runs a plain loop and adds the modelled cost of device calls to the
process's clock arithmetically (:func:`replay`). Several processes sharing a device do race
(who takes memory first matters), so :func:`run_shared` makes each a simpy process that waits
until its next event's timestamp, issues every event of that instant, and is held for the
modelled cost of each device call — allocator time shows up as slowdown and shifts the race.
It pays one simpy step per distinct timestamp or device call, never one per event.
A shared process may hold memory outside its allocator — its own context from its start, a
first-step load — counted in the device's used and peak bytes, not in its reserved bytes
(:class:`SharedProcess`).

Both paths share :class:`ProcessReplay`, whose inner loop is the per-event path: no per-event
object allocation, no logging, locals only. What a run reports is kept apart, by the loop's
observer (:class:`~allocsim.sim.kernel.run_report.RunReport`), told only of what changes a
figure; timelines are rebuilt afterwards with numpy. The engine counts allocated bytes (from
the trace) and reads reserved bytes from the device; it never trusts a policy's own counters
for headline figures.
"""

from __future__ import annotations

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
from allocsim.sim.kernel.results import RunResult
from allocsim.sim.kernel.run_report import FirstOOM, RunReport
from allocsim.sim.kernel.trace_scratch import with_trace_scratch
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace

CHUNK_EVENTS = 1 << 16      # events converted to Python lists at a time (bounds memory)
# A run's first chunk, each next one twice the last up to CHUNK_EVENTS: a run that stops
# early — a min-capacity probe of a repeating trace stops once it repeats, often within
# 2,000 events — converted 65,536 events of every column first, about half its time.
FIRST_CHUNK_EVENTS = 1 << 11
TIMELINE_POINTS = 2048      # buckets of the downsampled timeline
Progress = Callable[[int, int], None]


class ProcessReplay:
    """One process's events through one policy; its state survives between batches. What the
    run reports — peaks, OOMs, the timeline's buckets and samples, the device-call log — is
    kept by its :class:`~allocsim.sim.kernel.run_report.RunReport` (:attr:`report`), told
    through hooks at the events that change a figure; the loop here keeps only what the next
    event needs (the live buffers, the live bytes).

    Costs: :meth:`advance` is O(events) engine work — per event at most one policy call,
    O(1) dict and counter updates, a sample every ``n // TIMELINE_POINTS`` events — plus
    whatever the policy's ``malloc``/``free`` cost, and O(1) per device call (a comparison;
    with the call log, list appends packed between chunks); traces are converted to lists
    :data:`CHUNK_EVENTS` at a time (the first chunks smaller: :data:`FIRST_CHUNK_EVENTS`).
    :meth:`result` is O(events) numpy work (the timeline).

    Memory (issue 17.4): besides the trace's columns as held (packed, see
    :mod:`allocsim.traces.model`), O(live buffers) for the live dict and the policy, one chunk
    of Python lists and the report's (no array per event of the trace). A run that keeps the
    device-call log (``stop_on_oom``, or ``call_log=True``) adds it."""

    def __init__(self, trace: Trace, policy: PolicySpec, device: SimulatedDevice, process: int = 0,
                 *, start_ns: int = 0, stop_on_oom: bool = False,
                 memory_stats: bool = False, call_log: bool | None = None) -> None:
        trace = buffers_on_device(trace, device.profile)   # a TPU holds u8[n] buffers
        self.trace = trace
        self.spec = policy
        self.view = device.view(process)
        # A TPU step's scratch, where its trace carries one (trace_scratch.py).
        self.policy = with_trace_scratch(policy, trace).build(self.view)
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
        # The full device-call log is kept for a run that may stop early (``stop_on_oom``: its
        # timeline's buckets follow where it stopped) or when asked (``call_log``).
        self.report = RunReport(trace, self.sizes, self.policy, self.view,
                                points=TIMELINE_POINTS,
                                keeps_call_log=stop_on_oom if call_log is None else call_log)
        self._base = 0
        self._lists: tuple[list, list, list, list] = ([], [], [], [])
        self._chunk_events = min(FIRST_CHUNK_EVENTS, CHUNK_EVENTS)  # the next chunk's

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
        if i == self.n:
            self.report.between_chunks()    # the last chunk's call log packed as the others
        self.next_index = i
        return i

    def _load(self, start: int) -> None:
        stop = min(self.n, start + self._chunk_events)
        self._chunk_events = min(CHUNK_EVENTS, 2 * self._chunk_events)
        trace = self.trace
        self._base = start
        self._lists = ([], [], [], [])      # the previous chunk's lists go before the next's
        self.report.between_chunks()
        # The columns as held (a packed column stays packed; tolist() gives the same ints).
        self._lists = (trace.column("op")[start:stop].tolist(),
                       trace.column("id")[start:stop].tolist(),
                       self.sizes[start:stop].tolist(),
                       trace.column("stream")[start:stop].tolist())

    def _run(self, i: int, stop: int, stop_on_call: bool) -> tuple[int, bool]:
        """The per-event loop over events [i, stop) of the loaded chunk: O(stop − i) plus the
        policy's calls. Returns the next index and whether it stopped right after a device
        call (``stop_on_call``).

        The events run in segments that end at the report's next sampled event or the end of
        its timeline bucket, so the loop itself checks neither the sample point, the bucket
        nor the end: per event it is one policy call, the live-dict update, the running sum
        and one comparison of the device's call counter. It allocates nothing beyond the live
        dict's entry for a new buffer; the report hears of a new peak of live bytes, an event
        that made device calls (when the call log is kept or the bytes reserved pass the
        bucket's most), an OOM and an unmatched free — the report's hooks
        (:mod:`~allocsim.sim.kernel.run_report`). A stopping OOM (``stop_on_oom``) or, with
        ``stop_on_call``, a device call ends the segment early; the event's own device calls,
        sample and bucket are still reported, as for every other event.

        This is the one per-event loop: every policy is driven through its own ``malloc`` and
        ``free`` (the Python models are the specification; speed comes from the native core,
        not from copies of this loop inside policies)."""
        ops, ids, sizes, streams = self._lists
        base = self._base
        live = self.live
        malloc, free = self.policy.malloc, self.policy.free
        view = self.view
        calls = view.calls
        allocated = self.allocated
        report = self.report
        on_peak, on_call = report.on_peak_allocated, report.on_device_call
        peak = report.peak_allocated
        next_sample = report.next_sample
        keeps_log = report.keeps_call_log
        buckets = report.buckets
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
                            report.on_out_of_memory(i, size, allocated)
                            if self.stop_on_oom:
                                self.stopped = True
                                break               # its device calls are reported below
                        else:
                            live[buffer] = address
                            allocated += size
                            if allocated > peak:
                                peak = allocated
                                on_peak(i, allocated)
                else:
                    address = live.pop(buffer, None)
                    if address is None:
                        if size:
                            report.on_unmatched_free(i)
                    else:
                        free(address)
                        allocated -= size
                if view.calls != calls:
                    calls = view.calls
                    if keeps_log or view.reserved > top:    # else nothing to note
                        top = on_call(i, top)
                    if stop_on_call:
                        called = True
                        break
            else:
                broke = False
            if view.calls != calls:                 # a stopping OOM's own device calls
                calls = view.calls
                top = on_call(i, top)
                called = True
            if i == next_sample:
                report.on_sample(i)
                next_sample = report.next_sample
            if i == bucket_last:
                report.on_bucket_end(top)
                top = -1
                bucket_last = buckets.last_event
            i += 1
            if broke:
                break
        buckets.top = top
        self.allocated = allocated
        return i, called

    # -- results ---------------------------------------------------------------------
    def result(self, device_name: str) -> RunResult:
        """The run's :class:`~allocsim.sim.kernel.results.RunResult` on ``device_name``, from
        the events run so far."""
        return self.report.result(self.spec, device_name, events_run=self.next_index,
                                  stopped=self.stopped, start_ns=self.start_ns)


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
    """One process on a shared device: its trace, its policy, when it starts (simulated ns),
    and the memory it holds outside its allocator (0 and 0, the default: none, as before).

    - ``context_bytes``: its CUDA context, taken from the device when it starts (at
      ``start_ns``, before its first event) — on a real card each process has its own;
    - ``first_step_bytes``: what it loads lazily once it runs work (module images, library
      kernels: CUDA's lazy loading), taken just before event ``first_step_event`` (default 0,
      its first event; a recording's first train step is a later one).

    Both are held until the process exits, counted in the device's used and peak bytes and
    never in the process's reserved bytes (what its allocator took:
    :meth:`~allocsim.sim.kernel.device.ProcessDevice.hold_outside`). Either refused because
    the device is full, the process ends there as an OOM of its own: its first OOM is that
    event (0 for the context: it never started), asking those bytes, and the run's
    :attr:`SharedRun.refused_outside` names which it was."""

    trace: Trace
    policy: str | PolicySpec
    start_ns: int = 0
    process: int | None = None
    context_bytes: int = 0
    first_step_bytes: int = 0
    first_step_event: int = 0

    def __post_init__(self) -> None:
        for name in ("context_bytes", "first_step_bytes", "first_step_event"):
            if getattr(self, name) < 0:
                raise UserInputError(f"{name} must be >= 0, got {getattr(self, name)}")


CONTEXT, FIRST_STEP = "context", "first-step load"    # what a process was refused outside


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
    # Per process, in the order given: what the device refused it outside its allocator
    # (CONTEXT: it never started; FIRST_STEP: it died at its first-step load), else None.
    refused_outside: list[str | None] = field(default_factory=list)

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
    ``stop_on_oom``) exits, and its memory goes back to the device — what its allocator
    reserved and what it held outside it (:class:`SharedProcess`' context and first-step
    load; a process refused either stops there, whatever ``stop_on_oom`` says)."""
    env = simpy.Environment()
    shared = SimulatedDevice(device)
    runs: list[ProcessReplay] = []
    device_times: list[int] = [0]
    device_used: list[int] = [0]
    final_reserved: dict[int, int] = {}
    spans: dict[int, tuple[int, int]] = {}
    refused: dict[int, str] = {}

    def hold_outside(run: ProcessReplay, nbytes: int, event: int, what: str) -> bool:
        """``nbytes`` beside the allocator before event ``event``; refused, the process ends
        there with an OOM of that event asking those bytes."""
        if run.view.hold_outside(nbytes):
            device_times.append(int(env.now))
            device_used.append(shared.used)
            return True
        run.report.on_out_of_memory(event, nbytes, run.allocated)
        run.stopped = True
        refused[run.process] = what
        return False

    def process_body(run: ProcessReplay, spec: SharedProcess
                     ) -> Generator[simpy.Event, None, None]:
        times = run.trace.column("time_ns")         # as held: no unpacked copy
        if run.n == 0:
            spans[run.process] = (run.start_ns, run.start_ns)
            return
        if spec.context_bytes:                      # taken when it starts
            if run.start_ns > env.now:
                yield env.timeout(run.start_ns - env.now)
            hold_outside(run, spec.context_bytes, 0, CONTEXT)
        # The first-step load is still to take (None: none, or taken).
        load_at = spec.first_step_event if spec.first_step_bytes else None
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
            end = batch_end
            if load_at is not None:
                if i < load_at:                     # run up to it, then take it
                    end = min(end, load_at)
                else:
                    load_at = None
                    if not hold_outside(run, spec.first_step_bytes, i, FIRST_STEP):
                        break
            calls = run.view.calls
            run.advance(end, stop_on_call=True)
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
        # A process that may be refused its context or load stops early: its timeline then
        # needs the call log, as a run that stops at its first OOM does.
        outside = bool(spec.context_bytes or spec.first_step_bytes)
        run = ProcessReplay(spec.trace, _as_spec(spec.policy), shared, process,
                            start_ns=spec.start_ns, stop_on_oom=stop_on_oom,
                            call_log=stop_on_oom or outside)
        runs.append(run)
        env.process(process_body(run, spec))
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
        refused_outside=[refused.get(run.process) for run in runs],
    )


__all__ = ["CONTEXT", "FIRST_STEP", "OP_FREE", "FirstOOM", "ProcessReplay", "SharedProcess",
           "SharedRun", "replay", "run_shared"]
