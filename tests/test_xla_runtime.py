"""Issue 26 item 2: an XLA dump replayed as JAX's runtime hands it to the allocator.

The default view of every command that takes a dump: the parameters allocated as arrays before
the first execution; per execution the temp allocation(s) and each output allocation that no
donated parameter aliases, taken at the call (the temp freed at its end); a donated
parameter's buffer passes to the output aliasing it. Peak live is then ``argument + temp +
output - alias`` of ``compile().memory_analysis()``, exactly, for every module: held against the
figures jax gave when the committed dumps were made (tests/data/xla/{cpu,gpu}/
memory_analysis.json, by ``python tests/make_xla_dumps.py cpu gpu``) and, where jax (and for
XLA:GPU its CUDA plugin) is installed, against a fresh compile.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pytest
from xla_gpu_compiler import HAVE_CUDA_PLUGIN

from allocsim.sim.cli.main import main
from allocsim.traces import formats
from allocsim.traces.formats.xla.dump import list_modules
from allocsim.traces.model import OP_ALLOC, TraceError

DATA = Path(__file__).resolve().parent / "data" / "xla"
PLATFORMS = ("cpu", "gpu")
MODULES = ("jit_train_step", "jit_train_step_donated", "jit_update_cache",
           "jit_update_cache_donated", "jit_rnn_scan")
HAVE_JAX = importlib.util.find_spec("jax") is not None


def analysis(folder: Path) -> dict[str, dict[str, int]]:
    return json.loads((folder / "memory_analysis.json").read_text())["modules"]


def runtime_peak(m: dict[str, int]) -> int:
    return m["argument"] + m["temp"] + m["output"] - m["alias"]


def cli(*args: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main([str(a) for a in args])
        except SystemExit as exit_:
            status = int(exit_.code or 0)
    return status, out.getvalue(), err.getvalue()


def events(trace) -> list[tuple[str, int]]:
    return [("alloc" if op == OP_ALLOC else "free", int(size))
            for op, size in zip(trace.op, trace.size)]


# ============================================================== the peak is memory_analysis'
@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("steps", [1, 3])
def test_peak_live_is_memory_analysis_exactly(platform: str, module: str, steps: int) -> None:
    # One execution's peak is memory_analysis'; from the second on, the previous call's new
    # outputs are still held while the next runs (the loop rebinds them after it returns, as
    # the chip showed: tests/data/tpu/min-capacity), so the peak adds them once.
    folder = DATA / platform
    trace = formats.load(folder, module=module, steps=steps)
    m = analysis(folder)[module]
    want = runtime_peak(m) + (m["output"] - m["alias"] if steps > 1 else 0)
    assert trace.peak_live()[0] == want
    assert trace.metadata["xla"]["runtime"]["peak_bytes"] == runtime_peak(m)   # one execution's
    assert trace.metadata["xla"]["view"] == "runtime"
    assert trace.live_bytes()[-1] == 0  # everything freed at the end


def test_the_runtime_view_is_the_default_and_the_buffers_view_an_option() -> None:
    runtime = formats.load(DATA / "cpu", module="train_step")
    buffers = formats.load(DATA / "cpu", module="train_step", view="buffers")
    assert runtime.metadata["xla"]["view"] == "runtime"
    assert buffers.metadata["xla"]["view"] == "buffers"
    # The logical buffers are many; the runtime's blocks are the allocations.
    assert buffers.n_allocs > runtime.n_allocs


# ============================================================== hand-worked replays
def test_a_copy_update_allocates_its_output_per_execution_and_the_loop_rebinds_it() -> None:
    """jit_update_cache (no donation): parameters cache 2 MiB, new 32 KiB, index 4 B; no temp;
    one output of 2 MiB per execution, held through the next call and rebound when it
    returns."""
    trace = formats.load(DATA / "cpu", module="update_cache", steps=2)
    cache, new, index, out = 2097152, 32768, 4, 2097152
    assert events(trace) == [
        ("alloc", cache), ("alloc", new), ("alloc", index),       # the arrays, once
        ("alloc", out),                                           # execution 1's output
        ("alloc", out), ("free", out),                            # execution 2's, then rebound
        ("free", cache), ("free", new), ("free", index), ("free", out)]  # the end
    assert trace.peak_live()[0] == cache + new + index + 2 * out


def test_a_donated_update_takes_nothing_from_the_allocator_per_execution() -> None:
    """jit_update_cache_donated: the output aliases the donated cache; no temp: the 10
    executions ask nothing."""
    trace = formats.load(DATA / "cpu", module="update_cache_donated", steps=10)
    assert events(trace) == [("alloc", 2097152), ("alloc", 32768), ("alloc", 4),
                             ("free", 2097152), ("free", 32768), ("free", 4)]
    assert "[donated]" in trace.tag_name(int(trace.tag[0]))


def test_xla_gpu_asks_one_preallocated_temp_and_the_output_tuple_per_donated_step() -> None:
    """On XLA:GPU all temps are one preallocated-temp allocation; with every parameter
    donated, an execution takes it and the few-byte output tuple, and gives the temp back."""
    trace = formats.load(DATA / "gpu", module="train_step_donated", steps=2)
    m = analysis(DATA / "gpu")["jit_train_step_donated"]
    tuple_bytes = m["output"] - m["alias"]
    assert 0 < tuple_bytes < 1024
    parameters = trace.metadata["xla"]["runtime"]["parameters"]
    per_call = events(trace)[parameters:]
    assert per_call[:7] == [("alloc", m["temp"]), ("alloc", tuple_bytes), ("free", m["temp"]),
                            ("alloc", m["temp"]), ("alloc", tuple_bytes), ("free", m["temp"]),
                            ("free", tuple_bytes)]   # the first call's tuple, once rebound
    tags = [trace.tag_name(int(t)) for t in trace.tag[parameters:parameters + 2]]
    assert "preallocated temp" in tags[0] and "output" in tags[1]


def test_constants_stay_outside_the_allocator() -> None:
    """XLA:GPU holds constants as globals of the loaded module (gpu_executable.cc
    ResolveConstantGlobals), not from the allocator: reported, not allocated."""
    trace = formats.load(DATA / "cpu", module="rnn_scan")
    runtime = trace.metadata["xla"]["runtime"]
    assert runtime["constant_bytes_outside_allocator"] == trace.metadata["xla"]["constant_bytes"]
    assert runtime["constant_bytes_outside_allocator"] > 0
    assert trace.peak_live()[0] == runtime_peak(analysis(DATA / "cpu")["jit_rnn_scan"])


# ============================================================== the command line
def test_commands_replay_the_runtime_view_and_take_steps() -> None:
    status, out, err = cli("info", DATA / "gpu", "--module", "train_step", "--steps", "4")
    assert status == 0, err
    status, out_buffers, err = cli("info", DATA / "gpu", "--module", "train_step",
                                   "--xla-view", "buffers")
    assert status == 0, err
    assert out != out_buffers


def test_fidelity_reads_the_buffers_view_by_default() -> None:
    status, out, err = cli("fidelity", DATA / "gpu", "--module", "train_step", "--json")
    assert status == 0, err
    assert json.loads(out)["module"].endswith("jit_train_step")


@pytest.mark.parametrize("args, expect", [
    (("--steps", "0"), "steps must be a whole number of executions from 1"),
    (("--steps", "two"), "steps must be a whole number"),
    (("--steps", "2", "--xla-view", "buffers"), "applies to the runtime view only"),
])
def test_bad_steps_are_one_line(args: tuple[str, ...], expect: str) -> None:
    status, out, err = cli("info", DATA / "cpu", *args)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("allocsim: error: ") and expect in err, err


def test_a_bad_view_in_the_api_is_a_trace_error() -> None:
    with pytest.raises(TraceError, match="view 'logical' is not one of runtime, buffers"):
        formats.load(DATA / "cpu", view="logical")


# ============================================================== fresh compiles
@pytest.mark.skipif(not HAVE_JAX, reason="jax is not installed (pip install '.[jax]')")
def test_a_fresh_cpu_compile_matches_its_memory_analysis(tmp_path: Path) -> None:
    import make_xla_dumps

    folder = tmp_path / "cpu"
    make_xla_dumps.make(folder, "cpu")
    for module, m in analysis(folder).items():
        assert formats.load(folder, module=module).peak_live()[0] == runtime_peak(m), module


@pytest.mark.skipif(not HAVE_CUDA_PLUGIN,
                    reason="the CUDA plugin of jax is not installed (pip install '.[jax-gpu]': "
                           "~0.6 GB; compiles for a GPU without one)")
def test_a_fresh_gpu_compile_matches_its_memory_analysis(tmp_path: Path) -> None:
    import make_xla_dumps

    folder = tmp_path / "gpu"
    make_xla_dumps.make(folder, "gpu")
    modules = analysis(folder)
    assert set(modules) == set(MODULES)
    for module, m in modules.items():
        trace = formats.load(folder, module=module, steps=2)
        assert trace.peak_live()[0] == runtime_peak(m), module
        assert trace.metadata["xla"]["platform"] == "gpu"
        assert trace.metadata["xla"]["compute_capability"] == "9.0a"
    assert np.all(np.asarray([m["temp"] for m in modules.values()]) >= 0)


@pytest.mark.parametrize("module", ["jit_train_step", "jit_train_step_donated", "jit_rnn_scan"])
def test_min_capacity_under_jax_is_the_peak_over_its_fraction(module: str) -> None:
    """JAX's default preallocates 75% of the card as one BFC region: the smallest card holds
    the runtime view's peak in 0.75 of itself, up to BFC's rounding — each chunk to 256 bytes,
    and a free chunk under twice the request handed out whole (bfc_allocator.cc FindChunkPtr:
    split only when chunk >= 2 × rounded or the rest >= 128 MiB), which can waste up to the
    largest request at the region's end. No device share here (the fraction alone binds)."""
    from dataclasses import replace

    from allocsim.sim.kernel.device import PROFILES
    from allocsim.sim.questions.capacity.minimum import min_capacity
    trace = formats.load(DATA / "gpu", module=module, steps=3)
    peak = trace.peak_live()[0]
    resolution = 64 << 10
    device = replace(PROFILES["h100-80g"], context_bytes=0)
    answer = min_capacity(trace, "jax", device, resolution=resolution).min_capacity
    assert answer is not None
    rounding = 256 * trace.n_allocs + int(trace.size.max())
    assert peak / 0.75 <= answer <= (peak + rounding) / 0.75 + resolution


# ============================================================== several modules, no schedule
def test_a_dump_of_several_modules_without_a_schedule_is_one_line() -> None:
    """The runtime view replays one module's executions; a dump of several has no order of
    them, so reading "the largest" answered for one module of a job that runs several."""
    modules = [m.key for m in list_modules(DATA / "cpu")]
    assert len(modules) > 1
    for command in ("compare", "min-capacity"):
        status, out, err = cli(command, DATA / "cpu", "--policies", "bfc")
        assert status == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith(f"allocsim: error: {DATA / 'cpu'}: {len(modules)} modules")
        assert "--module NAME" in err and all(m in err for m in modules)
    with pytest.raises(TraceError, match="no schedule"):
        formats.load(DATA / "cpu")
    status, _, _ = cli("compare", DATA / "cpu", "--module", "rnn_scan", "--policies", "bfc")
    assert status == 0  # one module named: its executions
    assert formats.load(DATA / "cpu", view="buffers").name  # fidelity's view reads the largest


def test_info_of_several_modules_lists_them() -> None:
    status, out, err = cli("info", DATA / "cpu")
    assert status == 0, err
    holds = [line for line in out.splitlines() if line.strip().startswith("holds")]
    assert len(holds) == len(list_modules(DATA / "cpu"))
    assert "--module NAME" in out
    status, out, err = cli("info", DATA / "cpu", "--json")  # its JSON describes one trace
    assert status == 2 and out == "" and "--module NAME" in err and err.count("\n") == 1


def test_steps_past_the_generators_event_bound_are_refused_before_any_replay(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36.5: ``--steps 1000000`` of a module with 2,000 outputs asks for ~4e9 events and
    died in a MemoryError; the steps are held to the generators' bound (MAX_EVENTS), counted
    from the module before one event is made. Here the bound is lowered to what two steps of
    the committed module exceed."""
    from allocsim.traces.formats.xla import dump as xla_dump

    def no_replay(*args: object) -> None:
        raise AssertionError("replayed before the steps were checked")

    monkeypatch.setattr(xla_dump, "MAX_EVENTS", 10)
    monkeypatch.setattr(xla_dump, "replay_steps", no_replay)
    status, out, err = cli("info", DATA / "cpu", "--module", "jit_train_step", "--steps", "2")
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and "--steps 2" not in err, err
    assert "steps=2 asks for up to" in err and "at most 10 events" in err, err
