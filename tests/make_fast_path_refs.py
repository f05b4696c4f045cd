"""Record the reference results that tests/test_fast_paths.py holds the replay to (issue 17).

    python tests/make_fast_path_refs.py            # rewrite tests/data/fast_paths.json
    python tests/make_fast_path_refs.py --check    # compare instead, print the cases that differ

Every policy (and the settings that pick a different hot path) on every bundled trace and on
each generator at small sizes with a few seeds, on a roomy device and on a tight one (so the
OOM and release paths run too). Each case keeps the SHA-256 of its input trace's columns (so
a changed generator reads as such, not as a changed policy) and of its RunResult JSON
(``to_json_dict(timeline=True)``). Written before the speed work, from the code as it was;
rerun only for an intended change of results.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from reference_files import write_or_check

from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.kernel.engine import replay
from allocsim.traces import synth
from allocsim.traces.bundled import load_bundled_traces
from allocsim.traces.model import Trace

REFS = Path(__file__).parent / "data" / "fast_paths.json"

POLICIES = (
    "on-demand", "preallocate", "preallocate:fraction=0.05", "best-fit",
    "best-fit:page=2097152,trim=true", "bfc", "bfc:allow_growth=false",
    "bfc:garbage_collection=true", "bfc:fragmentation_fraction=0.1", "pytorch",
    "pytorch:expandable_segments=true", "pytorch:max_split_size_mb=64",
    "pytorch:roundup_power2_divisions=4", "pytorch:garbage_collection_threshold=0.6",
    "pytorch:per_process_memory_fraction=0.5", "pytorch:max_non_split_rounding_mb=64",
    "pytorch:expandable_segments=true,garbage_collection_threshold=0.6",
    "cupy", "cupy:fraction=0.5", "cuda-async", "cuda-async:fraction=0.75",
    "cuda-async:preallocate=true,fraction=0.5", "cuda-async:sync=none", "buddy",
    "buddy:release=true", "jax", "jax:preallocate=false", "jax:allocator=platform",
)
GENERATED = (("training", {"steps": 3, "layers": 3}), ("transformer", {"steps": 3}),
             ("kvcache", {"requests": 12}), ("random", {"events": 3000, "live": 200}))
SEEDS = (0, 1, 2)
DEVICES = (("a100-80g", None), ("t4-16g", "1GiB"))


def traces() -> Iterator[tuple[str, Trace]]:
    """(label, trace) for every input of the references."""
    for trace in load_bundled_traces():
        yield trace.name, trace
    for kind, params in GENERATED:
        for seed in SEEDS:
            yield f"{kind}-seed{seed}", synth.generate(kind, seed=seed, **params)


def trace_digest(trace: Trace) -> str:
    digest = hashlib.sha256()
    for column in (trace.op, trace.id, trace.size, trace.stream, trace.time_ns):
        digest.update(column.tobytes())
    return digest.hexdigest()[:16]


def result_digest(trace: Trace, policy: str, device: str, capacity: str | None) -> str:
    # With no device share (context_bytes 0): the references were recorded before the device
    # profiles gained one (issue 26.3), and they hold the replay's code, not the profiles.
    profile = replace(resolve_device(device, capacity), context_bytes=0)
    result = replay(trace, policy, profile).to_json_dict(timeline=True)
    # The trace's own time at each bucket (the report's shared axis) joined the timeline after
    # the references were recorded; it is the trace's time column, not the policy's doing.
    result["timeline"].pop("trace_time_ns", None)
    text = json.dumps(result, sort_keys=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def case_key(label: str, policy: str, device: str, capacity: str | None) -> str:
    return f"{label}|{policy}|{device}:{capacity or ''}"


def record() -> dict[str, dict[str, str]]:
    refs: dict[str, dict[str, str]] = {}
    for label, trace in traces():
        digest = trace_digest(trace)
        for policy in POLICIES:
            for device, capacity in DEVICES:
                refs[case_key(label, policy, device, capacity)] = {
                    "trace": digest, "result": result_digest(trace, policy, device, capacity)}
    return refs


def main(argv: list[str]) -> int:
    return write_or_check(record(), REFS, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
