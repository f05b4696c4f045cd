"""``allocsim tune``'s output: the answer first as text, the Pareto front as a table and a
figure, the failing settings with their reason; the files of ``-o DIR`` (``tune.json``,
``tune.png``, and ``tune-results.json`` + ``report.html``: the defaults, the answer and the
front as a comparison the HTML report renders)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from allocsim.policies import format_size
from allocsim.sim.kernel.engine import replay
from allocsim.sim.kernel.results import SCHEMA_VERSION
from allocsim.sim.output.display_text import shown
from allocsim.sim.output.figures import pyplot, save, size_unit
from allocsim.sim.output.files import write_json
from allocsim.sim.output.html_report import write_report
from allocsim.sim.output.tables import before_recording_note, context_note, format_table
from allocsim.sim.questions.compare import COMPARE_KIND
from allocsim.sim.questions.tune.recommend import TuneResult
from allocsim.sim.questions.tune.search import Trial
from allocsim.sim.questions.tune.space import describe
from allocsim.traces.model import Trace

FAILING_SHOWN = 3     # example settings listed per failure reason


def _mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / (1 << 20):,.1f} MiB"


def _memory(t: Trial, card: bool) -> str:
    return _mib(t.peak_reserved if card else t.min_capacity)


def _reason_kind(reason: str) -> str:
    return reason.split(" at ")[0].split(":")[0]


def _card_share(result: TuneResult) -> str:
    """The device's own share of the card, where it has one (in the card's memory and every
    answer's: ", of which 384.00MiB the CUDA context ... (assumed ...)")."""
    if not result.device.context_bytes:
        return ", no context" if result.card else ""
    return context_note(result.device)


def _table_rows(result: TuneResult) -> list[list[str]]:
    """The front's rows by memory, and the defaults' row wherever they are not on it: matched
    or beaten on both memory and time by a row above, or failing (then why)."""
    r, card = result, result.card

    def row(t: Trial, note: str) -> list[str]:
        return [describe(t.setting, r.capacity), _memory(t, card),
                f"{t.alloc_time_s * 1e3:.3g} ms", f"{t.slowdown:.3f}x",
                f"{t.result['device_mallocs']:,}", note]

    def note(t: Trial) -> str:
        marks = (["answer"] if t is r.best else []) + (["defaults"] if t is r.defaults else [])
        return ", ".join(marks)
    rows = [(t.memory, row(t, note(t))) for t in r.front]
    defaults = r.defaults
    if not any(t is defaults or t.setting == defaults.setting for t in r.front):
        failure = defaults.failure(r.max_slowdown)
        if failure is None:
            rows.append((defaults.memory, row(defaults, "defaults: a row above needs no more "
                                                        "memory and no more time")))
            rows.sort(key=lambda item: item[0])
        else:
            rows.append((1 << 62, [describe(defaults.setting, r.capacity), "-", "-", "-", "-",
                                   f"defaults: {failure}"]))
    return [cells for _, cells in rows]


def text(result: TuneResult) -> str:
    """The whole answer for a person: the line to paste first."""
    r = result
    card = r.card
    device = shown(r.device.label)
    where = (f"card {device} ({format_size(r.device.capacity)}{_card_share(r)})"
             if card else f"the smallest card (costs of {device}{_card_share(r)})")
    budget = "none" if r.max_slowdown is None else f"{r.max_slowdown:.2f}x"
    lines = [f"tune {shown(r.trace['name'])} as {r.framework} on {where}; slowdown budget "
             f"{budget}"]
    before = before_recording_note(r.trace)
    if before:
        lines.append(f"  peak live {format_size(r.trace['peak_live'])}{before}")
    lines.append("")
    if r.best is None:
        lines.append("ANSWER: " + r.headline())
    else:
        paste = r.paste or [f"(nothing to set: the {r.framework} defaults)"]
        lines.append("ANSWER (paste):")
        lines += [f"    {p}" for p in paste]
        lines.append("  " + r.headline())
        if r.current is not None:
            lines.append(f"  the current setting ({describe(r.current.setting, r.capacity)}): "
                         + (r.current.failure(r.max_slowdown) or
                            f"{_memory(r.current, card)}, "
                            f"{r.current.alloc_time_s * 1e3:.3g} ms"))
        lines.append("  why:")
        lines += [f"    - {reason}" for reason in r.reasons]
    lines.append(f"  rule: {r.rule}")
    lines += ["", f"Pareto front: {'peak reserved' if card else 'smallest card'} against "
                  "modelled allocator time (settings within the budget no other beats on both; "
                  "the defaults always shown)"]
    lines.append(format_table(_table_rows(r), ["setting", "memory", "alloc time", "slowdown",
                                               "dev mallocs", ""], left=(0, 5)))
    lines += ["", f"failing settings: {len(r.failing)} of {len(r.trials)}"]
    kinds: Counter[str] = Counter(_reason_kind(reason) for _, reason in r.failing)
    for kind, count in kinds.most_common():
        examples = [(t, reason) for t, reason in r.failing if _reason_kind(reason) == kind]
        lines.append(f"  {kind}: {count}")
        for t, reason in examples[:FAILING_SHOWN]:
            lines.append(f"    {t.setting.label}: {reason}")
    if r.fractions:
        lines += ["", "fractions (smallest that completes, grid 0.01, checked around):"]
        for a in r.fractions:
            answer = "none completes" if a.answer is None else f"{a.answer:g}"
            lines.append(f"  {a.key} under {a.base}: {answer} ({a.evaluations} replays"
                         + ("" if a.monotone else ", NOT monotone") + ")")
    if r.non_monotone:
        lines.append("non-monotone regions found (the answer is the smallest completing value):")
        for n in r.non_monotone:
            lines.append(f"  {n.key} under {n.setting}: bisection said {n.bisected:g}, "
                         f"answer {n.answer:g}; " + "; ".join(n.exceptions))
    ev = r.evidence
    lines += ["", "evidence:", f"  model: {ev.checked}"]
    if ev.fidelity:
        fid = ev.fidelity
        lines.append(f"  this recording under its own settings ({fid['recorded_policy']}): "
                     f"{fid['matched']}/{fid['total']} recorded device calls matched, "
                     f"{fid['extra']} extra, final segments "
                     f"{'match' if fid['final_segments_match'] else 'differ'}")
    if ev.recheck:
        rc = ev.recheck
        lines.append(f"  re-checked from the recorded start state (fidelity's seeded replay, "
                     f"{rc['seeded_segments']} segments): "
                     + ("completes" if rc["completed"] else f"{rc['ooms']} OOMs")
                     + f", peak reserved {_mib(rc['peak_reserved'])}"
                     + "".join(f"; {note}" for note in rc["notes"]))
    lines += [f"  assumed: {a}" for a in ev.assumptions]
    lines += [f"  a GPU run would confirm: {g}" for g in ev.gpu_would_confirm]
    lines.append("  not modelled (not searched): " + "; ".join(r.not_modelled))
    lines.append(f"\nsearch: {len(r.trials)} settings, {r.replays} replays "
                 f"({r.shared} settings shared another's replay), seed {r.seed}")
    return "\n".join(lines)


def figure(result: TuneResult, path: str | Path) -> Path:
    """Memory against modelled allocator time for every completing setting: the front joined,
    the answer, the defaults and the current setting marked, the budget as a line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    card = result.card
    done = [t for t in result.trials if t.completed and t.memory]
    top = max([t.memory for t in done] + [1])
    unit, scale = ("MiB", 1 << 20) if top < 64 << 30 else size_unit(top)
    inside = [t for t in done if t.within(result.max_slowdown)]
    over = [t for t in done if not t.within(result.max_slowdown)]
    ax.scatter([t.memory / scale for t in inside], [t.alloc_time_s * 1e3 for t in inside], s=14,
               color="#1f77b4", alpha=0.6, label=f"within budget ({len(inside)})")
    stacked = Counter((t.memory, round(t.alloc_time_s, 12)) for t in inside)
    for (memory, seconds), count in stacked.items():
        if count > 1:   # settings with the same outcome draw on one point: say how many
            ax.annotate(f"×{count}", (memory / scale, seconds * 1e3), fontsize=7,
                        xytext=(4, 4), textcoords="offset points", color="#1f77b4")
    if over:
        ax.scatter([t.memory / scale for t in over], [t.alloc_time_s * 1e3 for t in over], s=14,
                   color="#aaaaaa", label=f"over budget ({len(over)})")
    front = result.front
    ax.plot([t.memory / scale for t in front], [t.alloc_time_s * 1e3 for t in front], "-o",
            color="#ff7f0e", ms=5, lw=1.2, label="Pareto front")
    marks = [(result.defaults, "s", "black", "defaults"),
             (result.current, "D", "#2ca02c", "current"), (result.best, "*", "#d62728", "answer")]
    for trial, marker, color, name in marks:
        if trial is not None and trial.completed and trial.memory:
            ax.scatter([trial.memory / scale], [trial.alloc_time_s * 1e3], marker=marker,
                       s=140 if marker == "*" else 60, color=color, zorder=5,
                       label=f"{name}: {describe(trial.setting, result.capacity)[:60]}")
        elif trial is not None and name != "answer":
            ax.plot([], [], " ", label=f"{name}: out of memory (not drawn)")
    duration = float(result.trace.get("duration_s") or 0)
    if result.max_slowdown is not None and duration > 0:
        budget_ms = (result.max_slowdown - 1) * duration * 1e3
        drawn = max([t.alloc_time_s * 1e3 for t in done] + [0.0])
        if budget_ms <= 5 * drawn:
            ax.axhline(budget_ms, color="red", ls="--", lw=1,
                       label=f"budget {result.max_slowdown:.2f}x")
        else:   # a line far above every point would squash them all onto the axis
            ax.plot([], [], " ", label=f"budget {result.max_slowdown:.2f}x = {budget_ms:.3g} ms "
                                       "(off the scale)")
    ax.axvline(result.trace["peak_live"] / scale, color="#777777", ls="--", lw=1,
               label="peak live (lower bound)")
    if card and result.device.capacity <= 4 * top:
        ax.axvline(result.device.capacity / scale, color="black", ls=":", lw=1,
                   label=f"card {format_size(result.device.capacity)}")
    elif card:  # a card far past every point left the plot mostly empty: named, not drawn
        ax.plot([], [], " ", label=f"card {format_size(result.device.capacity)} (off the scale)")
    times = [t.alloc_time_s for t in done if t.alloc_time_s > 0]
    if times and max(times) > 30 * min(times):
        ax.set_yscale("log")        # caching and not caching differ by orders of magnitude
    ooms = sum(1 for t in result.trials if not t.completed)
    ax.set_xlabel(f"{'peak reserved' if card else 'smallest card'} ({unit})")
    ax.set_ylabel("modelled allocator time (ms)")
    ax.set_title(f"tune {shown(result.trace['name'])} as {result.framework}\n{len(result.trials)} "
                 f"settings; {ooms} run out of memory (not drawn)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return save(fig, path)


def comparison_document(result: TuneResult, trace: Trace) -> dict[str, Any]:
    """The defaults, the current setting, the answer and the front replayed with their
    timelines, shaped as a compare results document (the HTML report's comparison)."""
    chosen: list[Trial] = []
    for trial in [result.defaults, result.current, result.best, *result.front]:
        if trial is not None and trial not in chosen:
            chosen.append(trial)
    runs = []
    for trial in chosen:
        device = result.device.device_with(trial.capacity, result.device.context_bytes)
        # Named by the registry spec each ran as (what `export-snapshot --policy` takes);
        # the lines to paste are in the reason.
        runs.append(replay(trace, trial.spec, device).to_json_dict(timeline=True))
    best = result.best
    paste = "; ".join(result.paste) or "nothing to set"
    return {"schema": SCHEMA_VERSION, "kind": COMPARE_KIND, "trace": result.trace,
            "device": {"name": result.device.label, "capacity": result.device.capacity,
                       "granularity": result.device.granularity,
                       "map_granularity": result.device.map_granularity,
                       "context_bytes": result.device.context_bytes},
            "results": runs,
            "winner": None if best is None else runs[chosen.index(best)]["policy"],
            "reason": f"tune: paste {paste} — {result.headline()}",
            "max_slowdown": result.max_slowdown}


def write_files(result: TuneResult, trace: Trace, folder: str | Path) -> list[Path]:
    """``tune.json``, ``tune.png``, ``tune-results.json`` and ``report.html`` in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(result.to_json_dict(), folder / "tune.json", kind="tune")
    figure(result, folder / "tune.png")
    document = comparison_document(result, trace)
    write_json(document, folder / "tune-results.json", kind="results")
    write_report([document], folder / "report.html", title=f"allocsim tune — {trace.name}")
    return [folder / name for name in ("tune.json", "tune.png", "tune-results.json",
                                       "report.html")]
