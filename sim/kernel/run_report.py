"""What a replay reports, kept as it goes: the observer of the engine's per-event loop.

:class:`~allocsim.sim.kernel.engine.ProcessReplay` runs the events and tells a
:class:`RunReport` only what a result needs, at the moments it happens — the hooks, as a
:class:`~allocsim.policies.chunk_policy.ChunkObserver` is told of a policy's searches:

- :meth:`RunReport.on_peak_allocated`: live requested bytes passed their peak;
- :meth:`RunReport.on_device_call`: the event made device calls (the call log, the bucket's
  most reserved bytes, the run's peak of reserved bytes);
- :meth:`RunReport.on_out_of_memory` and :meth:`RunReport.on_unmatched_free`: an alloc failed,
  a free found nothing live (both skipped in the allocated timeline);
- :meth:`RunReport.on_sample` and :meth:`RunReport.on_bucket_end`: at the events the report
  asked for (:attr:`RunReport.next_sample`, the bucket's last event), so the loop checks
  neither per event;
- :meth:`RunReport.between_chunks`: the loop loads its next chunk of events.

None is called per event: the loop keeps its running sums in locals and calls a hook only on
what changes a figure. :meth:`RunReport.result` then builds the
:class:`~allocsim.sim.kernel.results.RunResult` and its timeline with numpy. The report reads
the device's counters (reserved bytes) and the policy's bytes in use, never the policy's own
headline figures.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

from allocsim.policies import Policy, PolicySpec
from allocsim.sim.kernel.device import ProcessDevice
from allocsim.sim.kernel.results import CallLog, RunResult, Timeline
from allocsim.traces.model import OP_ALLOC, Trace

TIMELINE_BLOCK_EVENTS = 1 << 16     # events per block of the timeline's allocated bytes


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


class RunReport:
    """The figures of one process's replay, kept through the loop's hooks (module docstring).

    Memory: the timeline's buckets as they close (:class:`BucketSummary`), a sample of the
    policy's bytes in use every ``n // points`` events, 8 bytes per skipped event, and, when
    kept (``keeps_call_log``), the device-call log packed between chunks (:class:`CallLog`:
    ~3 bytes a call for a policy calling at every event) — no array per event of the trace.
    Each hook is O(1); :meth:`result` is O(events) numpy work, a block of
    :data:`TIMELINE_BLOCK_EVENTS` events at a time."""

    def __init__(self, trace: Trace, sizes: np.ndarray, policy: Policy, view: ProcessDevice,
                 *, points: int, keeps_call_log: bool) -> None:
        self.trace = trace
        self.sizes = sizes              # the trace's matched sizes, as the loop reads them
        self.policy = policy
        self.view = view
        self.n = n = len(trace)
        self.points = points
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
        self.buckets = BucketSummary(n, max(1, -(-n // points)))
        # The full device-call log, (event index, reserved after, cumulative cost) per event
        # that made calls: kept for a run that may stop early (its timeline's buckets follow
        # where it stopped) or when asked (the validator reads the reserved bytes after every
        # event). Appended through plain lists' appends (on-demand makes a call per event),
        # packed between chunks; np.asarray(self.call_events) etc. give every entry.
        self.keeps_call_log = keeps_call_log
        self.call_log = CallLog()
        self.call_events = self.call_log.events
        self.call_reserved = self.call_log.reserved
        self.call_cost = self.call_log.cost
        self.sample_every = max(1, n // points)
        self.next_sample = 0
        self.samples: list[tuple[int, int]] = []  # (event index, policy bytes in use)

    # -- the hooks -------------------------------------------------------------------
    def on_peak_allocated(self, i: int, allocated: int) -> None:
        """Live requested bytes reached a new peak, ``allocated``, at event ``i``."""
        self.peak_allocated = allocated
        self.peak_allocated_event = i
        self.in_use_at_peak_allocated = self.policy.bytes_in_use

    def on_device_call(self, i: int, top: int) -> int:
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

    def on_out_of_memory(self, i: int, size: int, allocated: int) -> None:
        """Event ``i``, an alloc of ``size`` bytes, failed with ``allocated`` live bytes."""
        self.ooms += 1
        self.skipped_events.append(i)
        if self.first_oom is None:
            # What the other processes on the device held at that moment (shared runs).
            view = self.view
            others = {other.process: other.reserved for other in view.device.views.values()
                      if other.process != view.process}
            self.first_oom = FirstOOM(i, size, allocated, view.reserved,
                                      self.policy.stats().largest_free_block, others)

    def on_unmatched_free(self, i: int) -> None:
        """Event ``i`` frees a buffer that is not live (its alloc failed): it counts nothing."""
        self.skipped_events.append(i)

    def on_sample(self, i: int) -> None:
        """Event ``i`` is :attr:`next_sample`: the policy's bytes in use after it."""
        self.samples.append((i, self.policy.bytes_in_use))
        self.next_sample += self.sample_every

    def on_bucket_end(self, top: int) -> None:
        """The timeline's bucket ends with the event just run; ``top`` the most reserved after
        its calls (-1: none)."""
        view = self.view
        self.buckets.close(top, view.reserved, view.cost_s)

    def between_chunks(self) -> None:
        """No event is half-run: the call log may pack what it holds."""
        if self.keeps_call_log:
            self.call_log.pack()

    # -- the result ------------------------------------------------------------------
    def result(self, spec: PolicySpec, device_name: str, *, events_run: int, stopped: bool,
               start_ns: int) -> RunResult:
        """The run's figures after ``events_run`` events (``stopped``: at its first OOM, with
        ``stop_on_oom``); the timeline's clock starts at ``start_ns``."""
        view = self.view
        trace = self.trace
        oom = self.first_oom
        timeline = self._timeline(events_run, start_ns)
        reserved = timeline.reserved.astype(np.float64)
        in_use = timeline.in_use.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(reserved > 0, (reserved - in_use) / reserved, 0.0)
        return RunResult(
            policy=str(spec), trace=trace.name, device=device_name, process=view.process,
            events=self.n, allocs=trace.n_allocs,
            completed=self.ooms == 0 and not stopped,
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

    def _timeline(self, n: int, start_ns: int) -> Timeline:
        """Allocated (exact, from the trace), reserved (exact, from the device-call log) and
        in-use (sampled) over the first ``n`` events, reduced to at most ``points`` buckets of
        equal event count; the max per bucket keeps every peak visible. Allocated is built
        block by block and reserved and the clock from the call log a chunk at a time
        (:meth:`CallLog.per_bucket`), so the temporaries stay a few MB whatever the trace's
        length."""
        bucket = max(1, -(-n // self.points))
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
        trace_times = time_ns[last].astype(np.int64) - t0 + start_ns
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


__all__ = ["TIMELINE_BLOCK_EVENTS", "BucketSummary", "FirstOOM", "RunReport"]
