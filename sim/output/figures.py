"""Figures (matplotlib, Agg backend, PNG) of simulated runs:

- ``memory_timeline.png``: per policy, allocated vs reserved (and bytes in use) over the run,
  OOMs marked;
- ``peaks.png``: peak reserved next to peak allocated, per policy;
- ``fragmentation.png``: free share of reserved memory over the run, per policy;
- the processes of a shared run, stacked against the device's capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.policies.units import format_size
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.engine import SharedRun
from allocsim.sim.kernel.results import RunResult
from allocsim.sim.questions.share import ShareSpec


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported only when a figure is drawn (so that
    commands printing tables never pay for matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _gib(values: np.ndarray | Sequence[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.float64) / (1 << 30)


def plot_timelines(results: Sequence[RunResult], path: str | Path, title: str = "") -> Path:
    plt = pyplot()
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
            at = min(int(np.searchsorted(tl.event, result.first_oom_event)), len(seconds) - 1)
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
    plt = pyplot()
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
    plt = pyplot()
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


def plot_share(run: SharedRun, specs: Sequence[ShareSpec], device: DeviceProfile,
               path: str | Path) -> Path:
    """Each process's reserved bytes over time, stacked, with the device's capacity."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ends = [int(r.timeline.time_ns[-1]) for r in run.results
            if r.timeline is not None and len(r.timeline.time_ns)]
    grid = np.linspace(0, max([*ends, 1]), 1000)
    stacked = np.zeros_like(grid)
    for index, result in enumerate(run.results):
        tl = result.timeline
        if tl is None or not len(tl.time_ns):
            continue
        at = np.searchsorted(tl.time_ns, grid, side="right") - 1
        values = np.where((at >= 0) & (grid <= tl.time_ns[-1]), tl.reserved[np.maximum(at, 0)], 0)
        ax.fill_between(grid / 1e9, stacked / (1 << 30), (stacked + values) / (1 << 30),
                        step="post", alpha=0.6, label=f"p{index} {result.policy}"
                        + ("" if result.completed else " (OOM)"))
        stacked = stacked + values
    ax.axhline(device.capacity / (1 << 30), color="red", ls="--", lw=1, label="capacity")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("reserved (GiB)")
    ax.set_title(f"processes sharing {device.name}", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
