"""Each compiled job and recording names the jax, jaxlib, libtpu and XLA versions it came from,
"unknown" where nobody wrote one down (experiments/runner/versions.py), and the experiments'
outputs carry them: results.json's trace facts and each population member's row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.runner.versions import KEYS, STAMPS, stamp, stamp_problems, versions_of

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = [ROOT / "experiments" / "data" / name
           for name in ("xla-gpu", "xla_gpu", "jax", "jax/sizes")]
FOLDERS.append(ROOT / "tests" / "data" / "tpu" / "steps")
FOLDERS.append(ROOT / "tests" / "data" / "tpu")


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.relative_to(ROOT).as_posix())
def test_every_index_entry_names_each_version(folder: Path) -> None:
    assert stamp_problems(folder) == []


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.relative_to(ROOT).as_posix())
def test_every_data_file_has_an_entry(folder: Path) -> None:
    for path in sorted(folder.iterdir()):
        if path.name in ("index.json", STAMPS) or (path / STAMPS).exists():
            continue    # a stamped folder of its own (jax/sizes) is checked as one
        versions = versions_of(path, ROOT)
        assert versions is not None, f"{path.relative_to(ROOT)} names no versions"
        assert set(KEYS) <= set(versions)


def test_a_missing_version_is_a_problem_and_unknown_is_not(tmp_path: Path) -> None:
    (tmp_path / STAMPS).write_text(json.dumps({
        "a.npz": {"jax": "0.10.2", "jaxlib": "0.10.2", "xla": "unknown"},
        "b.npz": {"jax": "unknown", "jaxlib": "unknown", "libtpu": "unknown",
                  "xla": "unknown"}}))
    assert stamp_problems(tmp_path) == [
        f"{tmp_path.name}/a.npz: no libtpu version (write \"unknown\" where it is not known)"]


def test_a_new_file_is_stamped_with_what_is_installed(tmp_path: Path) -> None:
    stamp(tmp_path, ["new.npz"])
    versions = versions_of(tmp_path / "new.npz", ROOT)
    assert versions is not None and set(KEYS) <= set(versions)
    assert stamp_problems(tmp_path) == []


def test_the_runner_carries_a_recordings_versions_into_results(tmp_path: Path) -> None:
    from experiments.runner.execute import execute
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "experiment.toml").write_text(
        'title = "tiny"\ndevice = "a100-40g"\npolicies = ["bfc"]\ntrace_kinds = true\n'
        '[[traces]]\nlabel = "jit"\nfile = "experiments/data/jax/train-jit-donate.npz"\n')
    facts = execute(folder, lambda *a: None)["traces"]
    assert facts[0]["versions"]["jax"] == "0.10.2"
    assert facts[0]["versions"]["libtpu"] == "unknown"


def test_a_population_row_names_its_members_versions() -> None:
    from experiments.preallocate_vs_grow.member import MemberTask, measure_member, sources
    source = sources({"kind": "recorded",
                      "files": ["experiments/data/jax/train-jit-donate.npz"]}, "a100-40g")[0]
    row = measure_member(MemberTask(source, ("bfc",), False, None, True))
    assert row["versions"]["jaxlib"] == "0.10.2"
    generated = sources({"generate": "training", "seeds": 1, "params": {"steps": 1}},
                        "a100-40g")[0]
    assert "versions" not in measure_member(MemberTask(generated, ("bfc",), False, None,
                                                       False))


def test_a_compiled_jobs_versions_come_from_its_index_entry() -> None:
    jobs = ROOT / "experiments" / "data" / "xla-gpu"
    versions = versions_of(jobs / "125m-b8-t1024-h100-80g.buffers.npz", ROOT)
    assert versions == json.loads((jobs / "index.json").read_text())[
        "125m-b8-t1024-h100-80g"]["versions"]
