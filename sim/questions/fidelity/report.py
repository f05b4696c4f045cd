"""The fidelity report: how far the model's device calls follow the recorded ones.

:class:`FidelityReport` is what :func:`allocsim.sim.questions.fidelity.pytorch.fidelity`
returns: the counts (matched, total, extra, per action), the first divergence with the trace and the
model's segments around it, the final segments of both, and the notes; as one screen of text
(:meth:`FidelityReport.text`) or one JSON object (:meth:`FidelityReport.to_json_dict`,
schema 1, no wall-clock figures).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from allocsim.policies import format_size

__all__ = ["FidelityReport", "segments_text"]


@dataclass
class FidelityReport:
    """How far the model's device calls follow the recorded ones (see the module docstring)."""

    trace: str
    source: str
    events: int
    policy: str
    settings: dict[str, Any]
    not_modelled: list[str]
    capacity: int
    capacity_source: str
    matched: int
    total: int
    extra: int
    by_action: dict[str, dict[str, int]]
    first_divergence: dict[str, Any] | None
    final_segments_match: bool
    final_segments: dict[str, Any]
    empty_cache_calls: int
    injected_ooms: int
    seeded_segments: int
    seeded_blocks: int
    notes: list[str]
    elapsed_s: float = 0.0

    @property
    def all_matched(self) -> bool:
        return self.matched == self.total and self.extra == 0

    @property
    def exit_status(self) -> int:
        """0 when every recorded call matched, none was extra and the final segments agree."""
        return 0 if self.all_matched and self.final_segments_match else 1

    def to_json_dict(self) -> dict[str, Any]:
        return {"schema": 1, "trace": self.trace, "source": self.source, "events": self.events,
                "policy": self.policy, "settings": self.settings,
                "not_modelled": self.not_modelled, "capacity": self.capacity,
                "capacity_source": self.capacity_source, "matched": self.matched,
                "total": self.total, "extra": self.extra, "by_action": self.by_action,
                "all_matched": self.all_matched, "first_divergence": self.first_divergence,
                "final_segments_match": self.final_segments_match,
                "final_segments": self.final_segments,
                "empty_cache_calls": self.empty_cache_calls,
                "injected_ooms": self.injected_ooms, "seeded_segments": self.seeded_segments,
                "seeded_blocks": self.seeded_blocks, "notes": self.notes,
                "exit_status": self.exit_status}

    def text(self) -> str:
        """One screen."""
        share = f"{self.matched / self.total:.1%}" if self.total else "nothing recorded"
        actions = ", ".join(f"{a} {c['matched']}/{c['recorded']}"
                            for a, c in self.by_action.items() if c["recorded"] or c["matched"])
        lines = [f"fidelity of {self.policy} on {self.trace} ({self.events:,} events)",
                 f"  device      {format_size(self.capacity)} — {self.capacity_source}"]
        if self.not_modelled:
            lines.append("  not modelled: " + "; ".join(self.not_modelled))
        if self.seeded_segments:
            lines.append(f"  start       {self.seeded_segments} recorded segments seeded, "
                         f"{self.seeded_blocks} blocks live in them")
        lines.append(f"  matched     {self.matched:,}/{self.total:,} recorded device calls "
                     f"({share}){': ' + actions if actions else ''}")
        lines.append(f"  extra       {self.extra:,} simulated calls the recording did not make")
        if self.empty_cache_calls or self.injected_ooms:
            lines.append(f"  replayed    {self.empty_cache_calls} inferred empty_cache() calls, "
                         f"{self.injected_ooms} recorded OOM requests")
        final = self.final_segments
        lines.append(f"  final       {'match' if self.final_segments_match else 'DIFFER'}: "
                     f"recorded {final['recorded_count']} segments "
                     f"({format_size(final['recorded_bytes'])}), model {final['model_count']} "
                     f"({format_size(final['model_bytes'])})")
        if not self.final_segments_match:
            lines.append(f"              only recorded: {_sizes_text(final['only_recorded'])}; "
                         f"only model: {_sizes_text(final['only_model'])}")
        for note in self.notes:
            lines.append(f"  note        {note}")
        d = self.first_divergence
        if d is None:
            lines.append("result: every recorded decision reproduced (exit 0)"
                         if self.exit_status == 0 else "result: the final segments differ (exit 1)")
        else:
            lines += _divergence_lines(d)
        return "\n".join(lines)


def _divergence_lines(d: dict[str, Any]) -> list[str]:
    """The first divergence: the calls, reserved bytes, the trace and the model's segments."""
    lines = [f"result: DIVERGES (exit 1); first divergence before trace event "
             f"{d['event']:,} ({d['where']}), recorded entry #{d['index']}:",
             f"  recorded    {_call_text(d['recorded'])}   [here: "
             f"{_list_text(d['recorded_here'])}]",
             f"  simulated   {_call_text(d['simulated'])}   [here: "
             f"{_list_text(d['simulated_here'])}]",
             f"  reserved    recorded {format_size(d['recorded_reserved'])}, model "
             f"{format_size(d['model_reserved'])} (before this point)",
             "  trace around it:"]
    for e in d["trace_events"]:
        mark = ">" if e["index"] == d["event"] else " "
        lines.append(f"   {mark}{e['index']:>9,} {e['op']:5s} id {e['id']:<8} "
                     f"{format_size(e['size']):>10s}  stream {e['stream']}  {e['tag'] or ''}")
    lines.append("  model segments then: " + segments_text(d["model_segments"]))
    return lines


def segments_text(segments: list[dict[str, Any]]) -> str:
    """One line for a :func:`~allocsim.sim.questions.fidelity.match.segment_summary` list:
    counts by pool and size, free space."""
    if not segments:
        return "none"
    total = sum(s["total_size"] for s in segments)
    free = sum(s["total_size"] - s["allocated_size"] for s in segments)
    largest = max(s["largest_free"] for s in segments)
    kinds = Counter((s["segment_type"], s["total_size"]) for s in segments)
    shown = ", ".join(f"{n}×{format_size(size, 0)} {kind}" for (kind, size), n in
                      sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))[:5])
    more = " …" if len(kinds) > 5 else ""
    return (f"{len(segments)} ({format_size(total)}; {format_size(free)} free inside, largest "
            f"free block {format_size(largest)}): {shown}{more}")


def _call_text(call: dict[str, Any] | None) -> str:
    if call is None:
        return "nothing"
    return f"{call['action']} {format_size(call['size'])}"


def _list_text(calls: list[list[Any]]) -> str:
    if not calls:
        return "none"
    shown = ", ".join(f"{a} {format_size(s, 0)}" for a, s in calls[:4])
    return shown + (f", … ({len(calls)})" if len(calls) > 4 else "")


def _sizes_text(sizes: list[int]) -> str:
    if not sizes:
        return "none"
    counts = Counter(sizes)
    return ", ".join(f"{n}×{format_size(s, 0)}" for s, n in sorted(counts.items())[:6])
