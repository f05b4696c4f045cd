"""``allocsim explain-oom``: real shortage or fragmentation, and what would have completed
(allocsim.sim.questions.explain), on hand-made traces whose answer is worked out by hand."""

from __future__ import annotations

import argparse
import json
import pickle

import pytest

from allocsim.policies import parse_policy
from allocsim.sim.cli.explain import register
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.questions.explain import (
    FRAGMENTATION,
    LIMIT,
    REAL_SHORTAGE,
    NoOOMError,
    explain_oom,
    variant_specs,
    verdict,
)
from allocsim.sim.questions.fidelity.pytorch import simulate_snapshot
from allocsim.traces import bundled, formats, synth
from allocsim.traces.formats.torch_snapshot import read_snapshot
from allocsim.traces.model import Trace

MiB = 1 << 20


def device(capacity: int) -> DeviceProfile:
    return DeviceProfile("t", capacity, granularity=512)


def fragmenting() -> Trace:
    """Eight 8 MiB buffers, every other one freed, then 16 MiB.

    PyTorch default (hand-worked): 8 MiB < 10 MiB takes a 20 MiB segment; the second 8 MiB
    fits the 12 MiB remainder; so four 20 MiB segments (80 MiB), each [8 live][8 live][4].
    Freeing the odd buffers leaves [8 live][12 free] in each: 48 MiB cached, none of it
    releasable (every segment is split) and no 16 MiB hole. At 90 MiB the 16 MiB segment does
    not fit next to 80 MiB: OOM, with live 32 + 16 = 48 MiB ≤ 90 MiB — fragmentation.
    Expandable segments pack the eight buffers into 64 MiB of one range (80 MiB mapped in
    20 MiB pages); the last hole joins the 16 MiB mapped tail, so 16 MiB fits: it completes.
    """
    events = [(k * 1000, "alloc", k, 8 * MiB) for k in range(8)]
    events += [(10_000 + k, "free", k, None) for k in range(1, 8, 2)]
    events += [(20_000, "alloc", 100, 16 * MiB), (21_000, "free", 100, None)]
    return Trace.from_events(events, name="fragmenting")


def test_fragmentation_under_pytorch_default_and_expandable_segments_completes() -> None:
    e = explain_oom(fragmenting(), "pytorch", device(90 * MiB))
    assert e.verdict == FRAGMENTATION
    assert (e.event, e.request, e.stream) == (12, 16 * MiB, 0)
    assert e.live == 32 * MiB and e.reserved == 80 * MiB and e.in_use == 32 * MiB
    assert e.cached_free == 48 * MiB and e.largest_free_block == 12 * MiB
    assert e.device_free == 10 * MiB and e.segment_needed == 16 * MiB
    rows = {a.policy: a for a in e.alternatives}
    assert not rows["pytorch"].completed and rows["pytorch"].first_oom_event == 12
    expandable = rows["pytorch:expandable_segments=true"]
    assert expandable.completed and expandable.peak_reserved == 80 * MiB
    assert expandable.spare == 10 * MiB
    assert rows["offline"].completed and rows["offline"].peak_reserved == 64 * MiB
    assert not rows["pytorch:max_split_size_mb=128"].completed
    assert "external fragmentation" in e.reason
    text = e.text()
    assert "FRAGMENTATION" in text and "most to spare: pytorch:expandable_segments=true" in text
    assert text.count("\n") < 30
    assert json.loads(json.dumps(e.to_json_dict()))["verdict"] == FRAGMENTATION


def test_a_trace_that_needs_more_than_the_capacity_is_a_real_shortage() -> None:
    trace = Trace.from_events([(0, "alloc", 1, 40 * MiB), (1, "alloc", 2, 40 * MiB),
                               (2, "alloc", 3, 40 * MiB)], name="short")
    e = explain_oom(trace, "pytorch", device(100 * MiB))
    assert e.verdict == REAL_SHORTAGE
    assert (e.event, e.live, e.reserved, e.cached_free) == (2, 80 * MiB, 80 * MiB, 0)
    assert e.alternatives and not e.completing          # not even the offline plan
    assert "none of them completes" in e.text()


def test_a_policy_that_is_not_pytorch_is_compared_with_the_base_policies() -> None:
    names = [str(s) for s in variant_specs(parse_policy("bfc"))]
    assert names[0] == "bfc"
    assert {"pytorch", "pytorch:expandable_segments=true", "pytorch:max_split_size_mb=128",
            "pytorch:max_split_size_mb=512", "pytorch:roundup_power2_divisions=4",
            "best-fit"} <= set(names)
    assert names.count("bfc") == 1
    # A failing pytorch configuration keeps its own settings in every variant.
    tuned = [str(s) for s in variant_specs(parse_policy("pytorch:max_split_size_mb=64"))]
    assert "pytorch:max_split_size_mb=64,expandable_segments=true" in tuned
    assert "bfc" not in tuned


def test_no_oom_is_a_one_line_error() -> None:
    with pytest.raises(NoOOMError, match="does not run out of memory") as err:
        explain_oom(fragmenting(), "pytorch", device(1 << 30))
    assert "\n" not in str(err.value)


def test_a_snapshot_with_a_recorded_oom_explains_the_recorded_request() -> None:
    trace = synth.generate("random", seed=2)
    capacity = int(trace.peak_live()[0] * 1.05) // (2 * MiB) * (2 * MiB)
    snapshot = simulate_snapshot(trace, "pytorch", device(capacity))
    oom = next(e for e in snapshot["device_traces"][0] if e["action"] == "oom")
    recorded = read_snapshot(pickle.dumps(snapshot, protocol=4), "oom.pickle", "oom")
    e = explain_oom(recorded)
    assert e.capacity == capacity and e.request == oom["size"]
    assert e.device == "recorded" and e.recorded["device_free"] == oom["device_free"]
    assert e.reserved == e.recorded["reserved"]     # the seeded model is where PyTorch was
    assert e.device_free == oom["device_free"]
    assert e.verdict in (FRAGMENTATION, REAL_SHORTAGE)
    assert e.verdict == (REAL_SHORTAGE if e.live + e.request > capacity else FRAGMENTATION)
    assert e.alternatives[0].policy == "pytorch (as recorded)"
    assert any(a.policy == "offline" for a in e.alternatives)


def run_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="allocsim")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_the_command(tmp_path, capsys) -> None:
    path = tmp_path / "fragmenting.csv"
    formats.save(fragmenting(), str(path))
    assert run_command(["explain-oom", str(path), "--capacity", "90MiB"]) == 0
    assert "verdict: FRAGMENTATION" in capsys.readouterr().out
    assert run_command(["explain-oom", str(path), "--capacity", "90MiB", "--json",
                        "--max-split-sizes", "64"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == FRAGMENTATION
    assert [a["policy"] for a in data["alternatives"]][:2] == ["pytorch", "offline"]
    assert "pytorch:max_split_size_mb=64" in [a["policy"] for a in data["alternatives"]]


# -- a policy that may hold less than the card: JAX's pool, BFC's fraction ------------------
def test_memory_outside_the_policys_limit_is_never_counted_as_free() -> None:
    """Hand-worked: a 100 MiB card, a pool of 75 MiB (JAX's default share) all handed out as
    blocks holding 45 MiB of live data, a 10 MiB request. The 25 MiB outside the pool cannot
    be reached, so this is internal fragmentation (in use 75 > live 45), not external."""
    kind, reason = verdict(100 * MiB, 45 * MiB, 10 * MiB, in_use=75 * MiB, reserved=75 * MiB,
                           largest_free=0, limit=75 * MiB)
    assert kind == FRAGMENTATION and "internal fragmentation" in reason
    assert "25.00MiB outside the policy's limit not counted" in reason
    kind, _ = verdict(100 * MiB, 70 * MiB, 10 * MiB, in_use=70 * MiB, reserved=75 * MiB,
                      largest_free=5 * MiB, limit=75 * MiB)
    assert kind == LIMIT                    # 80 MiB fits the card, not the 75 MiB pool
    kind, _ = verdict(100 * MiB, 95 * MiB, 10 * MiB, in_use=95 * MiB, reserved=95 * MiB,
                      largest_free=0, limit=75 * MiB)
    assert kind == REAL_SHORTAGE


def test_jax_running_out_of_its_pool_is_a_limit_not_fragmentation() -> None:
    """The bundled JAX recording at 30 MiB under `jax`: the 21 MiB request fits the card with
    the live 3.8 MiB but not the 22.5 MiB pool (75%) — a larger fraction serves it."""
    trace = formats.load(bundled.bundled_path("sample-jax-cpu-train.npz"))
    e = explain_oom(trace, "jax", device(30 * MiB))
    assert e.allocator_limit == 30 * MiB * 3 // 4 // 256 * 256
    assert e.verdict == LIMIT and e.live + e.request <= 30 * MiB
    assert "policy's limit" in e.text()
    whole_card = explain_oom(trace, "bfc", device(24 * MiB))      # fraction 1: the card
    assert whole_card.allocator_limit is None
