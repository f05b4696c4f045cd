"""The meta recorder held to a real recording in ../shared/traces: the pytorch model's replay of
a meta recording against its replay of the real trace of the same program.

Of the real PyTorch recordings there (SOURCES.md), one comes from a program we can run again:
``torch-profiler-cpu-mlp-train.json.gz`` (torch.profiler, CPU, torch 2.13), whose script is not
there but was rebuilt from its sizes and order (tests/torch_programs/mlp_logsumexp.py; the
first test shows it is that program, event for event). The two CUDA snapshots are not:

- ``torch-snapshot-lm-inference.pickle``: the stack frames name
  ``cs336_basics/model.py`` driven by ``cs336_systems/nsys_profile.py``
  (Wedsonlin/assignment2-systems), neither of which is here, with the model's sizes given on
  its command line, which the snapshot does not keep; and its window, opened after warm-up, makes
  no segment_alloc at all (1,280 allocs into 98 segments reserved before it), so a replay from
  an empty device has no recorded device call to be compared with.
- ``torch-snapshot-eor.pickle`` (JasperSolt/EoR_NN): its frames are C++ only (no Python file or
  line), its script and data are not here, and it too starts with segments already present.

So the one comparison made is on a CPU recording, which is what PyTorch's caching allocator
model would be handed from that program's run: the CPU has no caching allocator, and the model
replays the requests.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the meta recorder needs PyTorch (pip install "
                                    "'torch>=2.13,<2.15', the CPU build is enough)")

from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.kernel.engine import replay
from allocsim.traces.formats import load
from allocsim.traces.model import OP_ALLOC, Trace
from allocsim.traces.record.torch.meta_script import record_script

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
REAL_MLP = SHARED / "torch-profiler-cpu-mlp-train.json.gz"
PROGRAM = Path(__file__).parent / "torch_programs" / "mlp_logsumexp.py"
needs_shared = pytest.mark.skipif(not REAL_MLP.exists(), reason="../shared/traces is absent")


def _signed_sizes(trace: Trace) -> list[int]:
    return [size if op == OP_ALLOC else -size
            for op, size in zip(trace.op.tolist(), trace.size.tolist())]


def _device_calls(trace: Trace, spec: str) -> list[int]:
    """The reserved bytes after each change: the model's segment allocations in order."""
    result = replay(trace, spec, resolve_device("a100-80g"))
    assert result.completed and result.timeline is not None
    assert len(result.timeline.event) == len(trace)  # one point per event: nothing merged
    reserved = result.timeline.reserved.tolist()
    return [r for i, r in enumerate(reserved) if i == 0 or r != reserved[i - 1]]


@needs_shared
def test_the_rebuilt_program_is_the_shared_traces_program():
    from allocsim.traces.record.torch.profiler import record_torch

    saved = sys.argv
    try:
        sys.argv = [str(PROGRAM)]
        ours = record_torch(lambda: runpy.run_path(str(PROGRAM)), output=None)
    finally:
        sys.argv = saved
    real = load(str(REAL_MLP))
    assert len(real) == 1098
    assert _signed_sizes(ours) == _signed_sizes(real)


@needs_shared
def test_pytorch_replays_the_meta_recording_as_it_replays_the_real_one(tmp_path):
    real = load(str(REAL_MLP))
    run = record_script(["python", str(PROGRAM)], tmp_path / "mlp.npz", kernels="cpu")
    assert run.error is None, run.error
    meta = run.trace
    # Not the same events: the real one also holds what stays on the host on a GPU (AdamW's
    # step counts and their scalar temporaries, 4-8 B) and logsumexp's kernel-internal
    # temporaries (5,120 B), which no dispatch-level recorder and no meta kernel sees.
    assert 300 < len(meta) < len(real)
    real_sizes = [s for s in _signed_sizes(real) if abs(s) >= 8192]
    meta_sizes = [s for s in _signed_sizes(meta) if abs(s) >= 8192]
    # Every block that is not a small one, same size, same order, up to the program's end;
    # the frees after its last allocation (the interpreter dropping the model and the
    # optimizer when train() returns) come in another order under the recorder: as a set.
    last = max(i for i, s in enumerate(real_sizes) if s > 0) + 1
    assert meta_sizes[:last] == real_sizes[:last]
    assert sorted(meta_sizes[last:]) == sorted(real_sizes[last:])
    assert 0 <= real.peak_live()[0] - meta.peak_live()[0] < 64
    for spec in ("pytorch", "pytorch:expandable_segments=true"):
        real_calls = _device_calls(real, spec)
        assert len(real_calls) >= 12
        assert _device_calls(meta, spec) == real_calls, spec


@pytest.mark.slow
def test_the_pytorch_guides_full_size_row_is_real_output(tmp_path, capsys):
    """One row of docs/pytorch.md's 1.3B table (bf16 autocast on an A100 40 GB: record,
    compare, min-capacity and a full tune search), rerun: the guide prints what the experiment
    does."""
    from experiments import torch_1b

    assert torch_1b.main(["-o", str(tmp_path), "--targets", "a100-40g",
                          "--precisions", "bf16"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| a100-40g |")]
    guide = (Path(__file__).resolve().parents[1] / "docs" / "pytorch.md").read_text()
    assert len(rows) == 1 and rows[0] in guide.splitlines()
