"""Nothing a user gave is overwritten: every command that writes a file replaces an existing
one only when allocsim wrote it (sim/output/ownership.py); any other file is refused in one
line, exit 2, and left byte-identical (issue 16, data safety)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from allocsim.sim.cli.main import main

FOREIGN = {
    "an RMM log": b"Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x10,256,0x0\n",
    "a JSON file": b'{"anything": 1}\n',
    "a real-looking snapshot": b"\x80\x04}\x94(\x8c\x08segments\x94]\x94u.",
    "notes": b"my notes\n",
    "a zip": b"PK\x03\x04 not an npz",
}


def run(argv: list[str], capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    status = main(argv)
    return status, capsys.readouterr().err.strip().splitlines()


def writers(tmp: Path, target: Path) -> dict[str, list[str]]:
    """Every command that writes one file, each pointed at ``target``."""
    trace = tmp / "in.npz"
    return {
        "gen": ["gen", "random", "events=50", "-o", str(target)],
        "convert": ["convert", str(trace), str(target)],
        "export-snapshot": ["export-snapshot", str(trace), "-o", str(target)],
        "baseline": ["baseline", str(trace), "--policies", "on-demand", "-o", str(target)],
    }


@pytest.fixture
def source(tmp_path: Path, capsys) -> Path:
    assert main(["gen", "random", "events=50", "-o", str(tmp_path / "in.npz")]) == 0
    capsys.readouterr()
    return tmp_path / "in.npz"


SUFFIX = {"gen": ".csv", "convert": ".csv", "export-snapshot": ".pickle", "baseline": ".json"}


@pytest.mark.parametrize("content", list(FOREIGN))
@pytest.mark.parametrize("command", list(SUFFIX))
def test_a_file_allocsim_did_not_write_is_refused_and_kept(command: str, content: str,
                                                           tmp_path: Path, source: Path,
                                                           capsys) -> None:
    target = tmp_path / f"theirs{SUFFIX[command]}"
    target.write_bytes(FOREIGN[content])
    status, err = run(writers(tmp_path, target)[command], capsys)
    assert status == 2 and len(err) == 1, err
    assert err[0].startswith(f"allocsim: error: {target}: exists and is not ")
    assert "refusing to overwrite" in err[0]
    assert target.read_bytes() == FOREIGN[content]


@pytest.mark.parametrize("command", list(SUFFIX))
def test_its_own_output_is_replaced(command: str, tmp_path: Path, source: Path, capsys) -> None:
    target = tmp_path / f"ours{SUFFIX[command]}"
    argv = writers(tmp_path, target)[command]
    assert run(argv, capsys)[0] == 0
    first = target.read_bytes()
    assert run(argv, capsys)[0] == 0, "a second run replaces what the first one wrote"
    assert target.read_bytes() == first


@pytest.mark.parametrize("suffix", [".npz", ".csv", ".csv.gz", ".jsonl", ".jsonl.gz", ".pickle"])
def test_every_trace_format_allocsim_writes_is_recognised(suffix: str, tmp_path: Path,
                                                          source: Path, capsys) -> None:
    target = tmp_path / f"t{suffix}"
    assert run(["convert", str(source), str(target)], capsys)[0] == 0
    assert run(["convert", str(source), "-o", str(target)], capsys)[0] == 0


def test_a_gzipped_foreign_file_is_refused(tmp_path: Path, source: Path, capsys) -> None:
    target = tmp_path / "theirs.csv.gz"
    target.write_bytes(gzip.compress(FOREIGN["an RMM log"]))
    before = target.read_bytes()
    status, err = run(["convert", str(source), str(target)], capsys)
    assert status == 2 and len(err) == 1 and target.read_bytes() == before


def test_a_folder_in_the_way_is_refused(tmp_path: Path, source: Path, capsys) -> None:
    (tmp_path / "dir.csv").mkdir()
    status, err = run(["convert", str(source), str(tmp_path / "dir.csv")], capsys)
    assert status == 2 and err == [f"allocsim: error: {tmp_path / 'dir.csv'}: exists and is "
                                   "not a file; refusing to write a trace there"]


def test_a_device_profile_or_baseline_of_allocsim_is_recognised_by_its_keys(tmp_path) -> None:
    from allocsim.sim.output.ownership import is_allocsim_json
    baseline = tmp_path / "b.json"
    baseline.write_text(json.dumps({"allocsim_baseline": 1, "cells": []}))
    assert is_allocsim_json(baseline, "baseline")
    assert not is_allocsim_json(baseline, "device-profile")


@pytest.mark.parametrize("option", ["-o", "--log"])
def test_record_refuses_before_it_runs_the_program(option: str, tmp_path: Path, capsys) -> None:
    script = tmp_path / "train.py"
    ran = tmp_path / "ran"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    theirs = tmp_path / "theirs.jsonl"
    theirs.write_bytes(FOREIGN["notes"])
    argv = (["record", "-o", str(theirs)] if option == "-o"
            else ["record", "-o", str(tmp_path / "new.npz"), "--log", str(theirs)])
    status, err = run([*argv, "--", "python", str(script)], capsys)
    assert status == 2 and len(err) == 1 and "refusing to overwrite" in err[0]
    assert not ran.exists() and theirs.read_bytes() == FOREIGN["notes"]


# -- folders: --out DIR writes fixed names; a user's file under one of them is kept ------------
def test_compare_twice_into_one_folder_replaces_its_own_files(tmp_path: Path, source: Path,
                                                              capsys) -> None:
    out = tmp_path / "results"
    argv = ["compare", str(source), "--policies", "on-demand", "bfc", "-o", str(out), "--figures"]
    assert run(argv, capsys)[0] == 0
    written = sorted(p.name for p in out.iterdir())
    assert "results.json" in written and any(name.endswith(".png") for name in written)
    assert run(argv, capsys)[0] == 0
    assert sorted(p.name for p in out.iterdir()) == written


@pytest.mark.parametrize("name", ["results.json", "peaks.png", "report.html"])
def test_compare_keeps_a_users_file_in_its_folder(name: str, tmp_path: Path, source: Path,
                                                  capsys) -> None:
    out = tmp_path / "results"
    out.mkdir()
    theirs = out / name
    theirs.write_bytes(FOREIGN["a JSON file"] if name.endswith(".json") else b"\x89PNG mine")
    before = theirs.read_bytes()
    status, err = run(["compare", str(source), "--policies", "on-demand", "-o", str(out),
                       "--figures"], capsys)
    assert status == 2 and len(err) == 1 and f"{theirs}: exists and is not" in err[0]
    assert theirs.read_bytes() == before


@pytest.mark.parametrize("name", ["share.json", "share.png"])
def test_share_keeps_a_users_file_in_its_folder(name: str, tmp_path: Path, source: Path,
                                                capsys) -> None:
    out = tmp_path / "shared"
    out.mkdir()
    (out / name).write_bytes(FOREIGN["notes"])
    status, err = run(["share", f"{source}:on-demand", "-o", str(out)], capsys)
    assert status == 2 and len(err) == 1 and (out / name).read_bytes() == FOREIGN["notes"]


def test_the_json_kinds_name_keys_their_schemas_require() -> None:
    """The recogniser's keys are keys every document of that kind has, by its schema."""
    from allocsim.sim.output.ownership import ANSWER_KEYS, JSON_KINDS, RUN_RESULT_KEYS
    schemas = Path(__file__).resolve().parents[1] / "sim" / "output" / "schemas"
    for kind, recogniser in JSON_KINDS.items():
        if kind == "experiment":
            continue    # no schema; held to the experiments' own results below
        schema = json.loads((schemas / f"{kind}.schema.json").read_text())
        required = set(schema.get("required", []))
        for definition in schema.get("$defs", {}).values():
            required |= set(definition.get("required", []))
        assert set(recogniser.keys) <= required, (kind, set(recogniser.keys) - required)
    compare = json.loads((schemas / "compare.schema.json").read_text())["$defs"]
    assert set(RUN_RESULT_KEYS) <= set(compare["run_result"]["required"])
    capacity = json.loads((schemas / "min-capacity.schema.json").read_text())["$defs"]
    assert set(ANSWER_KEYS) <= set(capacity["answer"]["required"])


def test_every_experiments_results_file_is_recognised_so_a_rerun_may_replace_it() -> None:
    from allocsim.sim.output.ownership import is_allocsim_json
    experiments = Path(__file__).resolve().parents[1] / "experiments"
    found = sorted(experiments.glob("*/results.json"))
    assert found
    for path in found:
        assert is_allocsim_json(path, "experiment"), path


# -- each JSON output by its own kind's mark, never by another kind's keys (issue 25.1) ---------
LAB_INVENTORY = b'{"name":"lab inventory","capacity":42}\n'   # a device profile's keys
JSON_OUTPUTS = {"results.json": "allocsim-compare", "min_capacity.json": "allocsim-min-capacity",
                "share.json": "allocsim-share"}


def folder_command(name: str, source: Path, out: Path) -> list[str]:
    """The command that writes ``out/name``."""
    return {"results.json": ["compare", str(source), "--policies", "on-demand", "-o", str(out)],
            "min_capacity.json": ["min-capacity", str(source), "--policies", "on-demand",
                                  "-o", str(out)],
            "share.json": ["share", f"{source}:on-demand", "-o", str(out)]}[name]


@pytest.mark.parametrize("name", list(JSON_OUTPUTS))
def test_a_users_json_with_name_and_capacity_is_kept(name: str, tmp_path: Path, source: Path,
                                                      capsys) -> None:
    out = tmp_path / "d"
    out.mkdir()
    (out / name).write_bytes(LAB_INVENTORY)
    status, err = run(folder_command(name, source, out), capsys)
    assert status == 2 and len(err) == 1, err
    assert f"{out / name}: exists and is not " in err[0] and "refusing to overwrite" in err[0]
    assert (out / name).read_bytes() == LAB_INVENTORY


@pytest.mark.parametrize("name", list(JSON_OUTPUTS))
def test_each_json_output_says_what_it_is_and_another_kind_is_not_replaced(
        name: str, tmp_path: Path, source: Path, capsys) -> None:
    mine = tmp_path / "mine"
    assert run(folder_command(name, source, mine), capsys)[0] == 0
    document = json.loads((mine / name).read_text())
    assert document["kind"] == JSON_OUTPUTS[name]
    for other in JSON_OUTPUTS:
        if other == name:
            continue
        # Another command's output under this name is not this command's to replace.
        out = tmp_path / f"into-{other}"
        out.mkdir()
        (out / other).write_bytes((mine / name).read_bytes())
        before = (out / other).read_bytes()
        status, err = run(folder_command(other, source, out), capsys)
        assert status == 2 and len(err) == 1 and (out / other).read_bytes() == before, err


@pytest.mark.parametrize("name", list(JSON_OUTPUTS))
def test_a_file_of_an_earlier_version_without_the_mark_is_still_replaced(
        name: str, tmp_path: Path, source: Path, capsys) -> None:
    out = tmp_path / "d"
    argv = folder_command(name, source, out)
    assert run(argv, capsys)[0] == 0
    document = json.loads((out / name).read_text())
    del document["kind"]            # as allocsim wrote it before the mark
    (out / name).write_text(json.dumps(document, indent=2) + "\n")
    assert run(argv, capsys)[0] == 0
    assert json.loads((out / name).read_text())["kind"] == JSON_OUTPUTS[name]
    # ... but not once it lacks the shape earlier versions wrote down to its run results.
    entries = {"results.json": "results", "min_capacity.json": "answers",
               "share.json": "processes"}[name]
    document.pop("kind", None)
    document[entries] = [{"policy": "mine"}]
    (out / name).write_text(json.dumps(document))
    before = (out / name).read_bytes()
    assert run(argv, capsys)[0] == 2 and (out / name).read_bytes() == before
