"""Does the ``bfc`` model make the decisions TensorFlow's/XLA's BFC allocator made?

What it is for
    A profiler ``.xplane.pb`` (:mod:`allocsim.traces.formats.xla.xplane`) records, for every call
    of a BFC allocator, the chunk it handed out or freed (``allocation_bytes``, ``addr``) and
    its bytes in use after the call (``bytes_allocated``); the importer keeps them as
    ``metadata["reference_events"]``, one per trace event. :func:`bfc_fidelity` replays the
    trace through :class:`~allocsim.policies.bfc.BFCAllocator` configured as recorded and
    compares after every call: the chunk size handed out (or freed), its place (region and
    offset, i.e. the address), and the bytes in use.

What it follows
    - Limit: ``bfc_memory_limit`` (= bytes_available + bytes_reserved + bytes_allocated, the
      same on every record; xla/tsl/framework/bfc_allocator.cc ``AddTraceMe``).
    - Growth settings are not in the file: the replay is run with ``allow_growth`` and
      ``garbage_collection`` each on and off and the setting that matches most is reported
      (ties: TensorFlow's CPU defaults first, allow_growth on, garbage collection off), said so.
    - Addresses: BFC's best fit breaks ties by address and regions never merge, so the
      model's regions must lie where the real ones lay. A region the model creates for an
      allocation is placed at the address the recording handed out for it (a new region's
      first chunk is its base) when that range is free; otherwise above every recorded address.
    - Start: when the first record's ``bytes_allocated`` is more than its own chunk, the
      recording started mid-run. Buffers freed later are in the trace's prologue (their sizes
      from the deallocation record); they are replayed first but their places and the regions
      before recording cannot be known: their free records are counted as ``unknowable`` and
      left out of the comparison, and bytes in use is compared net of the bytes live at the
      start. ``matched_until`` says how far the match goes without a break: the last
      recorded call matched before the first divergence (-1 when none; the prologue's guesses
      never count). A start state rebuilt from the records
      (:mod:`~allocsim.sim.questions.fidelity.bfc_start`) whose replay still diverges is decided
      further by every record after it (:mod:`~allocsim.sim.questions.fidelity.bfc_start_refine`):
      the report gives the state kept and how many states match as far.

Counting: ``total`` = compared records; a record matches when chunk size, address and bytes
in use all agree. Exit status 0 only when all do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from allocsim.errors import UserInputError
from allocsim.policies import format_size
from allocsim.policies.bfc import MIN_ALLOCATION, BFCAllocator, round_bytes
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.questions.fidelity.bfc_start import StartState, start_states
from allocsim.sim.questions.fidelity.bfc_start_refine import MAX_REPLAYED_EVENTS, refine
from allocsim.sim.questions.fidelity.device import RecordedAddressDevice, address_floor
from allocsim.traces.allocator_records import check_allocator_records
from allocsim.traces.model import OP_ALLOC, Trace, TraceError

__all__ = ["BFCFidelityError", "BFCFidelityReport", "bfc_fidelity", "is_bfc_recording"]

SETTINGS = [(True, False), (True, True), (False, False), (False, True)]
SCREEN_KEEP = 16        # rebuilt start states replayed whole at most (after screening)
SCREEN_CAP = 256        # states kept from one screening round
RULES = {
    "split": "ShouldSplitChunk (split when chunk >= 2*rounded or chunk - rounded >= "
             "max_internal_fragmentation), bfc_allocator.cc SplitChunk / FindChunkPtr",
    "best_fit": "FindChunkPtr (bins walked upward; smallest fitting chunk, lowest address "
                "on ties)",
    "extend": "Extend (new region: curr_region_allocation_bytes doubling, min(curr, "
              "available); back-off by 0.9)",
    "limit": "memory_limit (Extend fails when rounded > memory_limit - total_region_bytes)",
    "coalesce": "FreeAndMaybeCoalesce (merge with the next chunk, then the previous one)",
    "in_use": "stats.bytes_in_use (the whole chunk counts, slack included)",
}


class BFCFidelityError(UserInputError):
    """The trace is not a BFC recording (one line)."""


def is_bfc_recording(trace: Trace) -> bool:
    return trace.metadata.get("format") == "xplane" and "bfc_memory_limit" in trace.metadata


class PlacedDevice(RecordedAddressDevice):
    """A device that puts the next range at ``place`` (the recorded address) when free."""

    def __init__(self, profile: DeviceProfile, floor: int) -> None:
        super().__init__(profile, floor)
        self.place: int | None = None
        self.places: list[int] = []     # a rebuilt start's regions, in the order asked for

    def _address_range(self, nbytes: int) -> int:
        if self.places and self._unused(self.places[0], nbytes):
            base = self.places.pop(0)
            self._hold(base, nbytes)
            return base
        if self.place is not None and self._unused(self.place, nbytes):
            base, self.place = self.place, None
            self._hold(base, nbytes)
            return base
        return super()._address_range(nbytes)


@dataclass
class Replay:
    """One replay of the trace through ``bfc`` with given growth settings."""

    trace: Trace
    limit: int
    allow_growth: bool
    garbage_collection: bool
    matched: int = 0
    total: int = 0
    unknowable: int = 0
    by_field: dict[str, int] = field(default_factory=lambda: {"chunk": 0, "address": 0,
                                                              "in_use": 0})
    matched_until: int = -1     # last recorded call before the first divergence (-1: none)
    divergence: dict[str, Any] | None = None
    regions: int = 0
    prologue_bytes: int = 0     # bytes in use before the first record (mid-run start)
    start: StartState | None = None   # the rebuilt state before the first record, if any
    events: int | None = None         # replay only this many trace events (a screening run)
    states_left: int = 1              # start states that matched as far as this one
    refinement: list[str] = field(default_factory=list)  # gaps changed by bfc_start_refine

    def run(self) -> Replay:
        trace, meta = self.trace, self.trace.metadata
        refs = {int(r["event"]): r for r in meta["reference_events"]}
        addresses = [int(r["addr"]) for r in refs.values()]
        floor = address_floor(a + int(r["chunk"]) for a, r in zip(addresses, refs.values()))
        capacity = max(self.limit, 1) * 2
        device = PlacedDevice(DeviceProfile("bfc-recording", capacity, granularity=1), floor)
        policy = BFCAllocator(device.view(0), memory_limit=self.limit,
                              allow_growth=self.allow_growth,
                              garbage_collection=self.garbage_collection)
        prologue = int(meta.get("prologue_events", 0))
        start = self.start
        if start is not None:
            device.places = [base for base, _ in start.regions]
            policy.seed(start.regions, start.live, start.curr_region_allocation_bytes)
        first = min(refs) if refs else 0
        start_in_use = 0
        if refs:
            r0 = refs[first]
            start_in_use = int(r0["in_use"]) - (int(r0["chunk"]) if r0["action"] == "alloc"
                                                else -int(r0["chunk"]))
        prologue_addrs: set[int] = set()
        address_of: dict[int, int] = {}
        ops, ids, sizes = trace.op.tolist(), trace.id.tolist(), trace.size.tolist()
        broken = False
        offset = start_in_use   # bytes in use the model does not hold (set after the prologue)
        for index in range(len(trace) if self.events is None else min(self.events,
                                                                        len(trace))):
            if index == prologue:
                offset = start_in_use - policy.bytes_in_use
            if start is not None and index < prologue:   # live in the seeded state already
                address_of[ids[index]] = start.prologue_address[ids[index]]
                continue
            ref = refs.get(index)
            if ops[index] == OP_ALLOC:
                if ref is not None:
                    device.place = int(ref["addr"])
                address = policy.malloc(sizes[index])
                device.place = None
                if address is None:
                    if ref is not None:
                        self._compare(index, ref, policy, None, None, offset, broken)
                        broken = True
                    continue
                address_of[ids[index]] = address
                if index < prologue:
                    prologue_addrs.add(address)
                if ref is not None:
                    chunk = policy.chunks.size[address]
                    broken = not self._compare(index, ref, policy, address, chunk,
                                               offset, broken) or broken
            else:
                address = address_of.pop(ids[index], None)
                if address is None:
                    continue
                chunk = policy.chunks.size[address]
                policy.free(address)
                if ref is None:
                    continue
                if address in prologue_addrs:
                    prologue_addrs.discard(address)
                    self.unknowable += 1
                    continue
                broken = not self._compare(index, ref, policy, address, chunk,
                                           offset, broken) or broken
            # The prologue (buffers live before recording) is the replay's own guess, not a
            # recorded call: a match "up to event N" counts recorded calls only.
            if not broken and ref is not None:
                self.matched_until = index
        self.regions = len(policy.chunks.regions)
        self.prologue_bytes = start_in_use
        return self

    def _compare(self, index: int, ref: dict[str, Any], policy: BFCAllocator,
                 address: int | None, chunk: int | None, offset: int,
                 broken: bool) -> bool:
        self.total += 1
        want_addr, want_chunk, want_in_use = int(ref["addr"]), int(ref["chunk"]), \
            int(ref["in_use"])
        in_use = policy.bytes_in_use + offset
        ok_chunk = chunk == want_chunk
        ok_addr = address == want_addr
        ok_use = in_use == want_in_use
        self.by_field["chunk"] += ok_chunk
        self.by_field["address"] += ok_addr
        self.by_field["in_use"] += ok_use
        ok = ok_chunk and ok_addr and ok_use
        self.matched += ok
        if not ok and self.divergence is None:
            self.divergence = self._divergence(index, ref, policy, address, chunk, in_use)
        return ok

    def _divergence(self, index: int, ref: dict[str, Any], policy: BFCAllocator,
                    address: int | None, chunk: int | None, in_use: int) -> dict[str, Any]:
        want_addr, want_chunk = int(ref["addr"]), int(ref["chunk"])
        regions = policy.chunks.regions

        def place(addr: int | None) -> dict[str, int] | None:
            if addr is None:
                return None
            for base, size in regions.items():
                if base <= addr < base + size:
                    return {"region": base, "offset": addr - base, "region_bytes": size}
            return None

        action = str(ref["action"])
        if address is None:
            rule = "limit"
        elif action == "free":
            rule = "coalesce" if chunk != want_chunk else "in_use"
        elif address == want_addr and chunk != want_chunk:
            rule = "split"
        elif address != want_addr and place(want_addr) is None:
            rule = "extend"
        elif address != want_addr:
            rule = "best_fit"
        else:
            rule = "in_use"
        rounded = -(-int(self.trace.size[index]) // MIN_ALLOCATION) * MIN_ALLOCATION
        tag = self.trace.tag_name(int(self.trace.tag[index])) if action == "alloc" else None
        return {"event": index, "action": action, "requested": int(ref["requested"]),
                "rounded": rounded, "tag": tag, "rule": rule, "rule_text": RULES[rule],
                "recorded": {"chunk": want_chunk, "address": want_addr,
                             "place": place(want_addr), "in_use": int(ref["in_use"])},
                "model": {"chunk": chunk, "address": address, "place": place(address),
                          "in_use": in_use},
                "model_regions": [[base, size] for base, size in sorted(regions.items())]}


@dataclass
class BFCFidelityReport:
    trace: str
    source: str
    allocator: str
    events: int
    memory_limit: int
    allow_growth: bool
    garbage_collection: bool
    settings_tried: list[dict[str, Any]]
    matched: int
    total: int
    unknowable: int
    by_field: dict[str, int]
    matched_until: int
    started_mid_run: bool
    bytes_in_use_at_start: int
    model_regions: int
    first_divergence: dict[str, Any] | None
    notes: list[str]
    start_state: dict[str, Any] | None = None    # the rebuilt state at the first record
    elapsed_s: float = 0.0

    @property
    def exit_status(self) -> int:
        return 0 if self.total and self.matched == self.total else 1

    def to_json_dict(self) -> dict[str, Any]:
        return {"schema": 1, "kind": "bfc", "trace": self.trace, "source": self.source,
                "allocator": self.allocator, "events": self.events, "policy": "bfc",
                "memory_limit": self.memory_limit, "allow_growth": self.allow_growth,
                "garbage_collection": self.garbage_collection,
                "settings_tried": self.settings_tried, "matched": self.matched,
                "total": self.total, "unknowable": self.unknowable, "by_field": self.by_field,
                "matched_until": self.matched_until, "started_mid_run": self.started_mid_run,
                "bytes_in_use_at_start": self.bytes_in_use_at_start,
                "model_regions": self.model_regions, "start_state": self.start_state,
                "first_divergence": self.first_divergence, "notes": self.notes,
                "exit_status": self.exit_status}

    def text(self) -> str:
        share = 100.0 * self.matched / self.total if self.total else 0.0
        lines = [f"trace {self.trace}: {self.events:,} events, BFC allocator "
                 f"{self.allocator or '<unnamed>'}, limit {format_size(self.memory_limit)}",
                 f"model bfc: memory_limit={self.memory_limit} allow_growth="
                 f"{self.allow_growth} garbage_collection={self.garbage_collection} "
                 "(growth settings inferred: best of "
                 + ", ".join(f"{s['allow_growth']}/{s['garbage_collection']} {s['matched']}"
                             for s in self.settings_tried) + ")",
                 f"matched {self.matched:,}/{self.total:,} records ({share:.1f}%): chunk size "
                 f"{self.by_field['chunk']:,}, address {self.by_field['address']:,}, bytes in "
                 f"use {self.by_field['in_use']:,}"]
        if self.unknowable:
            lines.append(f"not knowable: {self.unknowable:,} records (buffers allocated "
                         "before recording)")
        if self.started_mid_run:
            lines.append(f"recording started mid-run: "
                         f"{format_size(self.bytes_in_use_at_start)} in use before the first "
                         "record")
            state = self.start_state
            if state is not None:
                lines.append("  state at the first record rebuilt from the records: regions "
                             + ", ".join(f"{format_size(size)} at {base:#x}"
                                         for base, size in state["regions"])
                             + f"; {state['live_chunks']} live chunks "
                             f"({format_size(state['live_bytes'])})"
                             + "".join(f"; {g}" for g in state["guesses"][1:]))
                if state.get("states_left", 1) > 1:
                    lines.append(f"  the records leave {state['states_left']} start states "
                                 "that match as far; this is the first")
        div = self.first_divergence
        if div is None:
            lines.append("every compared record matched")
        else:
            rec, mod = div["recorded"], div["model"]

            def where(d: dict[str, Any]) -> str:
                if d["address"] is None:
                    return "nothing (refused)"
                spot = d["place"]
                at = (f"region {spot['region']:#x}+{spot['offset']:#x}" if spot
                      else "outside the model's regions")
                return f"chunk {d['chunk']} at {d['address']:#x} ({at}), in use {d['in_use']}"

            lines += [(f"matched without a break up to event {self.matched_until:,}"
                       if self.matched_until >= 0 else "no recorded call matched before the "
                       "first divergence"),
                      f"first divergence at event {div['event']:,}: {div['action']} of "
                      f"{div['requested']} B (rounded {div['rounded']})"
                      + (f" [{div['tag']}]" if div.get("tag") else ""),
                      f"  recorded: {where(rec)}",
                      f"  model:    {where(mod)}",
                      f"  rule: {div['rule_text']}"]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def bfc_fidelity(trace: Trace, *, allow_growth: bool | None = None,
                 garbage_collection: bool | None = None) -> BFCFidelityReport:
    """Replay a BFC recording through ``bfc`` and compare after every call (module docstring).
    Growth settings given are used as they are; those not given are inferred."""
    started = time.perf_counter()
    if not is_bfc_recording(trace):
        raise BFCFidelityError(f"{trace.metadata.get('source', trace.name)}: not a BFC "
                               "recording (expected a profiler .xplane.pb or log folder)")
    meta = trace.metadata
    try:
        check_allocator_records(trace)
    except TraceError as error:
        raise BFCFidelityError(str(error)) from None
    limit = int(meta["bfc_memory_limit"]) if meta.get("bfc_memory_limit") else \
        _record_limit(meta["reference_events"][0])
    tried = [s for s in SETTINGS if (allow_growth is None or s[0] == allow_growth)
             and (garbage_collection is None or s[1] == garbage_collection)]
    states, why_not = _start_states(trace, limit)
    replays = [_best_replay(trace, limit, growth, gc, states.get(growth, []))
               for growth, gc in tried]
    best = max(replays, key=lambda r: (r.matched, r.matched_until))   # first wins ties
    notes = []
    if best.start is not None and best.matched < best.total:
        at = replays.index(best)
        best, stopped = _refined(trace, limit, best)
        replays[at] = best
        if stopped:
            notes.append(f"the start state's refinement stopped after replaying "
                         f"{MAX_REPLAYED_EVENTS:,} events "
                         "(sim/questions/fidelity/bfc_start_refine.py); "
                         "the state it reached is reported")
    if best.prologue_bytes and best.start is None:
        reason = why_not.get(best.allow_growth, "")
        notes.append("the allocator's state at the first record was not rebuilt"
                     + (f": {reason}" if reason else "") + "; the replay starts from nothing, "
                     "so places and chunk sizes after the start may differ for that alone")
    elif best.start is not None and why_not.get(best.allow_growth):   # found some, gave up
        notes.append(why_not[best.allow_growth])
    if meta.get("time_ties"):
        notes.append(f"{meta['time_ties']} groups of records share a timestamp; ordered by "
                     "the bytes_allocated chain")
    if best.prologue_bytes and not meta.get("prologue_events"):
        notes.append("bytes in use before recording belong to buffers never freed in it")
    return BFCFidelityReport(
        trace=trace.name, source=str(meta.get("source", "")),
        allocator=str(meta.get("allocator", "")), events=len(trace), memory_limit=limit,
        allow_growth=best.allow_growth, garbage_collection=best.garbage_collection,
        settings_tried=[{"allow_growth": r.allow_growth,
                         "garbage_collection": r.garbage_collection, "matched": r.matched}
                        for r in replays],
        matched=best.matched, total=best.total, unknowable=best.unknowable,
        by_field=best.by_field, matched_until=best.matched_until,
        started_mid_run=best.prologue_bytes > 0, bytes_in_use_at_start=best.prologue_bytes,
        model_regions=best.regions, first_divergence=best.divergence, notes=notes,
        start_state=_describe(best), elapsed_s=time.perf_counter() - started)


def _start_in_use(refs: list[dict[str, Any]]) -> int:
    if not refs:
        return 0
    r0 = refs[0]
    return int(r0["in_use"]) - (int(r0["chunk"]) if r0["action"] == "alloc"
                                else -int(r0["chunk"]))


def _record_limit(first: dict[str, Any]) -> int:
    """The memory limit the first record gives: available + reserved + in use."""
    return int(first["available"]) + int(first["reserved"]) + int(first["in_use"])


def _start_states(trace: Trace, limit: int) -> tuple[dict[bool, list[StartState]],
                                                     dict[bool, str]]:
    """For each allow_growth, the start states a mid-run recording allows
    (sim/questions/fidelity/bfc_start.py), or why there are none."""
    refs = sorted(trace.metadata["reference_events"], key=lambda r: int(r["event"]))
    start_in_use = _start_in_use(refs)
    if start_in_use <= 0:
        return {}, {}
    prologue_ids = set(trace.id[:int(trace.metadata.get("prologue_events", 0))].tolist())
    prologue = {}
    for k, ref in enumerate(refs):
        buffer = int(trace.id[int(ref["event"])])
        if ref["action"] == "free" and buffer in prologue_ids and buffer not in prologue:
            prologue[buffer] = k
    states, why = {}, {}
    for growth in (True, False):
        first = round_bytes(min(limit, 2 << 20)) if growth else round_bytes(limit)
        states[growth], why[growth] = start_states(refs, prologue, start_in_use, limit, first)
    return states, why


def _best_replay(trace: Trace, limit: int, growth: bool, gc: bool,
                 states: list[StartState]) -> Replay:
    """The replay from the rebuilt start state that matches most, or from nothing when there
    is none. States are screened on a growing prefix of the trace (64 events, then 4x), each
    round keeping those that match most of it, so that thousands of arrangements cost a few
    full replays; the survivors are replayed whole."""

    def run(state: StartState, events: int | None) -> Replay | None:
        try:
            return Replay(trace, limit, growth, gc, start=state, events=events).run()
        except ValueError:      # a state the allocator cannot be seeded with (overlaps)
            return None

    for state in states[:SCREEN_KEEP]:      # the likeliest arrangements come first
        replay = run(state, None)
        if replay is not None and replay.matched == replay.total:
            return replay
    survivors = list(states)
    events = 64
    while len(survivors) > SCREEN_KEEP and events < len(trace):
        scored = [(replay.matched, k) for k, state in enumerate(survivors)
                  if (replay := run(state, events)) is not None]
        top = max((m for m, _ in scored), default=0)
        survivors = [survivors[k] for m, k in scored if m == top][:SCREEN_CAP]
        events *= 4
    best: Replay | None = None
    for state in survivors:
        replay = run(state, None)
        if replay is not None and (best is None or (replay.matched, replay.matched_until)
                                   > (best.matched, best.matched_until)):
            best = replay
            if best.matched == best.total:
                break
    return best if best is not None else Replay(trace, limit, growth, gc).run()


def _refined(trace: Trace, limit: int, best: Replay) -> tuple[Replay, bool]:
    """``best`` (a replay from a rebuilt start state that diverges) with its start state
    decided further by the records after it (:mod:`~allocsim.sim.questions.
    bfc_start_refine`); and whether the refinement stopped at its bound."""

    def run(state: StartState, events: int | None) -> Replay | None:
        try:
            return Replay(trace, limit, best.allow_growth, best.garbage_collection,
                          start=state, events=events).run()
        except ValueError:      # a state the allocator cannot be seeded with
            return None

    assert best.start is not None
    found = refine(best.start, best, lambda r: (r.matched_until, r.matched), best.total, run,
                   len(trace))
    found.replay.states_left = found.left
    found.replay.refinement = found.changes
    return found.replay, found.stopped


def _describe(replay: Replay) -> dict[str, Any] | None:
    state = replay.start
    if state is None:
        return None
    return {"regions": [[base, size] for base, size in state.regions],
            "live_chunks": len(state.live), "live_bytes": sum(c for _, c, _ in state.live),
            "curr_region_allocation_bytes": state.curr_region_allocation_bytes,
            "guesses": state.guesses + replay.refinement, "states_left": replay.states_left}
