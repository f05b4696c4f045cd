"""Tests of the synthetic workload generators (allocsim.traces.synth).

The validity checker here is deliberately independent of allocsim.traces.model's helpers: it
walks the events with a dict of live ids, so a bug shared by a generator and Trace.live_bytes
cannot hide.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.traces.model import COLUMN_DTYPES, OP_ALLOC, OP_FREE, Trace
from allocsim.traces.synth import GENERATORS, GeneratorInfo, generate, parse_params

KINDS = ["training", "transformer", "kvcache", "random"]


# ---------------------------------------------------------------------------- helpers
def check_valid(trace: Trace) -> dict[int, int]:
    """Assert the trace is a valid alloc/free sequence; return the ids live at the end -> size."""
    assert all(getattr(trace, c).dtype == d for c, d in COLUMN_DTYPES.items())
    assert np.all(np.diff(trace.time_ns) >= 0), "time goes backwards"
    assert np.all(trace.size > 0), "non-positive size"
    assert set(np.unique(trace.op).tolist()) <= {OP_ALLOC, OP_FREE}
    assert np.all((trace.tag >= 0) & (trace.tag < len(trace.tags))), "tag outside the table"
    live: dict[int, int] = {}
    seen: set[int] = set()
    for index, (op, ident, size) in enumerate(zip(trace.op.tolist(), trace.id.tolist(),
                                                   trace.size.tolist())):
        if op == OP_ALLOC:
            assert ident not in live, f"event {index}: alloc of live id {ident}"
            assert ident not in seen, f"event {index}: id {ident} reused"
            live[ident] = size
            seen.add(ident)
        else:
            assert ident in live, f"event {index}: free of id {ident} that is not live"
            assert live.pop(ident) == size, f"event {index}: free size differs from alloc"
    return live


def live_bytes(trace: Trace) -> np.ndarray:
    """Live bytes after each event, from the size column alone (frees carry their size)."""
    return np.cumsum(np.where(trace.op == OP_ALLOC, trace.size, -trace.size))


def tag_mask(trace: Trace, name: str) -> np.ndarray:
    return trace.tag == trace.tags.index(name)


def columns_equal(a: Trace, b: Trace) -> bool:
    return all(getattr(a, c).tobytes() == getattr(b, c).tobytes() for c in COLUMN_DTYPES)


# ---------------------------------------------------------------------------- registry
def test_registry_describes_every_generator():
    assert sorted(GENERATORS) == sorted(KINDS)
    for kind, info in GENERATORS.items():
        assert isinstance(info, GeneratorInfo) and info.name == kind
        assert info.description and "\n" not in info.description
        assert "seed" in info.params and "events" in info.params
        for name, (kind_type, default, help) in info.params.items():
            assert kind_type in (int, float, str, bool), (kind, name)
            assert help, (kind, name)
            assert default is None or isinstance(default, (kind_type, int)), (kind, name)


@pytest.mark.parametrize("kind", KINDS)
def test_defaults_generate_valid_traces(kind):
    trace = generate(kind)
    check_valid(trace)
    assert trace.metadata["name"] == f"synth-{kind}"
    assert trace.metadata["source"] == f"synth:{kind}"
    peak = int(live_bytes(trace).max())
    assert 200 * 2**20 <= peak <= 4 * 2**30, f"default peak {peak / 2**30:.2f} GiB"


def test_default_training_trace_is_a_small_realistic_model():
    trace = generate("training")
    assert 10_000 <= len(trace) <= 30_000
    assert 256 * 2**20 <= int(live_bytes(trace).max()) <= 4 * 2**30


# ---------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_trace_other_seed_differs(kind):
    a = generate(kind, seed=1, events=5000)
    b = generate(kind, seed=1, events=5000)
    c = generate(kind, seed=2, events=5000)
    assert columns_equal(a, b) and a.tags == b.tags and a.metadata == b.metadata
    assert not columns_equal(a, c)


@pytest.mark.parametrize("kind", KINDS)
def test_metadata_says_how_to_regenerate(kind):
    trace = generate(kind, seed=7, events=3000)
    meta = json.loads(json.dumps(trace.metadata))  # JSON-serialisable, and survives a round trip
    assert meta["params"]["seed"] == 7
    again = generate(kind, **meta["params"])
    assert columns_equal(trace, again)


# ---------------------------------------------------------------------------- validity / size
VARIANTS = [
    ("training", {"optimizer": "sgd", "layers": 3, "hidden": 96, "batch": 33, "steps": 3}),
    ("training", {"dtype_bytes": 2, "layers": 2, "classes": 10}),
    ("transformer", {"seq_dist": "bucketed", "bucket": 48, "steps": 4}),
    ("transformer", {"seq_dist": "lognormal", "min_seq": 1, "max_seq": 300, "steps": 4}),
    ("transformer", {"min_seq": 100, "max_seq": 100, "steps": 2}),
    ("kvcache", {"block_tokens": 1, "requests": 6, "max_output": 40}),
    ("kvcache", {"min_output": 1, "max_output": 3, "requests": 30, "max_concurrent": 4}),
    ("kvcache", {"load": 3.0, "requests": 20, "layers": 2}),
    ("random", {"size_dist": "uniform", "streams": 3, "events": 3000}),
    ("random", {"size_dist": "powers", "min_size": 1, "max_size": 4096, "events": 3000}),
    ("random", {"mean_lifetime": 50, "live": 200, "events": 3000}),
]


@pytest.mark.parametrize("kind,params", VARIANTS)
def test_variants_are_valid(kind, params):
    check_valid(generate(kind, **params))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("events", [1_000, 20_000, 200_000])
def test_events_parameter_is_honoured(kind, events):
    trace = generate(kind, events=events)
    assert abs(len(trace) - events) <= 0.2 * events, len(trace)
    if events <= 20_000:
        check_valid(trace)


@pytest.mark.parametrize("kind", KINDS)
def test_times_and_sizes_are_realistic(kind):
    trace = generate(kind, events=10_000)
    gaps = np.diff(trace.time_ns)
    assert gaps.min() >= 0
    assert 100 <= np.median(gaps) <= 1_000_000  # between 0.1 us and 1 ms
    assert gaps.max() < 1_000_000_000
    allocs = trace.size[trace.op == OP_ALLOC]
    assert np.all(allocs % 2 == 0)  # whole elements
    assert np.any(allocs % 512 != 0)  # real requests are not all aligned
    assert len(np.unique(allocs)) > 5


# ---------------------------------------------------------------------------- per workload
def test_training_returns_to_persistent_baseline_every_step():
    steps = 4
    trace = generate("training", layers=3, hidden=128, batch=64, steps=steps)
    live = live_bytes(trace)
    starts = np.flatnonzero(tag_mask(trace, "data/input") & (trace.op == OP_ALLOC))
    assert len(starts) == steps
    baseline = live[starts[0] - 1]
    # Before each step and at the end, exactly the parameters and optimizer state are live.
    assert np.all(live[starts - 1] == baseline)
    assert live[-1] == baseline
    assert np.all(live[starts[0]:] >= baseline)
    # ... and the live set is exactly the buffers allocated before the first step.
    assert set(check_valid(trace)) == set(trace.id[:starts[0]].tolist())
    # Adam: two state buffers per parameter; a step's events repeat exactly.
    n_params = int(np.sum(trace.op[:starts[0]] == OP_ALLOC)) // 3
    assert n_params == 6 * 3 + 2
    per_step = starts[1] - starts[0]
    first, second = slice(starts[0], starts[1]), slice(starts[1], starts[1] + per_step)
    assert np.array_equal(trace.size[first], trace.size[second])


def test_training_tags_name_phase_and_layer():
    trace = generate("training", layers=4, steps=1)
    for name in ("param/layer3", "forward/layer3/act", "backward/layer3/grad", "optimizer/tmp",
                 "optimizer/state/layer0"):
        assert name in trace.tags


def test_transformer_sizes_follow_sequence_length():
    batch, heads, d, e = 2, 4, 64, 2
    trace = generate("transformer", layers=2, d_model=d, heads=heads, batch=batch, vocab=1000,
                     min_seq=16, max_seq=256, steps=12, seed=3)
    seq = np.array(trace.metadata["seq_lens"])
    assert len(np.unique(seq)) > 3
    embed = trace.size[tag_mask(trace, "forward/embed/act") & (trace.op == OP_ALLOC)]
    scores = trace.size[tag_mask(trace, "forward/layer0/attn_scores") & (trace.op == OP_ALLOC)]
    assert np.array_equal(embed, batch * seq * d * e)  # proportional to tokens
    assert np.array_equal(scores, batch * heads * seq * seq * e)  # quadratic in seq_len


def test_transformer_bucketing_rounds_lengths():
    trace = generate("transformer", seq_dist="bucketed", bucket=64, min_seq=1, max_seq=512,
                     steps=30)
    seq = np.array(trace.metadata["seq_lens"])
    assert np.all(seq % 64 == 0) and seq.max() <= 512


def test_transformer_per_step_buffers_are_freed():
    trace = generate("transformer", steps=3, layers=2)
    live = check_valid(trace)
    tags = {trace.tags[t] for t in trace.tag[np.isin(trace.id, list(live))]}
    assert all(t.startswith(("param/", "optimizer/state/")) for t in tags)


def test_kvcache_buffers_grow_block_by_block():
    block, per_token = 8, 1024
    trace = generate("kvcache", block_tokens=block, bytes_per_token=per_token, layers=2,
                     requests=12, min_output=32, max_output=64)
    check_valid(trace)
    kv = np.isin(trace.tag, [trace.tags.index(t) for t in trace.tags if t.startswith("kv/")])
    assert np.all(trace.size[kv] % (block * per_token) == 0)
    # A growth is "alloc the bigger buffer, then free the old one" for the same layer.
    grow = np.flatnonzero(kv[:-1] & kv[1:] & (trace.op[:-1] == OP_ALLOC)
                          & (trace.op[1:] == OP_FREE) & (trace.tag[:-1] == trace.tag[1:]))
    assert len(grow) > 20
    assert np.all(trace.size[grow] - trace.size[grow + 1] == block * per_token)
    assert len(np.unique(trace.size[kv])) > 5


def test_kvcache_respects_concurrency_and_frees_finished_requests():
    trace = generate("kvcache", requests=40, max_concurrent=4, layers=1, max_output=64)
    live = check_valid(trace)
    # Everything finished: only the weights remain.
    still_live = trace.tag[np.isin(trace.id, list(live))]
    assert all(trace.tags[t].startswith("weights/") for t in still_live)
    kv = tag_mask(trace, "kv/layer0")
    running = np.cumsum(np.where(kv & (trace.op == OP_ALLOC), 1, 0)
                        - np.where(kv & (trace.op == OP_FREE), 1, 0))
    assert running.max() <= 4 + 1  # + 1: a growing cache briefly exists twice


def test_random_hovers_around_target_live_count():
    trace = generate("random", live=500, events=40_000, seed=5)
    count = np.cumsum(np.where(trace.op == OP_ALLOC, 1, -1))
    assert 400 <= count[5000:].mean() <= 600
    resident = generate("random", live=500, mean_lifetime=100, events=20_000)
    count = np.cumsum(np.where(resident.op == OP_ALLOC, 1, -1))
    assert 400 <= count[5000:].mean() <= 600


@pytest.mark.parametrize("dist", ["lognormal", "uniform", "powers"])
def test_random_sizes_stay_in_range(dist):
    trace = generate("random", size_dist=dist, min_size=1000, max_size=300_000, events=5000)
    assert trace.size.min() >= 1000 - 4 and trace.size.max() <= 300_000
    if dist == "powers":
        assert np.all(trace.size & (trace.size - 1) == 0)


# ---------------------------------------------------------------------------- errors / params
def test_unknown_kind_names_the_known_ones():
    with pytest.raises(ValueError, match="known kinds: kvcache, random, training, transformer"):
        generate("nope")
    with pytest.raises(ValueError, match="known kinds"):
        parse_params("nope", [])


def test_unknown_parameter_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown parameter 'depth'.*known parameters: .*layers"):
        generate("training", depth=3)
    with pytest.raises(ValueError, match="known parameters"):
        parse_params("kvcache", ["nope=1"])


@pytest.mark.parametrize("kind,params", [
    ("training", {"layers": 0}),
    ("training", {"optimizer": "lion"}),
    ("transformer", {"min_seq": 600, "max_seq": 500}),
    ("transformer", {"seq_dist": "zipf"}),
    ("kvcache", {"min_output": 9, "max_output": 8}),
    ("random", {"size_dist": "normal"}),
    ("random", {"mean_lifetime": 5000, "live": 10}),
    ("random", {"size_dist": "powers", "min_size": 300, "max_size": 400}),
])
def test_bad_values_raise_value_error(kind, params):
    with pytest.raises(ValueError):
        generate(kind, **params)


def test_parse_params_converts_declared_types():
    assert parse_params("kvcache", ["bytes_per_token=64MiB"]) == {"bytes_per_token": 64 << 20}
    assert parse_params("random", ["max_size=1GiB"])["max_size"] == 1 << 30
    assert parse_params("random", ["min_size=512KiB"])["min_size"] == 512 << 10
    assert parse_params("random", ["max_size=1.5GB"])["max_size"] == 1_500_000_000
    assert parse_params("random", ["max_size=1.5GiB"])["max_size"] == 3 << 29
    assert parse_params("random", ["min_size=4096"])["min_size"] == 4096
    assert parse_params("random", ["min_size=1_048_576"])["min_size"] == 1 << 20
    assert parse_params("training", ["events=1_000_000", "layers=24", "seed=3"]) == {
        "events": 1_000_000, "layers": 24, "seed": 3}
    assert parse_params("training", ["events=1e5"]) == {"events": 100_000}
    assert parse_params("kvcache", ["load=0.5"]) == {"load": 0.5}
    assert parse_params("transformer", ["seq_dist=bucketed", "events=none"]) == {
        "seq_dist": "bucketed", "events": None}
    assert parse_params("random", ["mean_lifetime=80"]) == {"mean_lifetime": 80.0}


@pytest.mark.parametrize("item", ["layers=64MiB", "layers=1.5", "max_size=0.3KiB",
                                  "max_size=12 parsecs", "layers", "=3", "load=fast"])
def test_parse_params_rejects_bad_values(item):
    kind = "random" if item.startswith("max_size") else (
        "kvcache" if item.startswith("load") else "training")
    with pytest.raises(ValueError):
        parse_params(kind, [item])


def test_generate_accepts_string_values():
    a = generate("random", events="2_000", max_size="1MiB")
    b = generate("random", events=2000, max_size=1 << 20)
    assert columns_equal(a, b)


# ---------------------------------------------------------------------------- properties / speed
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), concurrent=st.integers(1, 8), block=st.integers(1, 32),
       min_out=st.integers(1, 40), extra=st.integers(0, 80), layers=st.integers(1, 3))
def test_kvcache_valid_for_any_parameters(seed, concurrent, block, min_out, extra, layers):
    trace = generate("kvcache", seed=seed, requests=10, max_concurrent=concurrent,
                     block_tokens=block, min_output=min_out, max_output=min_out + extra,
                     layers=layers, min_prompt=1, max_prompt=100, d_model=64, vocab=100)
    check_valid(trace)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32), live=st.integers(1, 300), frac=st.floats(0.01, 1.0),
       dist=st.sampled_from(["lognormal", "uniform", "powers"]), events=st.integers(1, 3000))
def test_random_valid_for_any_parameters(seed, live, frac, dist, events):
    trace = generate("random", seed=seed, live=live, mean_lifetime=2 * live * frac,
                     size_dist=dist, events=events, min_size=2, max_size=10_000)
    assert len(trace) == events
    check_valid(trace)


@pytest.mark.parametrize("kind", KINDS)
def test_a_million_events_can_be_generated(kind):
    # Speed is measured by experiments/bench_replay.py, not asserted here.
    trace = generate(kind, events=1_000_000)
    assert len(trace) > 800_000


# ---------------------------------------------------------------------------- compilation modes,
# buffer donation and static shapes (issue 7)
from allocsim.traces.synth._common import StepProgram, TagTable  # noqa: E402
from allocsim.traces.synth.training import parameter_shapes as training_shapes  # noqa: E402
from allocsim.traces.synth.transformer import parameter_shapes as transformer_shapes  # noqa: E402

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
