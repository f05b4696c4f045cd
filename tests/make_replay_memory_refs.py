"""Record the results tests/test_replay_memory.py holds the memory-lean replay to (issue 17.4).

    python tests/make_replay_memory_refs.py            # rewrite tests/data/replay_memory.json
    python tests/make_replay_memory_refs.py --check    # compare instead, print what differs

Recorded from the engine as it was before the replay's memory was cut (whole-trace matched
sizes, the device-call log as three plain typed arrays, whole-trace temporaries): for each
case, the SHA-256 of what a caller can see of a replay — ``replay(...)``'s RunResult JSON with
its timeline, the shared engine's results, a run stopped at its first OOM, and the per-event
arrays the validator reads off :class:`ProcessReplay` (``call_events``, ``call_reserved``).
The traces are built to cross many chunks of the engine when its chunk is made small: several
generators, the bundled traces, free sizes left unknown, several streams, tags. Rerun only for
an intended change of results.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
from reference_files import write_or_check

from allocsim.policies import parse_policy
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice, resolve_device
from allocsim.sim.kernel.engine import ProcessReplay, SharedProcess, replay, run_shared
from allocsim.traces import synth
from allocsim.traces.bundled import load_bundled_traces
from allocsim.traces.model import OP_FREE, SIZE_UNKNOWN, Trace

REFS = Path(__file__).parent / "data" / "replay_memory.json"

POLICIES = ("on-demand", "preallocate", "best-fit:page=2097152,trim=true", "bfc", "pytorch",
            "cupy", "cuda-async", "cuda-async:fraction=0.75", "buddy:release=true")
DEVICES = (("a100-80g", None), ("t4-16g", "256MiB"))


def _unknown_free_sizes(trace: Trace) -> Trace:
    """The same events with every other free's size unknown (matched sizes are computed)."""
    size = trace.size.copy()
    frees = np.flatnonzero(trace.op == OP_FREE)
    size[frees[::2]] = SIZE_UNKNOWN
    return Trace(time_ns=trace.time_ns, op=trace.op, id=trace.id, size=size,
                 stream=trace.stream, process=trace.process, tag=trace.tag,
                 tags=list(trace.tags), metadata=dict(trace.metadata, name=f"{trace.name}-unk"))


def _streams(trace: Trace) -> Trace:
    """The same events on three streams (by id), tags constant."""
    return Trace(time_ns=trace.time_ns, op=trace.op, id=trace.id, size=trace.size,
                 stream=(trace.id % 3).astype(np.int32), process=trace.process,
                 tag=np.zeros(len(trace), np.int32), tags=["one"],
                 metadata=dict(trace.metadata, name=f"{trace.name}-streams"))


def traces() -> Iterator[tuple[str, Trace]]:
    """(label, trace) for every input of the references."""
    for trace in load_bundled_traces():
        yield trace.name, trace
    training = synth.generate("training", seed=0, steps=3, layers=4)
    yield "training", training
    yield "transformer", synth.generate("transformer", seed=1, steps=2)
    yield "kvcache", synth.generate("kvcache", seed=2, requests=20)
    random = synth.generate("random", seed=3, events=6000, live=300)
    yield "random", random
    yield "random-unknown-free-sizes", _unknown_free_sizes(random)
    yield "training-unknown-free-sizes", _unknown_free_sizes(training)
    yield "random-streams", _streams(random)


def _digest(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()[:16]


def _json(value: object) -> str:
    return json.dumps(_without_trace_times(value), sort_keys=False)


def _without_trace_times(value: object) -> object:
    """A result (or a list of them) without its timeline's ``trace_time_ns``: the trace's own
    time at each bucket (the report's shared axis) joined the timeline after the references
    were recorded; it is the trace's time column, not the replay's doing."""
    if isinstance(value, list):
        return [_without_trace_times(item) for item in value]
    if isinstance(value, dict) and isinstance(value.get("timeline"), dict):
        timeline = {k: v for k, v in value["timeline"].items() if k != "trace_time_ns"}
        return {**value, "timeline": timeline}
    return value


def reference_device(device: str, capacity: str | None) -> DeviceProfile:
    """The device of a case, with no device share (context_bytes 0): the references were
    recorded before the profiles gained one (issue 26.3) and hold the replay's code."""
    return replace(resolve_device(device, capacity), context_bytes=0)


def case(trace: Trace, policy: str, device: str, capacity: str | None) -> dict[str, str]:
    """The digests of one (trace, policy, device) case."""
    profile = reference_device(device, capacity)
    out = {"replay": _digest(_json(replay(trace, policy, profile).to_json_dict(timeline=True))),
           "stopped": _digest(_json(replay(trace, policy, profile, stop_on_oom=True)
                                    .to_json_dict(timeline=True)))}
    run = ProcessReplay(trace, parse_policy(policy), SimulatedDevice(profile), call_log=True)
    run.report.sample_every = 1
    run.advance(run.n)
    result = run.result(profile.label)
    log = b"".join(np.asarray(column, dtype=dtype).tobytes() for column, dtype in (
        (run.report.call_events, np.int64), (run.report.call_reserved, np.int64),
        (run.report.call_cost, np.float64)))
    out["log"] = _digest(log + _json(result.to_json_dict(timeline=True)).encode())
    return out


def shared_case(trace: Trace, policy: str, device: str, capacity: str | None) -> str:
    """Two copies of ``trace`` sharing the device, the second starting later."""
    profile = reference_device(device, capacity)
    later = max(1, int(trace.time_ns[-1] - trace.time_ns[0]) // 3) if len(trace) else 1
    run = run_shared([SharedProcess(trace, policy), SharedProcess(trace, policy, later)], profile)
    return _digest(_json([r.to_json_dict(timeline=True) for r in run.results])
                   + run.device_time_ns.tobytes().hex() + run.device_used.tobytes().hex()
                   + str(run.device_peak))


def key(label: str, policy: str, device: str, capacity: str | None) -> str:
    return f"{label}|{policy}|{device}:{capacity or ''}"


SHARED_LABELS = ("training", "random")
SHARED_POLICIES = ("on-demand", "bfc", "cuda-async")


def record() -> dict[str, object]:
    refs: dict[str, object] = {}
    for label, trace in traces():
        for policy in POLICIES:
            for device, capacity in DEVICES:
                refs[key(label, policy, device, capacity)] = case(trace, policy, device, capacity)
        if label in SHARED_LABELS:
            for policy in SHARED_POLICIES:
                for device, capacity in DEVICES:
                    refs["shared|" + key(label, policy, device, capacity)] = shared_case(
                        trace, policy, device, capacity)
    return refs


def main(argv: list[str]) -> int:
    return write_or_check(record(), REFS, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
