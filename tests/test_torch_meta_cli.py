"""The issue's bad input for ``allocsim record --framework pytorch``, as the command line says it.

tests/test_torch_meta.py holds the recorder to each case through :func:`record_script`; here
the same five go through the command: what it prints (one line, or the script's own
traceback without allocsim's frames), its exit status, and what it leaves on disk — and
SIGTERM comes from outside, as a job scheduler sends it, to a separate ``allocsim record``
process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the meta recorder needs PyTorch (pip install "
                                    "'torch>=2.13,<2.15', the CPU build is enough)")

from allocsim.sim.cli.main import main
from allocsim.traces.formats import load


def _record(tmp_path: Path, body: str, capsys) -> tuple[int, list[str], Path, Path]:
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(body))
    out = tmp_path / "out.npz"
    status = main(["record", "--framework", "torch", "-o", str(out), "--", "python", str(prog)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return status, err, prog, out


def test_a_program_that_never_touches_cuda_is_one_line_and_exit_2(tmp_path, capsys):
    status, err, _, out = _record(tmp_path, "import torch\nx = torch.ones(4)\n", capsys)
    assert status == 2
    assert len(err) == 1 and err[0].startswith("allocsim: ") and "'cuda'" in err[0]
    assert not out.exists()


def test_item_names_the_line_and_keeps_the_partial_trace(tmp_path, capsys):
    status, err, prog, out = _record(tmp_path, """\
        import torch
        x = torch.ones(4, device="cuda")
        print((x * 2).sum().item())
        """, capsys)
    assert status == 1
    assert not any("Traceback" in line for line in err)
    assert err[0].startswith(f"allocsim: record: {prog}:3: Tensor.item()")
    assert "partial trace written" in err[-1] and len(err) == 2
    assert load(str(out)).metadata["partial"]


def test_a_cuda_only_extension_is_named_without_a_traceback(tmp_path, capsys):
    status, err, prog, out = _record(tmp_path, """\
        import torch
        lib = torch.library.Library("allocsim_cli_ext", "DEF")
        lib.define("fused(Tensor x) -> Tensor")
        lib.impl("fused", lambda x: x * 2, "CUDA")
        x = torch.ones(1024, device="cuda")
        torch.ops.allocsim_cli_ext.fused(x)
        """, capsys)
    assert status == 1 and len(err) == 2
    assert "allocsim_cli_ext::fused" in err[0] and f"{prog}:6" in err[0]
    assert len(load(str(out))) == 1


def test_a_crash_prints_the_scripts_traceback_alone_and_keeps_the_trace(tmp_path, capsys):
    status, err, prog, out = _record(tmp_path, """\
        import torch
        a = torch.ones(1000, device="cuda")
        raise RuntimeError("boom")
        """, capsys)
    assert status == 1
    assert err[0] == "Traceback (most recent call last):"
    assert not any("allocsim" in line and "File" in line for line in err)
    assert any(str(prog) in line for line in err) and "RuntimeError: boom" in err
    assert load(str(out)).size.tolist() == [4000]


def test_sigterm_from_outside_keeps_the_trace_and_exits_143(tmp_path):
    prog = tmp_path / "prog.py"
    ready = tmp_path / "ready"
    prog.write_text(textwrap.dedent(f"""\
        import time, torch
        a = torch.ones(1000, device="cuda")
        open({str(ready)!r}, "w").close()
        time.sleep(120)
        b = torch.ones(2000, device="cuda")
        """))
    out = tmp_path / "out.npz"
    child = subprocess.Popen([sys.executable, "-m", "allocsim", "record", "--framework", "torch",
                              "-o", str(out), "--", "python", str(prog)],
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not ready.exists():
            assert child.poll() is None and time.monotonic() < deadline, "no start"
            time.sleep(0.1)
        os.kill(child.pid, signal.SIGTERM)
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 128 + signal.SIGTERM, err
    assert "partial trace written" in err and "Traceback" not in err
    assert load(str(out)).size.tolist() == [4000]
