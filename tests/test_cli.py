"""The allocsim command: outputs people read, JSON that CI parses, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocsim.sim.cli import main
from allocsim.traces import formats

RESULT_KEYS = {"policy", "completed", "peak_allocated", "peak_reserved", "utilization",
               "fragmentation", "ooms", "first_oom_event", "device_mallocs", "device_frees",
               "alloc_time_s"}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture()
def small_trace(tmp_path: Path) -> Path:
    path = tmp_path / "small.csv"
    path.write_text("time_ns,op,id,size\n0,alloc,1,1048576\n10000000,alloc,2,4096\n"
                    "20000000,free,1,\n30000000,alloc,3,3000000\n40000000,free,2,\n"
                    "50000000,free,3,\n")
    return path


def test_compare_with_no_arguments_runs_the_bundled_training_trace(capsys) -> None:
    code, out, _ = run(capsys, "compare")
    assert code == 0
    assert "default-training" in out and "winner:" in out
    for policy in ("on-demand", "preallocate", "best-fit", "bfc"):
        assert policy in out


def test_compare_json_follows_the_documented_schema(capsys, small_trace: Path) -> None:
    code, out, _ = run(capsys, "compare", str(small_trace), "--json", "--capacity", "1GiB")
    data = json.loads(out)
    assert code == 0
    assert set(data) >= {"trace", "device", "results", "winner", "reason"}
    assert data["device"]["capacity"] == 1 << 30
    assert data["trace"]["events"] == 6 and data["trace"]["peak_live"] == 3000000 + 4096
    assert all(RESULT_KEYS <= set(result) for result in data["results"])
    assert data["winner"] in [r["policy"] for r in data["results"]]


def test_compare_json_of_several_traces_is_an_array(capsys, small_trace: Path) -> None:
    code, out, _ = run(capsys, "compare", str(small_trace), str(small_trace), "--json",
                       "--policies", "bfc", "on-demand")
    data = json.loads(out)
    assert code == 0 and isinstance(data, list) and len(data) == 2
    assert [r["policy"] for r in data[0]["results"]] == ["bfc", "on-demand"]


def test_compare_out_writes_results_and_figures(capsys, small_trace: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    code, _, _ = run(capsys, "compare", str(small_trace), "--out", str(out_dir), "--figures")
    assert code == 0
    for name in ("results.json", "memory_timeline.png", "peaks.png", "fragmentation.png"):
        assert (out_dir / name).stat().st_size > 0
    data = json.loads((out_dir / "results.json").read_text())
    assert "timeline" in data["results"][0]
    assert (out_dir / "peaks.png").read_bytes()[:4] == b"\x89PNG"


def test_a_capacity_too_small_makes_every_policy_fail_and_no_winner(capsys,
                                                                   small_trace: Path) -> None:
    code, out, _ = run(capsys, "compare", str(small_trace), "--capacity", "2MiB", "--json")
    data = json.loads(out)
    assert code == 0 and data["winner"] is None
    assert all(not r["completed"] for r in data["results"])


@pytest.mark.parametrize("argv, message", [
    (["compare", "missing.csv"], "missing.csv"),
    (["compare", "--policies", "bfc:colour=red"], "has no parameter 'colour'"),
    (["compare", "--capacity", "lots"], "not a size: 'lots'"),
    (["compare", "--device", "tpu-v9"], "unknown device 'tpu-v9'"),
    (["gen", "nothing", "-o", "x.npz"], "nothing"),
])
def test_user_mistakes_end_in_one_line_and_exit_2(capsys, argv, message) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("allocsim: error:") and message in lines[0]


def test_a_malformed_trace_names_the_file_and_the_event(capsys, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time_ns,op,id,size\n0,alloc,1,100\n5,free,2,\n")
    code, _, err = run(capsys, "compare", str(bad))
    assert code == 2
    line = err.strip()
    assert "\n" not in line and "bad.csv" in line and "event 1" in line and "unknown id" in line


def test_gen_info_and_convert_round_trip(capsys, tmp_path: Path) -> None:
    npz = tmp_path / "t.npz"
    code, out, _ = run(capsys, "gen", "training", "layers=2", "steps=2", "-o", str(npz))
    assert code == 0 and "wrote" in out
    code, out, _ = run(capsys, "info", str(npz))
    assert code == 0 and "peak live" in out and "largest live at the peak" in out
    csv = tmp_path / "t.csv.gz"
    code, _, _ = run(capsys, "convert", str(npz), str(csv))
    assert code == 0
    assert formats.load(npz).equals(formats.load(csv), metadata=False)


def test_convert_refuses_to_overwrite_its_input(capsys, small_trace: Path) -> None:
    before = small_trace.read_bytes()
    code, _, err = run(capsys, "convert", str(small_trace), str(small_trace))
    assert code == 2 and "refusing to overwrite" in err
    assert small_trace.read_bytes() == before


def test_info_json_reports_the_peak(capsys, small_trace: Path) -> None:
    code, out, _ = run(capsys, "info", str(small_trace), "--json")
    assert code == 0
    facts = json.loads(out)
    assert facts["peak_live"] == 3000000 + 4096 and facts["leaks"] == 0


def test_policies_and_devices_are_listed(capsys) -> None:
    assert run(capsys, "policies")[1].count("bfc") >= 1
    out = run(capsys, "devices")[1]
    assert "a100-40g" in out and "h200-141g" in out


@pytest.mark.parametrize("argv, message", [
    (["min-capacity", "default", "--resolution", "0"], "resolution must be a positive size"),
    (["compare", "--capacity=0"], "capacity must be positive"),
])
def test_meaningless_sizes_are_refused_in_one_line(capsys, argv, message) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_an_internal_error_is_not_reported_as_the_users_mistake(capsys, monkeypatch) -> None:
    # Only UserInputError is a user's mistake; a ValueError from inside allocsim is a bug and
    # must keep its traceback instead of becoming "allocsim: error: ...".
    from allocsim.sim.cli import compare as compare_command

    def broken(args):
        raise ValueError("chunk list out of order")
    monkeypatch.setattr(compare_command, "run", broken)
    with pytest.raises(ValueError, match="chunk list out of order"):
        main(["compare"])
    assert "allocsim: error" not in capsys.readouterr().err


def test_a_user_input_error_is_one_line_and_exit_2(capsys, monkeypatch) -> None:
    from allocsim.errors import UserInputError
    from allocsim.sim.cli import compare as compare_command

    def refuses(args):
        raise UserInputError("run.npz: event 7: free of an unknown id")
    monkeypatch.setattr(compare_command, "run", refuses)
    assert main(["compare"]) == 2
    assert capsys.readouterr().err == "allocsim: error: run.npz: event 7: free of an unknown id\n"


def test_policies_lists_every_name_policies_accepts(capsys) -> None:
    code, out, _ = run(capsys, "policies")
    assert code == 0
    names = {line.split()[0] for line in out.splitlines() if line and not line.startswith(" ")}
    assert {"on-demand", "preallocate", "best-fit", "bfc", "pytorch", "cupy", "cuda-async",
            "buddy", "jax", "offline"} <= names
    assert "alignment=" in out and "memory_limit=" in out


def test_a_trace_given_after_the_policy_list_is_taken_as_a_trace(capsys, small_trace) -> None:
    code, out, _ = run(capsys, "compare", "--policies", "bfc", "on-demand", str(small_trace),
                       "--json")
    data = json.loads(out)
    assert code == 0 and data["trace"]["name"] == "small"
    assert [r["policy"] for r in data["results"]] == ["bfc", "on-demand"]


def test_report_never_overwrites_a_file_it_did_not_write(capsys, tmp_path) -> None:
    assert main(["compare", "--policies", "bfc", "--out", str(tmp_path / "r")]) == 0
    capsys.readouterr()
    notes = tmp_path / "notes.html"
    notes.write_text("<html>my notes</html>")
    code, _, err = run(capsys, "report", str(tmp_path / "r" / "results.json"), "-o", str(notes))
    assert code == 2 and "is not an HTML report allocsim wrote" in err and err.count("\n") == 1
    assert notes.read_text() == "<html>my notes</html>"
    page = tmp_path / "page.html"
    assert run(capsys, "report", str(tmp_path / "r" / "results.json"), "-o", str(page))[0] == 0
    assert run(capsys, "report", str(tmp_path / "r" / "results.json"), "-o", str(page))[0] == 0


def test_gen_lists_every_generators_parameters(capsys) -> None:
    from allocsim.sim.cli.main import build_parser
    gen = build_parser()._subparsers._group_actions[0].choices["gen"]  # type: ignore[union-attr]
    text = gen.format_help()
    assert "kvcache:" in text and "bytes_per_token" in text and "steps" in text


def test_gen_and_convert_create_a_missing_output_folder(capsys, tmp_path, small_trace) -> None:
    target = tmp_path / "new" / "deeper" / "t.npz"
    assert run(capsys, "gen", "random", "events=1000", "-o", str(target))[0] == 0
    assert target.exists()
    converted = tmp_path / "other" / "t.csv"
    assert run(capsys, "convert", str(small_trace), str(converted))[0] == 0
    assert converted.exists()


def test_share_says_when_the_processes_never_ran_at_the_same_time(tmp_path, capsys) -> None:
    trace = tmp_path / "t.npz"
    assert main(["gen", "random", "events=200", "-o", str(trace)]) == 0
    capsys.readouterr()
    assert main(["share", f"{trace}:on-demand", f"{trace}:on-demand@100s"]) == 0
    out = capsys.readouterr().out
    assert "no two of them ran at the same time" in out and "never shared" in out
    assert main(["share", f"{trace}:on-demand", f"{trace}:on-demand", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ran_together"] is True
    assert all(p["end_ns"] >= p["start_ns"] for p in data["processes"])


@pytest.mark.parametrize("argv", [
    ["info", "default"],
    ["compare", "default", "--policies", "bfc"],
    ["min-capacity", "default", "--policies", "best-fit", "--resolution", "64MiB"],
    ["explain-oom", "default", "--policy", "bfc", "--capacity", "1GiB"],
    ["convert", "default", "{tmp}/default.csv"],
    ["export-snapshot", "default", "--policy", "bfc", "-o", "{tmp}/run.pickle"],
    ["share", "default:bfc", "--capacity", "4GiB"],
    ["baseline", "default", "--policies", "bfc", "-o", "{tmp}/baseline.json"],
])
def test_every_command_that_takes_a_trace_takes_default(capsys, tmp_path, argv) -> None:
    """`default` names the bundled trace wherever a trace file is asked for."""
    code, out, err = run(capsys, *(a.replace("{tmp}", str(tmp_path)) for a in argv))
    assert code in (0, 1), err                     # 1: share/explain report a failure
    assert "no such file" not in err
    assert "default-training" in out + err or "wrote" in out or "p0    default" in out


def test_a_capacity_as_allocsim_prints_it_is_rounded_down_to_bytes_and_said(capsys) -> None:
    """allocsim prints sizes such as 2.64GiB; typed back, that is 2,834,678,415.36 bytes."""
    code, _out, err = run(capsys, "compare", "default", "--policies", "bfc",
                         "--capacity", "2.64GiB")
    assert code == 0
    assert "using 2,834,678,415 bytes (rounded down)" in err
    from allocsim.policies.units import parse_size_floor
    assert parse_size_floor("2.64GiB") == (2_834_678_415, False)
    assert parse_size_floor("1.5KiB") == (1536, True)
    assert parse_size_floor("7.999999999999999999EiB")[0] == 8 * 2**60 - 2   # exact: no float


def test_gen_takes_seed_as_a_parameter_or_an_option_and_refuses_two_that_differ(
        capsys, tmp_path: Path) -> None:
    # seed=N is listed among every generator's parameters; it used to reach generate() twice
    # (TypeError traceback). Either spelling is the seed; two that differ are one error line.
    by_param, by_option = tmp_path / "a.npz", tmp_path / "b.npz"
    assert run(capsys, "gen", "random", "events=200", "seed=1", "-o", str(by_param))[0] == 0
    assert run(capsys, "gen", "random", "events=200", "--seed", "1", "-o", str(by_option))[0] == 0
    a, b = formats.load(by_param), formats.load(by_option)
    assert a.equals(b, metadata=False)
    assert not a.equals(formats.load(tmp_path / "t0.npz"), metadata=False) if run(
        capsys, "gen", "random", "events=200", "-o", str(tmp_path / "t0.npz"))[0] == 0 else False
    assert run(capsys, "gen", "random", "events=200", "seed=1", "--seed", "1", "-o",
               str(tmp_path / "c.npz"))[0] == 0
    code, _, err = run(capsys, "gen", "random", "events=200", "seed=1", "--seed", "2", "-o",
                       str(tmp_path / "d.npz"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "seed is given twice" in err
    assert not (tmp_path / "d.npz").exists()
