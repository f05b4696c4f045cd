"""The PyTorch recorder under the torch a user has (issue 37, item 6): the CPU build and the
CUDA build on a machine with no GPU driver, releases 2.13 and 2.14.

An ordinary AdamW training script (tests/torch_programs/mlp_adamw.py: the device from
``torch.accelerator``, as PyTorch's tutorials pick it) is recorded, and its trace is held to
arithmetic done here from the model's shapes, not from the recording:

- at the end, with only the model and the optimizer left, live = parameters + AdamW's two
  moments + the cuBLAS workspaces (one per thread that ran a GEMM: the main thread's and the
  autograd engine's);
- the peak is inside ``optimizer.step()``: parameters + gradients + the two moments + the one
  temporary per parameter that foreach AdamW makes (the square root of the second moment) +
  the batch, the labels and the loss + the workspaces.

In-process tests use the torch of the interpreter running pytest. The same recording under
other builds runs in a subprocess of each interpreter that ``ALLOCSIM_TORCH_PYTHONS`` names
(paths separated by ``os.pathsep``; each must import allocsim and its own torch): CI makes
one with the CUDA build (``.ci/run``).
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the meta recorder needs PyTorch (pip install "
                                             "'torch>=2.13,<2.15', the CPU build is enough)")

from allocsim.errors import UserInputError  # noqa: E402
from allocsim.traces.formats import load  # noqa: E402
from allocsim.traces.model import OP_ALLOC, Trace  # noqa: E402
from allocsim.traces.record.torch.meta import TorchMetaRecorder  # noqa: E402
from allocsim.traces.record.torch.meta_script import record_script  # noqa: E402
from allocsim.traces.record.torch.meta_targets import TARGETS, cublas_workspace_bytes  # noqa: E402

PROGRAM = Path(__file__).parent / "torch_programs" / "mlp_adamw.py"
FEATURES, HIDDEN, CLASSES, BATCH, STEPS = 256, 512, 10, 16, 3
SIZES = [str(n) for n in (FEATURES, HIDDEN, CLASSES, BATCH, STEPS)]
FLOAT32, INT64 = 4, 8


def _expected(target: str) -> tuple[int, int]:
    """(live at the end, peak) of mlp_adamw.py at SIZES, from its shapes (module docstring)."""
    parameters = FLOAT32 * (FEATURES * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES)
    workspaces = 2 * cublas_workspace_bytes(TARGETS[target])
    batch = FLOAT32 * BATCH * FEATURES + INT64 * BATCH + FLOAT32  # x, y and the scalar loss
    end = parameters + 2 * parameters + workspaces
    peak = parameters + parameters + 2 * parameters + parameters + batch + workspaces
    return end, peak


def _live_at_end(trace: Trace) -> int:
    sizes = trace.size.astype("int64")
    return int(sizes[trace.op == OP_ALLOC].sum() - sizes[trace.op != OP_ALLOC].sum())


def _assert_adamw_trace(trace: Trace, target: str) -> None:
    end, peak = _expected(target)
    assert trace.metadata["cublas_workspaces"] == 2
    assert _live_at_end(trace) == end
    assert int(trace.peak_live()[0]) == peak
    tags = set(trace.tags)
    assert any(tag.startswith("optimizer:AdamW.step:") for tag in tags)
    assert any(tag.startswith("backward:") for tag in tags)


def test_an_ordinary_adamw_script_is_recorded_in_full(tmp_path):
    run = record_script(["python", str(PROGRAM), *SIZES], tmp_path / "run.npz",
                        target="h100-80g")
    assert run.error is None, run.error
    _assert_adamw_trace(run.trace, "h100-80g")
    assert load(str(tmp_path / "run.npz")).metadata["torch"] == torch.__version__


def test_torch_accelerator_answers_as_the_target_and_is_put_back():
    accelerator = torch.accelerator
    before = {name: getattr(accelerator, name) for name in accelerator.__all__}
    with TorchMetaRecorder(None, target="h100-80g") as recorder:
        assert accelerator.is_available() and accelerator.device_count() == 1
        assert accelerator.current_accelerator() == torch.device("cuda")
        assert accelerator.current_accelerator(check_available=True).type == "cuda"
        assert accelerator.current_device_index() == 0
        stream = accelerator.current_stream()
        assert stream is torch.cuda.current_stream() and not stream.is_capturing()
        side = torch.cuda.Stream()
        accelerator.set_stream(side)
        x = torch.empty(256, device="cuda")
        accelerator.set_stream(stream)
        with accelerator.device_index(0):
            accelerator.synchronize()
        assert accelerator.memory_allocated() == 1024 == recorder.live_bytes
        assert accelerator.max_memory_allocated() == 1024
        assert accelerator.get_memory_info() == (TARGETS["h100-80g"].total_memory - 1024,
                                                 TARGETS["h100-80g"].total_memory)
        del x
        assert accelerator.memory_allocated() == 0
    assert recorder.trace is not None and recorder.trace.stream.tolist() == [side.stream_id] * 2
    assert {name: getattr(accelerator, name) for name in accelerator.__all__} == before


def test_torch_cuda_submodules_and_the_memory_summary_answer_as_torch_cuda_does():
    memory, random, graphs = torch.cuda.memory, torch.cuda.random, torch.cuda.graphs
    before = (memory.mem_get_info, random.manual_seed, graphs.is_current_stream_capturing)
    total = TARGETS["h100-80g"].total_memory
    with TorchMetaRecorder(None, target="h100-80g"):
        x = torch.empty(256, device="cuda")
        assert memory.mem_get_info() == (total - 1024, total)
        assert memory.memory_allocated() == 1024 == memory.max_memory_allocated()
        random.manual_seed(0)
        assert not graphs.is_current_stream_capturing()
        summary = torch.cuda.memory_summary()
        assert "1024" in summary and "h100-80g" in summary
        del x
    assert (memory.mem_get_info, random.manual_seed, graphs.is_current_stream_capturing) \
        == before


def test_a_script_that_computes_on_the_cpu_is_refused_not_recorded_as_workspaces(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""\
        import torch
        a = torch.ones(8, 8)
        (a @ a).sum()
        """))
    with pytest.raises(UserInputError, match="put nothing on 'cuda'"):
        record_script(["python", str(prog)], tmp_path / "out.npz")
    assert not (tmp_path / "out.npz").exists()


def _other_pythons() -> list[str]:
    named = os.environ.get("ALLOCSIM_TORCH_PYTHONS", "")
    return [path for path in named.split(os.pathsep) if path]


OTHER_PYTHONS = _other_pythons() or [pytest.param(None, marks=pytest.mark.skip(
    reason="ALLOCSIM_TORCH_PYTHONS names no other interpreter (CI names one with torch's CUDA "
           "build: .ci/run)"))]


def _record_under(python: str, tmp_path: Path, argv: list[str], **env: str) -> Trace:
    """``allocsim record --framework torch --target h100-80g -- python ARGV`` run by ``python``;
    the trace, after checking it says that interpreter's torch."""
    version = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=120)
    assert version.returncode == 0, f"{python} cannot import torch: {version.stderr[-2000:]}"
    out = tmp_path / "other.npz"
    done = subprocess.run(
        [python, "-m", "allocsim", "record", "--framework", "torch", "--target", "h100-80g",
         "-o", str(out), "--", "python", *argv],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": "", **env})
    assert done.returncode == 0, done.stderr[-4000:]
    trace = load(str(out))
    assert trace.metadata["torch"] == version.stdout.strip()
    return trace


@pytest.mark.parametrize("python", OTHER_PYTHONS)
@pytest.mark.slow
def test_the_adamw_script_under_another_torch_build(tmp_path, python):
    _assert_adamw_trace(_record_under(python, tmp_path, [str(PROGRAM), *SIZES]), "h100-80g")


@pytest.mark.parametrize("python", OTHER_PYTHONS)
@pytest.mark.slow
def test_another_build_records_the_same_events_as_this_one(tmp_path, python, monkeypatch):
    """A GPT step under bf16 autocast with SDPA: the same allocations and frees, in the same
    order, on the same streams, with the same tags (2.13.0+cpu against 2.14.1+cu130)."""
    gpt = str(PROGRAM.with_name("gpt_adamw.py"))
    other = _record_under(python, tmp_path, [gpt], MIXED="bf16")
    monkeypatch.setenv("MIXED", "bf16")
    run = record_script(["python", gpt], tmp_path / "here.npz", target="h100-80g")
    assert run.error is None, run.error
    here = run.trace
    assert len(here) == len(other) > 0
    for column in ("op", "size", "stream"):
        assert getattr(here, column).tolist() == getattr(other, column).tolist(), column
    assert [here.tags[i] for i in here.tag] == [other.tags[i] for i in other.tag]


def test_a_dataloader_pinning_in_its_own_thread_records_the_batches(tmp_path):
    """With workers, the DataLoader pins each batch in a thread of its own (which needs an
    accelerator on the CPU build and a driver on the CUDA build): pinned host memory is not the
    device's, so the batches' host-to-device copies are all that is recorded of them."""
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        data = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
        loader = DataLoader(data, batch_size=16, num_workers=2, pin_memory=True)
        batches = [x.to("cuda", non_blocking=True) for x, _ in loader]
        """))
    pin_memory = torch.Tensor.pin_memory
    run = record_script(["python", str(prog)], tmp_path / "out.npz")
    assert run.error is None, run.error
    assert run.trace.size.tolist() == [16 * 16 * 4] * 4
    assert torch.Tensor.pin_memory is pin_memory
