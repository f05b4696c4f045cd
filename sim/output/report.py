"""Results for people: a readable table, results.json, and figures.

Figures (matplotlib, Agg backend, PNG):
- ``memory_timeline.png``: per policy, allocated vs reserved (and bytes in use) over the run,
  OOMs marked;
- ``peaks.png``: peak reserved next to peak allocated, per policy;
- ``fragmentation.png``: free share of reserved memory over the run, per policy.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.policies.units import format_size
from allocsim.sim.kernel.results import RunResult
from allocsim.sim.questions.compare import Comparison

COLUMNS = ("policy", "done", "peak reserved", "peak allocated", "util", "frag", "OOMs",
           "dev mallocs", "dev frees", "alloc time", "slowdown")


def _row(result: RunResult) -> list[str]:
    return [
        result.policy,
        "yes" if result.completed else "NO",
        format_size(result.peak_reserved),
        format_size(result.peak_allocated),
        f"{result.utilization:.1%}",
        f"{result.fragmentation:.1%}",
        str(result.ooms),
        f"{result.device_mallocs:,}",
        f"{result.device_frees:,}",
        f"{result.alloc_time_s * 1e3:.3g} ms",
        f"{result.slowdown:.3f}x",
    ]


def format_table(rows: Sequence[Sequence[str]], header: Sequence[str],
                 left: Sequence[int] = (0,)) -> str:
    """A plain text table: columns in ``left`` left-aligned (text), the rest right (numbers)."""
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def comparison_text(comparison: Comparison) -> str:
    """The table ``allocsim compare`` prints, with the trace, the device and the verdict."""
    trace = comparison.trace
    device = comparison.device
    head = (f"trace  {trace['name']}: {trace['events']:,} events, {trace['allocs']:,} allocs, "
            f"{trace['duration_s']:.3g} s, peak live {format_size(trace['peak_live'])}\n"
            f"device {device.name}: {format_size(device.capacity)}\n")
    table = format_table([_row(r) for r in comparison.results], COLUMNS)
    verdict = (f"winner: {comparison.winner} — {comparison.reason}" if comparison.winner
               else f"winner: none — {comparison.reason}")
    return f"{head}\n{table}\n\n{verdict}"


def write_json(data: Any, path: str | Path) -> None:
    """Write JSON atomically (temp file + rename); keys in schema order, not sorted."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes 0600; a results file is as readable as any
    with os.fdopen(handle, "w") as out:
        json.dump(data, out, indent=2)
        out.write("\n")
    os.replace(tmp, path)


# -- figures ---------------------------------------------------------------------------
def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _gib(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64) / (1 << 30)


def plot_timelines(results: Sequence[RunResult], path: str | Path, title: str = "") -> Path:
    plt = _pyplot()
    n = max(1, len(results))
    fig, axes = plt.subplots(n, 1, figsize=(9, 2.2 * n + 0.6), sharex=True, squeeze=False)
    for ax, result in zip(axes[:, 0], results):
        tl = result.timeline
        if tl is None or not len(tl.event):
            continue
        seconds = tl.time_ns / 1e9
        ax.fill_between(seconds, _gib(tl.allocated), step="post", alpha=0.35, label="allocated")
        ax.step(seconds, _gib(tl.in_use), where="post", lw=0.8, label="in use (rounded)")
        ax.step(seconds, _gib(tl.reserved), where="post", lw=1.4, color="black", label="reserved")
        if result.first_oom_event is not None:
            at = np.searchsorted(tl.event, result.first_oom_event)
            at = min(at, len(seconds) - 1)
            ax.axvline(seconds[at], color="red", ls="--", lw=1, label="first OOM")
        ax.set_title(f"{result.policy}: peak reserved {format_size(result.peak_reserved)}, "
                     f"utilization {result.utilization:.0%}", fontsize=9, loc="left")
        ax.set_ylabel("GiB")
    axes[0, 0].legend(loc="upper right", fontsize=7, ncol=4)
    axes[-1, 0].set_xlabel("simulated time (s)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_peaks(results: Sequence[RunResult], path: str | Path, title: str = "") -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(results) + 2), 3.6))
    x = np.arange(len(results))
    ax.bar(x - 0.2, _gib([r.peak_reserved for r in results]), 0.4, label="peak reserved")
    ax.bar(x + 0.2, _gib([r.peak_allocated for r in results]), 0.4, label="peak allocated")
    for i, r in enumerate(results):
        if not r.completed:
            ax.annotate("OOM", (i - 0.2, r.peak_reserved / (1 << 30)), ha="center", color="red",
                        fontsize=8)
    ax.set_xticks(x, [r.policy for r in results], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("GiB")
    ax.legend(fontsize=8)
    ax.set_title(title or "peak reserved vs peak allocated", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_fragmentation(results: Sequence[RunResult], path: str | Path, title: str = "") -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.4))
    for result in results:
        tl = result.timeline
        if tl is None or not len(tl.event):
            continue
        reserved = tl.reserved.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(reserved > 0, (reserved - tl.in_use) / reserved, 0.0)
        ax.step(tl.time_ns / 1e9, share * 100, where="post", lw=1, label=result.policy)
    ax.set_ylabel("free inside reserved (%)")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    ax.set_title(title or "external fragmentation over time", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_comparisons(comparisons: Sequence[Comparison], out_dir: str | Path) -> list[Path]:
    """Into ``out_dir``: ``results.json`` (one object, or an array for several traces, as
    ``--json`` prints), ``report.html`` with every trace, and the three figures per trace
    (prefixed ``NN-NAME-`` when there are several). Returns the paths written."""
    from allocsim.sim.output.html_report import write_report

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    documents = [c.to_json_dict(timeline=True) for c in comparisons]
    json_path = out / "results.json"
    write_json(documents[0] if len(documents) == 1 else documents, json_path)
    title = ("allocsim: " + documents[0]["trace"]["name"]) if len(documents) == 1 \
        else f"allocsim: {len(documents)} traces"
    written = [json_path, write_report(documents, out / "report.html", title)]
    for index, comparison in enumerate(comparisons):
        name = comparison.trace["name"]
        prefix = "" if len(comparisons) == 1 else f"{index:02d}-{name}-"
        written += [
            plot_timelines(comparison.results, out / f"{prefix}memory_timeline.png", f"trace {name}"),
            plot_peaks(comparison.results, out / f"{prefix}peaks.png", f"trace {name}"),
            plot_fragmentation(comparison.results, out / f"{prefix}fragmentation.png", f"trace {name}"),
        ]
    return written
