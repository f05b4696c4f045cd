"""min-capacity's shortcuts (issue 17): same answers as a replay per capacity, fewer replays."""

from __future__ import annotations

import pytest

from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.questions import capacity
from allocsim.traces.bundled import load_default_trace

GiB = 1 << 30


def _plain(monkeypatch: pytest.MonkeyPatch, trace, policy: str, device: DeviceProfile):
    """The answer with every capacity replayed (the shortcut disabled)."""
    real = capacity._generous_probe

    def no_shortcut(*args):
        probe = real(*args)
        return capacity._Probe(probe.completed, probe.peak_reserved, probe.peak_used, True)

    with monkeypatch.context() as patch:
        patch.setattr(capacity, "_generous_probe", no_shortcut)
        return capacity.min_capacity(trace, policy, device, resolution=4 << 20)


@pytest.mark.parametrize("policy", ["on-demand", "buddy", "bfc", "pytorch", "preallocate"])
def test_shortcut_gives_the_same_answer(monkeypatch: pytest.MonkeyPatch, policy: str) -> None:
    trace = load_default_trace()
    device = DeviceProfile("test", 80 * GiB)
    fast = capacity.min_capacity(trace, policy, device, resolution=4 << 20)
    plain = _plain(monkeypatch, trace, policy, device)
    assert (fast.min_capacity, fast.monotone, fast.exceptions) == (
        plain.min_capacity, plain.monotone, plain.exceptions)
    assert fast.evaluations <= plain.evaluations


def test_capacity_blind_policy_needs_few_replays() -> None:
    answer = capacity.min_capacity(load_default_trace(), "on-demand", DeviceProfile("t", 80 * GiB))
    assert answer.monotone and answer.evaluations <= 4


def test_probe_notices_capacity_reads() -> None:
    trace = load_default_trace()
    device = DeviceProfile("test", 80 * GiB)
    assert not capacity._generous_probe(trace, capacity.parse_policy("on-demand"),
                                        device).capacity_read
    assert capacity._generous_probe(trace, capacity.parse_policy("preallocate"),
                                    device).capacity_read
