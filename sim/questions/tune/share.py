"""Several jobs on one card: per-job fractions (limits) under which all complete, checked by
replaying them together as ``allocsim share`` does.

How: each job's framework setting that bounds what it holds (:data:`LIMITED`: JAX's
``XLA_PYTHON_CLIENT_MEM_FRACTION`` with preallocation, then without it; PyTorch's
``set_per_process_memory_fraction``; TensorFlow's memory limit; CuPy's pool limit) is searched
alone on the card for its smallest completing fraction (tune's bisection with its checks,
:meth:`~allocsim.sim.questions.tune.search.Search.fraction`). If the smallest fractions sum
to more than 1 no such limits exist: each job holds up to its limit, and together they would
need more than the card. Otherwise the rest of the card is shared out in proportion (rounded
down to the grid), and the jobs are replayed together, all starting at once, through
:func:`~allocsim.sim.questions.share.share`; if that fails, the smallest fractions are
replayed together instead. The answer is the first assignment that completes together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from allocsim.policies import format_size
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.questions.share import ShareSpec, share
from allocsim.sim.questions.tune.recommend import check_trace
from allocsim.sim.questions.tune.search import STEP, Search
from allocsim.sim.questions.tune.space import Setting, TuneInputError, framework
from allocsim.traces.model import Trace

LIMITED: dict[str, tuple[dict[str, Any], ...]] = {
    "jax": ({}, {"preallocate": False}),
    "pytorch": ({},),
    "tensorflow": ({},),
    "cupy": ({},),
}


@dataclass
class JobAnswer:
    name: str
    setting: Setting
    smallest: float
    paste: list[str]
    completed: bool
    peak_reserved: int
    first_oom_event: int | None


@dataclass
class ShareAnswer:
    framework: str
    device: DeviceProfile
    fits: bool
    base: str
    jobs: list[JobAnswer] = field(default_factory=list)
    device_peak: int = 0
    attempts: list[str] = field(default_factory=list)
    reason: str = ""

    def to_json_dict(self) -> dict[str, Any]:
        return {"framework": self.framework,
                "device": {"name": self.device.label, "capacity": self.device.capacity},
                "fits": self.fits, "base": self.base, "reason": self.reason,
                "device_peak": self.device_peak, "attempts": self.attempts,
                "jobs": [{"trace": j.name, "setting": dict(j.setting.values),
                          "smallest_fraction": j.smallest, "paste": j.paste,
                          "completed": j.completed, "peak_reserved": j.peak_reserved,
                          "first_oom_event": j.first_oom_event} for j in self.jobs]}

    def text(self) -> str:
        lines = [f"tune {len(self.jobs) or 'the'} jobs as {self.framework} on one card "
                 f"{self.device.label} ({format_size(self.device.capacity)}), all starting "
                 "together", ""]
        if not self.fits:
            lines.append("ANSWER: " + self.reason)
        else:
            lines.append("ANSWER (paste, per job):")
            for job in self.jobs:
                lines.append(f"  {job.name}:")
                lines += [f"    {p}" for p in job.paste] or ["    (defaults)"]
            lines.append(f"  {self.reason}")
        if self.jobs:
            lines.append("")
            for job in self.jobs:
                state = ("completes" if job.completed
                         else f"OOM at event {job.first_oom_event}")
                lines.append(f"  {job.name}: smallest fraction alone {job.smallest:g}, given "
                             f"{dict(job.setting.values)}; together: {state}, peak reserved "
                             f"{format_size(job.peak_reserved)}")
        lines += [f"  tried: {a}" for a in self.attempts]
        return "\n".join(lines)


def _together(traces: Sequence[Trace], names: Sequence[str], settings: Sequence[Setting],
              device: DeviceProfile, fw_name: str) -> tuple[bool, Any]:
    fw = framework(fw_name)
    specs = [ShareSpec(name, fw.spec(s, device.capacity), 0) for name, s in zip(names, settings)]
    run = share(list(traces), specs, device)
    return all(r.completed for r in run.results), run


def tune_share(traces: Sequence[Trace], names: Sequence[str], framework_name: str,
               device: DeviceProfile, *, any_trace: bool = False) -> ShareAnswer:
    """Per-job limits for ``traces`` (one process each, all starting at once) on ``device``."""
    fw = framework(framework_name)
    for trace in traces:
        if len(trace.processes()) > 1:
            raise TuneInputError(f"{trace.name}: holds {len(trace.processes())} processes; "
                                 "give one trace per job")
        check_trace(trace, fw, device, card=True, any_trace=any_trace)
    total_live = sum(t.peak_live()[0] for t in traces)
    if total_live > device.capacity:
        raise TuneInputError(f"the jobs' peak live bytes add up to {format_size(total_live)}, "
                             f"more than the card's {format_size(device.capacity)}: no limits "
                             "fit them together (if they peak at the same time)")
    answer = ShareAnswer(fw.name, device, False, "")
    for base_values in LIMITED[fw.name]:
        base = fw.make(base_values)
        smallest: list[float] = []
        for trace in traces:
            search = Search(trace, fw, device, card=True, max_slowdown=None, seed=0)
            found = search.fraction(base)
            if found.answer is None:
                smallest = []
                answer.attempts.append(f"{base.label}: {trace.name} does not complete alone "
                                       "on the card at any fraction")
                break
            smallest.append(found.answer)
        if not smallest:
            continue
        need = sum(smallest)
        if need > 1 + 1e-9:
            answer.attempts.append(f"{base.label}: the smallest fractions {smallest} add up to "
                                   f"{need:.2f} > 1")
            continue
        steps = round(1 / STEP)
        spare = 1 - need
        spread = [math.floor((f + spare * f / need) * steps + 1e-9) / steps for f in smallest]
        for fractions in (spread, smallest):
            settings = [base.with_values(**{fw.fraction_key: round(f, 6)}) for f in fractions]
            ok, run = _together(traces, names, settings, device, fw.name)
            answer.attempts.append(f"{base.label}: fractions {fractions} together: "
                                   + ("all complete" if ok else "an OOM"))
            answer.jobs = [JobAnswer(name, s, small, fw.paste(s, device.capacity),
                                     r.completed, r.peak_reserved, r.first_oom_event)
                           for name, s, small, r in zip(names, settings, smallest, run.results)]
            answer.device_peak = run.device_peak
            if ok:
                answer.fits = True
                answer.base = base.label
                answer.reason = (f"all {len(traces)} complete together (replayed as `allocsim "
                                 f"share` does); device peak {format_size(run.device_peak)} of "
                                 f"{format_size(device.capacity)}; fractions sum to "
                                 f"{sum(fractions):.2f} (at least {need:.2f} needed)")
                return answer
    answer.reason = ("no per-job limits found under which all complete together: "
                     + "; ".join(answer.attempts))
    return answer
