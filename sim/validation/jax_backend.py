"""The ``jax`` backend: a trace replayed on a TPU through JAX, against the ``tpu`` model.

How it runs
    A child process (:mod:`allocsim.sim.validation.jax_child`, so the TPU runtime starts fresh
    and this process never opens the chip) replays the trace under ``jax.profiler``: every
    alloc is one ``u8[n]`` array put on the device, every free deletes it, and
    ``memory_stats()`` is read after every event. The runtime writes its own record of every
    allocation and free (offset in HBM, bytes taken, running total) into the profile.

What is compared
    - Every record of the runtime, through the ``tpu`` model
      (:func:`allocsim.sim.questions.fidelity.tpu.tpu_fidelity`): the HBM offset, the bytes
      and the bytes in use after each call. Checks ``places`` and ``in use after each call``,
      with the first divergence and its rule.
    - After every event, as for the other backends: bytes in use (``bytes_in_use`` less the
      runtime's own bytes before the first array) against the simulation of the trace with
      each buffer at its ``u8[n]`` size (:func:`allocsim.traces.tpu_layout.u8_buffer_bytes`),
      reserved bytes (what the runtime holds: its bytes in use, less its own, plus its
      ``bytes_reserved`` — the tpu model's reserved, each buffer taken as placed) and the
      first OOM.

No capacity can be given: the TPU runtime takes all of HBM whatever JAX's
``XLA_PYTHON_CLIENT_*`` variables say (measured: bytes_limit and bytes_reserved do not move).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.policies import format_size
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.device_buffers import buffers_on_device
from allocsim.sim.kernel.device_profile import resolve_device
from allocsim.sim.questions.fidelity.tpu import TpuFidelity, tpu_fidelity
from allocsim.sim.validation.errors import ValidatorError, one_line
from allocsim.sim.validation.measured import CallLog, Measured
from allocsim.sim.validation.report import Check, ValidationReport
from allocsim.traces.model import OP_ALLOC, Trace

__all__ = ["JaxRun", "add_jax_checks", "jax_profile", "model_spec_text", "require_jax",
           "run_jax"]

_CHILD = "allocsim.sim.validation.jax_child"
NO_TPU_STATUS = 3


def require_jax() -> None:
    """Raise :class:`ValidatorError` (one line) when JAX cannot be imported here."""
    if importlib.util.find_spec("jax") is None:
        raise ValidatorError("backend jax needs JAX on a TPU, and JAX is not installed here "
                             "(pip install \"jax[tpu]\")")


@dataclass
class JaxRun:
    """What one replay on a JAX device measured, with the runtime's own records."""

    measured: Measured
    recording: Trace              # the profile, imported: every record of the runtime
    replayed: Trace               # the trace with each buffer at its u8[n] size on the TPU
    fidelity: TpuFidelity
    limit: int                    # bytes_limit
    runtime_bytes: int            # bytes_in_use before the first array
    stopped_at: int | None
    elapsed: dict[str, float] = field(default_factory=dict)


def model_spec_text(runtime_bytes: int) -> str:
    """The ``tpu`` model with the runtime's own bytes as measured."""
    return f"tpu:runtime_bytes={runtime_bytes}"


def _run_child(trace: Trace, folder: Path, max_ooms: int, timeout_s: float | None
               ) -> dict[str, Any]:
    events = folder / "events.npz"
    np.savez(events, op=trace.op, id=trace.id, size=trace.size, alloc_op=np.int64(OP_ALLOC))
    logdir, result, log = folder / "logdir", folder / "result.json", folder / "child.log"
    command = [sys.executable, "-m", _CHILD, str(events), str(logdir), str(result),
               str(max_ooms)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    with open(log, "w") as err:
        try:
            done = subprocess.run(command, env=env, stdout=err, stderr=subprocess.STDOUT,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise ValidatorError(f"the JAX replay ran past {timeout_s:g} s and was "
                                 f"stopped") from None
    text = log.read_text(errors="replace")
    if done.returncode != 0 or not result.is_file():
        lines = [line for line in text.splitlines() if line.strip()]
        if done.returncode == NO_TPU_STATUS and lines:
            raise ValidatorError(one_line(lines[-1]))
        raise ValidatorError(f"the JAX replay failed (exit status {done.returncode}): "
                             f"{one_line((lines or ['no output'])[-1])}")
    data: dict[str, Any] = json.loads(result.read_text())
    return data


def run_jax(trace: Trace, capacity: int | None = None, *, max_ooms: int = 1,
            keep_profile: str | Path | None = None,
            timeout_s: float | None = None) -> JaxRun:
    """Replay ``trace`` on the first JAX device (a TPU) in a child process, import the
    runtime's records and compare them with the ``tpu`` model (module docstring)."""
    if capacity is not None:
        raise ValidatorError("backend jax: the TPU runtime takes all of HBM (bytes_limit); a "
                             "capacity cannot limit it, so none can be given")
    require_jax()
    from allocsim.traces import formats
    elapsed: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="allocsim-jax-") as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        result = _run_child(trace, folder, max(1, max_ooms), timeout_s)
        elapsed["child_s"] = time.perf_counter() - started
        elapsed["replay_s"] = float(result.get("replay_s", 0.0))
        started = time.perf_counter()
        try:
            recording = formats.load(folder / "logdir")
        except Exception as err:   # the profile is the runtime's, not the user's
            raise ValidatorError(f"the JAX replay's profile could not be read: "
                                 f"{one_line(err)}") from None
        elapsed["import_s"] = time.perf_counter() - started
        if keep_profile is not None:
            import shutil
            shutil.copytree(folder / "logdir", Path(keep_profile), dirs_exist_ok=True)
    limit = int(result["limit"])
    runtime_bytes = int(result["start_stats"].get("bytes_in_use", 0))
    fidelity = tpu_fidelity(recording, runtime_bytes=runtime_bytes)
    fidelity.name = trace.name
    stopped_at = result.get("stopped_at")
    stop = len(trace) if stopped_at is None else int(stopped_at) + 1
    # Each buffer at the HBM its u8[n] array takes, as the chip held it.
    replayed = buffers_on_device(trace.select(np.arange(len(trace)) < stop),
                                 resolve_device("tpu-v5e"))
    in_use = np.asarray(result["in_use"], dtype=np.int64) - runtime_bytes
    # What the runtime holds: its buffers and the programs' scratch (none here: no program
    # is run), each buffer taken from HBM as it is placed, given back as it is freed.
    reserved = in_use + np.asarray(result["reserved"], dtype=np.int64)
    calls = CallLog()
    ops, sizes = np.asarray(replayed.op)[:stop], np.asarray(replayed.size)[:stop]
    refused = {int(e) for e in result["ooms"]}
    for event in range(stop):
        if ops[event] == OP_ALLOC:
            calls.add(event, "malloc", int(sizes[event]), event not in refused, 0)
        else:
            calls.add(event, "free", int(sizes[event]), True, 0)
    ooms = [int(e) for e in result["ooms"]]
    measured = Measured(reserved=reserved, used=in_use, first_oom_event=ooms[0] if ooms else None,
                        ooms=len(ooms), calls=calls, calls_exact=False, call_count=len(calls),
                        device_name=f"{result['device']}, HBM {format_size(limit)} "
                                    f"(JAX {result['versions'].get('jax', '?')}, libtpu "
                                    f"{result['versions'].get('libtpu', '?')})",
                        versions={str(k): str(v) for k, v in result["versions"].items()})
    measured.notes.append(
        f"the TPU runtime through JAX in a child process: one u8[n] array per alloc "
        f"(jax.device_put), deleted at its free; in use = memory_stats()['bytes_in_use'] less "
        f"the runtime's own {runtime_bytes:,} B; reserved = that plus bytes_reserved (the "
        f"programs' scratch), what the runtime holds of HBM (bytes_limit {limit:,} B); the "
        f"trace is simulated with each buffer at its u8[n] size (traces/tpu_layout.py)")
    if stopped_at is not None:
        measured.notes.append(f"the replay stopped at trace event {int(stopped_at):,} after "
                              f"{len(ooms)} refusal(s); later events were not replayed")
    return JaxRun(measured=measured, recording=recording, replayed=replayed,
                  fidelity=fidelity, limit=limit, runtime_bytes=runtime_bytes,
                  stopped_at=None if stopped_at is None else int(stopped_at),
                  elapsed=elapsed)


def jax_profile(run: JaxRun, given: DeviceProfile | None) -> DeviceProfile:
    """The simulated device: the chip's own HBM (bytes_limit), no context (the runtime's own
    bytes are the model's ``runtime_bytes``)."""
    base = given if given is not None else resolve_device("tpu-v5e")
    return base.device_with(None if base.capacity == run.limit else run.limit, context=0)


def add_jax_checks(report: ValidationReport, run: JaxRun) -> ValidationReport:
    """The record-by-record checks (places, in use) and the fidelity's lines as notes."""
    fid = run.fidelity
    total = fid.total
    for name, key, what in (("places", "address", "HBM offset"),
                            ("in use after each call", "in_use", "bytes in use")):
        got = fid.by_field[key]
        report.checks.append(Check(name, bool(total) and got == total,
                                   f"{what} as the runtime's after {got:,}/{total:,} records"))
    report.notes.extend(fid.lines())
    return report
