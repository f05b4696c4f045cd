"""Tests of the synthetic generators' compilation modes (eager, fused, remat), buffer donation,
functional optimizers, static shapes and the newer parameters (issue 7).
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from synth_checks import check_valid, columns_equal, live_bytes, tag_mask

from allocsim.traces.model import OP_ALLOC, Trace
from allocsim.traces.synth import generate, parse_params
from allocsim.traces.synth._common import StepProgram, TagTable
from allocsim.traces.synth.training import parameter_shapes as training_shapes
from allocsim.traces.synth.transformer import parameter_shapes as transformer_shapes

MODES = ["eager", "fused", "remat"]
PERSISTENT = ("param/", "optimizer/state/")


def is_weight_grad(tag: str) -> bool:
    return tag.startswith("backward/") and tag.endswith("/grad")


def activation_peak(trace: Trace) -> int:
    """Peak live bytes of per-step buffers other than weight gradients (activations & temps)."""
    other = np.array([t.startswith(PERSISTENT) or is_weight_grad(t) for t in trace.tags])
    signed = np.where(trace.op == OP_ALLOC, trace.size, -trace.size)
    return int(np.cumsum(np.where(other[trace.tag], 0, signed)).max())


def step_starts(trace: Trace, first_tag: str) -> np.ndarray:
    return np.flatnonzero(tag_mask(trace, first_tag) & (trace.op == OP_ALLOC))


# An activation-dominated model: the activations, not parameters + gradients, set the peak.
ACTIVATION_BOUND = {"layers": 4, "hidden": 256, "batch": 2048, "steps": 2}


@pytest.mark.parametrize("extra", [{}, {"dropout": 0.1}, {"separate_bias": True},
                                   {"dropout": 0.1, "separate_bias": True, "optimizer": "sgd"}])
def test_training_modes_order_peak_allocations_and_time(extra):
    traces = {m: generate("training", mode=m, **ACTIVATION_BOUND, **extra) for m in MODES}
    for trace in traces.values():
        check_valid(trace)
    peak = {m: int(live_bytes(t).max()) for m, t in traces.items()}
    allocs = {m: t.n_allocs for m, t in traces.items()}
    assert peak["remat"] < peak["fused"] < peak["eager"], peak
    assert allocs["fused"] < allocs["eager"] < allocs["remat"], allocs
    assert traces["remat"].duration_ns > traces["fused"].duration_ns
    # the forward's recompute shows up under its own tags
    assert any(t.startswith("recompute/layer0/") for t in traces["remat"].tags)
    assert not any(t.startswith("recompute/") for t in traces["eager"].tags)


def test_training_modes_at_default_sizes():
    traces = {m: generate("training", mode=m, steps=2) for m in MODES}
    act = {m: activation_peak(t) for m, t in traces.items()}
    assert act["remat"] < act["fused"] < act["eager"], act
    assert traces["fused"].n_allocs < traces["eager"].n_allocs < traces["remat"].n_allocs
    assert traces["remat"].duration_ns > traces["fused"].duration_ns
    # peaks never rise from eager to fused to remat
    peaks = [int(live_bytes(traces[m]).max()) for m in MODES]
    assert peaks[0] >= peaks[1] >= peaks[2]


def test_training_eager_is_the_default_and_the_bundled_trace_is_unchanged():
    from allocsim.traces.bundled import load_default_trace
    default = generate("training", seed=0)
    assert columns_equal(default, generate("training", seed=0, mode="eager", dropout=0.0,
                                           separate_bias=False, optimizer_mode="inplace"))
    assert default.equals(load_default_trace(), metadata=False)


def test_training_eager_intermediates_are_explicit():
    b, h, e = 64, 128, 4
    common = {"layers": 2, "hidden": h, "batch": b, "steps": 1, "dropout": 0.1,
              "separate_bias": True}
    eager = generate("training", mode="eager", **common)
    fused = generate("training", mode="fused", **common)

    def sizes(trace: Trace, tag: str) -> list[int]:
        if tag not in trace.tags:
            return []
        return sorted(trace.size[tag_mask(trace, tag) & (trace.op == OP_ALLOC)].tolist())

    # dropout masks: one byte per element, after GELU (b x 4h) and on the residual branch (b x h)
    assert sizes(eager, "forward/layer0/dropout_mask") == [b * h, b * 4 * h]
    assert sizes(fused, "forward/layer0/dropout_mask") == [b * h, b * 4 * h]
    # eager: fc1 out, bias-add out, GELU out, dropout out; fc2 out, bias-add out, dropout out
    assert sizes(eager, "forward/layer0/tmp") == [b * h * e] * 3 + [b * 4 * h * e]
    assert sizes(eager, "forward/layer0/act") == [b * h * e] * 2 + [b * 4 * h * e] * 3
    # fused: no intermediates; one kernel output feeds fc2 and is not saved
    assert sizes(fused, "forward/layer0/tmp") == []
    assert sizes(fused, "forward/layer0/fused") == [b * 4 * h * e]
    assert sizes(fused, "forward/layer0/act") == [b * h * e] * 2 + [b * 4 * h * e]


def test_remat_forward_keeps_only_each_blocks_input():
    layers, b, h, e = 5, 256, 128, 4
    trace = generate("training", mode="remat", layers=layers, hidden=h, batch=b, steps=2)
    check_valid(trace)
    live = live_bytes(trace)
    start = step_starts(trace, "data/input")[0]
    head = np.flatnonzero(tag_mask(trace, "forward/head/act") & (trace.op == OP_ALLOC))[0]
    # before the head: the batch, the labels and one checkpoint (block output) per block
    assert live[head - 1] - live[start - 1] == (layers + 1) * b * h * e + b * 8
    eager = generate("training", mode="eager", layers=layers, hidden=h, batch=b, steps=2)
    eager_head = np.flatnonzero(tag_mask(eager, "forward/head/act") & (eager.op == OP_ALLOC))[0]
    assert live_bytes(eager)[eager_head - 1] > live[head - 1] + layers * 8 * b * h * e


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_donation_lowers_the_peak_by_one_copy_of_params_and_state(optimizer):
    # A parameter-dominated model, so the optimizer step sets the peak.
    kw = {"layers": 2, "hidden": 512, "batch": 8, "classes": 100, "steps": 3,
          "optimizer": optimizer}
    copy_trace = generate("training", optimizer_mode="functional", **kw)
    donated = generate("training", optimizer_mode="functional", donate=True, **kw)
    inplace = generate("training", **kw)
    live = check_valid(copy_trace)
    check_valid(donated)
    assert columns_equal(donated, inplace)  # donated buffers are updated where they are

    shapes = training_shapes(2, 512, 100)
    e, n_state = 4, {"adam": 2, "sgd": 1}[optimizer]
    one_copy = (1 + n_state) * sum(shapes.values()) * e
    largest = max(shapes.values()) * e  # Adam's temporary, the gradients' last moments
    drop = int(live_bytes(copy_trace).max()) - int(live_bytes(donated).max())
    assert one_copy - largest <= drop <= one_copy, (drop, one_copy)

    # Each step frees the previous step's parameters and state: the baseline is unchanged
    # between steps, and what stays live is one set of parameters and state, new ids.
    lb = live_bytes(copy_trace)
    starts = step_starts(copy_trace, "data/input")
    assert np.all(lb[starts - 1] == lb[starts[0] - 1]) and lb[-1] == lb[starts[0] - 1]
    assert sum(live.values()) == one_copy
    assert not set(live) & set(copy_trace.id[:starts[0]].tolist())
    assert all(copy_trace.tags[t].startswith(PERSISTENT)
               for t in copy_trace.tag[np.isin(copy_trace.id, list(live))])
    # The new buffers are allocated while the old ones are live: in the optimizer phase the
    # live bytes exceed the baseline by parameters + state + gradients.
    grads = sum(shapes.values()) * e
    assert int(lb.max()) >= lb[starts[0] - 1] + one_copy + grads


def test_transformer_modes_order_peak_allocations_and_time():
    kw = {"layers": 3, "steps": 4, "seed": 2}
    traces = {m: generate("transformer", mode=m, **kw) for m in MODES}
    for trace in traces.values():
        check_valid(trace)
    assert (traces["remat"].metadata["seq_lens"] == traces["eager"].metadata["seq_lens"])
    peak = {m: int(live_bytes(t).max()) for m, t in traces.items()}
    allocs = {m: t.n_allocs for m, t in traces.items()}
    assert peak["remat"] < peak["fused"] < peak["eager"], peak
    assert allocs["fused"] < allocs["eager"] < allocs["remat"], allocs
    assert traces["remat"].duration_ns > traces["fused"].duration_ns


def test_transformer_donation_and_functional_optimizer():
    kw = {"layers": 2, "d_model": 256, "vocab": 20000, "batch": 1, "min_seq": 16,
          "max_seq": 64, "steps": 3}
    copy_trace = generate("transformer", optimizer_mode="functional", **kw)
    donated = generate("transformer", optimizer_mode="functional", donate=True, **kw)
    live = check_valid(copy_trace)
    assert columns_equal(donated, generate("transformer", **kw))
    shapes = transformer_shapes(2, 256, 20000, 64)
    one_copy = 3 * sum(shapes.values()) * 4
    drop = int(live_bytes(copy_trace).max()) - int(live_bytes(donated).max())
    assert one_copy - max(shapes.values()) * 4 <= drop <= one_copy, (drop, one_copy)
    assert sum(live.values()) == one_copy


def test_transformer_static_shapes_make_every_step_identical():
    kw = {"layers": 2, "min_seq": 16, "max_seq": 200, "steps": 6, "seed": 4}
    static = generate("transformer", static_shapes=True, **kw)
    dynamic = generate("transformer", **kw)
    check_valid(static)
    assert static.metadata["seq_lens"] == [200] * 6
    assert static.metadata["unpadded_seq_lens"] == dynamic.metadata["seq_lens"]
    assert len(set(dynamic.metadata["seq_lens"])) > 1

    def per_step_sizes(trace: Trace) -> list[bytes]:
        starts = [*step_starts(trace, "data/tokens"), len(trace)]
        return [trace.size[a:b].tobytes() for a, b in itertools.pairwise(starts)]

    assert len(set(per_step_sizes(static))) == 1
    assert len(set(per_step_sizes(dynamic))) > 1
    # padding to the longest length costs memory
    assert live_bytes(static).max() >= live_bytes(dynamic).max()
    # static shapes combine with the other new parameters
    for mode in MODES:
        check_valid(generate("transformer", static_shapes=True, mode=mode, layers=2, steps=2))


NEW_VARIANTS = [
    ("training", {"mode": "fused", "dropout": 0.2, "layers": 3, "hidden": 96, "batch": 33}),
    ("training", {"mode": "remat", "separate_bias": True, "optimizer": "sgd", "layers": 2}),
    ("training", {"mode": "remat", "dropout": 0.5, "optimizer_mode": "functional",
                  "dtype_bytes": 2, "layers": 2}),
    ("training", {"optimizer_mode": "functional", "donate": True, "mode": "fused"}),
    ("transformer", {"mode": "fused", "optimizer_mode": "functional", "layers": 2}),
    ("transformer", {"mode": "remat", "static_shapes": True, "seq_dist": "lognormal",
                     "layers": 2}),
]


@pytest.mark.parametrize("kind,params", NEW_VARIANTS)
def test_new_parameters_are_valid_deterministic_and_regenerable(kind, params):
    a = generate(kind, seed=3, events=4000, **params)
    check_valid(a)
    b = generate(kind, seed=3, events=4000, **params)
    assert columns_equal(a, b) and a.tags == b.tags and a.metadata == b.metadata
    assert not columns_equal(a, generate(kind, seed=4, events=4000, **params))
    meta = json.loads(json.dumps(a.metadata))
    for name, value in params.items():
        assert meta["params"][name] == value
    assert columns_equal(a, generate(kind, **meta["params"]))


def test_new_parameters_parse_from_strings():
    assert parse_params("training", ["mode=remat", "donate=true", "dropout=0.1",
                                     "separate_bias=yes", "optimizer_mode=functional"]) == {
        "mode": "remat", "donate": True, "dropout": 0.1, "separate_bias": True,
        "optimizer_mode": "functional"}
    assert parse_params("transformer", ["static_shapes=1", "mode=fused"]) == {
        "static_shapes": True, "mode": "fused"}
    a = generate("training", mode="fused", optimizer_mode="functional", donate="false", steps=2)
    b = generate("training", mode="fused", optimizer_mode="functional", donate=False, steps=2)
    assert columns_equal(a, b)


@pytest.mark.parametrize("kind,params", [
    ("training", {"mode": "jit"}),
    ("training", {"dropout": 1.0}),
    ("training", {"dropout": -0.1}),
    ("training", {"optimizer_mode": "lazy"}),
    ("training", {"donate": True}),  # donation needs a functional update
    ("transformer", {"mode": "flash"}),
    ("transformer", {"donate": True, "optimizer_mode": "inplace"}),
])
def test_new_parameters_reject_bad_values(kind, params):
    with pytest.raises(ValueError):
        generate(kind, **params)


def test_step_program_hands_buffers_on_to_the_next_step():
    tags = TagTable()
    p = StepProgram((), tags)
    old = p.inherit("param/w", 100)
    tmp = p.alloc("tmp", 7)
    new = p.alloc("param/w", 100)
    p.hand_on(old, new)
    p.free(tmp, old)
    p.require_closed()
    cols = p.render(np.ones((3, 1)), first_id=10, rng=np.random.default_rng(0),
                    initial_ids={old: 5})
    # the buffer step 0 inherits (id 5) is allocated before the program
    whole = Trace.from_columns(np.cumsum(np.r_[0, cols["gap_ns"]]), np.r_[OP_ALLOC, cols["op"]],
                               np.r_[5, cols["id"]], np.r_[100, cols["size"]],
                               tag=np.r_[tags("param/w"), cols["tag"]], tags=tags.names)
    live = check_valid(whole)
    assert live == {10 + 2 * p.n_slots + new: 100}
    # misuse of a step program is a bug in a generator, not a user's mistake
    with pytest.raises(RuntimeError):
        p.render(np.ones((1, 1)), first_id=10, rng=np.random.default_rng(0))  # no initial ids

    q = StepProgram((), tags)
    q_old = q.inherit("param/w", 100)
    with pytest.raises(RuntimeError):
        q.hand_on(q_old, q.alloc("param/w", 99))  # a successor must have the same size
    q.free(q_old)
    with pytest.raises(AssertionError):
        q.require_closed()  # the inherited slot was never handed on
