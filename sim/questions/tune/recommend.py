"""The setting to paste, for a job and a card (``allocsim tune``).

What it is for
    People do not ask "how do these allocators compare" but "what do I set so my job fits on
    this card without slowing down" — ``max_split_size_mb`` against fragmentation?  which
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``?  does ``expandable_segments`` help?  :func:`tune`
    searches one framework's real settings (:mod:`~allocsim.sim.questions.tune.space`) on a
    trace and answers with the line to paste, what it predicts against the framework's
    defaults, and why.

The question and the answer
    - With a card (``device`` as given, ``card=True``): the setting must complete the trace
      without an OOM and keep the run within the slowdown budget (compare's default, 1.10).
      Fitting the card is then met, so the answer is the fastest: the least modelled
      allocator time (within 2%, closer than the cost model tells apart, or within 0.1% of
      the job's duration, a difference the job cannot feel, counts as a tie),
      then the fewest changes from the defaults, then the lowest peak reserved
      (:func:`~allocsim.sim.questions.tune.search.answer_order`) — among the settings no
      other beats on both memory and modelled time (the Pareto front, the table tune prints):
      a tie never hands the answer to a setting the table shows beaten on both
      (:func:`answer_from_table`). When the defaults fit and nothing is faster or smaller, the
      answer is "nothing to set". The rule travels with the answer (:func:`answer_rule`).
    - Without a card (``card=False``): the smallest card each setting runs on (min-capacity's
      search) wins, then the modelled time, then the fewest changes.
    The result also holds the Pareto front of memory against modelled time (the settings no
    other beats on both), every setting that fails and why (OOM, over the budget), the
    fractions' answers and any non-monotone region the checks found
    (:mod:`~allocsim.sim.questions.tune.search`), the reasons
    (:mod:`~allocsim.sim.questions.tune.explain`) and the evidence
    (:mod:`~allocsim.sim.questions.tune.evidence`).

Input it refuses (one line, :class:`~allocsim.sim.questions.tune.space.TuneInputError`): an
unknown framework or setting, a current setting the framework's parser would reject, a card
smaller than the trace's peak live bytes (no setting of any allocator fits there), and a
trace recorded from another framework unless ``any_trace`` (then the assumption is stated).

Several jobs on one card: :mod:`~allocsim.sim.questions.tune.share`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from allocsim.policies import format_size
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.questions.compare import DEFAULT_MAX_SLOWDOWN, trace_facts
from allocsim.sim.questions.tune.evidence import Evidence, gather
from allocsim.sim.questions.tune.explain import why
from allocsim.sim.questions.tune.search import (
    TIME_TIE,
    TIME_TIE_OF_RUN,
    Evaluator,
    FractionAnswer,
    NonMonotone,
    Progress,
    Trial,
    answer_order,
    rank_key,
    search,
)
from allocsim.sim.questions.tune.space import (
    Framework,
    Setting,
    TuneInputError,
    exact_size,
    framework,
    trace_framework,
)
from allocsim.traces.model import Trace

TUNE_SCHEMA = 1


@dataclass
class TuneResult:
    """Everything :func:`tune` found; :meth:`to_json_dict` is the ``--json`` document."""

    trace: dict[str, Any]
    framework: str
    device: DeviceProfile
    card: bool
    max_slowdown: float | None
    seed: int
    defaults: Trial
    best: Trial | None
    current: Trial | None
    trials: list[Trial]
    front: list[Trial]
    failing: list[tuple[Trial, str]]
    non_monotone: list[NonMonotone]
    fractions: list[FractionAnswer]
    reasons: list[str]
    evidence: Evidence
    not_modelled: tuple[str, ...]
    replays: int
    shared: int
    paste: list[str] = field(default_factory=list)

    @property
    def capacity(self) -> int | None:
        return self.device.capacity if self.card else None

    def headline(self) -> str:
        """The answer in one sentence: the prediction against the defaults."""
        if self.best is None:
            where = f" on {format_size(self.device.capacity)}" if self.card else ""
            done = sorted((t for t in self.trials if t.completed), key=lambda t: t.slowdown)
            if done:
                return (f"{len(done)} {self.framework} settings complete{where} but none within "
                        f"the {self.max_slowdown:.2f}x slowdown budget; the least slow is "
                        f"{done[0].setting.label} ({done[0].slowdown:.3f}x)")
            return f"no {self.framework} setting searched completes{where}"
        d, b = self.defaults, self.best
        what = "peak reserved" if self.card else "smallest card"
        mine, theirs = _memory(b, self.card), _memory(d, self.card)
        verdict = ("completes" if b.completed else "fails")
        state = ("the defaults " + ("complete" if d.completed else
                                    f"run out of memory at event {d.result['first_oom_event']:,}")
                 if self.card else "the defaults")
        return (f"{verdict} with {what} {mine} and {b.alloc_time_s * 1e3:.3g} ms modelled "
                f"allocator time ({b.slowdown:.3f}x); {state}: {what} {theirs}, "
                f"{d.alloc_time_s * 1e3:.3g} ms ({d.slowdown:.3f}x)")

    @property
    def rule(self) -> str:
        return answer_rule(self.card)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "schema": TUNE_SCHEMA,
            "trace": self.trace, "framework": self.framework,
            "device": {"name": self.device.label, "capacity": self.device.capacity,
                       "context_bytes": self.device.context_bytes},
            "card": self.card, "max_slowdown": self.max_slowdown, "seed": self.seed,
            "answer": {"paste": self.paste, "headline": self.headline(), "rule": self.rule,
                       "setting": None if self.best is None else self.best.to_json_dict(),
                       "why": self.reasons},
            "defaults": self.defaults.to_json_dict(),
            "current": None if self.current is None else self.current.to_json_dict(),
            "front": [t.to_json_dict() for t in self.front],
            "failing": [{**t.to_json_dict(), "reason": reason} for t, reason in self.failing],
            "fractions": [{"base": a.base, "key": a.key, "answer": a.answer,
                           "evaluations": a.evaluations, "monotone": a.monotone}
                          for a in self.fractions],
            "non_monotone": [n.to_json_dict() for n in self.non_monotone],
            "evidence": self.evidence.to_json_dict(),
            "not_modelled": list(self.not_modelled),
            "search": {"settings": len(self.trials), "replays": self.replays,
                       "shared": self.shared},
            "trials": [t.to_json_dict() for t in self.trials],
        }


def _memory(trial: Trial, card: bool) -> str:
    if not card:
        return "none" if trial.min_capacity is None else exact_size(trial.min_capacity)
    return exact_size(trial.peak_reserved)


def pareto_front(trials: Sequence[Trial], budget: float | None) -> list[Trial]:
    """The passing settings no other passing setting beats on both memory and modelled time
    (one per distinct point, the simplest setting), by memory."""
    passing = sorted((t for t in trials if t.within(budget)), key=rank_key)
    front: list[Trial] = []
    best_time = float("inf")
    for trial in passing:
        if trial.alloc_time_s < best_time - 1e-15:
            front.append(trial)
            best_time = trial.alloc_time_s
    return front


def answer_rule(card: bool) -> str:
    """The rule that picked the answer, in a sentence printed with it."""
    if not card:
        return ("the smallest card; then the least modelled allocator time; then the fewest "
                "changes from the defaults")
    return (f"the fastest setting that fits the card within the slowdown budget; modelled "
            f"times within {TIME_TIE:.0%} of the fastest (or {TIME_TIE_OF_RUN:.1%} of the "
            "job's duration) tie, and a tie goes to the fewest changes from the defaults, then "
            "the least memory; only the table's rows (settings no other beats on both memory "
            "and time) can be the answer")


def answer_from_table(front: Sequence[Trial], *, card: bool, duration_s: float
                      ) -> Trial | None:
    """The answer: :func:`~allocsim.sim.questions.tune.search.answer_order`'s first among
    the Pareto ``front``. Taken from all passing ``trials`` instead, a tie on time could go
    to a setting (often the defaults) that another beats on both memory and time, an answer
    the printed table contradicts."""
    ordered = answer_order(list(front), card, duration_s)
    return ordered[0] if ordered else None


def check_trace(trace: Trace, fw: Framework, device: DeviceProfile, *, card: bool,
                any_trace: bool) -> str | None:
    """Refuse what tune cannot answer; the framework the trace says it came from."""
    recorded = trace_framework(trace)
    name = trace.metadata.get("source") or trace.name
    if len(trace.processes()) > 1:
        raise TuneInputError(f"{name}: the trace holds {len(trace.processes())} processes; "
                             "tune one at a time (each as its own trace: several traces are "
                             "jobs sharing the card)")
    if recorded is not None and recorded != fw.name and not any_trace:
        raise TuneInputError(
            f"{name}: a {recorded} recording, tuned as {fw.name}: that assumes {fw.name} would "
            f"make the same requests; pass --any-trace to tune it anyway")
    peak = trace.peak_live()[0]
    if card and peak > device.capacity:
        raise TuneInputError(
            f"{name}: peak live {format_size(peak)} is more than the card's "
            f"{format_size(device.capacity)}: no allocator setting fits (give a card of at "
            "least peak live, or none for the smallest)")
    if not len(trace):
        raise TuneInputError(f"{name}: the trace has no events: nothing to tune")
    return recorded


def tune(trace: Trace, framework_name: str, device: DeviceProfile, *, card: bool = True,
         max_slowdown: float | None = DEFAULT_MAX_SLOWDOWN, seed: int = 0,
         current: str | None = None, any_trace: bool = False,
         evaluate: Evaluator | None = None, progress: Progress | None = None) -> TuneResult:
    """Search ``framework_name``'s settings for ``trace`` on ``device`` (its capacity is the
    card when ``card``; otherwise the smallest card is searched for, and ``device`` gives
    the costs and granularity). ``current``: the setting the job runs with now, written as
    for the framework (``PYTORCH_CUDA_ALLOC_CONF=...``, ``XLA_PYTHON_CLIENT_MEM_FRACTION=.5``):
    replayed beside the others and reported. ``evaluate``: where the replays run
    (:func:`~allocsim.sim.questions.tune.search.local_evaluator` by default; the sweeps'
    local pool or Dask through :mod:`allocsim.sim.sweeps.tune_runner`). The same inputs and
    ``seed`` give the same result."""
    fw = framework(framework_name)
    recorded = check_trace(trace, fw, device, card=card, any_trace=any_trace)
    now = fw.parse_current(current) if current else None
    if trace.metadata.get("synthetic_times") and max_slowdown is not None:
        max_slowdown = None     # made-up timestamps give made-up slowdowns (as compare)
    found = search(trace, fw, device, card=card, max_slowdown=max_slowdown, seed=seed,
                   evaluate=evaluate, progress=progress, extra=[now] if now else [])
    trials = found.trials
    by_label = {t.setting.label: t for t in trials}
    defaults = by_label[fw.default().label]
    front = pareto_front(trials, max_slowdown)
    best = answer_from_table(front, card=card, duration_s=trace.duration_ns / 1e9)
    failing = [(t, reason) for t in trials
               if (reason := t.failure(max_slowdown)) is not None]
    capacity = device.capacity if card else None
    paste = [] if best is None else fw.paste(best.setting, best.capacity if card else None)
    reasons = [] if best is None else why(trace, best, defaults, device, card=card,
                                          default_spec=fw.spec(fw.default(), capacity))
    evidence = gather(trace, fw, best, card=card, trace_framework=recorded,
                      device_capacity=device.capacity)
    return TuneResult(
        trace=trace_facts(trace), framework=fw.name, device=device, card=card,
        max_slowdown=max_slowdown, seed=seed, defaults=defaults, best=best,
        current=None if now is None else by_label[now.label], trials=trials,
        front=front, failing=failing,
        non_monotone=found.non_monotone, fractions=found.fractions, reasons=reasons,
        evidence=evidence, not_modelled=fw.not_modelled, replays=found.replays,
        shared=found.shared, paste=paste)


__all__ = ["Setting", "TuneInputError", "TuneResult", "answer_from_table", "answer_rule",
           "pareto_front", "tune"]
