"""A JAX recording survives the ends a job scheduler and a program give it (issue 26.4):
SIGTERM and ``os._exit`` lost the whole recording. Each case runs in a process of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax", reason="jax is not installed: the JAX recorder needs it")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="signals and fork as on Linux")

from allocsim.traces.formats import load  # noqa: E402

PROGRAM = textwrap.dedent("""
    import os, signal, sys, time
    import jax.numpy as jnp
    xs = [jnp.ones((1000,)) * i for i in range(3)]
    how = sys.argv[1]
    if how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the signal lands before this ends
    elif how == "os._exit":
        os._exit(7)
    print("finished")
""")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)


def ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("allocsim:")]


@pytest.mark.parametrize(("how", "status", "reason"), [
    ("sigterm", 143, "terminated by SIGTERM"), ("os._exit", 7, "os._exit(7)")])
def test_the_command_keeps_the_partial_trace(tmp_path, how, status, reason):
    (tmp_path / "train.py").write_text(PROGRAM)
    done = run([sys.executable, "-m", "allocsim", "record", "--framework", "jax", "-o",
                "run.npz", "--", "python", "train.py", how], tmp_path)
    assert done.returncode == status, done.stderr[-2000:]
    lines = ours(done.stderr)
    assert len(lines) == 1, done.stderr[-2000:]
    assert reason in lines[0] and "partial trace written to run.npz" in lines[0], lines
    assert "Traceback" not in done.stderr
    trace = load(tmp_path / "run.npz")
    assert len(trace) >= 3 and trace.metadata["partial"] == reason


LIBRARY = textwrap.dedent("""
    import os, signal, sys, time
    import jax.numpy as jnp
    import allocsim.traces.record
    how, out = sys.argv[1], sys.argv[2]
    with allocsim.traces.record.jax(out):
        xs = [jnp.ones((1000,)) * i for i in range(3)]
        if how == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        elif how == "os._exit":
            os._exit(3)
        elif how == "fork":
            child = os.fork()
            if child == 0:
                os._exit(0)  # a forked worker ending: it must not write the parent's trace
            os.waitpid(child, 0)
            print("written by the child:", os.path.exists(out))
        elif how == "handler":
            mine = lambda signum, frame: None
            signal.signal(signal.SIGTERM, mine)
            print("kept:", signal.getsignal(signal.SIGTERM) is mine)
""")


@pytest.mark.parametrize(("how", "status", "reason"), [
    ("sigterm", -signal.SIGTERM, "terminated by SIGTERM"), ("os._exit", 3, "os._exit(3)")])
def test_the_with_block_keeps_the_partial_trace(tmp_path, how, status, reason):
    (tmp_path / "prog.py").write_text(LIBRARY)
    done = run([sys.executable, "prog.py", how, "run.npz"], tmp_path)
    assert done.returncode == status, done.stderr[-2000:]
    trace = load(tmp_path / "run.npz")
    assert len(trace) >= 3 and trace.metadata["partial"] == reason


def test_a_forked_child_ending_writes_nothing_and_a_handler_of_the_program_stays(tmp_path):
    (tmp_path / "prog.py").write_text(LIBRARY)
    forked = run([sys.executable, "prog.py", "fork", "run.npz"], tmp_path)
    assert forked.returncode == 0, forked.stderr[-2000:]
    assert "written by the child: False" in forked.stdout
    assert "partial" not in load(tmp_path / "run.npz").metadata
    handled = run([sys.executable, "prog.py", "handler", "run2.npz"], tmp_path)
    assert handled.returncode == 0 and "kept: True" in handled.stdout, handled.stderr[-2000:]
