"""Where a recording is written, and what it may replace (issue 36, items 1, 2 and 11).

- The output path is resolved before the program runs: a script that changes its working folder
  does not move the trace into that folder (over a user's file of the same name there).
- A file the script itself writes at the output path, or anything else written there after
  allocsim checked it, is never replaced: one line says so, and the recording is kept beside it
  (``NAME.allocsim.EXT``), since a run cannot simply be made again.
- However the script ends — a ``BaseException`` of its own, ``os._exit(n)`` — the partial trace
  is written and said; only the recording process writes it (not a child the script forked).

Each case runs ``python -m allocsim record`` in a process of its own, in the folder of the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from allocsim.errors import UserInputError
from allocsim.traces.formats import load

LINUX = sys.platform.startswith("linux")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}

# One body per framework: allocate something, then whatever the case does (``{then}``).
ALLOCATE = {
    "torch": "import torch\nx = torch.ones(1000, device='cuda')\n",
    "jax": "import jax.numpy as jnp\nx = jnp.ones(1000)\n",
}


def needs(framework: str) -> None:
    pytest.importorskip(framework, reason=f"the {framework} recorder needs {framework}")


def record(tmp_path: Path, framework: str, then: str,
           output: str = "r.npz") -> subprocess.CompletedProcess:
    (tmp_path / "prog.py").write_text(ALLOCATE[framework] + textwrap.dedent(then))
    return subprocess.run([sys.executable, "-m", "allocsim", "record", "--framework", framework,
                           "-o", output, "--", "python", "prog.py"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)


def ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("allocsim:")]


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_script_that_changes_folder_does_not_move_the_trace(framework, tmp_path) -> None:
    needs(framework)
    (tmp_path / "sub").mkdir()
    users = tmp_path / "sub" / "r.npz"
    users.write_text("the user's own r.npz\n")
    done = record(tmp_path, framework, "import os\nos.chdir('sub')\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert users.read_text() == "the user's own r.npz\n"
    assert len(load(tmp_path / "r.npz")) >= 1


def test_the_cupy_recorder_resolves_its_outputs_before_the_script_runs(tmp_path,
                                                                      monkeypatch) -> None:
    from allocsim.traces.record import run_script
    (tmp_path / "sub").mkdir()
    users = tmp_path / "sub" / "r.npz"
    users.write_text("the user's own r.npz\n")
    (tmp_path / "prog.py").write_text("import os\nos.chdir('sub')\n")
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)    # no CuPy here: nothing to record
        run_script(["python", "prog.py"], "r.npz", log="r.jsonl")
    assert users.read_text() == "the user's own r.npz\n"
    assert (tmp_path / "r.npz").exists() and (tmp_path / "r.jsonl").exists()
    assert not (tmp_path / "sub" / "r.jsonl").exists()


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("existing", [False, True], ids=["new", "its-own-earlier-trace"])
def test_a_file_the_script_writes_at_the_output_is_kept(framework, existing, tmp_path) -> None:
    needs(framework)
    if existing:    # a trace allocsim wrote before, which it may replace, until the script writes
        assert record(tmp_path, framework, "").returncode == 0
    done = record(tmp_path, framework, "open('r.npz', 'w').write('the script wrote this')\n")
    assert done.returncode == 2
    assert (tmp_path / "r.npz").read_text() == "the script wrote this"
    lines = ours(done.stderr)
    assert len(lines) == 1 and "r.npz: another program wrote this file" in lines[0], lines
    assert "r.allocsim.npz" in lines[0]
    assert len(load(tmp_path / "r.allocsim.npz")) >= 1, "the recording is kept beside it"


def test_a_file_written_while_allocsim_writes_is_kept_and_nothing_written(tmp_path) -> None:
    from allocsim.atomic_files import atomic_output
    target = tmp_path / "out.json"
    with pytest.raises(UserInputError, match="nothing was written"):
        with atomic_output(target) as stream:
            stream.write(b"allocsim's")
            target.write_text("theirs")
    assert target.read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_base_exception_of_the_script_keeps_the_partial_trace(framework, tmp_path) -> None:
    needs(framework)
    done = record(tmp_path, framework, """
        class Stop(BaseException):
            pass
        raise Stop("enough")
    """)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Stop: enough" in done.stderr, "the script's own traceback, as Python prints it"
    assert "partial trace written to r.npz" in ours(done.stderr)[-1]
    trace = load(tmp_path / "r.npz")
    assert len(trace) >= 1 and "Stop" in trace.metadata["partial"]


@pytest.mark.skipif(not LINUX, reason="os._exit and fork as on Linux")
def test_os_exit_in_a_torch_recording_keeps_the_partial_trace_and_says_so(tmp_path) -> None:
    needs("torch")
    done = record(tmp_path, "torch", "import os\nos._exit(7)\n")
    assert done.returncode == 7
    assert ours(done.stderr) == [
        "allocsim: record: the script ended by os._exit(7); partial trace written to r.npz "
        "(1 events, peak live 3.91KiB on a100-80g)"]
    assert load(tmp_path / "r.npz").metadata["partial"] == "os._exit(7)"


@pytest.mark.skipif(not LINUX, reason="fork as on Linux")
def test_a_forked_child_writes_no_trace(tmp_path) -> None:
    needs("torch")
    done = record(tmp_path, "torch", """
        import os
        child = os.fork()
        if child:
            os.waitpid(child, 0)
            y = torch.ones(2000, device='cuda')     # the parent records on after its child
        else:
            z = torch.ones(5000, device='cuda')     # the child ends here, at the script's end
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [line for line in done.stderr.splitlines() if "r.npz" in line] == [
        "wrote r.npz: 2 events, peak live 11.72KiB on a100-80g"], "one process writes, once"
    trace = load(tmp_path / "r.npz")
    assert sorted(trace.size[trace.size > 0].tolist()) == [4000, 8000]


def test_compare_keeps_a_file_written_in_its_folder_while_it_draws(tmp_path, monkeypatch,
                                                                   capsys) -> None:
    """``compare -o DIR`` checks its folder first, then replays and draws: a report.html that
    appears meanwhile is another program's, and is kept."""
    from allocsim.sim.cli.main import main
    from allocsim.sim.output import results_dir
    source, out = tmp_path / "t.npz", tmp_path / "out"
    assert main(["gen", "random", "events=100", "-o", str(source)]) == 0
    draw = results_dir.png_bytes

    def drawing_while_someone_writes(fig):
        out.mkdir(exist_ok=True)
        (out / "report.html").write_text("my own page")
        return draw(fig)

    monkeypatch.setattr(results_dir, "png_bytes", drawing_while_someone_writes)
    capsys.readouterr()
    assert main(["compare", str(source), "--policies", "on-demand", "-o", str(out),
                 "--figures"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"allocsim: error: {out}/report.html: another program wrote this file after allocsim "
        "checked it; it is left as it is and nothing was written"]
    assert (out / "report.html").read_text() == "my own page"


@pytest.mark.skipif(not LINUX, reason="os._exit as on Linux")
def test_os_exit_after_writing_the_output_itself_is_one_line_and_keeps_both(tmp_path) -> None:
    needs("torch")
    done = record(tmp_path, "torch", "import os\nopen('r.npz', 'w').write('mine')\nos._exit(3)\n")
    assert done.returncode == 3
    assert ours(done.stderr) == [
        "allocsim: error: r.npz: another program wrote this file after allocsim checked it; it "
        "is left as it is and the new output was written to r.allocsim.npz instead"]
    assert (tmp_path / "r.npz").read_text() == "mine"
    assert load(tmp_path / "r.allocsim.npz").metadata["partial"] == "os._exit(3)"


def test_convert_keeps_a_file_written_at_its_output_while_it_reads(tmp_path, monkeypatch,
                                                                  capsys) -> None:
    from allocsim.sim.cli import trace_files
    from allocsim.sim.cli.main import main
    source, target = tmp_path / "t.npz", tmp_path / "t.csv"
    assert main(["gen", "random", "events=100", "-o", str(source)]) == 0
    read = trace_files.load_trace

    def reading_while_someone_writes(*args, **kwargs):
        target.write_text("my own table")
        return read(*args, **kwargs)

    monkeypatch.setattr(trace_files, "load_trace", reading_while_someone_writes)
    capsys.readouterr()
    assert main(["convert", str(source), str(target)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"allocsim: error: {target}: another program wrote this file after allocsim checked "
        "it; it is left as it is and nothing was written"]
    assert target.read_text() == "my own table"
