"""Compare policies on one trace and name the winner, with the reason.

The winner rule (documented in the README, stable for CI):
1. it completes the trace without an OOM;
2. its modelled allocator time keeps the run within the slowdown budget (default 1.10: the
   allocator may add at most 10% to the trace's duration) — without this, caching nothing
   (on-demand) would always "win" on memory while making the job several times slower;
   ``max_slowdown=None`` (``--max-slowdown inf``) drops the budget;
3. the lowest peak reserved; ties go to the lowest modelled allocator time, then to the policy
   spec in alphabetical order.
If no policy passes 1 and 2, there is no winner. The offline plan (``offline``), when compared,
is a bound and never the winner; the reason says how much it leaves to win. The reason says
what the winner saved over the runner-up, what it cost, and which policies the budget
excluded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from allocsim.policies import PolicySpec, format_size, parse_policy
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.engine import replay
from allocsim.sim.kernel.results import SCHEMA_VERSION, RunResult
from allocsim.sim.questions.framework_settings import Choice
from allocsim.sim.questions.offline import OFFLINE_NAME, offline_result
from allocsim.traces.model import Trace

DEFAULT_MAX_SLOWDOWN = 1.10
# The mark every comparison document carries (results.json, --json): how allocsim knows a
# results.json it may replace from a user's file of the same name (sim/output/ownership.py).
KIND_KEY = "kind"
COMPARE_KIND = "allocsim-compare"


@dataclass
class Comparison:
    """Every policy's result on one trace, and the verdict."""

    trace: dict[str, Any]
    device: DeviceProfile
    results: list[RunResult]
    winner: str | None
    reason: str
    max_slowdown: float | None = DEFAULT_MAX_SLOWDOWN
    # What was compared and why: a framework's settings (each with its lines to paste) or
    # the generic policies; None for a comparison made without one (the Python API's).
    choice: Choice | None = None

    def label(self, policy: str) -> str:
        """How the table and the verdict name ``policy``: the setting as pasted, where it is
        one of the framework's."""
        return policy if self.choice is None else self.choice.label(policy)

    @property
    def paste(self) -> tuple[str, ...] | None:
        """The winner's lines to paste (() for the framework's defaults); None without a
        winner or outside a framework's settings."""
        if self.winner is None or self.choice is None:
            return None
        return self.choice.paste(self.winner)

    def to_json_dict(self, *, timeline: bool = False) -> dict[str, Any]:
        framework = {}
        if self.choice is not None:
            paste = self.paste
            framework = {"framework": {**self.choice.to_json_dict(),
                                       "paste": None if paste is None else list(paste)}}
        return {
            "schema": SCHEMA_VERSION,
            KIND_KEY: COMPARE_KIND,
            "trace": self.trace,
            "device": {"name": self.device.label, "capacity": self.device.capacity,
                       "granularity": self.device.granularity,
                       "map_granularity": self.device.map_granularity,
                       "context_bytes": self.device.context_bytes},
            "results": [r.to_json_dict(timeline=timeline) for r in self.results],
            "winner": self.winner,
            "reason": self.reason,
            "max_slowdown": self.max_slowdown,
            **framework,
        }


def trace_facts(trace: Trace) -> dict[str, Any]:
    """The trace fields of the JSON schema: what was replayed."""
    peak, _ = trace.peak_live()
    facts: dict[str, Any] = {
        "name": trace.name, "source": str(trace.metadata.get("source", "")),
        "events": len(trace), "allocs": trace.n_allocs,
        "duration_s": round(trace.duration_ns / 1e9, 9), "peak_live": peak}
    unrecorded = trace.metadata.get("unrecorded_live_bytes")
    if unrecorded and unrecorded.get("max", 0) > 0:
        # Memory the recording shows was live before it started: not in the replay unless
        # the trace was read with --start-state unrecorded.
        facts["live_before_recording"] = {"min": int(unrecorded["min"]),
                                          "max": int(unrecorded["max"]),
                                          "in_replay": "start_state" in trace.metadata}
    return facts


def rank_key(result: RunResult) -> tuple:
    return (not result.completed, result.peak_reserved, result.alloc_time_s, result.policy)


def _against_the_plan(best: RunResult, plan: RunResult) -> str:
    """How the winner stands against the offline plan — a heuristic plan, not a bound — and
    against the bound, peak live."""
    gap = best.peak_reserved - plan.peak_reserved
    floor = f"; peak live, the lower bound, is {format_size(best.peak_allocated)}"
    if gap > 0:
        return (f"; the offline plan (a heuristic, not a bound) needs "
                f"{format_size(plan.peak_reserved)}, {format_size(gap)} less" + floor)
    if gap == 0:
        return f"; the offline plan needs the same {format_size(plan.peak_reserved)}" + floor
    return (f"; that is {format_size(-gap)} less than the offline plan "
            f"({format_size(plan.peak_reserved)}), a heuristic, not a bound" + floor)


def pick_winner(results: Sequence[RunResult], max_slowdown: float | None = DEFAULT_MAX_SLOWDOWN,
                name: Callable[[str], str] = str, order: Sequence[str] | None = None
                ) -> tuple[RunResult | None, str]:
    """The winning result and a one-sentence reason (see the module docstring for the rule);
    ``name`` turns a policy spec into how the reason names it (a framework's setting as
    pasted). ``order``: a framework's settings, the defaults first and then one change each:
    a full tie goes to the earlier (the fewest changes) rather than to the name."""
    def rank(result: RunResult) -> tuple:
        if order is None or result.policy not in order:
            return rank_key(result)
        return (*rank_key(result)[:3], f"{order.index(result.policy):09d}")
    budget = math.inf if max_slowdown is None else max_slowdown
    # The offline plan is a reference to compare against, not a policy a job can run; it is a
    # heuristic plan, not a bound (an online policy can beat it); the bound is peak live.
    plan = next((r for r in results if r.policy == OFFLINE_NAME and r.completed), None)
    results = [r for r in results if r.policy != OFFLINE_NAME]
    completed = [r for r in results if r.completed]
    slow = sorted((r for r in completed if r.slowdown > budget), key=rank)
    done = sorted((r for r in completed if r.slowdown <= budget), key=rank)
    excluded = ""
    if slow:
        excluded = f"; over the {budget:.2f}x slowdown budget: " + ", ".join(
            f"{name(r.policy)} ({format_size(r.peak_reserved)}, {r.slowdown:.2f}x)" for r in slow)
    if not done:
        if slow:
            return None, "no policy completes within the slowdown budget" + excluded
        fewest = min(results, key=lambda r: (r.ooms, r.policy), default=None)
        hint = f" (fewest OOMs: {name(fewest.policy)}, {fewest.ooms})" if fewest else ""
        return None, "no policy completes the trace without running out of memory" + hint
    best = done[0]
    if plan is not None:
        excluded += _against_the_plan(best, plan)
    cost = (f"{best.device_mallocs + best.device_frees:,} device calls, "
            f"{best.alloc_time_s * 1e3:.3g} ms modelled allocator time")
    first = name(best.policy)
    if len(done) == 1:
        return best, (f"{first} is the only policy that completes without OOM within the "
                      f"budget ({cost}){excluded}")
    second = done[1]
    runner_up = name(second.policy)
    if second.peak_reserved == best.peak_reserved:
        if second.alloc_time_s == best.alloc_time_s:
            # The same memory and the same modelled time (often the same allocator under two
            # names): the name (or, among a framework's settings, the fewer change) decides,
            # and the reason says so rather than inventing a gap.
            return best, (f"{first} completes without OOM and ties {runner_up} on "
                          f"peak reserved ({format_size(best.peak_reserved)}) and allocator "
                          f"time ({cost}); "
                          + ("first by name" if order is None else "the fewest changes from "
                             "the defaults decide") + excluded)
        return best, (f"{first} completes without OOM, ties {runner_up} on peak "
                      f"reserved ({format_size(best.peak_reserved)}) and spends less time in "
                      f"the allocator ({cost}){excluded}")
    saved = second.peak_reserved - best.peak_reserved
    return best, (f"{first} completes without OOM with the lowest peak reserved, "
                  f"{format_size(best.peak_reserved)} ({format_size(saved)} less than "
                  f"{runner_up}); it costs {cost}{excluded}")


def normalize_spec(spec: str | PolicySpec) -> str | PolicySpec:
    """A parsed policy spec, or the name of the offline plan (which is not an online policy)."""
    if isinstance(spec, str) and spec.strip() == OFFLINE_NAME:
        return OFFLINE_NAME
    return parse_policy(spec)


def compare(trace: Trace, policies: Sequence[str | PolicySpec], device: DeviceProfile, *,
            progress: Callable[[str, int, int], None] | None = None,
            max_slowdown: float | None = DEFAULT_MAX_SLOWDOWN,
            choice: Choice | None = None) -> Comparison:
    """Replay ``trace`` through each policy on a fresh ``device`` and pick the winner.
    ``choice``: what the policies stand for (a framework's settings: the verdict names each as
    pasted; :mod:`~allocsim.sim.questions.framework_settings`)."""
    name = str if choice is None else choice.label
    order = None if choice is None or choice.framework is None else choice.specs
    specs = [normalize_spec(p) for p in policies]
    results = []
    for spec in specs:
        if spec == OFFLINE_NAME:
            results.append(offline_result(trace, device))
            continue
        report = None if progress is None else (
            lambda done, total, s=str(spec): progress(s, done, total))
        results.append(replay(trace, spec, device, progress=report))
    if trace.metadata.get("synthetic_times") and max_slowdown is not None:
        # Made-up timestamps give made-up slowdowns: judge on memory alone, and say so.
        winner, reason = pick_winner(results, None, name, order)
        reason += "; the trace's times are synthesised, so no slowdown budget was applied"
        max_slowdown = None
    else:
        winner, reason = pick_winner(results, max_slowdown, name, order)
    return Comparison(trace=trace_facts(trace), device=device, results=results,
                      winner=winner.policy if winner else None, reason=reason,
                      max_slowdown=max_slowdown, choice=choice)
