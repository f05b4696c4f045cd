"""Issue 12: a JSON Schema for every ``--json`` output and every file users keep, and real
outputs validated against it.

The schemas live in ``sim/output/schemas/<name>.schema.json`` (package data of
``allocsim.sim.output``, read here through importlib.resources as an installed copy would be).
Every output below is produced by the real command (``main([...])``) on the bundled traces,
on small traces written here, on runs that run out of memory, and — when the shared
recordings are present — on real PyTorch snapshots. Each schema is also shown to reject an
output with a required key removed and with a value of the wrong type.

Each schema file stands alone (no cross-file ``$ref``): definitions several outputs share
(the run result, the trace facts, the device profile, ...) are copied into each file's
``$defs``, and :func:`test_shared_definitions_are_identical_in_every_file` keeps the copies
equal.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import pickle
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from allocsim.sim.cli.main import build_parser, main
from allocsim.sim.kernel.device import PROFILES, DeviceProfile
from allocsim.sim.validation.calibrate import DeviceCalls, calibrate

MiB = 1 << 20
GiB = 1 << 30
SCHEMAS = resources.files("allocsim.sim.output") / "schemas"
BASE_URI = "https://allocsim.dev/schemas/"
REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "traces" / "data"
SHARED = REPO.parent / "shared" / "traces"
EOR = SHARED / "torch-snapshot-eor.pickle"
LM = SHARED / "torch-snapshot-lm-inference.pickle"
needs_eor = pytest.mark.skipif(not EOR.is_file(), reason=f"{EOR} not present")

SMALL_CSV = ("time_ns,op,id,size\n0,alloc,1,1048576\n10000000,alloc,2,4096\n"
             "20000000,free,1,\n30000000,alloc,3,3000000\n40000000,free,2,\n"
             "50000000,free,3,\n")
# Two processes (the share command runs one process of the run per recorded process).
TWO_PROCESSES_CSV = ("time_ns,op,id,size,stream,process\n0,alloc,1,4194304,0,0\n"
                     "1000,alloc,2,8388608,1,1\n2000,free,1,,0,0\n3000,free,2,,1,1\n")
# A malloc-lab file: no times (synthesised), a free of an id never allocated (dropped) and
# an alloc of a live id (renamed): lenient reading repairs both and says so.
MALLOCLAB = "20000\n3\n6\n1\na 0 2040\na 1 4096\nf 2\na 1 100\nf 0\nf 1\n"
# Eight 8 MiB buffers, every other one freed, then 16 MiB: fragmentation at 90 MiB under
# pytorch (tests/test_explain.py works it out by hand).
FRAGMENTING = ("time_ns,op,id,size\n"
               + "".join(f"{k * 1000},alloc,{k},{8 * MiB}\n" for k in range(8))
               + "".join(f"{10_000 + k},free,{k},\n" for k in range(1, 8, 2))
               + f"20000,alloc,100,{16 * MiB}\n21000,free,100,\n")
# 2 PiB: no policy completes it even on the 1 PiB probe device (min capacity "never").
HUGE_CSV = f"time_ns,op,id,size\n0,alloc,1,{2 << 50}\n1000,free,1,\n"


# ============================================================================ helpers
@cache
def schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))


def schema_names() -> list[str]:
    return sorted(p.name.removesuffix(".schema.json") for p in SCHEMAS.iterdir()
                  if p.name.endswith(".schema.json"))


@cache
def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(schema(name), format_checker=Draft202012Validator.FORMAT_CHECKER)


def errors_of(name: str, data: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in validator(name).iter_errors(data)]


def assert_valid(name: str, data: Any) -> None:
    errors = errors_of(name, data)
    assert not errors, f"{name}.schema.json rejects a real output:\n" + "\n".join(errors[:20])


def cli(*argv: str, expect: int = 0) -> str:
    """Run ``allocsim ARGV`` in-process; its stdout (exit status checked)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    assert code == expect, f"allocsim {' '.join(map(str, argv))}: exit {code}\n{err.getvalue()}"
    return out.getvalue()


def cli_json(*argv: str, expect: int = 0) -> Any:
    return json.loads(cli(*argv, expect=expect))


class FakeGPU:
    """The device calls calibration makes, on a pretend 16 GiB GPU that takes memory in
    2 MiB pages (so the measured granularity is 2 MiB) and whose calls take 10 µs + 1 µs/MiB."""

    def __init__(self) -> None:
        self.total = 16 * GiB
        self.used = 0
        self.clock = 0
        self.handles: dict[int, int] = {}

    def malloc(self, nbytes: int) -> int:
        taken = -(-nbytes // (2 * MiB)) * 2 * MiB
        self.used += taken
        self.clock += 10_000 + nbytes // MiB * 1_000
        handle = len(self.handles) + 1
        self.handles[handle] = taken
        return handle

    def free(self, handle: int) -> None:
        self.used -= self.handles.pop(handle)
        self.clock += 5_000

    def calls(self) -> DeviceCalls:
        return DeviceCalls(malloc=self.malloc, free=self.free,
                           mem_info=lambda: (self.total - self.used, self.total),
                           clock_ns=lambda: self.clock, name="Fake GPU",
                           versions={"cupy": "0"}, map_granularity=2 * MiB)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Small input files, written once for the module."""
    folder = tmp_path_factory.mktemp("inputs")
    written = {}
    for name, text in (("small.csv", SMALL_CSV), ("two.csv", TWO_PROCESSES_CSV),
                       ("lab.rep", MALLOCLAB), ("fragmenting.csv", FRAGMENTING),
                       ("empty.csv", "time_ns,op,id,size\n"), ("huge.csv", HUGE_CSV),
                       ("broken.csv", "time_ns,op,id,size\n0,alloc,1,-5\n")):
        (folder / name).write_text(text)
        written[name] = folder / name
    written["folder"] = folder
    return written


@pytest.fixture(scope="module")
def snapshot_with_oom(tmp_path_factory) -> Path:
    """A PyTorch snapshot of the pytorch model's run, with a recorded OOM (written the way
    tests/test_explain.py makes one)."""
    from allocsim.sim.questions.fidelity.pytorch import simulate_snapshot
    from allocsim.traces import synth
    trace = synth.generate("random", seed=2)
    capacity = int(trace.peak_live()[0] * 1.05) // (2 * MiB) * (2 * MiB)
    snapshot = simulate_snapshot(trace, "pytorch", DeviceProfile("t", capacity, granularity=512))
    assert any(e["action"] == "oom" for e in snapshot["device_traces"][0])
    path = tmp_path_factory.mktemp("snapshot") / "oom.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    return path


# ============================================================================ the schemas
def walk(node: Any, path: str = ""):
    """Every (path, subschema) in a schema."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{path}/{index}")


@pytest.mark.parametrize("name", schema_names())
def test_every_schema_is_a_valid_draft_2020_12_schema(name: str) -> None:
    document = schema(name)
    Draft202012Validator.check_schema(document)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert document["$id"] == f"{BASE_URI}{name}.schema.json"
    assert document["title"] and document["description"]
    for path, node in walk(document):
        # Every property says what it is and its unit (the if/then/else rules only restate
        # properties declared, and described, beside them).
        if isinstance(node.get("properties"), dict) and "/allOf/" not in path:
            for prop, sub in node["properties"].items():
                assert sub.get("description"), f"{name}: {path}/properties/{prop} has none"
        if "$ref" in node:
            target = node["$ref"]
            assert target.startswith("#/$defs/"), f"{name}: {path}: {target} not local"
            assert target.split("/")[-1] in document.get("$defs", {}), f"{name}: {target}"


def test_there_are_the_schemas_the_issue_asks_for() -> None:
    assert set(schema_names()) >= {
        "compare", "results", "min-capacity", "share", "info", "validate", "explain-oom",
        "fidelity", "baseline", "sweep", "device-profile"}


def test_every_command_with_json_output_has_a_schema() -> None:
    """Any subcommand that grows a --json flag must come with its schema."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    with_json = sorted(name for name, p in sub.choices.items()
                       if any("--json" in a.option_strings for a in p._actions))
    assert with_json == sorted(["compare", "min-capacity", "share", "info", "validate",
                                "explain-oom", "fidelity", "tune", "size"])
    assert set(with_json) <= set(schema_names())


def test_shared_definitions_are_identical_in_every_file() -> None:
    seen: dict[str, tuple[str, Any]] = {}
    for name in schema_names():
        for key, definition in schema(name).get("$defs", {}).items():
            if key in seen:
                assert definition == seen[key][1], (
                    f"$defs/{key} differs between {seen[key][0]} and {name}")
            else:
                seen[key] = (name, definition)


# ============================================================================ real outputs
@cache
def compare_outputs(folder: Path) -> list[tuple[str, Any]]:
    small, lab = folder / "small.csv", folder / "lab.rep"
    default = DATA / "default-training.npz"
    return [
        ("compare (the bundled traces)", cli_json("compare", "--json")),
        ("compare small.csv", cli_json("compare", small, "--json", "--capacity", "1GiB")),
        ("compare default at 64MiB (OOMs; offline does not fit)",
         cli_json("compare", default, "--json", "--capacity", "64MiB", "--policies",
                  "on-demand", "bfc", "pytorch", "jax", "offline")),
        ("compare two traces", cli_json("compare", small, DATA / "sample-torch-cpu-mlp.npz",
                                        "--json", "--policies", "bfc", "cupy", "offline")),
        ("compare malloc-lab (synthesised times: no budget)",
         cli_json("compare", lab, "--json", "--policies", "bfc", "buddy", "offline")),
        ("compare --max-slowdown inf", cli_json("compare", small, "--json", "--max-slowdown",
                                                "inf", "--policies", "on-demand",
                                                "best-fit")),
        ("compare empty trace", cli_json("compare", folder / "empty.csv", "--json",
                                         "--policies", "bfc", "pytorch", "offline")),
        ("compare --alloc-conf", cli_json("compare", small, "--json", "--policies", "bfc",
                                          "--alloc-conf", "expandable_segments:True")),
    ]


def test_compare_json_validates(files) -> None:
    outputs = compare_outputs(files["folder"])
    for label, data in outputs:
        assert_valid("compare", data)
        for comparison in data if isinstance(data, list) else [data]:
            policies = [r["policy"] for r in comparison["results"]]
            assert comparison["winner"] is None or comparison["winner"] in policies, label
            assert comparison["winner"] != "offline"
    bundled = dict(outputs)["compare (the bundled traces)"]
    assert isinstance(bundled, list) and len(bundled) == len(list(DATA.glob("*.npz")))
    oom = dict(outputs)["compare default at 64MiB (OOMs; offline does not fit)"]
    assert oom["winner"] is None and all(not r["completed"] for r in oom["results"])
    assert all(r["first_oom_event"] is not None for r in oom["results"])
    assert dict(outputs)["compare malloc-lab (synthesised times: no budget)"][
        "max_slowdown"] is None


def test_results_json_of_compare_out_validates(files, tmp_path) -> None:
    small = files["small.csv"]
    out = tmp_path / "one"
    cli("compare", small, "--out", out, "--policies", "bfc", "pytorch", "offline")
    one = json.loads((out / "results.json").read_text())
    assert_valid("results", one)
    assert all("timeline" in r for r in one["results"])
    # What --json prints is results.json less the timelines, and the compare schema
    # refuses a timeline (its shape is closed).
    printed = cli_json("compare", small, "--json", "--policies", "bfc", "pytorch", "offline")
    assert [{k: v for k, v in r.items() if k != "timeline"} for r in one["results"]] == \
        printed["results"]
    assert errors_of("compare", one) and errors_of("results", printed)
    several = tmp_path / "several"
    cli("compare", small, DATA / "default-training.npz", "--out", several, "--capacity",
        "64MiB", "--policies", "bfc", "offline")
    data = json.loads((several / "results.json").read_text())
    assert isinstance(data, list) and len(data) == 2
    assert_valid("results", data)


def test_min_capacity_json_and_min_capacity_file_validate(files, tmp_path) -> None:
    printed = cli_json("min-capacity", files["small.csv"], "--json", "--policies", "bfc",
                       "jax", "pytorch", "offline", "--out", tmp_path)
    assert_valid("min-capacity", printed)
    written = json.loads((tmp_path / "min_capacity.json").read_text())
    assert written == printed
    assert_valid("min-capacity", written)
    for argv in ([DATA / "sample-torch-cpu-mlp.npz", "--policies", "bfc", "offline"],
                 ["default", "--policies", "offline"],
                 [files["huge.csv"], "--policies", "bfc", "offline", "--resolution", "1GiB"]):
        assert_valid("min-capacity", cli_json("min-capacity", *argv, "--json"))
    never = cli_json("min-capacity", files["huge.csv"], "--policies", "bfc", "--json")
    assert never["answers"][0]["min_capacity"] is None and never["answers"][0]["headroom"] is None


def test_share_json_and_share_file_validate(files, tmp_path) -> None:
    oom = cli_json("share", "default:jax", "default:jax@10ms", "--capacity", "6GiB", "--json",
                   expect=1)
    assert_valid("share", oom)
    assert not oom["all_completed"] and oom["processes"][1]["first_oom_others"] == {
        "0": oom["processes"][0]["peak_reserved"]}
    both = cli_json("share", f"{files['small.csv']}:bfc", f"{files['two.csv']}:pytorch@1ms",
                    "--capacity", "1GiB", "--json", "--out", tmp_path)
    assert_valid("share", both)
    assert len(both["processes"]) == 3 and both["all_completed"]
    assert json.loads((tmp_path / "share.json").read_text()) == both
    # Memory outside each process's allocator: its context refused, said in the document.
    refused = cli_json("share", "default:on-demand", "default:on-demand@1ms", "--capacity",
                       "1GiB", "--process-context", "600MiB", "--json", expect=1)
    assert_valid("share", refused)
    assert [p["outside"]["refused"] for p in refused["processes"]] == [None, "context"]


def test_info_json_validates(files, snapshot_with_oom) -> None:
    traces = [*sorted(DATA.glob("*.npz")), files["small.csv"], files["two.csv"],
              files["lab.rep"], files["empty.csv"], snapshot_with_oom]
    traces += [p for p in (EOR, SHARED / "torch-profiler-cpu-mlp-train.json.gz") if p.is_file()]
    for path in traces:
        assert_valid("info", cli_json("info", path, "--json"))
    repaired = cli_json("info", files["lab.rep"], "--json")
    assert repaired["validation"]["repairs"] == {"unmatched_frees_dropped": 1,
                                                 "duplicate_allocs_renamed": 1}
    assert cli_json("info", DATA / "default-training.npz", "--json")["top_live_at_peak"]


def test_explain_oom_json_validates(files, snapshot_with_oom) -> None:
    shortage = cli_json("explain-oom", DATA / "default-training.npz", "--capacity", "1GiB",
                        "--json")
    assert_valid("explain-oom", shortage)
    assert shortage["verdict"] == "real shortage" and shortage["recorded"] is None
    fragmentation = cli_json("explain-oom", files["fragmenting.csv"], "--capacity", "90MiB",
                             "--json")
    assert_valid("explain-oom", fragmentation)
    assert fragmentation["verdict"] == "fragmentation"
    assert any(a["completed"] for a in fragmentation["alternatives"])
    not_pytorch = cli_json("explain-oom", files["fragmenting.csv"], "--capacity", "70MiB",
                           "--policy", "bfc", "--max-split-sizes", "64", "--json")
    assert_valid("explain-oom", not_pytorch)
    assert not_pytorch["segment_needed"] is None
    recorded = cli_json("explain-oom", snapshot_with_oom, "--json")
    assert_valid("explain-oom", recorded)
    assert recorded["device"] == "recorded" and recorded["recorded"] is not None


@needs_eor
def test_explain_oom_json_on_a_real_snapshot_validates() -> None:
    data = cli_json("explain-oom", EOR, "--capacity", "110MiB", "--policy", "pytorch", "--json")
    assert_valid("explain-oom", data)
    assert data["verdict"] == "fragmentation"


def test_fidelity_json_validates(snapshot_with_oom) -> None:
    data = cli_json("fidelity", snapshot_with_oom, "--json")
    assert_valid("fidelity", data)
    assert data["exit_status"] == 0 and data["injected_ooms"] >= 1
    assert data["settings"]["recorded"] is not None


@needs_eor
def test_fidelity_json_on_real_snapshots_validates() -> None:
    matched = cli_json("fidelity", EOR, "--json")
    assert_valid("fidelity", matched)
    assert matched["first_divergence"] is None
    diverging = cli_json("fidelity", EOR, "--capacity", "100MiB", "--json", expect=1)
    assert_valid("fidelity", diverging)
    assert diverging["first_divergence"] is not None and diverging["exit_status"] == 1
    if LM.is_file():
        assert_valid("fidelity", cli_json("fidelity", LM, "--json"))


def test_validate_json_and_report_file_validate(files, tmp_path) -> None:
    small = files["small.csv"]
    data = cli_json("validate", small, "--policy", "bfc", "--backend", "host", "--json",
                    "--out", tmp_path)
    assert_valid("validate", data)
    assert data["passed"]
    written = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert len(written) == 1
    assert_valid("validate", written[0])
    oom = cli_json("validate", small, "--policy", "pytorch", "--backend", "host",
                   "--capacity", "2MiB", "--json")
    assert_valid("validate", oom)
    assert oom["simulated"]["first_oom_event"] is not None
    cli("compare", small, "--out", tmp_path / "cmp", "--policies", "bfc", "best-fit")
    from_results = cli_json("validate", tmp_path / "cmp" / "results.json", "--backend",
                            "host", "--json")
    assert_valid("validate", from_results)


def test_baseline_file_validates(files, tmp_path) -> None:
    path = tmp_path / "baseline.json"
    cli("baseline", files["small.csv"], DATA / "sample-torch-cpu-mlp.npz", "--policies",
        "bfc", "pytorch", "offline", "-o", path)
    data = json.loads(path.read_text())
    assert_valid("baseline", data)
    assert len(data["cells"]) == 6
    cli("check", path)                       # what `check` reads back
    oom = tmp_path / "oom.json"
    cli("baseline", files["small.csv"], "--capacity", "2MiB", "--policies", "bfc", "-o", oom)
    assert_valid("baseline", json.loads(oom.read_text()))


def test_sweep_records_validate(files, tmp_path) -> None:
    definition = tmp_path / "grid.toml"
    definition.write_text(
        'name = "schemas"\noutput = "grid.jsonl"\n[grid]\n'
        f'traces = ["{files["small.csv"]}", "{files["broken.csv"]}"]\n'
        'policies = ["bfc", "offline"]\ncapacities = ["1GiB", "2MiB"]\n')
    cli("sweep", definition, "--workers", "1", "--no-progress", expect=1)
    records = [json.loads(line) for line in (tmp_path / "grid.jsonl").read_text().splitlines()]
    assert len(records) == 8
    for record in records:
        assert_valid("sweep", record)
    assert {r["status"] for r in records} == {"ok", "error"}
    assert any(r["result"] and not r["result"]["completed"] for r in records)


def test_device_profiles_validate(files, tmp_path) -> None:
    for profile in PROFILES.values():
        assert_valid("device-profile", profile.as_dict())
        assert_valid("device-profile", profile.device_with(24 * GiB).as_dict())
    path = tmp_path / "fake-gpu.json"
    calibration = calibrate([4096, MiB, 64 * MiB], repeats=3, calls=FakeGPU().calls(),
                            output=path)
    written = json.loads(path.read_text())
    assert_valid("device-profile", written)
    assert written["granularity"] == 2 * MiB
    assert_valid("calibrate-measurements", calibration.measurements_json())
    # ... and --device-profile reads what the schema accepts, the minimal form too.
    minimal = tmp_path / "minimal.json"
    minimal.write_text(json.dumps({"name": "mine", "capacity": 8 * GiB}))
    assert_valid("device-profile", json.loads(minimal.read_text()))
    for profile_file in (path, minimal):
        data = cli_json("compare", files["small.csv"], "--device-profile", profile_file,
                        "--json", "--policies", "bfc")
        assert_valid("compare", data)


# ============================================================================ they can fail
@cache
def samples(folder: Path, snapshot: Path) -> dict[str, Any]:
    """One real output per schema (an object; for array outputs, one element)."""
    small = folder / "small.csv"
    profile = PROFILES["a100-40g"].as_dict()
    calibration = calibrate([4096, MiB], repeats=1, calls=FakeGPU().calls())
    out = folder / "sample-results"
    cli("compare", small, "--out", out, "--capacity", "2MiB", "--policies", "bfc", "offline")
    baseline = folder / "sample-baseline.json"
    cli("baseline", small, "--policies", "bfc", "-o", baseline)
    return {
        "compare": cli_json("compare", small, "--json", "--capacity", "2MiB", "--policies",
                            "bfc", "offline"),
        "results": json.loads((out / "results.json").read_text()),
        "min-capacity": cli_json("min-capacity", small, "--json", "--policies", "bfc"),
        "share": cli_json("share", f"{small}:bfc", "--json"),
        "info": cli_json("info", small, "--json"),
        "explain-oom": cli_json("explain-oom", folder / "fragmenting.csv", "--capacity",
                                "90MiB", "--json"),
        "fidelity": cli_json("fidelity", snapshot, "--json"),
        "bfc-fidelity": cli_json("fidelity", Path(__file__).parent / "data" / "xplane" /
                                 "tf-cpu-default.xplane.pb", "--json"),
        "xla-fidelity": cli_json("fidelity", Path(__file__).parent / "data" / "xla" / "cpu",
                                 "--json"),
        "tpu-fidelity": cli_json("fidelity", Path(__file__).parent / "data" / "tpu" /
                                 "compaction-4", "--json"),
        "size": cli_json("size", "f32[17,129]", "bf16[3,5,7]", "pred[100]", "--json"),
        "validate": cli_json("validate", small, "--policy", "bfc", "--backend", "host",
                             "--json"),
        "baseline": json.loads(baseline.read_text()),
        "sweep": {"cell": f"{small} | bfc | a100-80g | default", "trace": str(small),
                  "policy": "bfc", "device": "a100-80g", "capacity": None, "status": "ok",
                  "error": None,
                  "result": cli_json("compare", small, "--json", "--policies",
                                     "bfc")["results"][0],
                  "wall_s": 0.01, "trace_loaded": True, "worker": "host:1"},
        "device-profile": profile,
        "calibrate-measurements": calibration.measurements_json(),
        "tune": cli_json("tune", small, "--framework", "pytorch", "--capacity", "8MiB",
                         "--json"),
    }


def top_object(name: str) -> dict[str, Any]:
    """The schema of the top-level object (the one element of a one-or-many output)."""
    document = schema(name)
    node = document
    while "properties" not in node:
        if node.get("type") == "array":     # a list of objects (size --json)
            node = node["items"]
            continue
        ref = node.get("$ref") or node["oneOf"][0]["$ref"]
        node = document["$defs"][ref.split("/")[-1]]
    return node


@pytest.mark.parametrize("name", schema_names())
def test_a_real_output_missing_a_required_key_is_rejected(name, files, snapshot_with_oom):
    whole = samples(files["folder"], snapshot_with_oom)[name]
    assert_valid(name, whole)
    listed = isinstance(whole, list)        # a list of objects: its first one, in a list
    sample = whole[0] if listed else whole
    required = top_object(name)["required"]
    assert required, f"{name}: nothing required"
    for key in required:
        broken = copy.deepcopy(sample)
        del broken[key]
        assert errors_of(name, [broken] if listed else broken), \
            f"{name}: accepted without {key!r}"


@pytest.mark.parametrize("name", schema_names())
def test_a_real_output_with_a_wrong_type_or_an_unknown_key_is_rejected(name, files,
                                                                        snapshot_with_oom):
    whole = samples(files["folder"], snapshot_with_oom)[name]
    listed = isinstance(whole, list)        # a list of objects: its first one, in a list
    sample = whole[0] if listed else whole

    def wrapped(document: dict) -> Any:
        return [document] if listed else document
    changed = 0
    for key, value in sample.items():
        if isinstance(value, bool) or not isinstance(value, (int, str, list, dict)):
            continue
        broken = copy.deepcopy(sample)
        broken[key] = [value] if not isinstance(value, list) else {"items": value}
        assert errors_of(name, wrapped(broken)), f"{name}: accepted {key!r} = {broken[key]!r}"
        changed += 1
    assert changed
    assert errors_of(name, wrapped({**sample, "no_such_key": 1})), f"{name}: shape not closed"


def test_run_results_are_checked_inside(files, snapshot_with_oom) -> None:
    """A few rules inside a run result: integers are integers, nulls only where documented,
    an OOM and 'completed' agree, policy_stats is open but holds integers."""
    sample = samples(files["folder"], snapshot_with_oom)["compare"]
    result = sample["results"][0]
    assert not result["completed"]                      # bfc at 2 MiB runs out of memory

    def with_result(**change: Any) -> dict[str, Any]:
        broken = copy.deepcopy(sample)
        broken["results"][0].update(change)
        return broken

    assert errors_of("compare", with_result(peak_reserved=float(result["peak_reserved"]) + .5))
    assert errors_of("compare", with_result(peak_reserved=None))
    assert errors_of("compare", with_result(completed=True))       # but first_oom_* are set
    assert errors_of("compare", with_result(ooms=0))
    assert errors_of("compare", with_result(utilization=1.5))
    assert errors_of("compare", with_result(unknown_metric=3))
    assert errors_of("compare", with_result(first_oom_others={"p0": 1}))
    stats = dict(result["policy_stats"], new_counter=7)
    assert not errors_of("compare", with_result(policy_stats=stats))
    assert errors_of("compare", with_result(policy_stats=dict(stats, new_counter="7")))
    broken = copy.deepcopy(sample)
    broken["schema"] = 2
    assert errors_of("compare", broken)
    explanation = samples(files["folder"], snapshot_with_oom)["explain-oom"]
    assert errors_of("explain-oom", {**explanation, "verdict": "bad luck"})
    record = samples(files["folder"], snapshot_with_oom)["sweep"]
    assert errors_of("sweep", {**record, "status": "error"})   # an error record needs an error
    assert not errors_of("sweep", {**record, "status": "error", "error": "TraceError: x",
                                   "result": None})
