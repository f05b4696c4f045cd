"""The seeded replay: a snapshot trace through the ``pytorch`` model, compared as it goes.

:class:`Replay` builds the model as recorded (settings, capacity, a
:class:`~allocsim.sim.questions.fidelity.device.RecordedAddressDevice`), seeds it with the
segments recording started in, then walks the trace once: before each point with recorded
entries it replays what the recording shows happened there without a trace event (an
inferred empty_cache(), a failed request and its release path, a failed cudaMalloc's retry)
and hands the device the recorded segments as address hints; after each event that made a
device call (or was expected to) it compares the model's calls with the recorded ones
(:class:`~allocsim.sim.questions.fidelity.match.Matcher`). Why each step is done so:
:mod:`allocsim.sim.questions.fidelity.pytorch`, "What it follows".

Cost: one pass, O(events) with no per-event allocation beyond the live-buffer dict, plus the
policy's own work; the comparison and episode handling run only at the (rare) points with
device calls.
"""

from __future__ import annotations

from typing import Any

from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.policies.pytorch.snapshot import segment_is_small
from allocsim.sim.kernel.device import DeviceCall, DeviceProfile
from allocsim.sim.questions.fidelity.device import RecordedAddressDevice, address_floor
from allocsim.sim.questions.fidelity.match import Matcher
from allocsim.sim.questions.fidelity.recording import (
    GROW_ACTIONS,
    Episode,
    FidelityError,
    expandable_range_bases,
)
from allocsim.sim.questions.fidelity.settings import SnapshotSettings
from allocsim.sim.questions.fidelity.start import sized_start_segments
from allocsim.traces.model import OP_ALLOC, Trace

__all__ = ["CALL_ACTION", "Replay", "stream_ranks"]

CALL_ACTION = {"malloc": "segment_alloc", "free": "segment_free", "map": "segment_map",
               "unmap": "segment_unmap"}
Stop = tuple[int, int | None]            # (trace event, episode index or None)


def stream_ranks(trace: Trace) -> dict[int, int]:
    """Small stream id → rank of its raw ``cudaStream_t`` handle. The importer numbers
    streams by first appearance, but PyTorch orders a pool by the raw handle (stream, size,
    address) — which is what decides the order empty_cache() and the OOM path release
    segments in — so the model gets streams numbered in raw-handle order."""
    handles: dict[int, int] = {}
    for small, raw in (trace.metadata.get("stream_handles") or {}).items():
        try:
            handles[int(small)] = int(raw)
        except (TypeError, ValueError):
            continue
    for small in trace.streams():
        handles.setdefault(small, small)
    order = sorted(handles, key=lambda small: (handles[small], small))
    return {small: rank for rank, small in enumerate(order)}


class Replay:
    """One replay of a snapshot trace through the seeded model, comparing as it goes."""

    def __init__(self, trace: Trace, settings: SnapshotSettings, capacity: int,
                 refs: list[dict[str, Any]], episodes: list[Episode]) -> None:
        meta = trace.metadata
        self.trace = trace
        self.refs = refs
        self.episodes = episodes
        self.ranks = stream_ranks(trace)
        initial = [dict(s, stream=self.ranks.get(int(s.get("stream", 0)), int(s.get("stream", 0))))
                   for s in meta.get("initial_segments") or []]
        floor = address_floor([int(s["address"]) + int(s["total_size"]) for s in initial]
                              + [int(r.get("addr") or 0) + int(r["size"]) for r in refs])
        profile = DeviceProfile("snapshot", capacity, granularity=512)
        self.device = RecordedAddressDevice(profile, floor)
        self.view = self.device.view(0)
        policy = settings.spec.build(self.view)
        if not isinstance(policy, PyTorchCachingAllocator):
            raise RuntimeError(f"fidelity models PyTorch's allocator; {settings.spec} built "
                               f"a {type(policy).__name__}")
        policy.keep_memory_stats(False)     # fidelity compares device calls, not memory_stats()
        self.policy = policy
        self.notes: list[str] = []
        self.seeded_segments = 0
        self.seeded_blocks = 0
        # Blocks freed in the recording are sized here by the model's own split rule.
        initial = sized_start_segments(initial, policy)
        self.prologue_map = self._seed(initial, int(meta.get("prologue_events") or 0))
        self.log: list[DeviceCall] = []
        self.view.log = self.log
        self.device.hints = []
        self.match = Matcher(refs, episodes)
        self.empty_cache_calls = 0
        self.injected_ooms = 0

    # -- the start state ------------------------------------------------------------
    def _seed(self, initial: list[dict[str, Any]], prologue: int) -> dict[int, int]:
        """Seed the model with the recorded start segments of its kind; map prologue event
        index → the model's address of its block.

        Ordinary segments are handed to the device as ``segment_alloc`` hints, so each
        takes its recorded address. Expandable segments (the mapped ranges at the start)
        are grouped by (stream, pool) into one virtual range each, starting at the lowest
        address known to lie in it (:func:`~allocsim.sim.questions.fidelity.recording.
        expandable_range_bases`: the ranges at the start and the later maps of that range;
        ``range_base`` on each segment); the device gets those bases as ``address_range``
        hints in address order, the order seed() asks for the ranges in, so the ranges and
        their blocks lie where the recording's lay. Segments of the other kind than the
        model's (all segments are one kind in the model) are not seeded, said in a note."""
        expandable = self.policy.expandable
        seedable = [s for s in initial if bool(s.get("is_expandable")) == expandable]
        if len(seedable) < len(initial):
            other = len(initial) - len(seedable)
            if expandable:
                self.notes.append(f"the model uses expandable segments but the recording started "
                                  f"with {other} ordinary segments: not seeded, their live "
                                  "blocks are allocated afresh")
            else:
                self.notes.append(f"{other} expandable segments at the start are not seeded "
                                  "(the model does not use expandable segments): their live "
                                  "blocks are allocated afresh")
        ordered = sorted(seedable, key=lambda s: int(s["address"]))
        if expandable:
            bases = expandable_range_bases(ordered, self.refs, self.ranks)
            ordered = [dict(s, range_base=bases[(int(s.get("stream", 0)),
                                                 segment_is_small(s))]) for s in ordered]
            self.device.hints = [("address_range", base, 0) for base in sorted(bases.values())]
        else:
            self.device.hints = [("segment_alloc", int(s["address"]), int(s["total_size"]))
                                 for s in ordered]
        try:
            mapping = self.policy.seed(ordered) if ordered else {}
        except ValueError as err:
            raise FidelityError(f"cannot start from the recorded segments: {err}") from None
        self.seeded_segments = len(ordered)
        self.seeded_blocks = len(mapping)
        return self._prologue_addresses(ordered, mapping, prologue)

    def _prologue_addresses(self, seedable: list[dict[str, Any]], mapping: dict[int, int],
                            prologue: int) -> dict[int, int]:
        """Prologue event index → the model's address of the seeded block it stands for: the
        prologue allocs and the active blocks, both in address order, paired by size."""
        blocks = sorted(mapping)
        requested = {}
        for seg in seedable:
            for block in seg.get("blocks") or []:
                if str(block.get("state", "")).startswith("active"):
                    requested[int(block["address"])] = (int(block.get("requested_size") or 0)
                                                        or int(block["size"]))
        sizes = self.trace.size[:prologue].tolist()
        result: dict[int, int] = {}
        q = 0
        for p in range(prologue):
            if q < len(blocks) and requested[blocks[q]] == sizes[p]:
                result[p] = mapping[blocks[q]]
                q += 1
        unmatched = prologue - len(result)
        if unmatched:
            self.notes.append(f"{unmatched} blocks live at the start lie in no seeded segment: "
                              "allocated afresh")
        return result

    # -- running ----------------------------------------------------------------------
    def run(self, stop: Stop | None = None) -> None:
        """Replay to the end, or stop just before ``(event, episode index)`` (episode None:
        before trace event ``event`` itself). The per-event path of fidelity."""
        trace = self.trace
        ops = trace.op.tolist()
        ids = trace.id.tolist()
        sizes = trace.size.tolist()
        ranks = self.ranks
        streams = [ranks[s] for s in trace.stream.tolist()] if any(
            small != rank for small, rank in ranks.items()) else trace.stream.tolist()
        n = len(ops)
        episodes = self.episodes
        policy, view, device = self.policy, self.view, self.device
        malloc, free = policy.malloc, policy.free
        compare = self.match.compare
        prologue = self.prologue_map
        live: dict[int, int] = {}
        k = 0
        next_episode = episodes[0].event if episodes else n + 1
        calls = view.calls
        for i in range(n + 1):
            expected: list[int] | None = None
            if i == next_episode:
                k, expected = self._before_event(i, k, stop)
                if k < 0:
                    return
                next_episode = episodes[k].event if k < len(episodes) else n + 1
                calls = view.calls
            if stop is not None and stop == (i, None):
                return
            if i == n:
                if expected is not None:
                    compare(expected, [], i, "end")
                break
            if expected is not None:
                device.hints = self._hints(expected)
            failed = 0
            if ops[i] == OP_ALLOC:
                if i in prologue:
                    live[ids[i]] = prologue[i]
                else:
                    size = sizes[i]
                    if size > 0:
                        address = malloc(size, streams[i])
                        if address is None:
                            failed = size
                        else:
                            live[ids[i]] = address
            else:
                freed = live.pop(ids[i], None)
                if freed is not None:
                    free(freed)
            if view.calls != calls or failed or expected is not None:
                made = view.calls - calls
                calls = view.calls
                simulated = self._simulated(made, failed, streams[i])
                compare(expected or [], simulated, i,
                        "alloc" if ops[i] == OP_ALLOC else "free")
                device.hints = []
                device.pressure = 0

    def _before_event(self, i: int, k: int, stop: Stop | None
                      ) -> tuple[int, list[int] | None]:
        """Replay the episodes recorded before trace event ``i`` (from episode ``k`` on) that
        no trace event made; ``(next episode, the entries event i itself is expected to make
        or None)``, or ``(-1, None)`` when ``stop`` is reached."""
        episodes = self.episodes
        expected: list[int] = []
        while k < len(episodes) and episodes[k].event == i:
            episode = episodes[k]
            if episode.kind == "event":
                expected += episode.entries
                k += 1
                break
            if stop == (i, k):
                return -1, None
            if episode.kind == "burst" and self._retry_path(episode):
                # The alloc's own retry after a failed cudaMalloc: the device refuses
                # new memory until as many segments went back as the recording shows.
                self.device.pressure = len(episode.entries)
                expected += episode.entries
            else:
                self._pre_episode(episode)
            k += 1
        return k, expected or None

    def _hints(self, entries: list[int]) -> list[tuple[str, int, int]]:
        """The recorded segments among ``entries``, as the device's address hints."""
        refs = self.refs
        return [(refs[j]["action"], refs[j]["addr"] or 0, refs[j]["size"]) for j in entries
                if refs[j]["action"] in GROW_ACTIONS]

    def _retry_path(self, episode: Episode) -> bool:
        """Is a ``burst`` the alloc's retry path rather than an empty_cache()? Only where
        they differ: max_split_size set (the retry first frees oversize blocks one by one)
        and the burst is not exactly what empty_cache() would release now (every unsplit
        free segment, large pool first, then by stream, size and address)."""
        policy = self.policy
        if policy.expandable or policy.max_split_size >= (1 << 62):
            return False
        unsplit = sorted((seg["segment_type"] == "small", seg["stream"], seg["total_size"],
                          seg["address"]) for seg in policy.segments()
                         if len(seg["blocks"]) == 1 and seg["blocks"][0]["state"] == "inactive")
        recorded = [self.refs[j]["size"] for j in episode.entries]
        return recorded != [size for _, _, size, _ in unsplit]

    def _pre_episode(self, episode: Episode) -> None:
        """Replay an inferred empty_cache() or a recorded failed request."""
        if episode.kind in ("empty_cache", "burst"):
            self._empty_cache(episode)
        else:
            self._failed_request(episode)

    def _empty_cache(self, episode: Episode) -> None:
        before = self.view.calls
        self.empty_cache_calls += 1
        self.policy.empty_cache()
        self.match.compare(episode.entries, self._simulated(self.view.calls - before, 0, 0),
                           episode.event, "empty_cache()")

    def _failed_request(self, episode: Episode) -> None:
        """The recorded request that failed: the model is expected to fail it too (and gives
        the block straight back when it does not: the program never got it)."""
        before = self.view.calls
        oom = self.refs[episode.entries[-1]]
        self.injected_ooms += 1
        self.device.hints = self._hints(episode.entries)
        size = max(1, int(oom["size"]))
        stream = int(oom.get("stream") or 0)
        address = self.policy.malloc(size, self.ranks.get(stream, stream))
        simulated = self._simulated(self.view.calls - before, size if address is None else 0, 0)
        if address is not None:
            self.policy.free(address)
        self.device.hints = []
        self.match.compare(episode.entries, simulated, episode.event, "recorded OOM request")

    def _simulated(self, made: int, failed: int, stream: int) -> list[tuple[str, int]]:
        """The last ``made`` device calls (failed ones are not recorded by PyTorch either),
        plus an oom for a failed request of ``failed`` bytes."""
        log = self.log
        calls = [(CALL_ACTION[c.kind], c.nbytes) for c in log[len(log) - made:] if c.ok] \
            if made else []
        if failed:
            calls.append(("oom", self.policy.rounded_size(failed)))
        if len(log) > 4096:
            del log[:]
        return calls
