"""A device is a typed value: a named profile and what was overridden of it (capacity,
context), resolved once at the edge by one rule (``DeviceProfile.device_with``) — never a size
written into the name and split back out."""

from __future__ import annotations

from allocsim.sim.cli.common import device_from_args
from allocsim.sim.cli.main import build_parser
from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.sweeps.grid import parse_definition

GiB = 1 << 30


def usable(profile) -> int:
    """What the allocators may take: the capacity less the device's own share."""
    return profile.capacity - profile.context_bytes


def test_a_capacity_is_the_same_memory_on_the_command_line_and_in_a_sweep(tmp_path):
    # The docs (README "context", docs/models.md): --capacity SIZE is the allocators' memory,
    # with no context unless --context gives one. A sweep's capacities are the same option.
    args = build_parser().parse_args(["compare", "--device", "a100-80g", "--capacity", "24GiB"])
    command_line = device_from_args(args)
    sweep = parse_definition({"grid": {"traces": ["synth:random?events=50"],
                                       "policies": ["bfc"], "devices": ["a100-80g"],
                                       "capacities": ["24GiB"]}}, base_dir=tmp_path)
    in_sweep = sweep.cells()[0].profile
    assert usable(command_line) == usable(in_sweep) == 25_769_803_776
    assert command_line == in_sweep
    assert in_sweep.name == "a100-80g" and in_sweep.label == "a100-80g@24.00GiB"


def test_the_name_keeps_the_profile_and_the_label_shows_the_override():
    card = resolve_device("a100-80g")
    assert card.label == card.name == "a100-80g"
    smaller = card.device_with(24 * GiB)
    assert smaller.name == "a100-80g" and smaller.own_capacity == card.capacity
    assert smaller.label == "a100-80g@24.00GiB"
    assert smaller.as_dict()["name"] == "a100-80g@24.00GiB"   # documents show it as before
    assert "own_capacity" not in smaller.as_dict()


def test_one_context_rule():
    card = resolve_device("a100-80g")
    assert card.context_bytes == 512 << 20
    assert card.device_with(24 * GiB).context_bytes == 0                  # no context given: none
    assert card.device_with(24 * GiB, 1 << 20).context_bytes == 1 << 20   # given: that one
    assert card.device_with(None, 0).context_bytes == 0                   # --context alone
    assert card.device_with(None, 0).label == "a100-80g"                  # the size is its own
    assert card.device_with() == card
    # A trial card of this device (min-capacity, tune) passes its context on, by name.
    trial = card.device_with(24 * GiB, card.context_bytes)
    assert usable(trial) == 24 * GiB - (512 << 20)


def test_a_stored_label_reads_back_as_the_profile_it_names():
    from allocsim.sim.kernel.device_buffers import is_tpu
    from allocsim.sim.kernel.device_profile import DeviceProfile
    tpu = resolve_device("tpu-v5e").device_with(8 * GiB)
    again = DeviceProfile.from_dict(tpu.as_dict())
    assert again == tpu and is_tpu(again) and again.label == "tpu-v5e@8.00GiB"
    mine = DeviceProfile.from_dict({"name": "lab@card", "capacity": GiB})
    assert mine.name == mine.label == "lab@card" and mine.own_capacity is None


def test_the_command_line_parses_and_checks_a_capacity_once(monkeypatch):
    import allocsim.sim.cli.common as common
    import allocsim.sim.kernel.device_profile as profiles
    calls: list[tuple[str, object]] = []
    check, parse = profiles.check_capacity, profiles.parse_size

    def counted_check(nbytes, what="capacity"):
        calls.append(("check", nbytes))
        return check(nbytes, what)

    def counted_parse(value):
        calls.append(("parse", value))
        return parse(value)

    for module in (common, profiles):
        monkeypatch.setattr(module, "check_capacity", counted_check)
    monkeypatch.setattr(profiles, "parse_size", counted_parse)
    args = build_parser().parse_args(["compare", "--capacity", "24GiB", "--context", "1GiB"])
    device = device_from_args(args)
    assert calls == [("check", 24 * GiB)]      # parse_size_floor in capacity_option, then this
    assert (device.capacity, device.context_bytes, device.label) == (
        24 * GiB, GiB, "a100-80g@24.00GiB")
