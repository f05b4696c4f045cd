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

import pickle
from pathlib import Path

from allocsim.policies import PolicySpec, parse_policy
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.output.files import atomic_output
from allocsim.traces.formats.torch_snapshot import snapshot_of_run
from allocsim.traces.model import OP_ALLOC, Trace

_ACTIONS = {"malloc": "segment_alloc", "free": "segment_free", "map": "segment_map",
            "unmap": "segment_unmap"}


def run_as_snapshot(trace: Trace, policy: str | PolicySpec, device: DeviceProfile) -> dict:
    """The snapshot dict of ``trace`` replayed through ``policy`` on ``device``. Requests the
    policy fails become ``oom`` entries (and their buffers are left out, as PyTorch records no
    alloc for them)."""
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
    failed_events: list[int] = []
    sizes = trace.matched_sizes()
    ops, ids = trace.op.tolist(), trace.id.tolist()
    streams, times = trace.stream.tolist(), trace.time_ns.tolist()
    for i, (op, ident, size, stream) in enumerate(zip(ops, ids, sizes.tolist(), streams)):
        logged = len(view.log)
        if op == OP_ALLOC:
            if size <= 0:
                failed_events.append(i)
                continue
            address = model.malloc(size, stream)
            if address is None:
                failed_events.append(i)
                segment_events.append({"action": "oom", "size": size, "stream": stream,
                                       "event": i, "time_ns": times[i],
                                       "device_free": device.capacity - view.device.used})
            else:
                live[ident] = address
                addresses[i] = address
        else:
            address = live.pop(ident, None)
            if address is None:
                failed_events.append(i)
            else:
                model.free(address)
        for call in view.log[logged:]:
            if call.ok and call.address is not None:
                segment_events.append({"action": _ACTIONS[call.kind], "addr": call.address,
                                       "size": call.nbytes, "stream": stream, "event": i,
                                       "time_ns": times[i]})
    kept = trace
    if failed_events:
        import numpy as np
        mask = np.ones(len(trace), dtype=bool)
        mask[failed_events] = False
        kept = trace.select(mask)
        index_map = np.cumsum(mask) - 1
        addresses = {int(index_map[i]): a for i, a in addresses.items()}
        for entry in segment_events:
            entry["event"] = int(index_map[min(entry["event"], len(trace) - 1)])
    snapshot = snapshot_of_run(kept, addresses, segment_events)
    snapshot.setdefault("allocator_settings", {})["allocsim_policy"] = str(spec)
    return snapshot


def export_snapshot(trace: Trace, policy: str | PolicySpec, device: DeviceProfile,
                    path: str | Path) -> Path:
    """Write the snapshot of ``trace`` under ``policy`` to ``path``, atomically: a killed or
    failed export leaves the previous file whole."""
    snapshot = run_as_snapshot(trace, policy, device)
    with atomic_output(path) as stream:
        pickle.dump(snapshot, stream, protocol=4)
    return Path(path)
