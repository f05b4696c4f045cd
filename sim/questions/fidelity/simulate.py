"""A PyTorch snapshot made by the ``pytorch`` model itself: fidelity's round trip.

:func:`simulate_snapshot` runs a trace through the model and writes what PyTorch would have
recorded: the model's addresses, its device calls as segment entries (each with the stream
that owns the segment), ``oom`` entries for the requests it failed, the final segments and
matching ``allocator_settings``. Imported again and checked with
:func:`~allocsim.sim.questions.fidelity.pytorch.fidelity`, it must match 100%.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Iterable
from typing import Any

import numpy as np

from allocsim.policies import PolicySpec, parse_policy
from allocsim.policies.pytorch.caching import PyTorchCachingAllocator
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.questions.fidelity.device import RecordedAddressDevice
from allocsim.sim.questions.fidelity.recording import LARGE_CAPACITY, FidelityError
from allocsim.sim.questions.fidelity.settings import settings_record
from allocsim.traces.model import OP_ALLOC, Trace

__all__ = ["simulate_snapshot"]


def simulate_snapshot(trace: Trace, policy: str | PolicySpec = "pytorch",
                      profile: DeviceProfile | None = None, *,
                      empty_cache_before: Iterable[int] = ()) -> dict[str, Any]:
    """A PyTorch snapshot dict of ``trace`` as the ``pytorch`` model runs it: the model's
    addresses, its device calls as segment entries, ``oom`` entries for requests it failed
    (dropped from the exported trace, as PyTorch records no alloc for them), final segments
    from :meth:`PyTorchCachingAllocator.segments` and matching ``allocator_settings``.
    ``empty_cache_before`` calls empty_cache() before those event indices (len(trace): at
    the end). Importing it and running :func:`~allocsim.sim.questions.fidelity.pytorch.fidelity`
    must match 100%: the round trip."""
    from allocsim.traces.formats.torch_snapshot import snapshot_of_run

    spec = parse_policy(policy)
    if spec.name != "pytorch":
        raise FidelityError(f"simulate_snapshot models PyTorch's allocator, not {spec.name!r}")
    profile = profile or DeviceProfile("simulated", LARGE_CAPACITY, granularity=512)
    device = RecordedAddressDevice(profile)
    model = spec.build(device.view(0))
    if not isinstance(model, PyTorchCachingAllocator):
        raise RuntimeError(f"{spec} built a {type(model).__name__}, not the pytorch model")
    recorder = _CallRecorder(device)
    keep, addresses = _run_model(trace, model, recorder, {int(i) for i in empty_cache_before})
    exported = trace if keep.all() else trace.select(keep)
    snapshot = snapshot_of_run(exported, addresses, recorder.entries)
    handles = {}
    for small, raw in (trace.metadata.get("stream_handles") or {}).items():
        try:
            handles[int(small)] = int(raw)
        except (TypeError, ValueError):
            continue
    snapshot["segments"] = [_snapshot_segment(seg, handles) for seg in model.segments()]
    snapshot["allocator_settings"] = settings_record(dict(spec.params))
    return snapshot


class _CallRecorder:
    """The model's device calls as snapshot entries (``device_traces``), each with the stream
    that owns the memory: a cudaMalloc'd segment keeps the stream it was first made for, a
    mapped page belongs to the virtual range (expandable segment) it lies in. O(log r) a call
    for r virtual ranges, O(r) to record a new range."""

    def __init__(self, device: RecordedAddressDevice) -> None:
        self.device = device
        self.calls: list[tuple[str, int, int]] = []
        device.calls = self.calls
        self.entries: list[dict[str, Any]] = []
        self._segment_stream: dict[int, int] = {}         # cudaMalloc'd segment -> its stream
        self._range_bases: list[int] = []                 # virtual ranges, sorted
        self._range_info: dict[int, tuple[int, int]] = {}  # base -> (size, stream)

    def _stream_of(self, action: str, address: int, stream: int) -> int:
        if action in ("segment_alloc", "segment_free"):
            return self._segment_stream.setdefault(address, stream)
        bases = self._range_bases
        at = bisect_right(bases, address) - 1
        if at >= 0 and address < bases[at] + self._range_info[bases[at]][0]:
            return self._range_info[bases[at]][1]
        return stream

    def flush(self, stream: int, event: int) -> None:
        """Record the calls made since the last flush, on behalf of ``stream``, before
        exported trace event ``event``."""
        for action, address, size in self.calls:
            if action == "address_range":
                insort(self._range_bases, address)
                self._range_info[address] = (size, stream)
                continue
            self.entries.append({"action": action, "addr": address, "size": size,
                                 "stream": self._stream_of(action, address, stream),
                                 "event": event})
        del self.calls[:]

    def oom(self, size: int, stream: int, event: int) -> None:
        """A request of ``size`` (rounded) bytes the model failed, before ``event``."""
        device = self.device
        self.entries.append({"action": "oom", "addr": 0, "stream": stream, "size": size,
                             "device_free": device.capacity - device.used, "event": event})


def _run_model(trace: Trace, model: PyTorchCachingAllocator, recorder: _CallRecorder,
               empties: set[int]) -> tuple[np.ndarray, dict[int, int]]:
    """Replay ``trace`` through ``model``, recording its calls; ``(which events the exported
    trace keeps, exported alloc index → address)``. A failed alloc and its free are dropped
    (PyTorch records no alloc for a failed request), and so are zero-byte allocs."""
    ops, ids = trace.op.tolist(), trace.id.tolist()
    sizes, streams = trace.size.tolist(), trace.stream.tolist()
    n = len(ops)
    keep = np.ones(n, dtype=bool)
    addresses: dict[int, int] = {}
    live: dict[int, int] = {}
    dropped: set[int] = set()
    kept = 0
    for i in range(n + 1):
        if i in empties:
            model.empty_cache()
            recorder.flush(0, kept)
        if i == n:
            break
        if ops[i] == OP_ALLOC:
            if sizes[i] <= 0:
                keep[i] = False
                dropped.add(ids[i])
                continue
            address = model.malloc(sizes[i], streams[i])
            recorder.flush(streams[i], kept)
            if address is None:
                keep[i] = False
                dropped.add(ids[i])
                recorder.oom(model.rounded_size(sizes[i]), streams[i], kept)
                continue
            live[ids[i]] = address
            addresses[kept] = address
        else:
            if ids[i] in dropped:
                dropped.discard(ids[i])
                keep[i] = False
                continue
            model.free(live.pop(ids[i]))
            recorder.flush(streams[i], kept)
        kept += 1
    return keep, addresses


def _snapshot_segment(seg: dict[str, Any], handles: dict[int, int]) -> dict[str, Any]:
    """One model segment as PyTorch's ``segments`` list has it (streams as raw handles)."""
    blocks = [{"address": b["address"], "size": b["size"], "requested_size": b["requested_size"],
               "state": b["state"], "frames": []} for b in seg["blocks"]]
    return {"device": 0, "address": seg["address"], "total_size": seg["total_size"],
            "allocated_size": seg["allocated_size"], "active_size": seg["active_size"],
            "requested_size": seg["requested_size"],
            "stream": handles.get(seg["stream"], seg["stream"]),
            "segment_type": seg["segment_type"], "segment_pool_id": [0, 0],
            "is_expandable": seg["is_expandable"], "frames": [], "blocks": blocks}
