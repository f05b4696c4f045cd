"""The runner's issue-30 keys: contrasts (one change at a time, min/median/max over pairs),
spreads, offset sweeps and MEM_FRACTION grids for sharing, and results free of machine
details. Hand-worked cases on tiny traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from allocsim.traces.model import Trace
from experiments.runner import contrasts, sweeps
from experiments.runner.execute import DefinitionError, execute, load_traces
from experiments.runner.portable import ROOT, machine_details

MiB = 1 << 20


def _trace(events: list[tuple[int, int, int, int, str]], name: str) -> Trace:
    """(time_ns, op 0=alloc 1=free, id, size, tag) rows."""
    tags = sorted({e[4] for e in events})
    return Trace(time_ns=[e[0] for e in events], op=[e[1] for e in events],
                 id=[e[2] for e in events], size=[e[3] for e in events],
                 stream=[0] * len(events), process=[0] * len(events),
                 tag=[tags.index(e[4]) for e in events], tags=tags,
                 metadata={"name": name, "source": "test"})


def _job(first_step_ns: int, steps: int, period_ns: int, size: int, name: str) -> Trace:
    """A JAX-recorder-like job: an init array at 0, then ``steps`` train steps (a temp each)."""
    events = [(0, 0, 0, size, "jit(init)/temp"), (1, 1, 0, size, "jit(init)/temp")]
    for k in range(steps):
        t = first_step_ns + k * period_ns
        events += [(t, 0, k + 1, size, "jit(step)/temp"), (t + period_ns // 2, 1, k + 1, size,
                                                           "jit(step)/temp")]
    return _trace(events, name)


def test_the_steady_phase_is_the_train_steps_read_off_the_recording() -> None:
    job = _job(first_step_ns=1_300_000_000, steps=4, period_ns=100_000_000, size=MiB,
               name="a")
    # the init temp is allocated once, the train step four times: the train step is the step
    assert sweeps.steady_phase(job) == (1_300_000_000, 1_650_000_000, 4)


def test_an_offset_lines_up_first_train_steps_and_says_how_long_they_overlap() -> None:
    phases = [(1_300_000_000, 2_800_000_000, 20), (1_400_000_000, 1_850_000_000, 20)]
    # offset 0: the second's first step at the first's: the second starts 0.1 s earlier.
    starts = sweeps._starts(phases, 0.0)
    assert starts == [100_000_000, 0]
    assert sweeps.overlap_s(phases, starts) == pytest.approx(0.45)
    # +1.5 s: the second's steps start 0.1 s before the first's end.
    starts = sweeps._starts(phases, 1.4)
    assert starts == [0, 1_300_000_000]
    assert sweeps.overlap_s(phases, starts) == pytest.approx(0.1)
    assert sweeps.overlap_s(phases, sweeps._starts(phases, 1.6)) == 0


def test_an_offset_sweep_reports_each_offset_and_capacity() -> None:
    a = _job(10_000_000, 5, 10_000_000, 40 * MiB, "a")
    b = _job(10_000_000, 5, 10_000_000, 40 * MiB, "b")
    result = sweeps.offset_sweep(
        {"label": "x", "traces": ["a", "b"], "capacities": ["64MiB", "128MiB"],
         "offsets": [0.0, 1.0],
         "configs": [["no cache", "jax:allocator=platform", "jax:allocator=platform"]]},
        {"a": a, "b": b}, "a100-40g")
    cells = {(r["offset_s"], k): sweeps._outcome(c)
             for r in result["rows"] for k, c in enumerate(r["cells"])}
    # together, 80 MiB of temps do not fit on 64 MiB; apart (1 s) or on 128 MiB they do
    assert cells[(1.0, 0)] == "both" and cells[(0.0, 1)] == "both" and cells[(1.0, 1)] == "both"
    assert cells[(0.0, 0)] in ("1st only", "2nd only")
    assert result["rows"][0]["overlap_s"] > 0 and result["rows"][1]["overlap_s"] == 0


def test_spread_gives_min_median_max_and_how_many_pairs_agree() -> None:
    assert contrasts.spread([-0.1, -0.3, 0.2, None]) == ["-30.0%", "-10.0%", "+20.0%",
                                                          "down in 2 of 4"]
    assert contrasts.spread([0.1]) == ["+10.0%", "+10.0%", "+10.0%", "up in 1 of 1"]


def test_a_contrast_pairs_peak_live_and_min_capacities() -> None:
    base = _trace([(0, 0, 1, 4 * MiB, "x"), (1, 1, 1, 4 * MiB, "x")], "base")
    variant = _trace([(0, 0, 1, 3 * MiB, "x"), (1, 1, 1, 3 * MiB, "x")], "variant")
    capacities = [{"trace": "base", "policy": "bfc", "min_capacity": 8 * MiB},
                  {"trace": "variant", "policy": "bfc", "min_capacity": 4 * MiB}]
    c = contrasts.contrast({"label": "l", "pairs": [["base", "variant"]]},
                           {"base": base, "variant": variant}, capacities)
    assert c["pairs"][0]["peak_live"] == [4 * MiB, 3 * MiB]
    assert c["pairs"][0]["min_capacity"] == {"bfc": [8 * MiB, 4 * MiB]}
    text = "\n".join(contrasts.render(c))
    assert "-25.0%" in text and "-50.0%" in text and "down in 1 of 1" in text


def test_results_name_trace_files_relative_to_the_repository() -> None:
    traces, _ = load_traces({"traces": [{"label": "j",
                                         "file": "experiments/data/jax/train-jit-donate.npz"}]})
    assert traces["j"].metadata["source"] == "experiments/data/jax/train-jit-donate.npz"


def test_a_machine_detail_in_the_results_is_found() -> None:
    assert machine_details({"a": [{"source": "experiments/data/x.npz"}, "peak / live"]}) == []
    found = machine_details({"a": [{"source": f"{ROOT}/experiments/data/x.npz"}],
                             "b": "read /home/someone/trace.npz"})
    assert [f.split(":")[0] for f in found] == ["results.a[0].source", "results.b"]


def test_the_runner_refuses_results_that_would_hold_a_machine_detail(tmp_path: Path) -> None:
    folder = tmp_path / "leaky"
    folder.mkdir()
    (folder / "experiment.toml").write_text(
        f'title = "{np.__file__}"\npolicies = ["bfc"]\n'
        '[[traces]]\nlabel = "t"\ngenerate = "training"\nparams = { steps = 1 }\n')
    with pytest.raises(DefinitionError, match="machine detail"):
        execute(folder, lambda *a: None)


def test_the_compiled_traces_the_experiments_name_are_xla_gpu_steps() -> None:
    """Every XLA:GPU trace a definition names is committed (the compile cache of
    experiments/xla_gpu_sizes.py), carries XLA's memory_analysis for the H100 target, and
    donation shows in it: a donated step's outputs alias its arguments, an undonated one's
    do not."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    from allocsim.traces import formats

    named = {t["file"] for name in ("compilation", "donation")
             for t in tomllib.loads((ROOT / "experiments" / name / "experiment.toml")
                                    .read_text())["traces"]
             if t.get("kind") == "compiled"}
    # 4 sizes × donation × remat, 3 variants × donation; donation across cards (A100-80GB,
    # L4) and batches (4, 16) at 1.3B without remat × donation
    assert len(named) == 30
    for file in sorted(named):
        trace = formats.load(ROOT / file)
        (step,) = trace.metadata["xla_gpu"]["executables"]
        card = "a100-80g" if "a100-80g" in file else "l4-24g" if "-l4-" in file else "h100-80g"
        assert trace.metadata["xla_gpu"]["target"] == card, file
        assert trace.metadata["xla_gpu"]["steps"] == 3
        if "-donate-" in file:
            assert step["alias"] > 0.99 * step["argument"] - 8 * 2**20, file
        else:
            assert step["alias"] == 0, file


def test_a_spread_gives_each_policys_headroom_over_the_traces() -> None:
    capacities = [{"trace": t, "policy": p, "headroom_ratio": r}
                  for t, p, r in (("a", "bfc", 0.1), ("b", "bfc", 0.3), ("c", "bfc", 0.2),
                                  ("a", "offline", 0.0), ("b", "offline", None))]
    spread = contrasts.spread_of({"label": "x", "traces": ["a", "b", "c", "missing"]},
                                 capacities)
    assert spread["traces"] == ["a", "b", "c"]
    text = "\n".join(contrasts.render_spread(spread))
    # bfc: min +10.0%, median +20.0%, max +30.0% at b; offline sized on 1 of 2 traces listed
    assert "+10.0%  +20.0%  +30.0%  3 of 3  b" in text
    assert "offline" in text and "1 of 3" in text


def test_a_fraction_grid_counts_the_offsets_at_which_both_complete() -> None:
    a = _job(10_000_000, 5, 10_000_000, 30 * MiB, "a")
    b = _job(10_000_000, 5, 10_000_000, 30 * MiB, "b")
    grid = sweeps.fraction_grid({"label": "g", "traces": ["a", "b"], "capacity": "100MiB",
                                 "fractions": [0.2, 0.5], "offsets": [0.0, 1.0]},
                                {"a": a, "b": b}, "a100-40g")
    # 0.2 × 100 MiB holds no 30 MiB temp; 0.5 each holds both at any offset
    assert grid["both_complete"][0][0] == 0 and grid["both_complete"][1][1] == 2
    assert "2/2" in "\n".join(sweeps.render_grid(grid))
