"""Matching the model's device calls against the recorded ones, and the final segments.

Within each point of the trace (an :class:`~allocsim.sim.questions.fidelity.recording.Episode`)
the recorded calls and the model's are compared as ``(action, size)`` lists: equal lists
match whole; otherwise difflib's longest matching blocks count what still matches, so one
divergence does not hide every later match, and the rest of the model's calls are *extra*.
The first point that differs is kept as the first divergence. At the end the recording's
segments are compared with the model's by count and sizes (:func:`final_comparison`).
"""

from __future__ import annotations

from collections import Counter
from difflib import SequenceMatcher
from typing import Any

from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.sim.questions.fidelity.recording import Episode, recorded_final_sizes
from allocsim.traces.model import OP_ALLOC, Trace

__all__ = ["CONTEXT_EVENTS", "Matcher", "final_comparison", "segment_summary",
           "trace_context"]

CONTEXT_EVENTS = 5                       # trace events shown either side of a divergence
Call = tuple[str, int]                   # (action, bytes)


class Matcher:
    """Counts of matched, extra and per-action matched calls over a replay, and the first
    divergence (a dict, completed by :func:`allocsim.sim.questions.fidelity.pytorch.fidelity`)."""

    def __init__(self, refs: list[dict[str, Any]], episodes: list[Episode]) -> None:
        self.refs = refs
        self.episodes = episodes
        self.matched = 0
        self.extra = 0
        self.matched_by_action: Counter[str] = Counter()
        self.divergence: dict[str, Any] | None = None
        self.divergence_at: tuple[int, int | None] | None = None

    def compare(self, entries: list[int], simulated: list[Call], event: int, where: str) -> None:
        """Compare recorded entries ``entries`` with the model's calls ``simulated``, both
        made before trace event ``event`` (``where`` says what made them). Equal lists cost
        O(calls); others difflib's O(calls²) — a point holds a handful of calls."""
        refs = self.refs
        recorded = [(refs[j]["action"], refs[j]["size"]) for j in entries]
        if recorded == simulated:
            self.matched += len(recorded)
            for action, _ in recorded:
                self.matched_by_action[action] += 1
            return
        matcher = SequenceMatcher(None, recorded, simulated, autojunk=False)
        same = 0
        for block in matcher.get_matching_blocks():
            same += block.size
            for action, _ in recorded[block.a:block.a + block.size]:
                self.matched_by_action[action] += 1
        self.matched += same
        self.extra += len(simulated) - same
        if self.divergence is None:
            self._diverged(entries, recorded, simulated, event, where)

    def _diverged(self, entries: list[int], recorded: list[Call], simulated: list[Call],
                  event: int, where: str) -> None:
        """Keep the first divergence: the first call that differs, and the point it is in."""
        refs = self.refs
        position = next(p for p in range(max(len(recorded), len(simulated)))
                        if p >= len(recorded) or p >= len(simulated)
                        or recorded[p] != simulated[p])
        if position < len(entries):
            index = entries[position]
        else:
            index = entries[-1] + 1 if entries else self._next_ref(event)
        ref = refs[index] if position < len(entries) else None
        self.divergence = {
            "index": index, "event": event, "where": where,
            "recorded": None if ref is None else {
                "action": ref["action"], "size": ref["size"], "addr": ref.get("addr"),
                "stream": ref.get("stream"), "time_ns": ref.get("time_ns"),
                **({"device_free": ref.get("device_free")} if ref["action"] == "oom" else {})},
            "simulated": None if position >= len(simulated) else {
                "action": simulated[position][0], "size": simulated[position][1]},
            "episode_start": entries[0] if entries else index,
            "recorded_here": [list(r) for r in recorded],
            "simulated_here": [list(s) for s in simulated],
        }
        episode = next((k for k, e in enumerate(self.episodes)
                        if e.event == event and e.entries == entries and e.kind != "event"),
                       None)
        self.divergence_at = (event, episode)

    def _next_ref(self, event: int) -> int:
        """Index of the first recorded entry at or after trace event ``event``."""
        return next((j for j, r in enumerate(self.refs) if r["event"] >= event), len(self.refs))


def final_comparison(initial: list[dict[str, Any]], refs: list[dict[str, Any]],
                     policy: PyTorchCachingAllocator) -> dict[str, Any]:
    """The recording's final segments (:func:`~allocsim.sim.questions.fidelity.recording.
    recorded_final_sizes`) against the model's, by count and sizes."""
    recorded = recorded_final_sizes(initial, refs)
    model = sorted(s["total_size"] for s in policy.segments())
    only_recorded = list((Counter(recorded) - Counter(model)).elements())
    only_model = list((Counter(model) - Counter(recorded)).elements())
    return {"match": recorded == model, "recorded_count": len(recorded),
            "model_count": len(model), "recorded_bytes": sum(recorded),
            "model_bytes": sum(model), "only_recorded": sorted(only_recorded),
            "only_model": sorted(only_model)}


def segment_summary(policy: PyTorchCachingAllocator) -> list[dict[str, Any]]:
    """Per model segment: address, size, pool, stream, allocated bytes, block counts and
    its largest free block."""
    out = []
    for seg in policy.segments():
        free = [b["size"] for b in seg["blocks"] if b["state"] == "inactive"]
        out.append({"address": seg["address"], "total_size": seg["total_size"],
                    "segment_type": seg["segment_type"], "stream": seg["stream"],
                    "allocated_size": seg["allocated_size"], "blocks": len(seg["blocks"]),
                    "free_blocks": len(free), "largest_free": max(free, default=0)})
    return out


def trace_context(trace: Trace, event: int) -> list[dict[str, Any]]:
    """The trace events within :data:`CONTEXT_EVENTS` of ``event``, as report rows."""
    lo, hi = max(0, event - CONTEXT_EVENTS), min(len(trace), event + CONTEXT_EVENTS + 1)
    rows = []
    for i in range(lo, hi):
        rows.append({"index": i, "op": "alloc" if trace.op[i] == OP_ALLOC else "free",
                     "id": int(trace.id[i]), "size": int(trace.size[i]),
                     "stream": int(trace.stream[i]), "time_ns": int(trace.time_ns[i]),
                     "tag": trace.tag_name(int(trace.tag[i]))})
    return rows
