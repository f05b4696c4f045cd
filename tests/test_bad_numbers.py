"""Numbers a user gets wrong, or that are simply huge: one error line (exit 2), never a crash."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from allocsim.errors import UserInputError
from allocsim.policies.units import format_size, parse_size
from allocsim.sim.cli.main import main
from allocsim.sim.kernel.device import PROFILES, DeviceProfile, SimulatedDevice

SMALL = "time_ns,op,id,size\n0,alloc,1,1048576\n10,free,1,\n"
HUGE = "time_ns,op,id,size\n0,alloc,1,9223372036854775807\n10,free,1,\n"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error_line(code: int, err: str, *needles: str) -> str:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("allocsim: error:"), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def small_trace(tmp_path: Path) -> Path:
    path = tmp_path / "small.csv"
    path.write_text(SMALL)
    return path


GOOD = {"name": "x", "capacity": 1 << 30}

BAD_PROFILES = {
    "granularity zero": ({**GOOD, "granularity": 0}, "granularity"),
    "granularity negative": ({**GOOD, "granularity": -512}, "granularity"),
    "granularity fractional": ({**GOOD, "granularity": 512.5}, "granularity"),
    "map granularity zero": ({**GOOD, "map_granularity": 0}, "map_granularity"),
    "capacity string": ({"name": "x", "capacity": "1GiB"}, "capacity"),
    "capacity negative": ({"name": "x", "capacity": -1}, "capacity"),
    "capacity zero": ({"name": "x", "capacity": 0}, "capacity"),
    "capacity float": ({"name": "x", "capacity": 1e9}, "capacity"),
    "capacity boolean": ({"name": "x", "capacity": True}, "capacity"),
    "capacity missing": ({"name": "x"}, "capacity"),
    "name missing": ({"capacity": 1 << 30}, "name"),
    "name not a string": ({"name": 3, "capacity": 1 << 30}, "name"),
    "unknown field": ({**GOOD, "capacty": 5}, "capacty"),
    "negative malloc cost": ({**GOOD, "costs": {"malloc_base_s": -1.0}}, "costs.malloc_base_s"),
    "negative slope": ({**GOOD, "costs": {"malloc_per_gib_s": -1e-3}}, "costs.malloc_per_gib_s"),
    "string cost": ({**GOOD, "costs": {"free_base_s": "14us"}}, "costs.free_base_s"),
    "null cost": ({**GOOD, "costs": {"unmap_base_s": None}}, "costs.unmap_base_s"),
    "unknown cost": ({**GOOD, "costs": {"malloc_s": 1.0}}, "costs.malloc_s"),
    "costs not an object": ({**GOOD, "costs": [1, 2]}, "costs"),
    "huge integer cost": ({**GOOD, "costs": {"map_base_s": 10**400}}, "costs.map_base_s"),
    "not an object": ([1, 2, 3], "JSON object"),
    # out of any device's range: every policy OOMed at 0 B, or the figures were nonsense
    "granularity 2^40": ({"name": "x", "capacity": 1 << 50, "granularity": 1 << 40},
                         "'granularity' must be at most 1.00GiB"),
    "map granularity 2^40": ({"name": "x", "capacity": 1 << 50, "map_granularity": 1 << 40},
                             "'map_granularity' must be at most 1.00GiB"),
    "granularity above the capacity": ({"name": "x", "capacity": 1 << 20,
                                        "granularity": 1 << 21}, "larger than the capacity"),
    "capacity 2^62": ({"name": "x", "capacity": 1 << 62}, "'capacity' must be at most"),
    "a call of a day": ({**GOOD, "costs": {"malloc_base_s": 86400}}, "from 0 to 3600"),
}


@pytest.mark.parametrize("case", sorted(BAD_PROFILES))
def test_a_bad_device_profile_is_one_error_line_naming_the_file_and_field(
        capsys, tmp_path: Path, small_trace: Path, case: str) -> None:
    data, field = BAD_PROFILES[case]
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(data))
    code, _, err = run(capsys, "compare", str(small_trace), "--device-profile", str(profile))
    assert_one_error_line(code, err, str(profile), field)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_costs_are_refused(capsys, tmp_path: Path, small_trace: Path,
                                      text: str) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text('{"name": "x", "capacity": 1073741824, "costs": {"free_base_s": '
                       + text + "}}")
    code, _, err = run(capsys, "compare", str(small_trace), "--device-profile", str(profile))
    assert_one_error_line(code, err, str(profile), "costs.free_base_s")


def test_a_device_profile_that_is_not_json_is_one_error_line(
        capsys, tmp_path: Path, small_trace: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text("{not json")
    code, _, err = run(capsys, "compare", str(small_trace), "--device-profile", str(profile))
    assert_one_error_line(code, err, str(profile))


def test_good_device_profiles_still_load(capsys, tmp_path: Path, small_trace: Path) -> None:
    # Every built-in profile round-trips through its own JSON form.
    for built_in in PROFILES.values():
        assert DeviceProfile.from_dict(json.loads(json.dumps(built_in.as_dict()))) == built_in
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({**GOOD, "granularity": 256, "map_granularity": 1 << 21,
                                   "costs": {"malloc_base_s": 0, "free_base_s": 1e-5,
                                             "source": "made up"},
                                   "source": "test"}))
    loaded = DeviceProfile.from_dict(json.loads(profile.read_text()))
    assert loaded.costs.malloc_base_s == 0.0 and loaded.costs.source == "made up"
    code, out, err = run(capsys, "compare", str(small_trace), "--device-profile", str(profile))
    assert code == 0, err
    assert "winner:" in out


def test_from_dict_raises_user_input_error_not_type_error() -> None:
    with pytest.raises(UserInputError, match="granularity"):
        DeviceProfile.from_dict({**GOOD, "granularity": 0})
    with pytest.raises(UserInputError, match="capacity"):
        DeviceProfile.from_dict({"name": "x", "capacity": "80GB"})


@pytest.mark.parametrize("body", ["", "0,alloc,1,0\n0,free,1,0\n"])
@pytest.mark.parametrize("output", [[], ["--json"]])
def test_min_capacity_of_a_trace_that_never_holds_a_byte_is_an_error(
        capsys, tmp_path: Path, body: str, output: list[str]) -> None:
    # Every capacity fits it: the old answer (one resolution step, exit 0) said nothing.
    empty = tmp_path / "empty.csv"
    empty.write_text("time_ns,op,id,size\n" + body)
    code, out, err = run(capsys, "min-capacity", str(empty), *output, "--resolution", "4MiB",
                         "--policies", "bfc", "cupy", "offline")
    assert_one_error_line(code, err, str(empty), "there is no minimum capacity to find")
    assert out == ""


def test_cupy_refuses_a_request_of_2_63_bytes_as_an_oom(capsys, tmp_path: Path) -> None:
    huge = tmp_path / "huge.csv"
    huge.write_text(HUGE)
    code, out, err = run(capsys, "compare", str(huge), "--policies", "cupy", "--json")
    assert code == 0, err
    assert "Traceback" not in err
    data = json.loads(out)
    (result,) = [r for r in data["results"] if r["policy"].startswith("cupy")]
    assert result["completed"] is False
    assert result["ooms"] == 1
    assert result["first_oom_event"] == 0


def test_cupy_with_a_limit_refuses_a_2_63_byte_request(capsys, tmp_path: Path) -> None:
    huge = tmp_path / "huge.csv"
    huge.write_text(HUGE)
    code, out, err = run(capsys, "compare", str(huge), "--policies", "cupy:limit=1GiB", "--json")
    assert code == 0, err
    (result,) = json.loads(out)["results"]
    assert result["ooms"] == 1 and result["device_mallocs"] == 0


def test_compare_on_a_huge_request_reads_sanely(capsys, tmp_path: Path) -> None:
    huge = tmp_path / "huge.csv"
    huge.write_text(HUGE)
    code, out, err = run(capsys, "compare", str(huge))
    assert code == 0, err
    assert "8.00EiB" in out
    assert "TiB" not in out
    # A refused cudaMalloc costs its fixed part, not minutes for 8 EiB of pages.
    code, out, err = run(capsys, "compare", str(huge), "--json")
    for result in json.loads(out)["results"]:
        assert result["alloc_time_s"] < 1.0, result


def test_a_refused_malloc_costs_only_the_fixed_part() -> None:
    profile = PROFILES["a100-80g"]
    view = SimulatedDevice(profile).view()
    assert view.reserve((1 << 63) - 1) is None
    assert math.isclose(view.cost_s, profile.costs.malloc_base_s)


@pytest.mark.parametrize(("nbytes", "text"), [
    (0, "0B"), (1023, "1023B"), (1536, "1.50KiB"), (1 << 30, "1.00GiB"),
    ((1 << 50) - 1, "1024.00TiB"),        # below 1 PiB: unchanged
    (1 << 50, "1.00PiB"), (3 << 55, "96.00PiB"), (1 << 60, "1.00EiB"),
    ((1 << 63) - 1, "8.00EiB"), (-(1 << 61), "-2.00EiB"), (1 << 70, "1024.00EiB"),
])
def test_format_size_goes_up_to_eib(nbytes: int, text: str) -> None:
    assert format_size(nbytes) == text


def test_sizes_in_pib_and_eib_parse_back() -> None:
    assert parse_size("1PiB") == 1 << 50
    assert parse_size("8EiB") == 1 << 63
    assert parse_size("2PB") == 2 * 1000**5
    assert parse_size(format_size(1 << 62)) == 1 << 62
