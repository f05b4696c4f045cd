"""A simulated run as a PyTorch memory snapshot, to open in PyTorch's memory viewer.

``allocsim export-snapshot TRACE --policy SPEC -o run.pickle`` replays the trace through any
policy and writes what it did — each buffer at the address the policy chose, each device call as
a segment_alloc / segment_free / segment_map / segment_unmap entry — in the pickle format of
``torch.cuda.memory._dump_snapshot``. Drag the file onto https://pytorch.org/memory_viz (or run
``python -m torch.cuda._memory_viz trace_plot run.pickle -o run.html``) to see the policy's
segments and blocks over time as PyTorch users see their own runs.

This is a plain event loop (not the engine's hot loop): it records an address per allocation,
which the engine deliberately does not.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from allocsim.policies import PolicySpec, format_size, parse_policy
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.output.files import atomic_output
from allocsim.traces.formats.torch_snapshot import snapshot_of_run
from allocsim.traces.model import OP_ALLOC, Trace

_ACTIONS = {"malloc": "segment_alloc", "free": "segment_free", "map": "segment_map",
            "unmap": "segment_unmap"}


@dataclass(frozen=True)
class SnapshotRun:
    """A replay as a snapshot: the snapshot dict, the requests the policy failed (``(trace
    event index, bytes)`` each, in order) and how many of the trace's events it shows (a
    failed request and the free of its buffer are left out)."""

    snapshot: dict
    failed: list[tuple[int, int]]
    shown_events: int

    def failure_note(self, what: str) -> str | None:
        """One line on the requests the policy failed, or None when none failed."""
        if not self.failed:
            return None
        event, size = self.failed[0]
        more = "" if len(self.failed) == 1 else f"; {len(self.failed) - 1:,} more requests fail"
        return (f"{what} runs out of memory at event {event:,} ({format_size(size)} "
                f"requested{more})")


def simulate_snapshot(trace: Trace, policy: str | PolicySpec,
                      device: DeviceProfile) -> SnapshotRun:
    """Replay ``trace`` through ``policy`` on ``device``, recording what a snapshot shows.
    Requests the policy fails become ``oom`` entries, placed where they happened (before the
    next event shown); their buffers are left out, as PyTorch records no alloc for them."""
    spec = parse_policy(policy)
    view = SimulatedDevice(device).view(0)
    model = spec.build(view)
    keep_memory_stats = getattr(model, "keep_memory_stats", None)
    if keep_memory_stats is not None:
        keep_memory_stats(False)     # the export reads blocks and segments, not memory_stats()
    view.log = []
    addresses: dict[int, int] = {}
    segment_events: list[dict] = []
    live: dict[int, int] = {}
    left_out: list[int] = []
    failed: list[tuple[int, int]] = []
    sizes = trace.matched_sizes()
    ops, ids = trace.op.tolist(), trace.id.tolist()
    streams, times = trace.stream.tolist(), trace.time_ns.tolist()
    for i, (op, ident, size, stream) in enumerate(zip(ops, ids, sizes.tolist(), streams)):
        logged = len(view.log)
        if op == OP_ALLOC:
            if size <= 0:
                left_out.append(i)
                continue
            address = model.malloc(size, stream)
            if address is None:
                left_out.append(i)
                failed.append((i, size))
                segment_events.append({"action": "oom", "size": size, "stream": stream,
                                       "event": i, "time_ns": times[i],
                                       "device_free": device.capacity - view.device.used})
            else:
                live[ident] = address
                addresses[i] = address
        else:
            address = live.pop(ident, None)
            if address is None:
                left_out.append(i)
            else:
                model.free(address)
        for call in view.log[logged:]:
            if call.ok and call.address is not None:
                segment_events.append({"action": _ACTIONS[call.kind], "addr": call.address,
                                       "size": call.nbytes, "stream": stream, "event": i,
                                       "time_ns": times[i]})
    kept = trace
    if left_out:
        shown = np.ones(len(trace), dtype=bool)
        shown[left_out] = False
        kept = trace.select(shown)
        # An entry of event i comes before the i-th event shown: the number shown before it
        # (a request left out at the start comes before the first; at the end, after the last).
        shown_before = (np.cumsum(shown) - shown).tolist()
        addresses = {shown_before[i]: a for i, a in addresses.items()}
        for entry in segment_events:
            entry["event"] = shown_before[entry["event"]]
    snapshot = snapshot_of_run(kept, addresses, segment_events)
    snapshot.setdefault("allocator_settings", {})["allocsim_policy"] = str(spec)
    return SnapshotRun(snapshot, failed, len(kept))


def run_as_snapshot(trace: Trace, policy: str | PolicySpec, device: DeviceProfile) -> dict:
    """The snapshot dict of ``trace`` replayed through ``policy`` on ``device``
    (:func:`simulate_snapshot`)."""
    return simulate_snapshot(trace, policy, device).snapshot


def write_snapshot(run: SnapshotRun, path: str | os.PathLike[str]) -> Path:
    """Write ``run``'s snapshot to ``path``, atomically: a killed or failed export leaves the
    previous file whole."""
    with atomic_output(path) as stream:
        pickle.dump(run.snapshot, stream, protocol=4)
    return Path(path)


def export_snapshot(trace: Trace, policy: str | PolicySpec, device: DeviceProfile,
                    path: str | Path) -> Path:
    """Write the snapshot of ``trace`` under ``policy`` to ``path``, atomically."""
    return write_snapshot(simulate_snapshot(trace, policy, device), path)
