"""Results as text for people: the aligned tables ``allocsim`` prints and their verdict lines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from allocsim.errors import UserInputError
from allocsim.policies.registry import parse_policy
from allocsim.policies.units import format_size
from allocsim.printable import printable
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.device_buffers import is_tpu
from allocsim.sim.kernel.engine import SharedRun
from allocsim.sim.kernel.results import RunResult
from allocsim.sim.output.display_text import shown
from allocsim.sim.questions.capacity.minimum import CapacityAnswer
from allocsim.sim.questions.compare import Comparison
from allocsim.sim.questions.share import ShareSpec

COLUMNS = ("policy", "done", "peak reserved", "peak allocated", "util", "frag", "OOMs",
           "dev mallocs", "dev frees", "alloc time", "slowdown")


def _row(result: RunResult, name: str | None = None) -> list[str]:
    # Nothing reserved (a run refused at its first request): there is no share to speak of,
    # and "100%" of 0 B would read as a perfect fit.
    held = result.peak_reserved > 0
    return [
        shown(result.policy if name is None else name),
        "yes" if result.completed else "NO",
        format_size(result.peak_reserved),
        format_size(result.peak_allocated),
        f"{result.utilization:.1%}" if held else "-",
        f"{result.fragmentation:.1%}" if held else "-",
        str(result.ooms),
        f"{result.device_mallocs:,}",
        f"{result.device_frees:,}",
        f"{result.alloc_time_s * 1e3:.3g} ms",
        f"{result.slowdown:.3f}x",
    ]


def format_table(rows: Sequence[Sequence[str]], header: Sequence[str],
                 left: Sequence[int] = (0,)) -> str:
    """A plain text table: columns in ``left`` left-aligned (text), the rest right (numbers).
    Every cell is shown escaped (:func:`printable`): a name in a table (a trace's, a tag's, a
    policy's) reaches the terminal with no control character, and the columns stay aligned."""
    header = [printable(c) for c in header]
    rows = [[printable(c) for c in row] for row in rows]
    widths = [max(len(x) for x in column) for column in zip(header, *rows)]
    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def before_recording_note(trace: dict[str, Any]) -> str:
    """Memory the recording shows live before it started, where there is some."""
    before = trace.get("live_before_recording")
    if not before:
        return ""
    if before.get("in_replay"):
        return f" (incl. {format_size(before['min'])} live before recording, as one buffer)"
    return (f" (and {format_size(before['min'])} live before recording that the replay does "
            "not hold; --start-state unrecorded adds it)")


def context_holder(device: DeviceProfile) -> str:
    """Who holds the device's own share, and whether its size is measured or assumed."""
    if is_tpu(device):   # measured on a v5e: memory_stats() before any array
        return "the TPU runtime holds (measured on a v5e; --context sets it)"
    return "the CUDA context and libraries hold (assumed; --context sets it)"


def context_note(device: DeviceProfile) -> str:
    """The device's own share, where it has one (its size assumed unless --context set it)."""
    if not device.context_bytes:
        return ""
    return f", of which {format_size(device.context_bytes)} {context_holder(device)}"


def comparison_text(comparison: Comparison) -> str:
    """The table ``allocsim compare`` prints, with the trace, the device and the verdict."""
    trace = comparison.trace
    device = comparison.device
    head = (f"trace  {printable(shown(trace['name']))}: {trace['events']:,} events, "
            f"{trace['allocs']:,} allocs, {trace['duration_s']:.3g} s, "
            f"peak live {format_size(trace['peak_live'])}"
            f"{before_recording_note(trace)}\n"
            f"device {shown(device.label)}: {format_size(device.capacity)}"
            f"{context_note(device)}\n")
    choice = comparison.choice
    framework = choice is not None and choice.framework is not None
    columns = ("setting", *COLUMNS[1:]) if framework else COLUMNS
    table = format_table([_row(r, comparison.label(r.policy)) for r in comparison.results],
                         columns)
    compared = "" if choice is None else choice.sentence() + "\n"
    winner = comparison.winner
    verdict = (f"winner: {shown(comparison.label(winner))} — {comparison.reason}" if winner
               else f"winner: none — {comparison.reason}")
    paste = comparison.paste
    if paste is not None and choice is not None:
        verdict += "\npaste:  " + ("\n        ".join(paste) if paste else
                                   f"nothing to set (the {comparison.label(winner or '')})")
    return f"{head}{compared}\n{table}\n\n{verdict}"


def _headroom_cell(size: int | None, peak_live: int) -> str:
    if size is None:
        return "-"
    if not peak_live:   # nothing live: no ratio to a peak of 0
        return format_size(size)
    return f"{format_size(size)} ({size / peak_live:+.1%})"


def _positive(facts: Mapping[str, Any], key: str) -> int:
    value = facts.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _calls_held(facts: Mapping[str, Any]) -> bool:
    """Whether min-capacity's ``tpu`` search held each executable's scratch and code as buffers
    through its calls (allocsim.traces.tpu_needed: the trace lists its calls)."""
    return (facts.get("view") != "needed" and isinstance(facts.get("calls"), list)
            and isinstance(facts.get("executables"), list))


def _scratch_beside(policy: str, facts: Mapping[str, Any]) -> int:
    """The program's scratch the ``tpu`` policy held beside the buffers in this answer (so in
    its gap over peak live): the spec's ``scratch_bytes``, else the trace's
    (``xla_tpu.scratch_bytes``, sim/kernel/trace_scratch.py) unless the search held it through
    each call as a buffer; none on another policy."""
    try:
        spec = parse_policy(policy)
    except UserInputError:
        return 0
    if spec.name != "tpu":
        return 0
    own = dict(spec.params).get("scratch_bytes")
    if isinstance(own, int):
        return max(own, 0)
    return 0 if _calls_held(facts) else _positive(facts, "scratch_bytes")


def _tpu_program_note(facts: Mapping[str, Any], beside: int) -> str:
    """What the note says of the program's own XLA:TPU bytes (scratch, generated code)."""
    scratch, code = _positive(facts, "scratch_bytes"), _positive(facts, "code_bytes")
    code_text = (f"the executables' generated code ({format_size(code)}, xla_tpu.code_bytes) "
                 "is the program's too, a buffer of the trace in peak live" if code else "")
    if beside:
        said = (f"XLA:TPU's scratch {format_size(scratch)} (trace metadata "
                "xla_tpu.scratch_bytes)" if scratch else "the spec's scratch_bytes")
        text = (f"on tpu, 'of it program' is the program's, not the allocator's: {said}, "
                "held beside the buffers; 'of it allocator' is what is left")
        return text + ("; " + code_text if code_text else "")
    if _calls_held(facts) and (scratch or code):
        parts = " and ".join(f"{what} {format_size(n)}" for what, n in
                             (("scratch", scratch), ("generated code", code)) if n)
        return (f"on tpu, the lower bound holds the program's XLA:TPU {parts} (trace metadata "
                "xla_tpu) through each executable's calls: they are the program's, not the "
                "allocator's")
    return f"on tpu, {code_text}" if code_text else ""


def capacity_text(trace: dict[str, Any], device: DeviceProfile, resolution: int,
                  answers: Sequence[CapacityAnswer], *,
                  xla_tpu: Mapping[str, Any] | None = None) -> str:
    """The table ``allocsim min-capacity`` prints: each policy's smallest card, split into
    the device's own share (the context), peak live and what the allocator adds, with a note
    saying so (a 103 MiB job's "+496.6%" is mostly the assumed 512 MiB context).

    ``xla_tpu``: the trace's ``xla_tpu`` metadata (a TPU program's). The scratch the ``tpu``
    policy held beside the buffers is the program's, not the allocator's: a column of its own
    ('of it program'), left out of 'of it allocator'; the note names the scratch and the
    generated code as the program's."""
    peak = int(trace["peak_live"])
    context = answers[0].context_bytes if answers else 0
    facts: Mapping[str, Any] = xla_tpu if isinstance(xla_tpu, Mapping) else {}
    beside = [_scratch_beside(a.policy, facts) if facts and a.min_capacity is not None else 0
              for a in answers]
    rows = []
    for a, scratch in zip(answers, beside):
        allocator = a.allocator_headroom
        row = [shown(a.policy),
               "never" if a.min_capacity is None else format_size(a.min_capacity),
               format_size(a.lower_bound), format_size(context),
               _headroom_cell(a.headroom, a.lower_bound)]
        if any(beside):
            row.append(f"scratch {format_size(scratch)}" if scratch else "-")
        row += [_headroom_cell(None if allocator is None else allocator - scratch,
                               a.lower_bound),
                "yes" if a.monotone else "NO: " + "; ".join(a.exceptions[:2]),
                str(a.evaluations)]
        rows.append(row)
    head = (f"trace {printable(shown(trace['name']))}: peak live {format_size(peak)}"
            f"{before_recording_note(trace)}; resolution {format_size(resolution)}")
    program = ["of it program"] if any(beside) else []
    table = format_table(rows, ["policy", "min capacity", "lower bound", "context", "headroom",
                                *program, "of it allocator", "monotone", "runs"],
                         left=(0, 6 + len(program)))
    if context:
        note = ("min capacity is the whole card = context + lower bound (peak live) + what the "
                f"allocator adds; the context is the {format_size(context)} that "
                f"{context_holder(device)}. headroom, min capacity over the lower bound, "
                "includes the context; 'of it allocator' leaves it out")
    else:
        note = ("min capacity is the allocator's memory: no context is assumed on this device "
                "(--context SIZE adds one), so headroom is what the allocator adds over peak "
                "live")
    tpu_note = _tpu_program_note(facts, max(beside, default=0)) if facts else ""
    if tpu_note:
        note += f"\nnote: {tpu_note}"
    return f"{head}\n\n{table}\n\nnote: {note}"


def share_text(run: SharedRun, specs: Sequence[ShareSpec], device: DeviceProfile) -> str:
    rows = []
    refused = run.refused_outside or [None] * len(run.results)
    for index, (spec, result) in enumerate(zip(specs, run.results)):
        if result.completed:
            outcome = "completed"
        else:
            others = ", ".join(f"p{p} held {format_size(b)}"
                               for p, b in sorted((result.first_oom_others or {}).items()))
            asking = format_size(result.first_oom_size or 0)
            # Memory outside its allocator refused (SharedProcess): said as what it was.
            outcome = (f"OOM before its first event: its {asking} context did not fit, "
                       "it never started" if refused[index] == "context" else
                       f"OOM at event {result.first_oom_event:,} loading its {asking} "
                       "first-step load" if refused[index] == "first-step load" else
                       f"OOM at event {result.first_oom_event:,} asking {asking}")
            outcome += f" ({others})" if others else ""
        rows.append([f"p{index}", Path(spec.trace).name, result.policy,
                     f"{spec.start_ns / 1e9:g}s", format_size(result.peak_reserved),
                     format_size(result.peak_allocated), outcome])
    table = format_table(rows, ["proc", "trace", "policy", "start", "peak reserved",
                                "peak allocated", "outcome"], left=(0, 1, 2, 6))
    verdict = ("all processes complete" if all(r.completed for r in run.results)
               else "they cannot share this device as configured")
    held = sorted({(s.outside.context_bytes, s.outside.first_step_bytes) for s in specs
                   if s.outside})
    if held:
        verdict = "; ".join(f"{format_size(c)} context and {format_size(f)} first-step load"
                            for c, f in held) + (
            " held by each process outside its allocator (in the peak of all processes, not "
            "in peak reserved)\n" + verdict)
    if len(run.results) > 1 and run.spans_ns and not run.ran_together():
        spans = "; ".join(f"p{k} {start / 1e9:g}–{end / 1e9:g}s"
                          for k, (start, end) in enumerate(run.spans_ns))
        verdict += (f", but no two of them ran at the same time ({spans}): the device was "
                    "never shared; start them closer together (TRACE:POLICY@START) to test "
                    "sharing")
    return (f"device {shown(device.label)}: {format_size(device.capacity)}; peak of all processes "
            f"together {format_size(run.device_peak)}\n\n{table}\n\n{verdict}")
