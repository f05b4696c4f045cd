"""``allocsim tune`` (issue 28): the setting to paste, for a job and a card.

What is held here: the paste lines are the frameworks' own syntax and read back as the
framework reads them; a setting the framework's parser rejects is refused in one line; the
settings said to share a replay really replay identically; the fraction search finds the
smallest completing fraction (checked against a scan of the whole grid), reports a
non-monotone region when one exists, and is reproducible; the executors give the same
answer as the in-process search; several jobs get limits under which `share` completes them;
bad input ends in one line and exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from allocsim.sim.cli.main import main
from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.kernel.engine import replay
from allocsim.sim.questions.share import ShareSpec, share
from allocsim.sim.questions.tune.recommend import tune
from allocsim.sim.questions.tune.search import Search
from allocsim.sim.questions.tune.share import tune_share
from allocsim.sim.questions.tune.space import TuneInputError, distinct_sizes, framework
from allocsim.traces import formats
from allocsim.traces.bundled import load_default_trace
from allocsim.traces.model import Trace

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "traces" / "data"
EOR = REPO.parent / "shared" / "traces" / "torch-snapshot-eor.pickle"


def fragmenting() -> Trace:
    """Eight 8 MiB buffers, every other one freed, then 16 MiB: under PyTorch's defaults the
    freed 8 MiB holes sit in separate 20 MiB segments, so on 90 MiB the 16 MiB request finds
    no block and no room for a new segment (tests/test_explain.py works it by hand)."""
    events = [(k * 1000, "alloc", k, 8 * MiB) for k in range(8)]
    events += [(10_000 + k, "free", k, 0) for k in range(1, 8, 2)]
    events += [(20_000, "alloc", 100, 16 * MiB)]
    return Trace.from_events(events, name="fragmenting")


# ========================================================================= the settings
def test_paste_lines_are_the_frameworks_own_syntax() -> None:
    pytorch, jax = framework("pytorch"), framework("jax")
    setting = pytorch.make({"expandable_segments": True, "max_split_size_mb": 512})
    assert pytorch.paste(setting) == [
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:512"]
    assert pytorch.spec(setting) == "pytorch:expandable_segments=true,max_split_size_mb=512"
    lists = pytorch.make({"roundup_power2_divisions": "[256:1,512:2,>:8]",
                          "per_process_memory_fraction": 0.5})
    assert pytorch.paste(lists) == [
        "PYTORCH_CUDA_ALLOC_CONF='roundup_power2_divisions:[256:1,512:2,>:8]'",
        "torch.cuda.set_per_process_memory_fraction(0.5)"]
    assert jax.paste(jax.make({"fraction": 0.62, "preallocate": False})) == [
        "XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=.62"]
    assert pytorch.paste(pytorch.default()) == [] and jax.paste(jax.default()) == []


@pytest.mark.parametrize("name, values", [
    ("pytorch", {"expandable_segments": True, "max_split_size_mb": 128,
                 "roundup_power2_divisions": "[256:1,>:4]"}),
    ("pytorch", {"backend": "cudaMallocAsync"}),
    ("jax", {"allocator": "cuda_async", "preallocate": False, "fraction": 0.5}),
    ("tensorflow", {"allow_growth": True, "garbage_collection": False}),
    ("cupy", {"pool": "async", "limit_fraction": 0.25}),
])
def test_a_pasted_setting_reads_back_as_the_same_setting(name: str, values: dict) -> None:
    fw = framework(name)
    setting = fw.make(values)
    lines = fw.paste(setting, 8 << 30)
    env = " ".join(line for line in lines if "=" in line.split("(")[0]
                   and not line.startswith("cupy."))
    if name == "cupy":
        env += " pool=async"
    assert fw.parse_current(env) == setting


@pytest.mark.parametrize("name, text, message", [
    ("pytorch", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true", "True or False"),
    ("pytorch", "max_split_size_mb:10", "must be >= 20"),
    ("pytorch", "max_splitsize_mb:100", "unrecognized key"),
    ("pytorch", "roundup_power2_divisions:3", "power of 2"),
    ("pytorch", "garbage_collection_threshold:1.5", "(0.0, 1.0)"),
    ("jax", "XLA_PYTHON_CLIENT_ALLOCATOR=fancy", "must be"),
    ("jax", "XLA_PYTHON_CLIENT_MEM_FRACTION=abc", "could not convert"),
    ("jax", "XLA_CLIENT_MEM_FRACTION=.5 XLA_PYTHON_CLIENT_MEM_FRACTION=.5", "deprecated"),
    ("jax", "XLA_PYTHON_CLIENT_ALLOCATOR=vmm", "does not model"),
    ("tensorflow", "TF_FORCE_GPU_ALLOW_GROWTH=yes", "could not be parsed"),
    ("cupy", "CUPY_GPU_MEMORY_LIMIT=150%", "out of range"),
])
def test_a_setting_the_framework_rejects_is_refused(name: str, text: str, message: str) -> None:
    with pytest.raises(TuneInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        framework(name).parse_current(text)


def test_jax_reads_preallocate_as_jax_does() -> None:
    """xla_bridge: preallocate = value not in ('false', 'False', '0') — so FALSE is true."""
    jax = framework("jax")
    assert jax.parse_current("XLA_PYTHON_CLIENT_PREALLOCATE=False").get("preallocate") is False
    assert jax.parse_current("XLA_PYTHON_CLIENT_PREALLOCATE=0").get("preallocate") is False
    assert jax.parse_current("XLA_PYTHON_CLIENT_PREALLOCATE=FALSE").get("preallocate") is None


def test_unknown_framework_and_setting_are_one_line() -> None:
    with pytest.raises(TuneInputError, match="known: pytorch, jax, tensorflow, cupy"):
        framework("mxnet")
    with pytest.raises(TuneInputError, match="has no setting 'fractionn'"):
        framework("jax").make({"fractionn": 0.5})


def test_what_each_setting_stands_for() -> None:
    """JAX's platform allocator ignores preallocate and the fraction (one replay for all);
    PyTorch's cudaMallocAsync is the stream-ordered pool that never releases (PyTorch sets
    the release threshold to UINT64_MAX)."""
    jax, pytorch = framework("jax"), framework("pytorch")
    platform = [jax.make({"allocator": "platform", "preallocate": p, "fraction": f})
                for p in (True, False) for f in (0.3, 0.9)]
    assert len({jax.modelled_as(s) for s in platform}) == 1
    assert jax.modelled_as(platform[0])[0] == "on-demand"
    name, params = pytorch.modelled_as(pytorch.make({"backend": "cudaMallocAsync"}))
    assert name == "cuda-async" and dict(params)["release_threshold"] >= 1 << 60


# ================================================================== shared replays are exact
@pytest.mark.parametrize("trace", [fragmenting(), load_default_trace()],
                         ids=["fragmenting", "default"])
def test_settings_that_share_a_replay_replay_identically(trace: Trace) -> None:
    """Every PyTorch discrete setting (with and without a GC threshold, with and without a
    fraction) against the setting its canonical form stands for: the same figures, replay by
    replay. A GC threshold with expandable segments and a fraction is dropped: GC frees no
    block of an expandable segment."""
    pytorch = framework("pytorch")
    sizes = distinct_sizes(trace)
    device = resolve_device(None, "2GiB")
    checked = 0
    settings = list(pytorch.discrete(trace, device.capacity))
    settings += [s.with_values(garbage_collection_threshold=0.7) for s in settings[:4]]
    settings += [s.with_values(garbage_collection_threshold=threshold,
                               per_process_memory_fraction=0.6)
                 for s in settings for threshold in (0.5, 0.8)
                 if pytorch.value(s).expandable_segments]
    for setting in settings:
        canonical = pytorch.canonical(setting, trace, sizes)
        if canonical == setting:
            continue
        mine = replay(trace, pytorch.spec(setting), device).to_json_dict()
        theirs = replay(trace, pytorch.spec(canonical), device).to_json_dict()
        mine.pop("policy"), theirs.pop("policy")
        assert mine == theirs, (setting, canonical)
        checked += 1
    assert checked >= 6


def test_a_gc_threshold_counts_outside_expandable_segments_only() -> None:
    """A 20 MiB and a 12 MiB segment; the 20 MiB block is freed; a 22 MiB request misses.
    With a fraction of 0.9 of 100 MiB and a GC threshold of 0.3 (30 MiB), 32 MiB cached is
    over it: GC gives the unsplit 20 MiB segment back before the new one (1 device free,
    peak 34 MiB), where without GC the new segment fits beside it (no free, peak 54 MiB).
    With expandable segments GC frees nothing (every block has a neighbour), so the threshold
    is dropped from the canonical setting there, and only there."""
    trace = Trace.from_events([(0, "alloc", 1, 20 * MiB), (1, "alloc", 2, 12 * MiB),
                               (2, "free", 1, 0), (3, "alloc", 3, 22 * MiB),
                               (4, "free", 3, 0), (5, "free", 2, 0)])
    device = resolve_device(None, "100MiB")
    pytorch = framework("pytorch")
    sizes = distinct_sizes(trace)
    outcomes = {}
    for expandable in (False, True):
        plain = pytorch.make({"expandable_segments": expandable,
                              "per_process_memory_fraction": 0.9})
        gc = plain.with_values(garbage_collection_threshold=0.3)
        runs = [replay(trace, pytorch.spec(s), device) for s in (gc, plain)]
        outcomes[expandable] = [(r.device_frees, r.peak_reserved) for r in runs]
        dropped = pytorch.canonical(gc, trace, sizes) == pytorch.canonical(plain, trace, sizes)
        assert dropped == expandable
    assert outcomes[False] == [(1, 34 * MiB), (0, 54 * MiB)]
    assert outcomes[True][0] == outcomes[True][1]


# ================================================================================ the search
def test_the_defaults_fail_and_tune_finds_a_setting_that_fits() -> None:
    trace = fragmenting()
    result = tune(trace, "pytorch", resolve_device(None, "90MiB"), max_slowdown=None)
    assert not result.defaults.completed
    assert result.best is not None and result.best.completed
    assert result.best.peak_reserved <= 90 * MiB
    again = replay(trace, result.best.spec, resolve_device(None, "90MiB"))
    assert again.completed and again.peak_reserved == result.best.peak_reserved
    assert result.paste and result.paste[0].startswith("PYTORCH_CUDA_ALLOC_CONF=")
    assert any("fragmentation" in reason for reason in result.reasons)
    reasons = {t.setting.label: r for t, r in result.failing}
    assert reasons["defaults"].startswith("OOM at event 12")
    assert result.shared > 0
    assert result.front and result.best.within(None)


def test_the_fraction_answer_is_the_smallest_completing_one_on_the_grid() -> None:
    """Held to a scan of every fraction of the grid, for JAX's preallocation."""
    trace = Trace.from_events([(0, "alloc", 1, 30 * MiB), (10, "alloc", 2, 10 * MiB),
                               (20, "free", 1, 0), (30, "alloc", 3, 35 * MiB)])
    device = resolve_device(None, "200MiB")
    jax = framework("jax")
    search = Search(trace, jax, device, card=True, max_slowdown=None, seed=0)
    found = search.fraction(jax.default())
    scan = [k / 100 for k in range(1, 101)
            if replay(trace, f"jax:fraction={k / 100}", device).completed]
    assert found.answer == scan[0]
    assert found.monotone
    assert found.evaluations < 25


def _fake_result(completed: bool) -> dict[str, Any]:
    return {"completed": completed, "peak_reserved": 1, "alloc_time_s": 0.0, "slowdown": 1.0,
            "ooms": 0 if completed else 1, "first_oom_event": None if completed else 0,
            "first_oom_size": 1, "first_oom_reserved": 0, "device_mallocs": 0,
            "device_frees": 0, "internal_fragmentation": 0, "external_fragmentation": 0}


def test_a_non_monotone_region_is_found_and_reported() -> None:
    """An allocator that completes above 0.6 and again between 0.2 and 0.4: bisection alone
    says 0.61; the checks below find the lower region and the answer moves there."""
    trace = Trace.from_events([(0, "alloc", 1, MiB), (1, "free", 1, 0)])
    jax = framework("jax")

    def evaluate(batch):
        out = []
        for spec, _ in batch:
            fraction = float(spec.rsplit("fraction=", 1)[1])
            out.append(_fake_result(fraction >= 0.605 or 0.195 <= fraction <= 0.405))
        return out

    search = Search(trace, jax, resolve_device(None, "1GiB"), card=True, max_slowdown=None,
                    seed=3, evaluate=evaluate)
    found = search.fraction(jax.default())
    assert not found.monotone
    [region] = search.non_monotone
    assert region.bisected == pytest.approx(0.61)
    assert 0.2 <= region.answer <= 0.4
    assert any("below the answer" in e for e in region.exceptions)


def test_the_search_is_reproducible() -> None:
    trace = load_default_trace()
    device = resolve_device(None, "4GiB")
    first = tune(trace, "jax", device, seed=7).to_json_dict()
    second = tune(trace, "jax", device, seed=7).to_json_dict()
    assert json.dumps(first) == json.dumps(second)


def _comparable(data: dict[str, Any]) -> dict[str, Any]:
    """A sweep cell replays past the first OOM (the in-process search stops there): the
    failing settings' figures differ, who fails and where does not."""
    data["failing"] = [(f["label"], f["first_oom_event"]) for f in data["failing"]]
    data["trials"] = [t for t in data["trials"] if t["completed"]]
    data["defaults"] = data["defaults"]["completed"], data["defaults"]["first_oom_event"]
    data["answer"].pop("why")
    return data


def test_the_local_pool_gives_the_in_process_answer() -> None:
    from allocsim.sim.sweeps.tune_runner import sweep_evaluator
    path = DATA / "sample-torch-cpu-mlp.npz"
    trace = formats.load(path)
    device = resolve_device(None, "16MiB")
    here = tune(trace, "pytorch", device).to_json_dict()
    pool = sweep_evaluator(str(path), "local", 2)
    try:
        there = tune(trace, "pytorch", device, evaluate=pool).to_json_dict()
    finally:
        pool.close()
    assert _comparable(here) == _comparable(there)


def test_a_dask_cluster_gives_the_in_process_answer() -> None:
    pytest.importorskip("distributed")
    from distributed import LocalCluster

    from allocsim.sim.sweeps.tune_runner import sweep_evaluator
    path = DATA / "sample-jax-cpu-train.npz"
    trace = formats.load(path)
    device = resolve_device(None, "32MiB")
    here = tune(trace, "jax", device).to_json_dict()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        remote = sweep_evaluator(str(path), cluster.scheduler_address.replace("tcp://", "dask://"),
                                 None)
        try:
            there = tune(trace, "jax", device, evaluate=remote).to_json_dict()
        finally:
            remote.close()
    assert _comparable(here) == _comparable(there)


def test_without_a_card_the_smallest_card_is_searched() -> None:
    trace = load_default_trace()
    result = tune(trace, "jax", resolve_device(None), card=False)
    assert result.best is not None and result.best.min_capacity is not None
    assert result.best.min_capacity <= result.defaults.min_capacity
    assert replay(trace, result.best.spec,
                  resolve_device(None, result.best.min_capacity)).completed


# ========================================================================= several jobs
def test_several_jobs_get_limits_under_which_share_completes_them() -> None:
    traces = [load_default_trace(), formats.load(DATA / "sample-jax-cpu-train.npz")]
    names = ["default", "jax-sample"]
    device = resolve_device(None, "6GiB")
    answer = tune_share(traces, names, "jax", device)
    assert answer.fits
    jax = framework("jax")
    specs = [ShareSpec(n, jax.spec(j.setting, device.capacity), 0)
             for n, j in zip(names, answer.jobs)]
    run = share(traces, specs, device)
    assert all(r.completed for r in run.results)
    assert sum(j.setting.get("fraction") for j in answer.jobs) <= 1.0


def test_jobs_that_cannot_share_a_card_are_told_so() -> None:
    traces = [load_default_trace(), load_default_trace()]
    answer = tune_share(traces, ["a", "b"], "jax", resolve_device(None, "3200MiB"))
    assert not answer.fits and "add up to" in answer.reason


# ============================================================================ the command
def run_cli(argv: list[str], capsys) -> tuple[int, str, list[str]]:
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, [line for line in err.splitlines() if line.strip()]


@pytest.mark.parametrize("argv, message", [
    (["default", "--framework", "mxnet", "--capacity", "4GiB"], "unknown framework"),
    (["default", "--framework", "pytorch", "--capacity", "4GiB", "--current",
      "max_split_size_mb:5"], "must be >= 20"),
    ([str(DATA / "sample-jax-cpu-train.npz"), "--framework", "pytorch", "--capacity", "1GiB"],
     "a jax recording, tuned as pytorch"),
    (["default", "--framework", "jax", "--capacity", "-1GiB"], "capacity"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys) -> None:
    status, _, err = run_cli(["tune", *argv], capsys)
    assert status == 2 and len(err) == 1 and message in err[0], err


def test_another_frameworks_trace_with_any_trace_states_the_assumption(capsys) -> None:
    status, out, _ = run_cli(["tune", str(DATA / "sample-jax-cpu-train.npz"), "--framework",
                              "pytorch", "--capacity", "64MiB", "--any-trace"], capsys)
    assert status == 0
    assert "recorded from jax, tuned as pytorch" in out
    assert out.index("ANSWER") < out.index("Pareto front") < out.index("failing settings")


def test_the_output_folder_holds_json_figure_and_report(tmp_path: Path, capsys) -> None:
    out = tmp_path / "tuned"
    argv = ["tune", str(DATA / "sample-torch-cpu-mlp.npz"), "--framework", "pytorch",
            "--capacity", "12MiB", "-o", str(out), "--json"]
    for _ in range(2):      # a rerun replaces its own files
        status, stdout, _ = run_cli(argv, capsys)
        assert status == 0
    data = json.loads(stdout)
    assert data == json.loads((out / "tune.json").read_text())
    assert (out / "tune.png").read_bytes().startswith(b"\x89PNG")
    assert "allocsim tune" in (out / "report.html").read_text()
    results = json.loads((out / "tune-results.json").read_text())
    assert results["results"][0]["policy"] == "pytorch"      # the defaults, as a spec
    winner = [r for r in results["results"] if r["policy"] == results["winner"]]
    assert len(winner) == 1 and winner[0]["peak_reserved"] == (
        data["answer"]["setting"]["peak_reserved"])


@pytest.mark.skipif(not EOR.is_file(), reason=f"{EOR} not present")
def test_a_recorded_snapshot_is_rechecked_from_its_start_state() -> None:
    trace = formats.load(EOR)
    result = tune(trace, "pytorch", resolve_device(None, "160MiB"))
    evidence = result.evidence
    assert evidence.fidelity is not None and evidence.fidelity["total"] > 0
    assert result.best is not None
    if result.best.spec.startswith("pytorch"):
        assert evidence.recheck is not None
        # Seeded from the recorded segments, or told why not (expandable segments are one
        # kind and the recording's start segments the other).
        assert evidence.recheck["seeded_segments"] > 0 or evidence.recheck["notes"]
        assert evidence.recheck["completed"] == result.best.completed


@pytest.mark.parametrize("command", [
    "allocsim tune traces/data/sample-jax-cpu-train.npz --framework jax --capacity 32MiB",
    "allocsim tune default traces/data/sample-jax-cpu-train.npz --framework jax --capacity 2GiB",
])
def test_the_user_guide_shows_what_tune_prints(command: str, capsys, monkeypatch) -> None:
    """The user guide's worked examples are real output: rerun, they print the same."""
    import re
    guide = (REPO / "docs" / "user-guide.md").read_text()
    block = re.search(r"\$ " + re.escape(command) + r"\n(.*?)\n```", guide, flags=re.S)
    assert block, command
    monkeypatch.chdir(REPO)
    status, out, _ = run_cli(command.split()[1:], capsys)
    assert status == 0
    assert out.rstrip() == block.group(1).rstrip()


def test_a_threshold_grid_that_flips_twice_is_a_non_monotone_region() -> None:
    trace = Trace.from_events([(0, "alloc", 1, MiB), (1, "free", 1, 0)])
    pytorch = framework("pytorch")

    def evaluate(batch):
        return [_fake_result("threshold=0.6" in spec or "threshold=0.65" in spec
                             or "threshold=0.9" in spec) for spec, _ in batch]

    search = Search(trace, pytorch, resolve_device(None, "1GiB"), card=True,
                    max_slowdown=None, seed=0, evaluate=evaluate)
    base = pytorch.default()
    grid = search.run([base.with_values(per_process_memory_fraction=0.5,
                                        garbage_collection_threshold=t)
                       for t in (0.5, 0.55, 0.6, 0.65, 0.7, 0.9)], "threshold")
    search.threshold_region(base, grid)
    [region] = search.non_monotone
    assert region.key == "garbage_collection_threshold" and region.answer == 0.6
    assert len(region.exceptions) == 3
