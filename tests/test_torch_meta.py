"""The PyTorch meta recorder (``allocsim record --framework pytorch``): held to CPU runs of the
same programs event for event, CUDA's kernel choices on the target, and bad input.

Every test needs torch (skipped, saying so, without it); the programs are
tests/torch_programs/*.py, ordinary scripts that put their tensors on "cuda".
"""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the meta recorder needs PyTorch (pip install "
                                             "'torch>=2.13,<2.15', the CPU build is enough)")

from allocsim.errors import UserInputError  # noqa: E402
from allocsim.sim.cli.main import main  # noqa: E402
from allocsim.sim.kernel.device import resolve_device  # noqa: E402
from allocsim.sim.kernel.engine import replay  # noqa: E402
from allocsim.traces.formats import load  # noqa: E402
from allocsim.traces.model import OP_ALLOC, Trace  # noqa: E402
from allocsim.traces.record.torch.meta import TorchMetaRecorder, ValueReadError  # noqa: E402
from allocsim.traces.record.torch.meta_script import record_script  # noqa: E402
from allocsim.traces.record.torch.meta_targets import (  # noqa: E402
    TARGETS,
    choose_sdpa_backend,
    cublas_workspace_bytes,
)

PROGRAMS = Path(__file__).parent / "torch_programs"


def _events(trace: Trace) -> list[tuple[int, int, int, int]]:
    """(op, size, stream, which alloc a free closes): the recording without ids and times."""
    opened: dict[int, int] = {}
    rows = []
    allocs = 0
    for op, bid, size, stream in zip(trace.op.tolist(), trace.id.tolist(), trace.size.tolist(),
                                     trace.stream.tolist()):
        if op == OP_ALLOC:
            opened[bid] = allocs
            rows.append((op, size, stream, allocs))
            allocs += 1
        else:
            rows.append((op, size, stream, opened.pop(bid)))
    return rows


def _record(tmp_path: Path, program: str, *args: str, **options: object) -> Trace:
    out = tmp_path / f"{program}-{options.get('backing', 'meta')}.npz"
    run = record_script(["python", str(PROGRAMS / f"{program}.py"), *args], out, **options)
    assert run.error is None, run.error
    return run.trace


@pytest.mark.parametrize("program", ["gpt_adamw", "encoder_adamw", "cnn_sgd", "kv_cache",
                                     "checkpointed", "autocast_mlp"])
def test_meta_recording_equals_a_cpu_recording_event_for_event(tmp_path, program):
    meta = _record(tmp_path, program, backing="meta", kernels="cpu")
    cpu = _record(tmp_path, program, backing="cpu")
    assert len(meta) > 100
    assert _events(meta) == _events(cpu)
    assert meta.peak_live() == cpu.peak_live()
    assert [meta.tags[t] for t in meta.tag] == [cpu.tags[t] for t in cpu.tag]


def _frees_together_as_sets(rows: list[tuple[int, int, int, int]]) -> list[tuple[int, ...]]:
    """``rows`` with each run of consecutive frees sorted: frees that happen at one release
    (autocast's cache, a C++ hash map cleared in its own order) compared as a set."""
    out: list[tuple[int, ...]] = []
    run: list[tuple[int, ...]] = []
    for row in rows:
        if row[0] == OP_ALLOC:
            out.extend(sorted(run))
            run = []
            out.append(row)
        else:
            run.append(row)
    return out + sorted(run)


def test_meta_autocast_equals_real_cpu_autocast(tmp_path, monkeypatch):
    # the mechanism (casts above autograd, last argument first, the weight-cast cache, the
    # policies) held to PyTorch's own AutocastCPU kernels, with the CPU's op lists
    monkeypatch.setenv("AUTOCAST_DEVICE", "cpu")
    meta = _record(tmp_path, "autocast_mlp", backing="meta", kernels="cpu")
    cpu = _record(tmp_path, "autocast_mlp", backing="cpu")
    assert meta.metadata["autocast_casts"] > 10
    assert _frees_together_as_sets(_events(meta)) == _frees_together_as_sets(_events(cpu))
    assert meta.peak_live() == cpu.peak_live()


def test_autocast_cuda_casts_on_the_target_and_sdpa_sees_the_cast(tmp_path):
    plain = _record(tmp_path, "gpt_adamw", target="a100-40g")
    mixed = _record(tmp_path, "autocast_mlp", target="a100-40g")
    assert mixed.metadata["sdpa_backends"] == {"flash": 2}  # bf16 after the cast: flash
    assert mixed.metadata["autocast_casts"] > 10
    assert "autocast_casts" not in plain.metadata
    bf16_copies = [t for t in mixed.tags if t.endswith(":aten._to_copy")]
    assert bf16_copies


def test_tags_name_module_backward_node_and_optimizer(tmp_path):
    trace = _record(tmp_path, "gpt_adamw")
    tags = set(trace.tags)
    assert "GPT.blocks.0.qkv:aten.addmm" in tags
    assert any(t.startswith("backward:AddmmBackward0:") for t in tags)
    assert any(t.startswith("optimizer:AdamW.step:aten._foreach") for t in tags)


def test_on_the_target_sdpa_and_the_cublas_workspace_follow_cuda(tmp_path):
    trace = _record(tmp_path, "gpt_adamw", target="a100-40g")
    meta = trace.metadata
    assert meta["sdpa_backends"] == {"efficient": 4}  # fp32: flash needs fp16/bf16
    assert meta["cublas_workspaces"] == 2  # the main thread's and the autograd thread's
    workspace = [i for i, t in enumerate(trace.tag) if trace.tags[t].startswith("cuBLAS")]
    assert [trace.tags[trace.tag[i]].split(",")[0] for i in workspace] == [
        "cuBLAS workspace (main thread", "cuBLAS workspace (autograd thread"]
    assert all(trace.size[i] == 8 * 2**20 + 128 * 2**10 for i in workspace)
    cpu_choice = _record(tmp_path, "gpt_adamw", kernels="cpu")
    # the efficient kernel keeps a B x H x L logsumexp, not the math path's L x L weights
    assert trace.peak_live()[0] - 2 * meta["cublas_workspace_bytes"] < \
        cpu_choice.peak_live()[0] + (1 << 20)


def _qkv(dtype, length=128, head_dim=64, grad=False):
    return [torch.empty(2, 4, length, head_dim, device="meta", dtype=dtype,
                        requires_grad=grad) for _ in range(3)]


ALL_ON = {"flash": True, "efficient": True, "math": True, "cudnn": True}


@pytest.mark.parametrize("target, dtype, mask, head_dim, grad, expected", [
    ("a100-40g", torch.bfloat16, False, 64, True, "flash"),
    ("h100-80g", torch.float16, False, 128, True, "flash"),
    ("a100-40g", torch.float32, False, 64, True, "efficient"),     # flash: fp16/bf16 only
    ("a100-40g", torch.bfloat16, True, 64, False, "efficient"),    # flash: no attn_mask
    ("rtx4090-24g", torch.bfloat16, False, 256, True, "efficient"),  # sm89: grad, d > 192
    ("rtx4090-24g", torch.bfloat16, False, 256, False, "flash"),
    ("t4-16g", torch.float16, False, 64, True, "efficient"),       # sm75: no flash
    ("t4-16g", torch.bfloat16, False, 64, True, "math"),           # sm75 efficient: fp16/fp32
    ("a100-40g", torch.bfloat16, False, 260, True, "math"),        # flash: d <= 256; eff: d%8
    ("a100-40g", torch.float32, False, 62, True, "math"),          # efficient: d % 4 != 0
])
def test_sdpa_backend_choice_follows_select_sdp_backend(target, dtype, mask, head_dim, grad,
                                                        expected):
    q, k, v = _qkv(dtype, head_dim=head_dim, grad=grad)
    attn_mask = torch.empty(128, 128, device="meta", dtype=torch.bool) if mask else None
    with torch.set_grad_enabled(True):
        got = choose_sdpa_backend(TARGETS[target], q, k, v, attn_mask=attn_mask,
                                  is_causal=False, enabled=ALL_ON)
    assert got == expected


def test_sdpa_respects_the_backend_switches():
    q, k, v = _qkv(torch.bfloat16)
    only_math = {"flash": False, "efficient": False, "math": True, "cudnn": False}
    assert choose_sdpa_backend(TARGETS["a100-40g"], q, k, v, attn_mask=None, is_causal=True,
                               enabled=only_math) == "math"
    assert choose_sdpa_backend(TARGETS["h100-80g"], q, k, v, attn_mask=None, is_causal=True,
                               enabled=ALL_ON, prefer_cudnn=True) == "cudnn"


SNAPSHOT = Path(__file__).resolve().parents[2] / "shared" / "traces" / "torch-snapshot-eor.pickle"


@pytest.mark.skipif(not SNAPSHOT.exists(), reason="../shared/traces is absent")
def test_a_real_training_snapshot_holds_two_cublas_workspaces_one_from_backward():
    # What the workspace rule follows, seen on a GPU: a training run's snapshot holds two
    # blocks of the default 8 MiB + 128 KiB, and the one allocated while recording came from
    # getNewWorkspace under a GEMM of the backward pass.
    import pickle

    snapshot = pickle.loads(SNAPSHOT.read_bytes())
    blocks = [b for seg in snapshot["segments"] for b in seg["blocks"]
              if b["size"] == 8519680 and b["state"] == "active_allocated"]
    assert len(blocks) == 2
    allocs = [e for trace in snapshot["device_traces"] for e in trace
              if e["action"] == "alloc" and e["size"] == 8519680]
    assert len(allocs) == 1
    names = [f["name"] for f in allocs[0]["frames"]]
    assert "at::cuda::getNewWorkspace()" in names
    assert any("autograd" in n or "Backward" in n for n in names)


def test_cublas_workspace_size_by_capability_and_config():
    assert cublas_workspace_bytes(TARGETS["a100-40g"], "") == 8519680
    assert cublas_workspace_bytes(TARGETS["h100-80g"], "") == 32 * 2**20
    assert cublas_workspace_bytes(TARGETS["a100-40g"], ":4096:8") == 32 * 2**20
    assert cublas_workspace_bytes(TARGETS["a100-40g"], ":16:8") == 128 * 2**10
    assert cublas_workspace_bytes(TARGETS["a100-40g"], "junk") == 8519680


def test_replays_through_the_pytorch_model(tmp_path):
    trace = _record(tmp_path, "gpt_adamw")
    saved = load(str(tmp_path / "gpt_adamw-meta.npz"))
    assert _events(saved) == _events(trace)
    result = replay(saved, "pytorch", resolve_device("rtx4090-24g"))
    assert result.completed and result.peak_allocated == trace.peak_live()[0]
    assert result.peak_reserved >= result.peak_allocated


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_a_value_read_stops_with_one_line_naming_the_line(tmp_path):
    prog = _script(tmp_path, """\
        import torch
        x = torch.ones(4, device="cuda")
        loss = (x * 2).sum()
        print(loss.item())
        """)
    run = record_script(["python", str(prog)], tmp_path / "out.npz")
    assert isinstance(run.error, ValueReadError) and run.exit_status == 1
    assert f"{prog}:4: Tensor.item()" in run.explanation and "\n" not in run.explanation
    assert load(str(tmp_path / "out.npz")).metadata["partial"]


def test_placeholder_values_read_zeros_and_the_program_runs_on(tmp_path):
    prog = _script(tmp_path, """\
        import torch
        x = torch.ones(4, device="cuda")
        assert x.sum().item() == 0.0 and not bool((x > 0).any()) and x.tolist() == [0.0] * 4
        assert f"{x.sum():.2f}" == "0.00" and x.cpu().shape == (4,) and x.device.type == "cuda"
        y = torch.zeros(8, device="cuda")
        """)
    run = record_script(["python", str(prog)], tmp_path / "out.npz", values="placeholder")
    assert run.error is None
    assert int(run.trace.peak_live()[0]) >= 16 + 32


def test_a_program_that_never_touches_cuda_is_refused(tmp_path):
    prog = _script(tmp_path, "import torch\nx = torch.ones(4)\n")
    with pytest.raises(UserInputError, match="put nothing on 'cuda'"):
        record_script(["python", str(prog)], tmp_path / "out.npz")
    assert not (tmp_path / "out.npz").exists()


def test_a_cuda_only_extension_op_is_named_and_the_partial_trace_kept(tmp_path):
    prog = _script(tmp_path, """\
        import torch
        lib = torch.library.Library("allocsim_test_ext", "DEF")
        lib.define("fused(Tensor x) -> Tensor")
        lib.impl("fused", lambda x: x * 2, "CUDA")
        x = torch.ones(1024, device="cuda")
        y = torch.ops.allocsim_test_ext.fused(x)
        """)
    run = record_script(["python", str(prog)], tmp_path / "out.npz")
    assert run.exit_status == 1
    assert "allocsim_test_ext::fused" in run.explanation and "no meta kernel" in run.explanation
    assert f"{prog}:6" in run.explanation
    assert len(load(str(tmp_path / "out.npz"))) == 1


def test_a_crash_midway_keeps_the_partial_trace(tmp_path):
    prog = _script(tmp_path, """\
        import torch
        a = torch.ones(1000, device="cuda")
        b = torch.ones(2000, device="cuda")
        raise RuntimeError("boom")
        """)
    run = record_script(["python", str(prog)], tmp_path / "out.npz")
    assert run.exit_status == 1 and isinstance(run.error, RuntimeError)
    saved = load(str(tmp_path / "out.npz"))
    assert saved.size.tolist() == [4000, 8000]


def test_sigterm_keeps_the_trace_and_exits_143(tmp_path):
    prog = _script(tmp_path, """\
        import os, signal, torch
        a = torch.ones(1000, device="cuda")
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10**7):
                pass
        except Exception:
            pass  # a script's own handler does not swallow the termination
        b = torch.ones(2000, device="cuda")
        """)
    run = record_script(["python", str(prog)], tmp_path / "out.npz")
    assert run.exit_status == 128 + signal.SIGTERM
    assert load(str(tmp_path / "out.npz")).size.tolist() == [4000]
    assert signal.getsignal(signal.SIGTERM) is not None


def test_torch_cuda_is_put_back_after_recording():
    before = torch.cuda.is_available
    with TorchMetaRecorder(None):
        assert torch.cuda.is_available() and torch.cuda.get_device_properties(0).major == 8
        x = torch.empty(256, device="cuda")
        assert torch.cuda.memory_allocated() == 1024 and x.is_cuda
    assert torch.cuda.is_available is before
    assert torch.empty(2, device="meta").device.type == "meta"


def test_cli_records_and_refuses_target_for_other_frameworks(tmp_path, capsys):
    out = tmp_path / "run.npz"
    status = main(["record", "--framework", "torch", "--target", "h100-80g", "-o", str(out),
                   "--", "python", str(PROGRAMS / "kv_cache.py")])
    assert status == 0 and out.exists()
    assert "peak live" in capsys.readouterr().err
    assert load(str(out)).metadata["target"] == "h100-80g"
    assert main(["record", "--framework", "jax", "--target", "h100-80g", "-o",
                 str(tmp_path / "x.npz"), "--", "python", "x.py"]) == 2
    # --framework jax takes a TPU target (record --target tpu-v5e); a GPU is one line
    assert "a TPU only" in capsys.readouterr().err
    assert main(["record", "--framework", "torch", "--target", "nope", "-o",
                 str(tmp_path / "y.npz"), "--", "python", str(PROGRAMS / "kv_cache.py")]) == 2
    assert "unknown target" in capsys.readouterr().err


def test_recorder_memory_is_per_live_storage_not_per_byte():
    sizes = []
    for n in (1 << 10, 1 << 28):  # 4 KiB and 1 GiB tensors: the recorder holds no data
        with TorchMetaRecorder(None) as rec:
            x = torch.empty(n, device="cuda")
            sizes.append(len(rec._live))
            del x
    assert sizes == [1, 1]
    assert rec.trace is not None and rec.trace.size.tolist() == [1 << 30, 1 << 30]


def test_cpu_recording_is_an_ordered_part_of_the_cpu_allocators_own_stream(tmp_path):
    # Independent of the recorder's dispatch mode: torch.profiler's [memory] events are the
    # CPU allocator's own calls. Every recorded event appears in them, in order; what the
    # profiler sees besides is kernel-internal scratch (mkldnn convolution, batch norm),
    # which no dispatch-level recorder — and no meta kernel — sees.
    import runpy
    import sys

    from allocsim.traces.record.torch.profiler import record_torch

    program = str(PROGRAMS / "cnn_sgd.py")
    saved = sys.argv
    namespace: dict[str, object] = {}
    try:
        sys.argv = [program]
        profiled = record_torch(lambda: namespace.update(runpy.run_path(program)), output=None)
    finally:
        sys.argv = saved
    recorded = _record(tmp_path, "cnn_sgd", backing="cpu")
    theirs = iter(zip(profiled.op.tolist(), profiled.size.tolist()))
    assert all(event in theirs for event in zip(recorded.op.tolist(), recorded.size.tolist()))
    assert len(profiled) > len(recorded)
    assert abs(profiled.peak_live()[0] - recorded.peak_live()[0]) < 4096


def test_a_gradscaler_loop_with_a_dataloader_and_a_side_stream(tmp_path):
    prog = _script(tmp_path, """\
        import torch, torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset
        model = nn.Linear(16, 4).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        data = DataLoader(TensorDataset(torch.randn(32, 16), torch.randint(0, 4, (32,))),
                          batch_size=8)
        for x, y in data:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        with torch.cuda.stream(torch.cuda.Stream()):
            z = torch.empty(1000, device="cuda")
        """)
    stopped = record_script(["python", str(prog)], tmp_path / "a.npz")
    assert f"{prog}:13: Tensor.item()" in stopped.explanation  # GradScaler.step reads found_inf
    run = record_script(["python", str(prog)], tmp_path / "b.npz", values="placeholder")
    assert run.error is None
    assert run.trace.streams() == [0, 1]
    assert run.trace.size[run.trace.stream == 1].tolist() == [4000]
    assert run.trace.metadata["autocast_casts"] > 0
