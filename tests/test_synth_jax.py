"""The generators' ``pattern=jax`` (issue 15): a jitted step hands its allocator the arguments,
ONE temp buffer (XLA's plan of the step's intermediates) and the outputs; donation aliases the
new parameters and state to the donated inputs. And the planner's core, traces/plan.py.

Numbers here are worked by hand (in the comments), or checked by a second route that shares no
code with the generator's (the eager trace's own events, planned by sim's plan_offline).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_synth import check_valid, columns_equal, live_bytes

from allocsim.sim.questions.offline import plan_offline
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace
from allocsim.traces.plan import best_gap, plan_lifetimes
from allocsim.traces.synth import generate, parse_params
from allocsim.traces.synth._common import StepProgram, TagTable
from allocsim.traces.synth.jit import render_jit, step_roles
from allocsim.traces.synth.training import parameter_shapes as training_shapes
from allocsim.traces.synth.transformer import parameter_shapes as transformer_shapes
from allocsim.traces.validate import validate

JAX = {"pattern": "jax", "optimizer_mode": "functional"}
TINY = {"layers": 1, "hidden": 8, "batch": 4, "classes": 3, "optimizer": "sgd", "steps": 3}


def allocs_mask(trace: Trace, prefix: str) -> np.ndarray:
    """The allocations whose tag starts with ``prefix``."""
    mine = np.array([t.startswith(prefix) for t in trace.tags])[trace.tag]
    return mine & (trace.op == OP_ALLOC)


def allocs(trace: Trace, prefix: str) -> np.ndarray:
    """Sizes of the allocations whose tag starts with ``prefix``."""
    return trace.size[allocs_mask(trace, prefix)]


# ---------------------------------------------------------------------------- the planner core
def test_plan_lifetimes_by_hand():
    # a 300 B over [1, 3), b 200 B over [2, 6), c 250 B over [4, 7). Largest first: a at 0;
    # c does not overlap a, so c at 0; b overlaps both, [0, 300) is taken: on top, at 300
    # rounded up to the alignment.
    starts, ends, sizes = np.array([1, 2, 4]), np.array([3, 6, 7]), np.array([300, 200, 250])
    offsets, heap = plan_lifetimes(starts, ends, sizes, 1)
    assert offsets.tolist() == [0, 300, 0] and heap == 500
    offsets, heap = plan_lifetimes(starts, ends, sizes, 64)
    assert offsets.tolist() == [0, 320, 0] and heap == 520
    offsets, heap = plan_lifetimes(starts, ends, sizes, 256)
    assert offsets.tolist() == [0, 512, 0] and heap == 712
    assert plan_lifetimes(np.zeros(0), np.zeros(0), np.zeros(0), 64)[1] == 0
    assert best_gap(np.array([0, 400]), np.array([100, 100]), 150) == 100
    with pytest.raises(ValueError):
        plan_lifetimes(starts, ends[:2], sizes)


def test_plan_offline_uses_the_core():
    trace = generate("training", layers=2, hidden=64, batch=16, steps=2)
    plan = plan_offline(trace, 256)
    offsets, heap = plan_lifetimes(plan.alloc_events, plan.free_events, plan.sizes, 256)
    assert np.array_equal(offsets, plan.offsets) and heap == plan.heap_size


# ---------------------------------------------------------------------------- a step by hand
def hand_program(tags: TagTable) -> tuple[StepProgram, dict[int, int]]:
    """Events: 0 x, 1 a, 2 b, 3 free a, 4 c, 5 loss, 6 free b, 7 free c, 8 new w, 9 free x,
    10 free old w: intermediates a, b, c with the lifetimes of test_plan_lifetimes_by_hand."""
    p = StepProgram((), tags)
    old_w = p.inherit("param/w", 1000)
    x = p.alloc("data/input", 100)
    a = p.alloc("act", 300)
    b = p.alloc("act", 200)
    p.free(a)
    c = p.alloc("act", 250)
    p.alloc("forward/loss/scalar", 4)
    p.free(b, c)
    p.hand_on(old_w, p.alloc("param/w", 1000))
    p.free(x, old_w)
    return p, {old_w: 0}


@pytest.mark.parametrize("alignment, temp", [(1, 500), (64, 520), (256, 712)])
@pytest.mark.parametrize("donate", [False, True])
def test_a_hand_written_step_compiles_to_arguments_one_temp_and_outputs(alignment, temp,
                                                                         donate):
    tags = TagTable()
    tags("param/w")
    p, initial = hand_program(tags)
    roles = step_roles(p.table())
    assert [len(roles[r]) for r in ("arguments", "loss", "state_in", "intermediates")] == \
        [1, 1, 1, 3]
    columns, meta = render_jit(p, np.ones((2, 1)), ["", ""], tags=tags, first_id=1,
                               rng=np.random.default_rng(0), initial_ids=initial,
                               donate=donate, temp_alignment=alignment)
    assert meta["executables"] == {"jit(step)": {"temp_bytes": temp, "steps": 2}}
    assert meta["compiles"] == 1
    names = [tags.names[t] for t in columns["tag"]]
    events = list(zip(columns["op"].tolist(), columns["size"].tolist(), names))
    A, F = OP_ALLOC, OP_FREE
    step0 = [(A, 100, "data/input"), (A, temp, "jit(step)/temp"), (A, 4, "jit(step)/output/loss")]
    if not donate:
        step0 += [(A, 1000, "jit(step)/output/param/w")]
    step0 += [(F, temp, "jit(step)/temp"), (F, 100, "data/input")]
    if not donate:
        step0 += [(F, 1000, "param/w")]   # the prologue's parameter, freed after the step
    step1 = [e for e in step0 if e != (F, 1000, "param/w")]
    if not donate:
        step1 += [(F, 1000, "jit(step)/output/param/w")]
    step1 += [(F, 4, "jit(step)/output/loss")]   # the previous step's loss
    assert events == step0 + step1
    whole = Trace.from_columns(np.cumsum(np.r_[0, columns["gap_ns"]]),
                               np.r_[OP_ALLOC, columns["op"]], np.r_[0, columns["id"]],
                               np.r_[1000, columns["size"]],
                               tag=np.r_[tags("param/w"), columns["tag"]], tags=tags.names)
    live = check_valid(whole)
    # what stays live: one parameter (donated: the original, id 0) and the last loss
    assert sorted(live.values()) == [4, 1000]
    assert (0 in live) == donate


# ---------------------------------------------------------------------------- training
def eager_step_temp(kind: str, kw: dict, alignment: int) -> int:
    """The second route to the temp size: the first step of the eager functional trace, whose
    intermediates are the buffers allocated and freed in the step other than the batch
    (``data/...``) and the loss, planned by sim's plan_offline over the trace's events."""
    trace = generate(kind, optimizer_mode="functional", **{**kw, "steps": 1})
    names = np.array(trace.tags, dtype=object)[trace.tag]
    special = np.array([n.startswith("data/") or n == "forward/loss/scalar" for n in names])
    in_step = np.arange(len(trace)) >= np.flatnonzero(special)[0]
    allocated = set(trace.id[in_step & (trace.op == OP_ALLOC)].tolist())
    freed = set(trace.id[trace.op == OP_FREE].tolist())
    inner = np.isin(trace.id, list(allocated & freed)) & ~special
    inner_trace = Trace.from_columns(trace.time_ns[inner], trace.op[inner], trace.id[inner],
                                     trace.size[inner])
    return plan_offline(inner_trace, alignment).heap_size


@pytest.mark.parametrize("mode", ["eager", "fused", "fused_elementwise", "remat"])
@pytest.mark.parametrize("alignment", [64, 256])
def test_training_temp_is_the_plan_of_the_steps_intermediates(mode, alignment):
    kw = {**TINY, "mode": mode}
    trace = generate("training", **JAX, temp_alignment=alignment, **kw)
    temps = allocs(trace, "jit(step)/temp")
    assert len(temps) == TINY["steps"] and len(set(temps.tolist())) == 1
    assert int(temps[0]) == eager_step_temp("training", kw, alignment)
    assert trace.metadata["jit"]["executables"]["jit(step)"]["temp_bytes"] == temps[0]
    assert trace.metadata["jit"]["compiles"] == 1


def test_training_tiny_temp_by_hand():
    # layers=1, hidden=8 (inner 32), batch=4, classes=3, sgd, fp32. The largest intermediates
    # are the two cuBLAS-style workspaces, max(1 MiB, k*n*e/8) + 4*m = 1,048,592 B each, which
    # never overlap each other: both go to offset 0, and whatever overlaps one goes above it,
    # from 1,048,640 (the next multiple of 64). Live beside the second workspace (fc1's
    # weight gradient): the LayerNorm output 4*8*4 = 128 and stats 4*2*4 = 32, the head's
    # weight gradients 3*8*4 = 96 and 3*4 = 12, the head's input gradient 128, fc2's weight
    # and bias gradients 32*8*4 = 1024 and 8*4 = 32, the fc1 output gradient 4*32*4 = 512:
    # 1,964 B, so the temp is at least 1,048,592 + 1,964. The plan's exact heap (1,051,724 B:
    # the decreasing-size order wastes 1,168 B over that) is checked by the second route.
    trace = generate("training", **JAX, **TINY)
    temp = int(allocs(trace, "jit(step)/temp")[0])
    assert temp >= 1_048_592 + 1_964
    assert temp == eager_step_temp("training", TINY, 64) == 1_051_724
    # against the eager functional step: one buffer instead of 36 intermediates
    assert trace.metadata["jit"]["intermediates_per_step"] == 36


def test_training_buffers_per_step_are_arguments_one_temp_and_the_outputs():
    # 1 layer: 6 parameters + the head's 2 = 8 parameters, sgd: 8 momentum buffers.
    n_params = 8
    undonated = generate("training", **JAX, **TINY)
    donated = generate("training", **JAX, donate=True, **TINY)
    prologue = 2 * n_params
    for trace, outputs in ((undonated, 1 + 2 * n_params), (donated, 1)):
        step_allocs = trace.n_allocs - prologue
        assert step_allocs == TINY["steps"] * (2 + 1 + outputs)   # batch + labels, temp, outputs
        assert len(allocs(trace, "jit(step)/temp")) == TINY["steps"]
        assert len(allocs(trace, "jit(step)/output/")) == TINY["steps"] * outputs
        assert trace.metadata["jit"]["outputs_per_step"] == outputs
    assert len(allocs(donated, "jit(step)/output/loss")) == TINY["steps"]
    assert len(allocs(undonated, "jit(step)/output/param/")) == TINY["steps"] * n_params


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_training_donation_saves_exactly_the_donated_bytes(optimizer):
    kw = {**TINY, "optimizer": optimizer, "layers": 2, "hidden": 64, "steps": 4}
    undonated = generate("training", **JAX, **kw)
    donated = generate("training", **JAX, donate=True, **kw)
    shapes = training_shapes(2, 64, 3)
    donated_bytes = (1 + {"adam": 2, "sgd": 1}[optimizer]) * sum(shapes.values()) * 4
    assert int(live_bytes(undonated).max()) - int(live_bytes(donated).max()) == donated_bytes
    # output-aliases-input, event for event: the donated step is the undonated one without the
    # new parameter/state buffers and the frees of the old ones; the temp is the same.
    names = np.array(undonated.tags, dtype=object)[undonated.tag]
    new_state = np.array([n.startswith(("jit(step)/output/param/",
                                        "jit(step)/output/optimizer/")) for n in names])
    old_state = (undonated.op == OP_FREE) & np.array(
        [n.startswith(("param/", "optimizer/state/")) for n in names])
    keep = ~new_state & ~old_state

    def events(trace: Trace, mask: np.ndarray) -> list[tuple[int, int, str]]:
        return [(int(o), int(s), trace.tags[t]) for o, s, t in
                zip(trace.op[mask], trace.size[mask], trace.tag[mask])]

    assert events(undonated, keep) == events(donated, np.ones(len(donated), dtype=bool))
    # donated: the prologue's buffers carry every step's new values, and stay live to the end
    n_state = {"adam": 3, "sgd": 2}[optimizer] * len(shapes)
    last_loss = int(donated.id[allocs_mask(donated, "jit(step)/output/loss")][-1])
    assert set(check_valid(donated)) == set(range(n_state)) | {last_loss}


def test_training_eager_donation_is_the_inplace_trace_but_jax_donation_is_not():
    # pattern=eager builds donation in (the in-place trace); pattern=jax derives it.
    kw = {**TINY, "optimizer_mode": "functional"}
    assert columns_equal(generate("training", donate=True, **kw),
                         generate("training", **{**kw, "optimizer_mode": "inplace"}))
    jax_donated = generate("training", pattern="jax", donate=True, **kw)
    assert not any(t.startswith("optimizer/tmp") for t in
                   np.array(jax_donated.tags)[jax_donated.tag])   # inside the temp


def test_training_jax_traces_are_valid_and_deterministic():
    for extra in ({}, {"donate": True}, {"mode": "remat", "dropout": 0.1},
                  {"mode": "fused", "optimizer": "adam", "dtype_bytes": 2}):
        a = generate("training", seed=5, **JAX, **{**TINY, **extra})
        validate(a, strict=True)
        check_valid(a)
        b = generate("training", seed=5, **JAX, **{**TINY, **extra})
        assert columns_equal(a, b) and a.tags == b.tags and a.metadata == b.metadata
        meta = json.loads(json.dumps(a.metadata))
        assert meta["params"]["pattern"] == "jax"
        assert columns_equal(a, generate("training", **meta["params"]))
        assert not columns_equal(a, generate("training", seed=6, **JAX, **{**TINY, **extra}))


def test_training_jax_persistent_state_is_all_that_stays_live():
    trace = generate("training", **JAX, **TINY)
    live = check_valid(trace)
    tags = {trace.tags[t] for t in trace.tag[np.isin(trace.id, list(live))]}
    assert tags == {"jit(step)/output/param/layer0", "jit(step)/output/param/head",
                    "jit(step)/output/optimizer/state/layer0",
                    "jit(step)/output/optimizer/state/head", "jit(step)/output/loss"}
    shapes = training_shapes(1, 8, 3)
    assert sum(live.values()) == 2 * sum(shapes.values()) * 4 + 4


def test_training_events_parameter_counts_compiled_steps():
    trace = generate("training", **JAX, donate=True, events=8_000)
    assert abs(len(trace) - 8_000) <= 0.2 * 8_000
    # 74 parameters, Adam: 222 prologue buffers; a donated step: batch, labels, temp, loss
    # allocated, then temp, batch, labels and the previous loss freed (none before step 0)
    assert len(trace) == 222 + 8 * trace.metadata["params"]["steps"] - 1


# ---------------------------------------------------------------------------- transformer
SMALL_T = {"layers": 1, "d_model": 32, "heads": 2, "vocab": 50, "batch": 2}


def test_transformer_recompiles_once_per_sequence_length():
    trace = generate("transformer", **JAX, **SMALL_T, min_seq=8, max_seq=64,
                     seq_dist="bucketed", bucket=16, steps=12, seed=1)
    seq = trace.metadata["seq_lens"]
    jit = trace.metadata["jit"]
    assert 1 < len(set(seq)) < 12 and jit["compiles"] == len(set(seq))
    assert set(jit["executables"]) == {f"jit(step)[seq={n}]" for n in seq}
    assert sum(e["steps"] for e in jit["executables"].values()) == 12
    # each step runs its shape's executable: one temp per step, tagged by executable, the
    # same size for the same shape, larger for a longer sequence
    temps = [(trace.tags[t], int(s)) for t, s, o in zip(trace.tag, trace.size, trace.op)
             if trace.tags[t].endswith("/temp") and o == OP_ALLOC]
    assert [t for t, _ in temps] == [f"jit(step)[seq={n}]/temp" for n in seq]
    size_of = {n: jit["executables"][f"jit(step)[seq={n}]"]["temp_bytes"] for n in set(seq)}
    assert [s for _, s in temps] == [size_of[n] for n in seq]
    ordered = [size_of[n] for n in sorted(size_of)]
    assert ordered == sorted(ordered) and len(set(ordered)) == len(ordered)
    static = generate("transformer", **JAX, **SMALL_T, min_seq=8, max_seq=64, steps=5,
                      static_shapes=True)
    assert static.metadata["jit"]["compiles"] == 1
    assert list(static.metadata["jit"]["executables"]) == ["jit(step)[seq=64]"]


def test_transformer_temp_covers_the_intermediates_and_donation_saves_the_state():
    kw = {**SMALL_T, "min_seq": 16, "max_seq": 16, "steps": 3}
    undonated = generate("transformer", **JAX, **kw)
    donated = generate("transformer", **JAX, donate=True, **kw)
    for trace in (undonated, donated):
        validate(trace, strict=True)
        check_valid(trace)
    temps = allocs(donated, "jit(step)[seq=16]/temp")
    assert np.array_equal(temps, allocs(undonated, "jit(step)[seq=16]/temp"))
    assert int(temps[0]) == eager_step_temp("transformer", kw, 64)
    shapes = transformer_shapes(1, 32, 50, 16)
    assert int(live_bytes(undonated).max()) - int(live_bytes(donated).max()) == \
        3 * sum(shapes.values()) * 4


# ---------------------------------------------------------------------------- parameters
def test_pattern_parameters_parse_validate_and_leave_eager_alone():
    assert parse_params("training", ["pattern=jax", "temp_alignment=256"]) == {
        "pattern": "jax", "temp_alignment": 256}
    for kind in ("training", "transformer"):
        with pytest.raises(ValueError, match="optimizer_mode=functional"):
            generate(kind, pattern="jax", steps=1)
        with pytest.raises(ValueError):
            generate(kind, pattern="xla", steps=1)
        with pytest.raises(ValueError):
            generate(kind, temp_alignment=0, steps=1)
        # eager is the default, and its metadata does not gain the new parameters
        default = generate(kind, steps=2)
        assert columns_equal(default, generate(kind, steps=2, pattern="eager"))
        assert "pattern" not in default.metadata["params"] and "jit" not in default.metadata


@pytest.mark.parametrize("kind, kw", [
    ("training", {"layers": 4, "hidden": 256, "batch": 2048, "steps": 2}),
    ("training", {"steps": 2, "dropout": 0.1, "separate_bias": True}),
    ("transformer", {"layers": 3, "steps": 4, "seed": 2}),
])
def test_fused_elementwise_is_fusion_alone(kind, kw):
    # fusion removes temporaries, not saved activations: fused_elementwise allocates less than
    # eager and takes less time, and its peak is eager's; fused's lower peak is recompute.
    traces = {m: generate(kind, mode=m, **kw) for m in ("eager", "fused", "fused_elementwise")}
    for trace in traces.values():
        check_valid(trace)
    peak = {m: int(live_bytes(t).max()) for m, t in traces.items()}
    assert peak["fused_elementwise"] == peak["eager"]
    assert peak["fused"] <= peak["eager"]
    assert traces["fused_elementwise"].n_allocs < traces["eager"].n_allocs
    assert traces["fused_elementwise"].duration_ns < traces["fused"].duration_ns
    assert not any(t.endswith(("/fused", "/recompute")) or t.startswith("recompute/")
                   for t in traces["fused_elementwise"].tags)
