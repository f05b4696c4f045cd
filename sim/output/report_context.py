"""What a comparison's numbers include and leave out: the box above each trace's table.

The CLI says it under its table (sim/output/tables.py: the device's assumed context, memory
live before recording); the page says the same, and what the page has room for besides:
what the recording itself reserved where the file kept it, and why the model's peak reserved
differs from it (memory live before the recording started is not replayed unless
``--start-state unrecorded``; the context is the device's, not the allocator's), and what the
replay does not model at all.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from allocsim.policies.units import format_size
from allocsim.sim.kernel.device_buffers import TPU_NAMES
from allocsim.sim.kernel.device_profile import read_label
from allocsim.sim.output.display_text import shown

# What no replay of a recording holds, whatever the trace: the replay sees the requests of
# the one allocator that was recorded, nothing else on the device.
NOT_MODELLED_ALWAYS = (
    "memory outside the recorded allocator: other processes on the device, NCCL buffers, "
    "and library workspaces (cuBLAS, cuDNN) unless the recording holds them")


@dataclass
class RecordingFacts:
    """What the trace file says beyond its events (from the trace, when the report has it)."""

    recorded_reserved: int | None = None          # the recording's own peak reserved
    not_modelled: list[str] = field(default_factory=list)


def _reference(data: dict[str, Any]) -> dict[str, Any]:
    """The run the recording is set against: the framework's own allocator where the table
    has it (pytorch, jax, bfc), else the winner, else the first row."""
    results = data["results"]
    for name in ("pytorch", "jax", "bfc"):
        for r in results:
            if r["policy"] == name:
                return r
    return next((r for r in results if r["policy"] == data.get("winner")), results[0])


def _gap(data: dict[str, Any], recorded: int, before: int, in_replay: bool) -> str:
    """Why the model's reserved is not the recording's."""
    run = _reference(data)
    model = int(run["peak_reserved"])
    text = (f"The recording's allocator reserved up to <b>{format_size(recorded)}</b>; the "
            f"model's <code>{html.escape(shown(run['policy']))}</code> reserves "
            f"<b>{format_size(model)}</b> at its peak")
    if recorded <= model:
        return text + ".</li>"
    gap = recorded - model
    parts = []
    if before and not in_replay:
        parts.append(f"{format_size(min(before, gap))} of it is memory live before the "
                     "recording started, which the replay does not hold")
    rest = gap - (min(before, gap) if not in_replay else 0)
    if rest > 0:
        parts.append(f"{format_size(rest)} is what the allocator kept cached beyond the model "
                     "(blocks freed before or outside the recording, a cache that grew under "
                     "other work, settings the model does not read)")
    return (text + f", {format_size(gap)} less: " + "; ".join(parts) + ".</li>")


def context_box(data: dict[str, Any], facts: RecordingFacts | None) -> str:
    """The list under a trace's heading: context, memory before recording, the recording's
    own reserved against the model's, and what is not modelled."""
    trace, device = data["trace"], data["device"]
    items = []
    context = int(device.get("context_bytes") or 0)
    capacity = format_size(int(device["capacity"]))
    if context:
        # as the CLI says it (sim/output/tables.py): measured on a TPU, assumed on a GPU
        holder = ("the TPU runtime holds (measured on a v5e)"
                  if read_label(str(device["name"]), int(device["capacity"]))[0] in TPU_NAMES else
                  "is assumed held by the CUDA context and libraries")
        items.append(f"<li>Device {html.escape(device['name'])}: {capacity}, of which "
                     f"<b>{format_size(context)}</b> {holder} before the allocator starts; "
                     "<code>--context</code> sets it. Peak reserved in the table does not "
                     "include it; a card fits when peak reserved + context ≤ capacity.</li>")
    else:
        items.append(f"<li>Device {html.escape(device['name'])}: {capacity}, no context "
                     "assumed (<code>--context</code> sets one).</li>")
    before = trace.get("live_before_recording") or {}
    before_bytes = int(before.get("min", 0))
    in_replay = bool(before.get("in_replay"))
    if before_bytes:
        items.append(
            f"<li><b>{format_size(before_bytes)}</b> was live before the recording started "
            + ("and is replayed as one buffer at the start.</li>" if in_replay else
               "and is <b>not</b> in the replay: every peak here leaves it out; "
               "<code>--start-state unrecorded</code> adds it as one buffer.</li>"))
    if facts is not None and facts.recorded_reserved:
        items.append("<li>" + _gap(data, facts.recorded_reserved, before_bytes, in_replay))
    not_modelled: Sequence[str] = [*(facts.not_modelled if facts else []), NOT_MODELLED_ALWAYS]
    items.append("<li>Not modelled: " + "; ".join(html.escape(line) for line in not_modelled)
                 + ".</li>")
    return "<ul class=context>" + "".join(items) + "</ul>"
