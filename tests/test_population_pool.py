"""A population measured in a process pool is the population measured in one process, byte for
byte (experiments/preallocate_vs_grow/pool.py): the rows come back in the definition's order
whatever order the workers finish in, and each finished member is reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.preallocate_vs_grow import population as pop
from experiments.preallocate_vs_grow.pool import measure_all

TINY = '''title = "tiny"
device = "a100-40g"
policies = ["bfc", "jax:preallocate=false", "offline"]
reserved = true
[[families]]
label = "mlp"
generate = "training"
params = { steps = 2 }
seeds = 2
[[families]]
label = "recorded"
kind = "recorded"
files = ["experiments/data/jax/train-jit-donate.npz"]
[[claims]]
text = "the offline plan needs less than BFC"
lower = "offline"
higher = "bfc"
[sensitivity]
cost_scale = [0.5, 1]
max_slowdown = [1.1]
'''


def tiny(where: Path) -> Path:
    folder = where / "tiny"
    folder.mkdir(parents=True)
    (folder / "population.toml").write_text(TINY)
    (folder / "README.md").write_text("# tiny\n\n## Findings\n\nNone.\n")
    return folder


def test_two_workers_write_the_population_one_process_writes(tmp_path: Path) -> None:
    serial, pooled = tiny(tmp_path / "serial"), tiny(tmp_path / "pooled")
    said: list[str] = []
    pop.run(serial, say=lambda *a: None, workers=1)
    pop.run(pooled, say=lambda *a: said.append(" ".join(map(str, a))), workers=2)
    for name in ("population.json", "README.md"):
        assert (pooled / name).read_bytes() == (serial / name).read_bytes(), name
    assert sorted(line.split()[1] for line in said) == ["1/3", "2/3", "3/3"]
    assert all(line.startswith("[population] ") and " s elapsed)" in line for line in said)


def test_rows_follow_the_tasks_order_not_the_finishing_order() -> None:
    import tomllib
    work = [task for _, task in pop.tasks(tomllib.loads(TINY))]
    forward = measure_all(work, 1, lambda *a: None)
    backward = measure_all(work[::-1], 2, lambda *a: None)
    assert backward == forward[::-1]
    assert [row["member"] for row in forward] == ["seed 0", "seed 1", "train-jit-donate"]


def test_workers_below_one_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        pop.main(["preallocate_vs_grow", "--workers", "0"])
    assert stop.value.code == 2
    assert "--workers must be at least 1, got 0" in capsys.readouterr().err


def _dies_once(task: tuple[str, int]) -> int:
    """Square ``number``; the first call to see no ``marker`` file makes it and kills its
    own worker (as a crash in the native core would)."""
    import os
    marker, number = task
    if number == 3 and not Path(marker).exists():
        Path(marker).write_text("died")
        os._exit(1)
    return number * number


def test_a_worker_that_dies_does_not_lose_the_run(tmp_path: Path) -> None:
    from experiments.preallocate_vs_grow.pool import in_pool
    marker = str(tmp_path / "died")
    tasks = [(marker, n) for n in range(6)]
    results: dict[int, int] = {}
    in_pool(_dies_once, tasks, 2, range(len(tasks)), results.__setitem__)
    assert Path(marker).exists()
    assert [results[i] for i in range(6)] == [0, 1, 4, 9, 16, 25]
