"""The Python examples of the README and docs/*.md run as written (with the imports they show),
and the baseline and sweep examples of the user guide run as shown."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
GUIDE = REPO / "docs" / "user-guide.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
EXAMPLES = [(doc.relative_to(REPO).as_posix(), block) for doc in DOCS
            for block in re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)]
BLOCKS = [block for _, block in EXAMPLES]


def test_the_readme_has_python_examples() -> None:
    assert re.search(r"```python\n", README.read_text())


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_each_python_example_runs(index: int, capsys: pytest.CaptureFixture[str]) -> None:
    doc, block = EXAMPLES[index]
    exec(compile(block, f"{doc} python block {index}", "exec"), {})
    assert capsys.readouterr().out  # every example prints what it computed


def test_the_baseline_example_runs_as_written(tmp_path: Path, monkeypatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from allocsim.sim.cli.main import main
    line = next(line for line in GUIDE.read_text().splitlines()
                if line.startswith("allocsim baseline traces/data/"))
    first, second = (part.split() for part in line.split("&&"))
    traces = sorted(str(p) for p in REPO.glob(first[2]))
    assert traces, "the guide's glob matches no bundled trace"
    monkeypatch.chdir(tmp_path)
    assert main([first[1], *traces, *first[3:]]) == 0
    assert main(second[1:]) == 0
    assert "baseline.json" in capsys.readouterr().out


def test_the_example_sweep_grid_the_guide_names_runs(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from allocsim.sim.cli.main import main
    grid = REPO / "docs" / "examples" / "grid.toml"
    assert "docs/examples/grid.toml" in GUIDE.read_text()
    out = tmp_path / "results.jsonl"
    assert main(["sweep", str(grid), "--output", str(out), "--workers", "1"]) == 0
    assert len(out.read_text().splitlines()) == 30   # 6 traces × 5 policies × 1 × 1
    assert not (grid.parent / "example-results.jsonl").exists()
