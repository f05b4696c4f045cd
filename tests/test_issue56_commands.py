"""Issue 56, items 2, 15 and 16: an output that cannot be written, an option that needs another
and a bad policy are refused in one line, exit 2, before any work (the script not run, no
trace replayed, no child process started), and nothing is changed.

Tests run as root here and may in CI, and root writes into read-only folders: the cases
that hold for root are a folder that does not exist and a path whose parent is a regular
file; the read-only folder itself is tried only when not root."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocsim.traces import formats, synth
from tests.one_line import refused

SAMPLE_JAX = Path(__file__).resolve().parents[1] / "traces" / "data" / "sample-jax-cpu-train.npz"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A folder this process cannot write into; skipped where it can all the same (root,
    with its override of file permissions, as os.geteuid() == 0 usually has: the
    missing-folder and file-parent tests hold there)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        (folder / "probe").touch()
    except PermissionError:
        yield folder
    else:
        (folder / "probe").unlink()
        pytest.skip("this process writes into a read-only folder (root): the missing-folder "
                    "and file-parent tests hold here")
    finally:
        folder.chmod(stat.S_IRWXU)


@pytest.fixture
def afile(tmp_path: Path) -> Path:
    path = tmp_path / "afile"
    path.write_text("a user's file\n")
    return path


# -- 1. record: the output's folder is checked before the script runs (56.2) ----------------

@pytest.fixture
def script(tmp_path: Path) -> tuple[Path, Path]:
    """A script that only writes a marker: the marker exists iff the script ran."""
    marker = tmp_path / "marker"
    path = tmp_path / "script.py"
    path.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return path, marker


def refused_record(capsys, tmp_path: Path, script: tuple[Path, Path], framework: str,
                   output: Path, *more: object) -> str:
    path, marker = script
    before = snapshot(tmp_path)
    line = refused(capsys, "record", "--framework", framework, "-o", output, *more, "--",
                   "python", path)
    assert not marker.exists(), "the script ran before the output was checked"
    assert snapshot(tmp_path) == before
    return line


@pytest.mark.parametrize("framework", ["jax", "pytorch", "cupy"])
def test_record_into_a_missing_folder_runs_nothing(capsys, tmp_path, script, framework,
                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = refused_record(capsys, tmp_path, script, framework, Path("nodir") / "r.npz")
    assert line == "allocsim: error: nodir/r.npz: the folder nodir does not exist"


@pytest.mark.parametrize("framework", ["jax", "pytorch", "cupy"])
def test_record_under_a_file_runs_nothing(capsys, tmp_path, script, afile, framework):
    line = refused_record(capsys, tmp_path, script, framework, afile / "sub" / "r.npz")
    assert "not a folder" in line or "Not a directory" in line, line


def test_record_log_into_a_missing_folder_runs_nothing(capsys, tmp_path, script):
    line = refused_record(capsys, tmp_path, script, "cupy", tmp_path / "r.npz", "--log",
                          tmp_path / "nodir" / "hooks.jsonl")
    assert line.endswith("does not exist"), line


@pytest.mark.parametrize("framework", ["jax", "pytorch", "cupy"])
def test_record_into_a_read_only_folder_runs_nothing(capsys, tmp_path, script, read_only,
                                                     framework):
    line = refused_record(capsys, tmp_path, script, framework, read_only / "r.npz")
    assert "cannot write into" in line and "Permission denied" in line, line


# -- 2. compare --figures needs -o; -o is checked before any replay (56.15) -----------------

@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.npz"
    formats.save(synth.generate("training", seed=1, events=300), path)
    return path


@pytest.fixture
def no_replay(monkeypatch) -> None:
    """compare refuses before any trace is replayed."""
    def replayed(*args: object, **kwargs: object) -> None:
        raise AssertionError("a trace was replayed before the output was checked")
    monkeypatch.setattr("allocsim.sim.cli.compare.compare", replayed)


def test_compare_figures_without_out_is_refused(capsys, tmp_path, trace, no_replay):
    before = snapshot(tmp_path)
    line = refused(capsys, "compare", trace, "--figures")
    assert "--figures" in line and "-o" in line, line
    assert snapshot(tmp_path) == before


def test_compare_out_under_a_file_is_refused_first(capsys, tmp_path, trace, afile, no_replay):
    before = snapshot(tmp_path)
    line = refused(capsys, "compare", trace, "--figures", "-o", afile / "results")
    assert line == f"allocsim: error: {afile / 'results'}: {afile} is not a folder"
    assert snapshot(tmp_path) == before


def test_compare_out_onto_a_file_is_refused_first(capsys, tmp_path, trace, afile, no_replay):
    line = refused(capsys, "compare", trace, "--figures", "-o", afile)
    assert "not a folder" in line, line
    assert afile.read_text() == "a user's file\n"


def test_compare_out_over_a_users_results_is_refused_first(capsys, tmp_path, trace, no_replay):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"mine": 1}\n')
    before = snapshot(tmp_path)
    refused(capsys, "compare", trace, "-o", out)
    assert snapshot(tmp_path) == before


def test_compare_into_a_read_only_folder_is_one_line_first(capsys, tmp_path, trace, read_only,
                                                           no_replay):
    line = refused(capsys, "compare", trace, "--figures", "-o", read_only)
    assert "cannot write into" in line, line
    assert list(read_only.iterdir()) == []


def test_compare_out_still_makes_missing_folders(capsys, tmp_path, trace):
    from allocsim.sim.cli.main import main
    out = tmp_path / "a" / "b"
    assert main(["compare", str(trace), "--policies", "bfc", "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "results.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "t.npz"]   # no probe left


# -- 3. validate --backend jax: policy and -o before the child starts (56.16) ---------------

@pytest.fixture
def no_child(monkeypatch) -> None:
    """validate refuses before the JAX child process would start."""
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the JAX child started before the arguments were checked")
    monkeypatch.setattr("allocsim.sim.validation.jax_backend.run_jax", started)


@pytest.mark.parametrize(("policy", "said"), [
    ("bfc:fraction=7", "fraction must be in (0, 1]"),
    ("pytorch:max_split_size_mb=-1", "max_split_size_mb"),
    ("nonsense", "unknown policy"),
])
def test_validate_jax_bad_policy_is_refused_before_the_child(capsys, policy, said, no_child):
    line = refused(capsys, "validate", SAMPLE_JAX, "--backend", "jax", "--policy", policy)
    assert said in line, line


def test_validate_jax_out_onto_a_file_is_refused_before_the_child(capsys, tmp_path, afile,
                                                                  no_child):
    before = snapshot(tmp_path)
    line = refused(capsys, "validate", SAMPLE_JAX, "--backend", "jax", "-o", afile)
    assert line == f"allocsim: error: {afile}: not a folder (a file of that name exists)"
    assert snapshot(tmp_path) == before


def test_validate_jax_out_under_a_file_is_refused_before_the_child(capsys, tmp_path, afile,
                                                                   no_child):
    line = refused(capsys, "validate", SAMPLE_JAX, "--backend", "jax", "--policy", "tpu",
                   "-o", afile / "report")
    assert line == f"allocsim: error: {afile / 'report'}: {afile} is not a folder"


def test_validate_into_a_read_only_folder_is_refused_first(capsys, read_only, no_child):
    line = refused(capsys, "validate", SAMPLE_JAX, "--backend", "jax", "-o", read_only / "v")
    assert "cannot write into" in line, line
