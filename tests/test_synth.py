"""Tests of the synthetic workload generators (allocsim.traces.synth).

The validity checker (tests/synth_checks.py) is deliberately independent of
allocsim.traces.model's helpers. The compilation modes, donation and static shapes are
tests/test_synth_modes.py's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth_checks import check_valid, columns_equal, live_bytes, tag_mask

from allocsim.traces.model import OP_ALLOC, OP_FREE
from allocsim.traces.synth import GENERATORS, GeneratorInfo, generate, parse_params

KINDS = ["training", "transformer", "kvcache", "random"]


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
    # Speed is measured by benchmarks/replay.py, not asserted here.
    trace = generate(kind, events=1_000_000)
    assert len(trace) > 800_000
