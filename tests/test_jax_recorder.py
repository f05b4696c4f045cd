"""The JAX recorder (allocsim.traces.record.jax): what it records against what JAX holds
(jax.live_arrays()), donation, temp buffers, tags, and `allocsim record --framework jax`."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed: the JAX recorder needs it")
jnp = pytest.importorskip("jax.numpy")

import allocsim.traces.record  # noqa: E402
from allocsim.errors import UserInputError  # noqa: E402
from allocsim.sim.cli.main import main  # noqa: E402
from allocsim.traces.formats import load  # noqa: E402
from allocsim.traces.model import OP_ALLOC, OP_FREE  # noqa: E402
from allocsim.traces.record.jax_recorder import internals as jax_internals  # noqa: E402
from allocsim.traces.record.jax_recorder.recorder import PROLOGUE_TAG, active_recorder  # noqa: E402


def live_array_bytes() -> int:
    return sum(a.nbytes for a in jax.live_arrays())


def init_mlp(sizes=(32, 256, 256, 10)):
    key = jax.random.key(0)
    params = []
    for a, b in itertools.pairwise(sizes):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (a, b)) * 0.1, jnp.zeros(b)))
    return params


def loss(params, x, y):
    for w, b in params[:-1]:
        x = jnp.tanh(x @ w + b)
    w, b = params[-1]
    return jnp.mean((x @ w + b - y) ** 2)


def sgd(params, x, y):
    grads = jax.grad(loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)


def train(steps: int, donate: bool, check=None, given: list | None = None):
    """``given``: a list holding the initial parameters, emptied so that only the loop holds
    them (a caller's reference would keep the first step's inputs alive without donation)."""
    update = jax.jit(sgd, donate_argnums=(0,) if donate else ())
    params = given.pop() if given else init_mlp()
    x = jnp.ones((64, 32))
    y = np.ones((64, 10), np.float32)  # from the host every step
    for step in range(steps):
        params = update(params, x, y)
        if check is not None and step % 5 == 4:
            check(step)
    jax.block_until_ready(params)
    return params


def test_training_loop_live_bytes_match_live_arrays(tmp_path):
    out = tmp_path / "run.npz"
    samples = []
    with allocsim.traces.record.jax(out) as recorder:
        assert active_recorder() is recorder

        def check(step):
            samples.append((step, recorder.live_bytes(), live_array_bytes()))
        params = train(20, donate=True, check=check)
        at_exit = live_array_bytes()
    assert active_recorder() is None
    assert len(samples) == 4
    for step, recorded, expected in samples:
        assert recorded == expected, f"step {step}: recorded {recorded}, JAX holds {expected}"
    trace = load(out)
    assert int(trace.live_bytes()[-1]) == at_exit
    end = trace.metadata["end_check"]
    assert end["match"] and end["recorded_live_bytes"] == at_exit
    meta = trace.metadata
    assert meta["recorder"].startswith("allocsim JaxRecorder") and meta["jax"] == jax.__version__
    assert meta["platform"] == jax.devices()[0].platform
    tags = set(trace.tags)
    assert "jit(sgd)/sub" in tags  # the updated parameters, by the op that made them
    assert "jit(sgd)/argument" in tags  # y, sent from the host for each step
    del params


def test_donation_lowers_the_peak_by_about_the_parameters():
    # Parameters made before recording (initialisation's random-number temps would be the
    # peak otherwise): the peak is then the update step's, at its execution: inputs + temp
    # (+ the new parameters without donation; with it they take the donated buffers).
    peaks, temps, params_bytes = {}, {}, 0
    x, y = jnp.ones((64, 32)), np.ones((64, 10), np.float32)
    for donate in (False, True):
        given = [init_mlp()]
        params_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(given))
        step = jax.jit(sgd, donate_argnums=(0,) if donate else ())
        temps[donate] = step.lower(given[0], x, y).compile().memory_analysis() \
            .temp_size_in_bytes
        with allocsim.traces.record.jax(None) as recorder:
            params = train(6, donate=donate, given=given)
        peaks[donate] = recorder.trace.peak_live()[0]
        del params
    # XLA:CPU assigns the donated step a larger temp buffer, which eats part of the saving.
    saved = peaks[False] - peaks[True]
    assert saved == params_bytes + temps[False] - temps[True], (peaks, temps, params_bytes)
    assert saved > 0


def test_donated_parameters_keep_their_buffers():
    update = jax.jit(sgd, donate_argnums=(0,))
    with allocsim.traces.record.jax(None) as recorder:
        params = init_mlp()
        x, y = jnp.ones((64, 32)), jnp.ones((64, 10))
        for _ in range(3):
            params = update(params, x, y)
        jax.block_until_ready(params)
    trace = recorder.trace
    tags = np.array([trace.tag_name(t) or "" for t in trace.tag])
    # Outputs that alias a donated parameter allocate nothing: no alloc tagged with sgd's
    # parameter update ops, and no parameter freed at the calls.
    updates = (trace.op == OP_ALLOC) & np.char.startswith(tags.astype(str), "jit(sgd)/sub")
    assert not updates.any()
    del params


def test_temp_buffer_around_each_execution():
    f = jax.jit(lambda a: jnp.sin(a) @ jnp.cos(a).T)
    a = jnp.ones((128, 128))
    temp = f.lower(a).compile().memory_analysis().temp_size_in_bytes
    assert temp > 0
    with allocsim.traces.record.jax(None) as recorder:
        outs = [f(a) for _ in range(3)]
    trace = recorder.trace
    tag = trace.tags.index("jit(<lambda>)/temp")
    rows = np.flatnonzero(trace.tag == tag)
    assert len(rows) == 6
    assert (trace.size[rows] == temp).all()
    assert list(trace.op[rows]) == [OP_ALLOC, OP_FREE] * 3
    for alloc, free in zip(rows[::2], rows[1::2]):
        assert trace.id[alloc] == trace.id[free]
        between = trace.op[alloc + 1:free]
        assert list(between) == [OP_ALLOC]  # the output, while the temp is held
    del outs


def test_eager_ops_prologue_and_deletes():
    before = jnp.arange(100.0)  # allocated before recording
    with allocsim.traces.record.jax(None) as recorder:
        total = before + 1
        gone = jnp.zeros(50)
        gone.delete()
        del total
    trace = recorder.trace
    assert trace.tag_name(int(trace.tag[0])) == PROLOGUE_TAG and trace.size[0] == 400
    assert "add" in trace.tags  # eager ops are tagged with their primitive
    assert trace.metadata["end_check"]["match"]
    del before


def test_recording_restores_the_fast_path():
    from jax._src import pjit
    from jax._src.interpreters import pxla
    original = pjit._get_fastpath_data, pxla.ExecuteReplicated.__call__
    with allocsim.traces.record.jax(None):
        assert pjit._get_fastpath_data is not original[0]
    assert (pjit._get_fastpath_data, pxla.ExecuteReplicated.__call__) == original


def test_an_unsupported_jax_version_is_refused_in_one_line():
    with pytest.raises(UserInputError) as err:
        jax_internals.check_version("0.9.3")
    assert str(err.value) == ("jax 0.9 is not supported by the recorder (tested: "
                              f"{jax_internals.TESTED}.x)")
    jax_internals.check_version(jax.__version__)  # the installed one is


# ---------------------------------------------------------------------- the command line
SCRIPT = """
import sys
import jax.numpy as jnp
x = jnp.ones((256,))
y = x * 2
print("ran", sys.argv[1:])
{ending}
"""


def record(tmp_path, monkeypatch, ending: str, *args: str) -> int:
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text(SCRIPT.format(ending=ending))
    return main(["record", "--framework", "jax", "-o", "run.npz", *args, "--", "python",
                 "train.py", "--steps", "2"])


def test_record_framework_jax(tmp_path, monkeypatch, capsys):
    assert record(tmp_path, monkeypatch, "") == 0
    captured = capsys.readouterr()
    assert "ran ['--steps', '2']" in captured.out
    assert captured.err.startswith("wrote run.npz: ")
    trace = load(tmp_path / "run.npz")
    assert trace.metadata["script"] == "train.py" and 1024 in set(trace.size.tolist())


@pytest.mark.parametrize(("ending", "status"), [("sys.exit(3)", 3),
                                                 ("raise ValueError('boom')", 1)])
def test_a_failing_script_keeps_its_status_and_partial_trace(tmp_path, monkeypatch, capsys,
                                                             ending, status):
    assert record(tmp_path, monkeypatch, ending) == status
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("allocsim:")]
    assert len(ours) == 1 and "partial trace written to run.npz" in ours[0]
    assert f"status {status}" in ours[0]
    if status == 1:
        assert "ValueError: boom" in err and "jax/recorder.py" not in err
    assert len(load(tmp_path / "run.npz")) > 0


def test_record_without_jax_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "jax", None)  # not importable, installed or not
    assert record(tmp_path, monkeypatch, "") == 2
    captured = capsys.readouterr()
    assert captured.err == ("allocsim: error: record: JAX is not installed (pip install jax); "
                            "the JAX recorder hooks JAX's dispatch\n")
    assert "ran" not in captured.out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_record_jax_refuses_log(tmp_path, monkeypatch, capsys):
    assert record(tmp_path, monkeypatch, "", "--log", "x.jsonl") == 2
    assert "--log is for --framework cupy" in capsys.readouterr().err
