"""The ``tensorflow`` backend: a trace replayed on TensorFlow's real BFC allocator, on the CPU.

How it runs
    TensorFlow makes its CPU allocator a BFC allocator when ``TF_CPU_ALLOCATOR_USE_BFC=true``
    (tensorflow/core/common_runtime/process_state.cc, ``GetCPUAllocator``: name
    ``bfc_cpu_allocator_for_gpu``, limit ``TF_CPU_BFC_MEM_LIMIT_IN_MB`` MiB — 64 GiB by
    default —, ``allow_growth`` on, garbage collection off). It reads those variables once,
    when the allocator is made, so the replay runs in a child process of its own
    (:mod:`allocsim.sim.validation.tensorflow_child`): the profiler is started, every alloc is
    one ``tf.raw_ops.Empty`` uint8 tensor of exactly the requested bytes, every free drops it,
    the profiler is stopped. ``TF_CPP_VMODULE=bfc_allocator=1`` makes the allocator log each
    new region (``Allocated memory at A to B``): that is the measured reserved memory.

What is compared
    - Every call of the allocator: the profile (``.xplane.pb``) is imported with
      :mod:`allocsim.traces.formats.xla.xplane` — it holds exactly what the allocator saw, the
      trace's buffers and anything TensorFlow allocated beside them — and replayed through the
      ``bfc`` model by :func:`allocsim.sim.questions.fidelity.bfc.bfc_fidelity` (same limit,
      ``allow_growth`` on, garbage collection off, regions at the recorded addresses): chunk
      size, place and bytes in use after every call. These are the checks ``chunk sizes``,
      ``places`` and ``in use after each call``.
    - After every event of the trace, as for the other backends: reserved bytes (the regions
      logged) and bytes in use (``bytes_allocated`` of the allocator's last record of the
      event) against the simulation of the trace (``bfc:memory_limit=LIMIT,allow_growth=true,
      garbage_collection=false`` on a device of LIMIT bytes and granularity 1, as
      ``allocsim compare`` would run it), and the first OOM.

A record belongs to the trace event whose buffer it allocates or frees; what TensorFlow
allocates beside the buffers belongs to the event being replayed (an allocation to the next
buffer's event, a free to the event before it).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.policies import format_size
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.questions.fidelity.device import RecordedAddressDevice, address_floor
from allocsim.sim.validation.errors import ValidatorError, one_line
from allocsim.sim.validation.measured import CallLog, Measured
from allocsim.sim.validation.report import Check, ValidationReport
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace

__all__ = ["DEFAULT_LIMIT", "TensorFlowRun", "add_tensorflow_checks", "host_placed_device",
           "model_spec_text",
           "require_tensorflow", "run_tensorflow", "tensorflow_checks", "tensorflow_limit",
           "tensorflow_profile"]

MiB = 1 << 20
DEFAULT_LIMIT = (1 << 16) * MiB      # TF_CPU_BFC_MEM_LIMIT_IN_MB's default: 64 GiB
ALLOCATOR = "bfc_cpu_allocator_for_gpu"
BUFFER_OP = "Empty"
_REGION = re.compile(r"Allocated memory at (0x[0-9a-fA-F]+) to (0x[0-9a-fA-F]+)")
_CHILD = "allocsim.sim.validation.tensorflow_child"


def require_tensorflow() -> None:
    """Raise :class:`ValidatorError` (one line) when TensorFlow cannot be imported here."""
    if importlib.util.find_spec("tensorflow") is None:
        raise ValidatorError("backend tensorflow needs TensorFlow, which is not installed "
                             "here (pip install tensorflow-cpu)")


def tensorflow_limit(capacity: int | None) -> tuple[int, int, str | None]:
    """(TF_CPU_BFC_MEM_LIMIT_IN_MB, the limit in bytes, a note) for a capacity (None: the
    default 64 GiB). The variable counts whole MiB: a capacity between is rounded down."""
    if capacity is None:
        return DEFAULT_LIMIT // MiB, DEFAULT_LIMIT, None
    megabytes = capacity // MiB
    if megabytes < 1:
        raise ValidatorError(f"capacity {format_size(capacity)}: TensorFlow's CPU BFC limit "
                             f"(TF_CPU_BFC_MEM_LIMIT_IN_MB) counts whole MiB; give at least "
                             f"1MiB")
    note = None
    if megabytes * MiB != capacity:
        note = (f"capacity {format_size(capacity)} rounded down to {megabytes} MiB "
                f"(TF_CPU_BFC_MEM_LIMIT_IN_MB counts whole MiB)")
    return megabytes, megabytes * MiB, note


def model_spec_text(limit: int) -> str:
    """The ``bfc`` model configured as TensorFlow's CPU BFC allocator is."""
    return f"bfc:memory_limit={limit},allow_growth=true,garbage_collection=false"


@dataclass
class TensorFlowRun:
    """What one replay on TensorFlow measured, with the allocator's own record."""

    measured: Measured
    recording: Trace                  # the profile, imported: every call the allocator saw
    replayed: Trace                   # the events replayed, TensorFlow's own calls inserted
    fidelity: Any                     # BFCFidelityReport of the recording vs the bfc model
    limit: int
    regions: list[tuple[int, int]]    # (base, bytes) of each region, in order
    driver_records: int               # records that are not a trace buffer's own
    stopped_at: int | None
    elapsed: dict[str, float] = field(default_factory=dict)


def _child_env(megabytes: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPU_BFC_MEM_LIMIT_IN_MB=str(megabytes),
               TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="bfc_allocator=1",
               CUDA_VISIBLE_DEVICES="", TF_ENABLE_ONEDNN_OPTS="0")
    return env


def _run_child(trace: Trace, folder: Path, megabytes: int, max_ooms: int,
               timeout_s: float | None) -> tuple[dict[str, Any], str]:
    events = folder / "events.npz"
    np.savez(events, op=trace.op, id=trace.id, size=trace.size, alloc_op=np.int64(OP_ALLOC))
    logdir, result, log = folder / "logdir", folder / "result.json", folder / "child.log"
    command = [sys.executable, "-m", _CHILD, str(events), str(logdir), str(result),
               str(max_ooms)]
    with open(log, "w") as err:
        try:
            done = subprocess.run(command, env=_child_env(megabytes), stdout=err,
                                  stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise ValidatorError(f"the TensorFlow replay ran past {timeout_s:g} s and was "
                                 f"stopped") from None
    text = log.read_text(errors="replace")
    if done.returncode != 0 or not result.is_file():
        tail = [line for line in text.splitlines() if line.strip()][-1:] or ["no output"]
        raise ValidatorError(f"the TensorFlow replay failed (exit status {done.returncode}): "
                             f"{one_line(tail[0])}")
    return json.loads(result.read_text()), text


def _owners(trace: Trace, recording: Trace, ooms: set[int], stop: int
            ) -> tuple[list[int], list[bool]]:
    """For each record (reference event) of the recording, the trace event it belongs to
    (``len(trace)``: after the trace), nondecreasing, and whether it is a trace buffer's own
    (else TensorFlow's; see the module docstring)."""
    refs = recording.metadata["reference_events"]
    ops, ids, sizes = trace.op.tolist(), trace.id.tolist(), trace.size.tolist()
    allocs = [i for i in range(stop) if ops[i] == OP_ALLOC and sizes[i] > 0 and i not in ooms]
    buffer_of: dict[int, int] = {}             # buffer id -> its alloc event
    free_event: dict[int, int] = {}            # alloc event -> its free event
    for i in range(stop):
        if ops[i] == OP_ALLOC:
            if sizes[i] > 0 and i not in ooms:
                buffer_of[ids[i]] = i
        elif ids[i] in buffer_of:
            free_event[buffer_of.pop(ids[i])] = i
    n = len(trace)
    owner = [-1] * len(refs)
    chunk_event: dict[int, int] = {}           # address of a live buffer chunk -> alloc event
    next_alloc = 0
    for k, ref in enumerate(refs):
        if ref["action"] == "alloc":
            tag = recording.tag_name(int(recording.tag[int(ref["event"])])) or ""
            if tag.split(" ")[0] == BUFFER_OP and next_alloc < len(allocs):
                event = allocs[next_alloc]
                if int(ref["requested"]) != sizes[event]:
                    raise ValueError(f"TensorFlow record {k}: Empty of {ref['requested']} B, "
                                     f"but trace event {event} asks {sizes[event]} B")
                next_alloc += 1
                owner[k] = event
                chunk_event[int(ref["addr"])] = event
        else:
            alloc_event = chunk_event.pop(int(ref["addr"]), -1)
            if alloc_event >= 0:
                owner[k] = free_event.get(alloc_event, n)
    if next_alloc != len(allocs):
        raise ValueError(f"the TensorFlow profile holds {next_alloc:,} of the trace's "
                         f"{len(allocs):,} buffers")
    mine = [o >= 0 for o in owner]
    following = n       # TensorFlow's own allocations go with the next buffer's event ...
    for k in range(len(refs) - 1, -1, -1):
        if owner[k] >= 0:
            following = owner[k]
        elif refs[k]["action"] == "alloc":
            owner[k] = following
    previous = 0        # ... and its frees with the event before them
    for k in range(len(refs)):
        if owner[k] < 0:
            owner[k] = previous
        previous = owner[k]
    if any(b < a for a, b in itertools.pairwise(owner)):
        raise ValueError("the TensorFlow profile's records are not in the trace's order")
    return owner, mine


def _with_tensorflow_calls(trace: Trace, recording: Trace, owner: list[int], mine: list[bool],
                           stop: int) -> tuple[Trace, list[int], np.ndarray]:
    """The trace as the allocator saw it: events ``[0, stop)`` with TensorFlow's own calls
    inserted where they happened (fresh buffer ids, tagged ``<tensorflow>``); the index in it
    of every record and of every original event."""
    refs = recording.metadata["reference_events"]
    n = len(trace)
    buffer_record: dict[int, int] = {owner[k]: k for k in range(len(refs))
                                     if mine[k] and refs[k]["action"] == "alloc"}
    for k in range(len(refs)):
        if mine[k] and refs[k]["action"] == "free":
            buffer_record.setdefault(owner[k], k)
    # Sort keys: event e at 3e+1; TensorFlow's calls of e before its buffer's record at 3e,
    # after it at 3e+2; ties in record order.
    keys: list[tuple[int, int]] = [(3 * i + 1, -1) for i in range(stop)]
    extra: list[int] = []
    for k in range(len(refs)):
        if mine[k] or (owner[k] >= stop and not owner[k] == stop == n):
            continue
        before = k < buffer_record.get(owner[k], len(refs))
        keys.append((3 * owner[k] + (0 if before else 2), k))
        extra.append(k)
    order = sorted(range(len(keys)), key=keys.__getitem__)
    position = [0] * len(keys)
    for rank, slot in enumerate(order):
        position[slot] = rank
    event_index = np.asarray(position[:stop], dtype=np.int64)
    tf_index = {k: position[stop + j] for j, k in enumerate(extra)}
    record_index = [(int(event_index[owner[k]]) if owner[k] < stop else -1) if mine[k]
                    else tf_index.get(k, -1) for k in range(len(refs))]
    total = len(keys)
    columns = {name: np.zeros(total, dtype=getattr(trace, name).dtype)
               for name in ("time_ns", "op", "id", "size", "stream", "process", "tag")}
    for name in columns:
        columns[name][event_index] = getattr(trace, name)[:stop]
    tags = list(trace.tags)
    tags.append("<tensorflow>")
    next_id = int(trace.id.max()) + 1 if len(trace) else 0
    live: dict[int, int] = {}
    for k in extra:
        at, ref = tf_index[k], refs[k]
        source = min(owner[k], stop - 1) if stop else 0
        columns["time_ns"][at] = trace.time_ns[source] if stop else 0
        columns["stream"][at], columns["process"][at] = 0, trace.process[source] if stop else 0
        if ref["action"] == "alloc":
            columns["op"][at], columns["id"][at] = OP_ALLOC, next_id
            columns["size"][at], columns["tag"][at] = int(ref["requested"]), len(tags) - 1
            live[int(ref["addr"])] = next_id
            next_id += 1
        else:
            columns["op"][at] = OP_FREE
            columns["id"][at] = live.pop(int(ref["addr"]), next_id)
            columns["size"][at], columns["tag"][at] = int(ref["requested"]), -1
            next_id += columns["id"][at] == next_id
    meta = dict(trace.metadata)
    meta["tensorflow_calls"] = len(extra)
    augmented = Trace(**columns, tags=tags, metadata=meta)
    return augmented, record_index, event_index


def _regions(log: str) -> list[tuple[int, int]]:
    """(base, bytes) of every region the allocator logged (``Allocated memory at A to B``)."""
    return [(int(a, 16), int(b, 16) - int(a, 16)) for a, b in _REGION.findall(log)]


def _series(n: int, recording: Trace, record_index: list[int],
            regions: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, CallLog, int]:
    """Reserved and in-use bytes after each of ``n`` events (``record_index``: the event of
    every record, -1 none), the region calls, and the bytes of regions no record lies in."""
    from allocsim.sim.validation.replay import after_each_event
    refs = recording.metadata["reference_events"]
    created = [0] * len(refs)       # region bytes made by record k
    before = 0
    log = CallLog()
    k = 0
    for base, size in regions:
        at = k
        while k < len(refs) and not (refs[k]["action"] == "alloc"
                                     and base <= int(refs[k]["addr"]) < base + size):
            k += 1
        if k == len(refs):          # no record in it after the previous region's first
            before += size
            k = at
            continue
        created[k] += size
        if record_index[k] >= 0:
            log.add(record_index[k], "malloc", size, True, 0)
        k += 1
    keep = np.asarray([i >= 0 for i in record_index], dtype=bool)
    events = np.asarray(record_index, dtype=np.int64)[keep]
    reserved = (before + np.cumsum(np.asarray(created, dtype=np.int64)))[keep]
    in_use = np.asarray([int(r["in_use"]) for r in refs], dtype=np.int64)[keep]
    out_reserved = np.maximum(after_each_event(events, reserved, n), before)
    out_used = after_each_event(events, in_use, n)
    return out_reserved, out_used, log, before


def run_tensorflow(trace: Trace, capacity: int | None, *, max_ooms: int = 1,
                   keep_profile: str | Path | None = None,
                   timeout_s: float | None = None) -> TensorFlowRun:
    """Replay ``trace`` on TensorFlow's CPU BFC allocator (limit: ``capacity`` rounded down to
    whole MiB, else 64 GiB) in a child process; import its profile and compare it with the
    ``bfc`` model call by call (module docstring). ``keep_profile``: a folder to copy the
    TensorBoard log folder to. ``max_ooms``: refusals before the replay stops (each costs
    TensorFlow's 10-second retry)."""
    require_tensorflow()
    from allocsim.sim.questions.fidelity.bfc import bfc_fidelity
    from allocsim.traces import formats
    megabytes, limit, limit_note = tensorflow_limit(capacity)
    elapsed: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="allocsim-tf-") as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        result, log = _run_child(trace, folder, megabytes, max(1, max_ooms), timeout_s)
        elapsed["child_s"] = time.perf_counter() - started
        elapsed["replay_s"] = float(result.get("replay_s", 0.0))
        started = time.perf_counter()
        try:
            recording = formats.load(folder / "logdir", allocator=ALLOCATOR)
        except Exception as err:   # the profile is TensorFlow's, not the user's
            raise ValidatorError(f"the TensorFlow replay's profile could not be read: "
                                 f"{one_line(err)}") from None
        elapsed["import_s"] = time.perf_counter() - started
        if keep_profile is not None:
            import shutil
            shutil.copytree(folder / "logdir", Path(keep_profile), dirs_exist_ok=True)
    ooms = [int(e) for e in result["ooms"]]
    stopped_at = result.get("stopped_at")
    stop = len(trace) if stopped_at is None else int(stopped_at) + 1
    owner, mine = _owners(trace, recording, set(ooms), stop)
    replayed, record_index, event_index = _with_tensorflow_calls(trace, recording, owner,
                                                                 mine, stop)
    driver = mine.count(False)
    regions = _regions(log)
    reserved, used, calls, before = _series(len(replayed), recording, record_index, regions)
    started = time.perf_counter()
    fidelity = bfc_fidelity(recording, allow_growth=True, garbage_collection=False)
    elapsed["fidelity_s"] = time.perf_counter() - started
    measured = Measured(reserved=reserved, used=used,
                        first_oom_event=int(event_index[ooms[0]]) if ooms else None,
                        ooms=len(ooms), calls=calls,
                        device_name=f"TensorFlow {result['versions'].get('tensorflow', '?')} "
                                    f"CPU BFC allocator ({ALLOCATOR}, limit "
                                    f"{format_size(limit)})",
                        versions={str(k): str(v) for k, v in result["versions"].items()})
    notes = measured.notes
    notes.append(f"TensorFlow's CPU BFC allocator (TF_CPU_ALLOCATOR_USE_BFC=true, "
                 f"TF_CPU_BFC_MEM_LIMIT_IN_MB={megabytes}) in a child process: one "
                 f"tf.raw_ops.Empty uint8 tensor per alloc, dropped at its free; in use = "
                 f"the allocator's bytes_allocated (its profile), reserved = the regions it "
                 f"logged; device-call time is not measured")
    if limit_note:
        notes.append(limit_note)
    if not regions:
        notes.append("the allocator logged no regions (TF_CPP_VMODULE=bfc_allocator=1 had no "
                     "effect?): reserved bytes are not measured")
    if before:
        notes.append(f"{format_size(before)} of regions were made before the first record")
    if driver:
        notes.append(f"{driver:,} of the allocator's {len(owner):,} calls were TensorFlow's "
                     f"own (not a trace buffer): they are in the trace replayed and simulated "
                     f"({len(replayed):,} events), tagged <tensorflow>, where they happened")
    if stopped_at is not None:
        notes.append(f"the replay stopped at trace event {int(stopped_at):,} (event "
                     f"{int(event_index[int(stopped_at)]):,} of the trace replayed), after "
                     f"{len(ooms)} refusal(s) (each costs TensorFlow's 10-second retry wait); "
                     f"later events were not replayed")
    return TensorFlowRun(measured=measured, recording=recording, replayed=replayed,
                         fidelity=fidelity, limit=limit, regions=regions, driver_records=driver,
                         stopped_at=None if stopped_at is None else int(stopped_at),
                         elapsed=elapsed)


def tensorflow_profile(profile: DeviceProfile, limit: int, given: bool) -> DeviceProfile:
    """The simulated device: the allocator's limit, granularity 1 (host memory: a region
    is exactly the bytes asked)."""
    base = profile if given else DeviceProfile("tensorflow-cpu", limit, granularity=1,
                                               map_granularity=1,
                                               source="TensorFlow's CPU BFC allocator")
    return replace(base.device_with(None if base.capacity == limit else limit), granularity=1)


def host_placed_device(profile: DeviceProfile, regions: list[tuple[int, int]]
                       ) -> RecordedAddressDevice:
    """The simulated device with each region where the host put TensorFlow's: a region of the
    size TensorFlow's allocator logged next is placed at that region's address (the first
    logged region of that size whose range is free), any other above every logged one. The
    host's allocator (malloc/mmap) hands regions out at falling addresses, the plain simulated
    device at rising ones, and BFC's best fit (bfc_allocator.cc FindChunkPtr) takes the lowest
    address among equal chunks — so with rising regions it picks other chunks than TensorFlow
    did, with every allocator rule followed."""
    device = RecordedAddressDevice(profile, address_floor(b + n for b, n in regions))
    device.hints = [("segment_alloc", base, size) for base, size in regions]
    return device


def tensorflow_checks(run: TensorFlowRun) -> tuple[list[Check], list[str]]:
    """The call-by-call checks (chunk sizes, places, in use) and notes of the comparison."""
    fid = run.fidelity
    total = int(fid.total)
    by = fid.by_field
    checks = []
    for name, key, what in (("chunk sizes", "chunk", "chunk size"),
                            ("places", "address", "place (region and offset)"),
                            ("in use after each call", "in_use", "bytes in use")):
        got = int(by[key])
        checks.append(Check(name, bool(total) and got == total,
                            f"{what} as TensorFlow's after {got:,}/{total:,} allocator calls"))
    notes = [f"call by call (bfc_fidelity, bfc:memory_limit={run.limit},allow_growth=true,"
             f"garbage_collection=false, regions at the recorded addresses): matched "
             f"{fid.matched:,}/{total:,}, "
             + (f"without a break up to recorded event {fid.matched_until:,}"
                if fid.matched_until >= 0 else "none before the first divergence")]
    div = fid.first_divergence
    if div is not None:
        rec, mod = div["recorded"], div["model"]
        notes.append(f"first divergence at allocator call {div['event']:,} ({div['action']} "
                     f"of {div['requested']} B, rounded {div['rounded']}"
                     + (f", {div['tag']}" if div.get("tag") else "")
                     + f"): TensorFlow chunk {rec['chunk']} at {rec['address']:#x} in use "
                     f"{rec['in_use']}, model chunk {mod['chunk']} at "
                     + ("-" if mod["address"] is None else f"{mod['address']:#x}")
                     + f" in use {mod['in_use']}; rule: {div['rule_text']}")
    notes += [f"call by call: {note}" for note in fid.notes]
    if run.regions:
        notes.append(f"the simulation places its regions where the host put TensorFlow's "
                     f"({len(run.regions)} logged; the host hands them out at falling "
                     "addresses, and BFC breaks ties between equal chunks by address)")
    return checks, notes


def add_tensorflow_checks(report: ValidationReport, run: TensorFlowRun) -> ValidationReport:
    """The report with the call-by-call checks and notes added (and the reserved check
    dropped when no region was logged)."""
    checks, notes = tensorflow_checks(run)
    if not run.regions:
        report.checks = [c for c in report.checks if c.name != "reserved"]
    fid = run.fidelity
    if fid.total and fid.matched == fid.total:
        # The allocator's every decision is reproduced at TensorFlow's own addresses, so a
        # per-event difference lies in the simulated device, not in the bfc model's rules.
        for check in report.checks:
            if check.ok is False:
                check.detail += (" (cause: not the bfc model's rules — every allocator call "
                                 "matched at TensorFlow's addresses — but where the simulated "
                                 "device put the regions, which decides BFC's address ties)")
    report.checks.extend(checks)
    report.notes.extend(notes)
    return report
