"""The search behind ``allocsim tune``: every discrete choice, then each fraction by a
bisection that checks around its answer.

Stages, on a fixed card (capacity ``C``):

1. *Discrete*: every combination of the framework's discrete settings
   (:meth:`~allocsim.sim.questions.tune.space.Framework.discrete`), each replayed once.
2. *Fraction*: for the best :data:`FRACTION_COMBOS` discrete choices the fraction applies to
   (and the framework's defaults; every choice where the defaults hold themselves to a share
   of the card below 1, JAX's 0.75: a larger share may rescue a failing one), the smallest
   fraction on a grid of :data:`STEP` that
   completes: bisection between a fraction known to fail (``fraction × C`` below peak live:
   no allocator keeps the data in less) and 1, then — allocators are not monotone in their
   settings, as min-capacity found for capacities — :data:`VERIFY_ABOVE` grid steps above the
   answer must complete and a spread below it (evenly spaced, plus :data:`VERIFY_RANDOM`
   points drawn with the seed) must fail. Each exception is a *non-monotone region*,
   reported, and the smallest completing fraction found becomes the answer.
3. *Threshold* (PyTorch): garbage_collection_threshold on a grid, at the fraction found for
   the best :data:`GC_COMBOS` choices (PyTorch collects only when a fraction is set); the grid
   is searched whole, and completion flipping more than once along it is a non-monotone
   region (:meth:`Search.threshold_region`).

Without a card the question is the smallest card per setting:
:func:`~allocsim.sim.questions.capacity.minimum.min_capacity` for each discrete choice (and JAX's
fraction on a grid), then one replay on that card for its modelled time.

Shared results: each setting is run as its registry spec with the choices that cannot change
this trace's outcome dropped (``Framework.canonical``, where the framework has one) and its
preset resolved (``jax:allocator=platform,fraction=0.5`` is ``on-demand``); settings with the
same canonical spec and card share one replay, and each says whose replay it reused.

Replays go through an *evaluator*: a function from a batch of ``(spec, device)`` to the
results' JSON dicts. :func:`local_evaluator` replays in this process; the sweeps room's
(:mod:`allocsim.sim.sweeps.tune_runner`) hands a batch to the local pool or Dask. Every
stage sends its replays as one batch, so a large search spreads over the workers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocsim.policies import format_size
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.engine import TIMELINE_POINTS, replay
from allocsim.sim.questions.capacity.minimum import min_capacity
from allocsim.sim.questions.shared_runs import SharedRuns
from allocsim.sim.questions.tune.space import Framework, Setting, distinct_sizes
from allocsim.traces.model import Trace

STEP = 0.01                  # the fraction grid
VERIFY_ABOVE = 4             # grid steps above a fraction's answer that must complete
VERIFY_BELOW = 4             # evenly spaced fractions below it that must fail
VERIFY_RANDOM = 4            # and fractions below it drawn with the seed
FRACTION_COMBOS = 3          # discrete choices whose fraction is searched (besides defaults)
GC_COMBOS = 2                # choices whose garbage_collection_threshold is searched
GC_THRESHOLDS = tuple(round(0.5 + 0.05 * k, 2) for k in range(10))   # 0.5 … 0.95
MIN_CARD_FRACTIONS = (0.75, 0.9, 0.95, 1.0)   # JAX's fraction without a card: a grid

Evaluator = Callable[[Sequence[tuple[str, DeviceProfile]]], list[dict[str, Any]]]
Progress = Callable[[int, str], None]        # (replays so far, what is being searched)


def local_evaluator(trace: Trace, *, share: bool = True) -> Evaluator:
    """Replay each ``(spec, device)`` in this process, in order, each stopped at its first OOM
    (a setting that runs out of memory fails whatever follows; the rest of its replay would
    cost as much as a passing one's, and on a tight card most settings fail). A failing
    setting's figures are therefore those up to its first OOM. Settings that differ only in
    their limit (the fractions on one card) share their runs' starts, and a run that repeats
    itself has its tail copied (sim/questions/shared_runs.py; ``share=False``: each replay
    from event 0 to its end), with the same results."""
    shared = SharedRuns(trace, timeline_points=TIMELINE_POINTS, share=share, repeats=share)

    def evaluate(batch: Sequence[tuple[str, DeviceProfile]]) -> list[dict[str, Any]]:
        return [shared.replay(spec, device).to_json_dict() for spec, device in batch]
    return evaluate


@dataclass
class Trial:
    """One setting's outcome: replayed on the card, or its smallest card (no card given)."""

    setting: Setting
    spec: str                     # the registry spec replayed (no-effect choices dropped)
    capacity: int                 # the card it ran on
    result: dict[str, Any]        # RunResult.to_json_dict() of that replay
    stage: str                    # discrete | fraction | threshold | current
    shared_with: str | None = None   # the setting whose replay answered this one
    min_capacity: int | None = None  # no card given: the smallest card it completes on

    @property
    def completed(self) -> bool:
        return bool(self.result["completed"])

    @property
    def peak_reserved(self) -> int:
        return int(self.result["peak_reserved"])

    @property
    def alloc_time_s(self) -> float:
        return float(self.result["alloc_time_s"])

    @property
    def slowdown(self) -> float:
        return float(self.result["slowdown"])

    @property
    def memory(self) -> int:
        """What the search minimises: peak reserved on the card, or the smallest card."""
        if self.min_capacity is not None:
            return self.min_capacity
        return self.peak_reserved

    def within(self, budget: float | None) -> bool:
        return self.completed and (budget is None or self.slowdown <= budget + 1e-12)

    def failure(self, budget: float | None) -> str | None:
        """Why the setting fails the question (None: it passes)."""
        r = self.result
        if not self.completed:
            if r.get("first_oom_event") is None:
                return "never completes (not even on the largest card tried)"
            return (f"OOM at event {r['first_oom_event']:,} (a {format_size(r['first_oom_size'])}"
                    f" request, {format_size(r['first_oom_reserved'])} reserved)")
        if budget is not None and self.slowdown > budget + 1e-12:
            return (f"over the slowdown budget: {self.slowdown:.3f}x > {budget:.2f}x "
                    f"({self.alloc_time_s * 1e3:.3g} ms modelled allocator time)")
        return None

    def to_json_dict(self) -> dict[str, Any]:
        r = self.result
        return {"setting": dict(self.setting.values), "label": self.setting.label,
                "spec": self.spec, "capacity": self.capacity, "stage": self.stage,
                "shared_with": self.shared_with, "min_capacity": self.min_capacity,
                "completed": self.completed, "peak_reserved": self.peak_reserved,
                "alloc_time_s": r["alloc_time_s"], "slowdown": r["slowdown"],
                "ooms": r["ooms"], "first_oom_event": r["first_oom_event"],
                "device_mallocs": r["device_mallocs"], "device_frees": r["device_frees"],
                "internal_fragmentation": r["internal_fragmentation"],
                "external_fragmentation": r["external_fragmentation"]}


def rank_key(trial: Trial) -> tuple:
    """Memory first, then modelled time, then the fewest changes from the defaults."""
    return (trial.memory, trial.alloc_time_s, len(trial.setting.values), trial.setting.label)


TIME_TIE = 0.02          # modelled times this close to the fastest count as equally fast,
TIME_TIE_OF_RUN = 0.001  # as do times within this share of the job's own duration


def answer_order(passing: Sequence[Trial], card: bool, duration_s: float = 0.0) -> list[Trial]:
    """The passing settings, best answer first.

    Without a card the question is the smallest card: :func:`rank_key`. With a card, fitting
    it is the constraint the passing settings all meet, so the answer is the fastest: the
    settings within :data:`TIME_TIE` of the least modelled allocator time (closer than the
    cost model can tell apart) or within :data:`TIME_TIE_OF_RUN` of the job's duration
    (``duration_s``: a difference the job cannot feel) come first, the fewest changes from
    the defaults among them, then the lowest peak reserved; the rest follow by time. What
    less memory would cost is the Pareto front's to show.
    """
    if not card or not passing:
        return sorted(passing, key=rank_key)
    fastest = min(t.alloc_time_s for t in passing)
    limit = max(fastest * (1 + TIME_TIE), fastest + TIME_TIE_OF_RUN * duration_s) + 1e-12

    def key(t: Trial) -> tuple:
        tied = t.alloc_time_s <= limit
        return (not tied, 0.0 if tied else t.alloc_time_s, len(t.setting.values),
                t.peak_reserved, t.alloc_time_s, t.setting.label)
    return sorted(passing, key=key)


@dataclass
class NonMonotone:
    """Where completion is not monotone in a fraction: the exceptions the checks found."""

    setting: str          # the other choices (label)
    key: str              # the fraction's name
    bisected: float       # what bisection alone answered
    answer: float         # the smallest completing fraction found
    exceptions: list[str] = field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "key": self.key, "bisected": self.bisected,
                "answer": self.answer, "exceptions": self.exceptions}


@dataclass
class FractionAnswer:
    """The smallest completing fraction for one discrete choice (None: none completes)."""

    base: str
    key: str
    answer: float | None
    evaluations: int
    monotone: bool


class Search:
    """One search: the trials run so far, the replay cache, the evaluator, the counts."""

    def __init__(self, trace: Trace, fw: Framework, device: DeviceProfile, *,
                 card: bool, max_slowdown: float | None, seed: int,
                 evaluate: Evaluator | None = None, progress: Progress | None = None) -> None:
        self.trace = trace
        self.fw = fw
        self.device = device
        self.card = card
        self.budget = max_slowdown
        self.rng = random.Random(seed)
        self.evaluate = evaluate or local_evaluator(trace)
        self.progress = progress
        self.trials: list[Trial] = []
        self.replays = 0
        self.shared = 0
        self.sizes = distinct_sizes(trace)
        self.peak_live = trace.peak_live()[0]
        self._cache: dict[tuple[Any, ...], tuple[dict[str, Any], str, int | None]] = {}
        self._by_label: dict[str, Trial] = {}
        self.non_monotone: list[NonMonotone] = []
        self.fractions: list[FractionAnswer] = []

    # -- running settings --------------------------------------------------------------
    def canonical(self, setting: Setting) -> tuple[str, tuple[Any, ...]]:
        """``(spec to run, sharing key)``: the setting with the choices that cannot change
        this trace's outcome dropped, and the model it resolves to."""
        canonical = getattr(self.fw, "canonical", None)
        if canonical is not None:
            setting = canonical(setting, self.trace, self.sizes)
        capacity = self.device.capacity if self.card else None
        return (self.fw.spec(setting, capacity),
                (*self.fw.modelled_as(setting, capacity), self.device.capacity))

    def run(self, settings: Sequence[Setting], stage: str) -> list[Trial]:
        """The trials of ``settings`` (one batch of replays for those not known yet)."""
        todo: list[tuple[str, DeviceProfile]] = []
        todo_keys: list[tuple[Any, ...]] = []
        keys: list[tuple[Setting, str, tuple[Any, ...]]] = []
        for setting in settings:
            if setting.label in self._by_label:
                keys.append((setting, "", ()))
                continue
            spec, key = self.canonical(setting)
            keys.append((setting, spec, key))
            if key not in self._cache and key not in todo_keys:
                todo.append((spec, self.device))
                todo_keys.append(key)
        if todo:
            if self.progress:
                self.progress(self.replays, f"{stage}: {len(todo)} replays")
            if self.card:
                for key, result in zip(todo_keys, self.evaluate(todo)):
                    self._cache[key] = (result, "", None)
            else:
                for key, (spec, _) in zip(todo_keys, todo):
                    self._cache[key] = self._smallest_card(spec)
            self.replays += len(todo)
        out = []
        for setting, spec, key in keys:
            known = self._by_label.get(setting.label)
            if known is not None:
                out.append(known)
                continue
            result, owner, smallest = self._cache[key]
            shared = None
            if owner:
                shared = owner
                self.shared += 1
            else:
                self._cache[key] = (result, setting.label, smallest)
            trial = Trial(setting, spec, int(smallest or self.device.capacity), result, stage,
                          shared, smallest)
            self._by_label[setting.label] = trial
            self.trials.append(trial)
            out.append(trial)
        return out

    def _smallest_card(self, spec: str) -> tuple[dict[str, Any], str, int | None]:
        answer = min_capacity(self.trace, spec, self.device)
        if answer.min_capacity is None:
            result = replay(self.trace, spec, self.device).to_json_dict()
            return result, "", None
        card = self.device.device_with(answer.min_capacity, self.device.context_bytes)
        result = replay(self.trace, spec, card).to_json_dict()
        return result, "", answer.min_capacity

    def ok(self, trial: Trial) -> bool:
        return trial.within(self.budget)

    def best(self, trials: Sequence[Trial]) -> list[Trial]:
        """The passing trials, best answer first (:func:`answer_order`)."""
        return answer_order([t for t in trials if self.ok(t)], self.card,
                            self.trace.duration_ns / 1e9)

    def threshold_region(self, base: Setting, grid: Sequence[Trial]) -> None:
        """Record a non-monotone region where completion along the threshold grid changes
        more than once (a grid searched whole, so nothing between its points is claimed)."""
        done = [t.completed for t in grid]
        flips = [k for k in range(1, len(done)) if done[k] != done[k - 1]]
        if len(flips) < 2:
            return
        key = "garbage_collection_threshold"
        passing = [t.setting.get(key) for t in grid if t.completed]
        self.non_monotone.append(NonMonotone(
            base.label, key, passing[0], passing[0],
            [f"{'completes' if done[k] else 'fails'} from {grid[k].setting.get(key):g}"
             for k in flips]))

    # -- the fraction ------------------------------------------------------------------
    def fraction(self, base: Setting) -> FractionAnswer:
        """The smallest completing fraction (grid :data:`STEP`) under ``base``'s other
        choices; checks around it and records any non-monotone region."""
        key = self.fw.fraction_key
        capacity = self.device.capacity
        steps = round(1 / STEP)
        start = self.replays

        def at(k: int) -> Setting:
            return base.with_values(**{key: round(k * STEP, 6)})

        def completes(ks: Sequence[int]) -> list[bool]:
            return [t.completed for t in self.run([at(k) for k in ks], "fraction")]

        # Known to fail without a run: a share of the card below peak live holds too little.
        low = max(0, math.ceil(self.peak_live / capacity / STEP) - 1)
        while low >= 1 and low * STEP * capacity >= self.peak_live:
            low -= 1
        if low >= steps or not completes([steps])[0]:
            self.fractions.append(FractionAnswer(base.label, key, None, self.replays - start,
                                                 True))
            return self.fractions[-1]
        high = steps
        while high - low > 1:
            middle = (low + high) // 2
            if completes([middle])[0]:
                high = middle
            else:
                low = middle
        bisected = answer = high
        exceptions: list[str] = []
        above = list(range(answer + 1, min(steps, answer + VERIFY_ABOVE) + 1))
        for k, done in zip(above, completes(above)):
            if not done:
                exceptions.append(f"fails at {k * STEP:.2f}, above the answer")
        floor = max(1, math.ceil(self.peak_live / capacity / STEP))
        below: list[int] = []
        if answer - 1 >= floor:
            below = sorted(set(np.linspace(floor, answer - 1, VERIFY_BELOW).astype(int).tolist())
                           | {self.rng.randint(floor, answer - 1) for _ in range(VERIFY_RANDOM)})
        for k, done in zip(below, completes(below)):
            if done:
                exceptions.append(f"completes at {k * STEP:.2f}, below the answer")
                answer = min(answer, k)
        if exceptions:
            self.non_monotone.append(NonMonotone(base.label, key, round(bisected * STEP, 6),
                                                 round(answer * STEP, 6), exceptions))
        found = FractionAnswer(base.label, key, round(answer * STEP, 6), self.replays - start,
                               not exceptions)
        self.fractions.append(found)
        return found


def search(trace: Trace, fw: Framework, device: DeviceProfile, *, card: bool,
           max_slowdown: float | None, seed: int = 0, evaluate: Evaluator | None = None,
           progress: Progress | None = None, extra: Sequence[Setting] = ()) -> Search:
    """Run the stages of the module docstring; ``extra`` settings (the job's current one)
    are run beside the discrete ones."""
    s = Search(trace, fw, device, card=card, max_slowdown=max_slowdown, seed=seed,
               evaluate=evaluate, progress=progress)
    capacity = device.capacity if card else None
    discrete = list(dict.fromkeys([fw.default(), *fw.discrete(trace, capacity), *extra]))
    if not card and fw.name == "jax":
        discrete += [d.with_values(fraction=f) for d in list(discrete)
                     if fw.fraction_applies(d) for f in MIN_CARD_FRACTIONS]
        discrete = list(dict.fromkeys(discrete))
    trials = s.run(discrete, "discrete")
    if not card or not fw.fraction_key:
        return s
    ranked = [t.setting for t in s.best(trials) if fw.fraction_applies(t.setting)
              and not t.setting.get(fw.fraction_key)]
    bases = [fw.default(), *ranked[:FRACTION_COMBOS]]
    if 0 < fw.defaults[fw.fraction_key] < 1:
        # The defaults hold themselves to a share of the card (JAX's 0.75): a choice that
        # fails there may complete with a larger share, so each one's fraction is searched.
        bases += [t.setting for t in trials if fw.fraction_applies(t.setting)
                  and not t.setting.get(fw.fraction_key)]
    bases = list(dict.fromkeys(bases))
    answers = [(base, s.fraction(base)) for base in bases if fw.fraction_applies(base)]
    if fw.name == "pytorch":
        found = sorted((a for a in answers if a[1].answer is not None),
                       key=lambda a: rank_key(s._by_label[a[0].with_values(
                           per_process_memory_fraction=a[1].answer).label]))
        for base, answer in found[:GC_COMBOS]:
            grid = [base.with_values(per_process_memory_fraction=answer.answer,
                                     garbage_collection_threshold=threshold)
                    for threshold in GC_THRESHOLDS]
            s.threshold_region(base, s.run(grid, "threshold"))
    return s
