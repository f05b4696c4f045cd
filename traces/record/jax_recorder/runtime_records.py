"""The TPU runtime's own allocation records, taken beside the JAX recorder's bookkeeping.

On a TPU the runtime writes one ``MemoryAllocation`` / ``MemoryDeallocation`` record per
buffer into a ``jax.profiler`` session (HBM offset, sizes as it holds them, running totals);
the recorder's own trace is what the program asked for (arrays, outputs, XLA's temp). Both are
kept: the recorder's as the trace, the runtime's beside it as ``NAME.runtime.npz`` (what
``allocsim fidelity`` replays through the ``tpu`` model), and the main trace's metadata says
where it is and how the two compare (``runtime_records``).

A profiler session the program starts itself cannot run beside this one (JAX allows one at a
time): the recorder then stops its own first and says so in ``runtime_records.note``. On other
platforms nothing is started (their runtimes write no such records).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from allocsim.atomic_files import OutputClaim, claim_output
from allocsim.errors import UserInputError
from allocsim.traces.formats import save
from allocsim.traces.model import Trace, TraceError

__all__ = ["RuntimeRecords", "beside"]

RUNTIME_SUFFIX = ".runtime.npz"


# Compression suffixes that belong to a trace file's extension (``run.jsonl.gz``).
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst")
# The metadata key that says whose records a sidecar holds (the trace file's name).
OWNER_KEY = "runtime_records_of"


def beside(output: str | os.PathLike[str]) -> Path:
    """Where the runtime's records of ``output`` go: its name less its extension, then
    ``.runtime.npz``, in its folder (``run.npz`` -> ``run.runtime.npz``, ``my.run.v2.npz`` ->
    ``my.run.v2.runtime.npz``: every dot but the extension's is the name's)."""
    path = Path(output)
    name = path.name
    if name.endswith(_COMPRESSED):
        name = name.rsplit(".", 1)[0]
    stem = name.rsplit(".", 1)[0] if "." in name.lstrip(".") else name
    return path.with_name(stem + RUNTIME_SUFFIX)


def _check_own(sidecar: Path, output: str | os.PathLike[str]) -> None:
    """Refuse, before the program runs, a file at the sidecar's path that is not an earlier
    copy of this recording's own records (another recording, or not a trace at all)."""
    if not sidecar.exists():
        return
    from allocsim.traces.formats import load
    owner = None
    try:
        owner = load(sidecar).metadata.get(OWNER_KEY)
    except Exception:   # not a trace we can read: not ours to replace
        owner = None
    if owner != Path(output).name:
        raise UserInputError(f"{sidecar}: the TPU runtime's records of {Path(output).name} "
                             "would go here, but the file there is not an earlier copy of "
                             "them; move it or record to another -o")


class RuntimeRecords:
    """One profiler session of the recorded TPU, read back into a trace when it stops."""

    def __init__(self, output: str | os.PathLike[str] | None) -> None:
        # Claimed at once, as the recorder's own output is: before the program runs.
        self.output_name = None if output is None else Path(output).name
        if output is not None:
            _check_own(beside(output), output)
        self.claim: OutputClaim | None = None if output is None \
            else claim_output(beside(output), keep_refused=True)
        self.folder: Path | None = None
        self.summary: dict[str, Any] = {}

    def start(self, platform: str) -> None:
        """Start a profiler session when the recorded device is a TPU (else note why not)."""
        if platform != "tpu":
            self.summary = {"note": f"not taken: the {platform} runtime writes no allocation "
                                    "records (only a TPU's does)"}
            return
        import jax
        self.folder = Path(tempfile.mkdtemp(prefix="allocsim-tpu-records-"))
        options = None
        try:
            options = jax.profiler.ProfileOptions()
            options.python_tracer_level = 0     # the records are the host tracer's
            options.host_tracer_level = 2
        except Exception:   # an older JAX: its defaults
            options = None
        try:
            jax.profiler.start_trace(str(self.folder), **({} if options is None
                                                           else {"profiler_options": options}))
        except Exception as error:   # a session the program or its harness already runs
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
            self.summary = {"note": f"not taken: a profiler session could not start ({error})"}

    def stop(self, recorded_peak: int) -> Trace | None:
        """Stop the session, read its records, write them beside the output; the trace."""
        if self.folder is None:
            return None
        import jax
        folder, self.folder = self.folder, None
        try:
            try:
                jax.profiler.stop_trace()
            except Exception as error:   # the program stopped it (and started its own)
                self.summary = {"note": f"not taken: the session was ended by the program "
                                        f"({error})"}
                return None
            from allocsim.traces.formats.xla.xplane import read_log_folder
            name = "runtime" if self.claim is None else self.claim.path.name.split(".")[0]
            try:
                trace = read_log_folder(folder, str(folder), name)
            except TraceError as error:
                self.summary = {"note": f"not taken: {error}"}
                return None
            peak = trace.peak_live()[0]
            self.summary = {
                "records": len(trace), "runtime_peak_in_use": peak,
                "recorder_peak_live": recorded_peak,
                "note": "the runtime's own records: sizes as it holds them, executables' "
                        "generated code included, XLA's temp not (held as reserved scratch)"}
            if self.claim is not None:
                trace.metadata[OWNER_KEY] = self.output_name
                save(trace, self.claim)
                self.summary["file"] = self.claim.path.name
            return trace
        finally:
            shutil.rmtree(folder, ignore_errors=True)

