"""Synthetic traces streamed to an .npz block by block (traces/synth/rendering.py,
traces/formats/native/npz_stream.py) are the traces the in-memory generator makes."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from allocsim.errors import UserInputError
from allocsim.sim.cli import main
from allocsim.traces import formats, synth
from allocsim.traces.formats.native.npz_stream import save_npz_blocks
from allocsim.traces.model import COLUMN_DTYPES, Trace, TraceError

CASES = [
    ("training", {}),
    ("training", {"optimizer": "sgd", "mode": "remat"}),
    # inherited ids: each step frees the parameters the step before handed on
    ("training", {"optimizer_mode": "functional", "layers": 2}),
    ("transformer", {}),
    ("transformer", {"optimizer_mode": "functional", "seq_dist": "lognormal"}),
    ("transformer", {"static_shapes": True, "mode": "fused"}),
]


def assert_same_trace(a: Trace, b: Trace) -> None:
    assert len(a) == len(b)
    for name in COLUMN_DTYPES:
        left, right = a.column(name), b.column(name)
        assert left.dtype == right.dtype, name      # held the same way after loading
        assert np.array_equal(left, right), name
    assert a.tags == b.tags
    assert json.dumps(a.metadata) == json.dumps(b.metadata)  # keys in the same order too


@pytest.mark.parametrize(("kind", "params"), CASES)
@pytest.mark.parametrize("block_events", [1, 10_000, 1 << 21])
def test_a_streamed_trace_loads_as_the_generated_one(tmp_path, kind, params, block_events):
    # block_events=1 renders one step at a time; 1 << 21 renders each part whole.
    whole, streamed = tmp_path / "whole.npz", tmp_path / "streamed.npz"
    generated = synth.generate(kind, seed=3, events=200_000, **params)
    formats.save(generated, whole)
    plan = synth.plan(kind, seed=3, events=200_000, **params)
    assert isinstance(plan, synth.SynthPlan)
    assert plan.n_events == len(generated)
    facts = synth.save_streamed(plan, streamed, block_events=block_events)
    assert facts.events == len(generated)
    assert facts.peak_live == generated.peak_live()[0]
    assert_same_trace(formats.load(whole), formats.load(streamed))


def test_the_streamed_file_is_an_npz_numpy_and_zipfile_read_as_write_npz_s(tmp_path):
    whole, streamed = tmp_path / "whole.npz", tmp_path / "streamed.npz"
    formats.save(synth.generate("transformer", events=20_000), whole)
    synth.save_streamed(synth.plan("transformer", events=20_000), streamed, block_events=5000)
    with zipfile.ZipFile(streamed) as archive:
        assert archive.testzip() is None                      # every member's CRC
        with zipfile.ZipFile(whole) as reference:
            assert archive.namelist() == reference.namelist()
    with np.load(whole) as a, np.load(streamed) as b:
        for key in a.files:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
    # the same plan gives the same bytes (fixed time stamps)
    again = tmp_path / "again.npz"
    synth.save_streamed(synth.plan("transformer", events=20_000), again, block_events=7000)
    assert again.read_bytes() == streamed.read_bytes()


def test_blocks_that_do_not_add_up_are_refused_and_leave_nothing(tmp_path):
    target = tmp_path / "short.npz"
    blocks = [{"time_ns": np.arange(3), "op": np.zeros(3), "id": np.arange(3),
               "size": np.ones(3)}]
    with pytest.raises(TraceError, match="the blocks hold 3 events, not the 4 announced"):
        save_npz_blocks(target, 4, blocks, tags=[], metadata={})
    with pytest.raises(TraceError, match="more than the 2 events announced"):
        save_npz_blocks(target, 2, blocks, tags=[], metadata={})
    assert list(tmp_path.iterdir()) == []


def test_plan_renders_nothing_and_streams_past_the_in_memory_limit():
    plan = synth.plan("training", events=500_000_000)
    assert isinstance(plan, synth.SynthPlan)
    assert abs(plan.n_events - 500_000_000) < 1000
    with pytest.raises(UserInputError, match=r"a generated trace holds at most 100,000,000 in "
                                             r"memory .* streams up to 10,000,000,000"):
        synth.generate("training", events=500_000_000)
    with pytest.raises(UserInputError, match="holds at most 10,000,000,000"):
        synth.plan("transformer", events=10**11)
    # kinds (and patterns) rendered whole keep the in-memory limit, and come back as traces
    with pytest.raises(UserInputError, match="holds at most 100,000,000"):
        synth.plan("kvcache", events=500_000_000)
    assert isinstance(synth.plan("random", events=1000), Trace)
    jitted = synth.plan("training", layers=2, steps=2, optimizer_mode="functional",
                        pattern="jax")
    assert isinstance(jitted, Trace) and "jit" in jitted.metadata


def test_gen_streams_a_large_npz(capsys, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(synth, "STREAM_ABOVE_EVENTS", 20_000)
    streamed, small = tmp_path / "t.npz", tmp_path / "small.npz"
    assert main(["gen", "transformer", "events=30000", "seed=2", "-o", str(streamed)]) == 0
    assert "(streamed)" in capsys.readouterr().out
    assert main(["gen", "transformer", "steps=2", "-o", str(small)]) == 0
    assert "(streamed)" not in capsys.readouterr().out
    reference = synth.generate("transformer", seed=2, events=30000)
    assert_same_trace(formats.load(streamed), _saved(reference, tmp_path))


def _saved(trace: Trace, folder: Path) -> Trace:
    path = folder / "reference.npz"
    formats.save(trace, path)
    return formats.load(path)


def test_gen_says_how_to_read_a_file_past_the_input_limit(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ALLOCSIM_MAX_INPUT_BYTES", "100000")
    assert main(["gen", "training", "layers=2", "steps=40", "-o", str(tmp_path / "t.npz")]) == 0
    assert "ALLOCSIM_MAX_INPUT_BYTES=" in capsys.readouterr().out
