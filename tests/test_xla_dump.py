"""Issue 13 (items 2, 7, 8): XLA dump folders as traces, and ``allocsim fidelity DUMP``.

The committed dump files (tests/data/xla/cpu, remade by ``python tests/make_xla_dumps.py``)
come from jax 0.10 on the CPU: an MLP training step with and without donation, an in-place
``dynamic_update_slice`` with and without donation, and a ``lax.scan``. These tests need no
jax; the one that makes a fresh dump skips without it.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import re
import shutil
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from jsonschema import Draft202012Validator

from allocsim.sim.cli.main import main
from allocsim.sim.questions.fidelity.xla import xla_fidelity
from allocsim.traces import formats
from allocsim.traces.formats.xla.dump import STEP_NS, list_modules, role_trace
from allocsim.traces.model import OP_ALLOC, OP_FREE, TraceError

DUMP = Path(__file__).resolve().parent / "data" / "xla" / "cpu"
MODULES = ["module_0000.jit_train_step", "module_0002.jit_train_step_donated",
           "module_0004.jit_update_cache", "module_0006.jit_update_cache_donated",
           "module_0008.jit_rnn_scan"]
STAGE = "cpu_after_optimizations"


def cli(*args: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main([str(a) for a in args])
        except SystemExit as exit_:
            status = int(exit_.code or 0)
    return status, out.getvalue(), err.getvalue()


def load(module: str | None = None, path: Path = DUMP):
    """A module's logical buffers (the ``buffers`` view these tests are about; the runtime
    view, the default, is tests/test_xla_runtime.py's)."""
    return formats.load(path, module=module, view="buffers")


def files_of(module: str, folder: Path = DUMP) -> dict[str, Path]:
    return {kind: folder / f"{module}.{STAGE}-{kind}.txt"
            for kind in ("live-range", "buffer-assignment", "buffer-assignment-values",
                         "memory-usage-report")}


def copy_module(tmp_path: Path, module: str = MODULES[0]) -> dict[str, Path]:
    folder = tmp_path / "dump"
    folder.mkdir(exist_ok=True)
    for path in files_of(module).values():
        shutil.copyfile(path, folder / path.name)
    return files_of(module, folder)


def live_range_peak(module: str) -> int:
    """The peak XLA's live-range file reports (it counts values sharing bytes again)."""
    text = files_of(module)["live-range"].read_text()
    return max(int(n) for n in re.findall(r"cumulative: (\d+) bytes", text))


# ============================================================================ the importer
def test_the_dump_lists_its_modules_and_reads_the_largest_temp_by_default() -> None:
    trace = load()
    assert trace.metadata["format"] == "xla-dump"
    assert trace.name == "module_0002.jit_train_step_donated"
    listing = trace.metadata["listing"]
    assert len(listing) == len(MODULES)
    assert [line.endswith("(read)") for line in listing].count(True) == 1
    assert "jit_train_step_donated" in next(line for line in listing if line.endswith("(read)"))
    assert all(re.search(r"arguments .*, outputs .*, temp ", line) for line in listing)
    assert [m.key for m in list_modules(DUMP)] == MODULES


@pytest.mark.parametrize("name", ["module_0008.jit_rnn_scan", "jit_rnn_scan", "rnn_scan",
                                  "8", "0008", "module_0008"])
def test_module_names(name: str) -> None:
    assert load(name).name == "module_0008.jit_rnn_scan"


def test_an_unknown_module_is_one_line_listing_the_known_ones() -> None:
    with pytest.raises(TraceError) as err:
        load("nope")
    message = str(err.value)
    assert "\n" not in message and "no module 'nope'" in message
    assert all(m in message for m in MODULES)


def test_an_ambiguous_module_name_is_refused(tmp_path: Path) -> None:
    copy_module(tmp_path, MODULES[4])
    for path in files_of(MODULES[4]).values():  # the same function compiled twice
        shutil.copyfile(path, tmp_path / "dump" / path.name.replace("0008", "0010"))
    with pytest.raises(TraceError, match=re.escape("ambiguous: module_0008.jit_rnn_scan, "
                                                   "module_0010.jit_rnn_scan")):
        load("rnn_scan", tmp_path / "dump")
    assert load("10", tmp_path / "dump").name == "module_0010.jit_rnn_scan"


@pytest.mark.parametrize("module", MODULES)
def test_shared_bytes_are_counted_once(module: str) -> None:
    """XLA's packing is valid, so the buffers never need more than its allocations at once:
    every value sharing bytes (in place, alias, tuple, phi, donation) is one buffer."""
    trace = load(module)
    xla = trace.metadata["xla"]
    peak, _ = trace.peak_live()
    assert 0 < peak <= xla["total_bytes"]
    temp = role_trace(trace, ("temp",))
    assert (temp.peak_live()[0] if len(temp) else 0) <= xla["temp_bytes"]
    assert xla["buffers"] + xla["shared_values"] + sum(xla["left_out"].values()) \
        == xla["values"]


def test_in_place_dynamic_update_slice_with_and_without_donation() -> None:
    copied = load("update_cache")
    assert copied.metadata["xla"]["shared_values"] == 1        # copy.1 updated in place
    assert copied.peak_live()[0] == copied.metadata["xla"]["total_bytes"] == 4227076
    # The live-range file's own peak counts the in-place update's operand and result twice.
    assert live_range_peak("module_0004.jit_update_cache") == 6324228  # 3 x 2 MiB
    donated = load("update_cache_donated")
    assert donated.n_allocs == 3                                # the cache is one buffer
    assert donated.peak_live()[0] == 2 * 2**20 + 32768 + 4
    tags = [donated.tags[t] for t in donated.tag[donated.op == OP_ALLOC]]
    assert "cache.1: cache (+1 in place) [parameter 0, output]" in tags


def test_parameters_outputs_and_op_names_are_in_the_tags() -> None:
    trace = load("train_step")
    tags = set(trace.tags)
    assert "x.1: x [parameter 8]" in tags
    assert any(t.startswith("params_0__0_.1: params[0][0]") and "[parameter 0]" in t
               for t in tags)
    assert any("[output]" in t for t in tags)
    assert any("jit(train_step)/transpose(jvp())" in t for t in tags)
    donated = load("train_step_donated")
    assert any("[parameter 0, output]" in t for t in donated.tags)


def test_times_are_schedule_positions() -> None:
    trace = load("rnn_scan")
    assert "µs" in trace.metadata["time_unit"] and trace.metadata["synthetic_times"]
    allocs = trace.time_ns[trace.op == OP_ALLOC]
    frees = trace.time_ns[trace.op == OP_FREE]
    assert np.all(allocs % STEP_NS == 0) and np.all(frees % STEP_NS == STEP_NS // 2)
    assert np.all(np.diff(trace.time_ns) >= 0)
    length = trace.metadata["xla"]["sequence_length"]
    assert frees.max() == length * STEP_NS + STEP_NS // 2


def test_xla_reference_is_kept() -> None:
    xla = load("train_step").metadata["xla"]
    assert xla["temp_bytes"] == 1053696 and xla["alignment"] == 64
    assert xla["total_bytes"] == 6486164
    kinds = {a["role"] for a in xla["allocations"]}
    assert kinds == {"argument", "output", "temp", "constant", "thread-local"}
    temp = [a for a in xla["allocations"] if a["role"] == "temp"]
    assert temp == [{"index": 35, "size": 1053696, "kind": "preallocated-temp",
                     "role": "temp", "values": 10, "buffers": 7}]
    assert xla["id_ranges"]["argument"][0] == 0
    donated = load("train_step_donated").metadata["xla"]
    assert donated["alias_bytes"] > 0
    json.dumps(load().metadata)  # JSON-serialisable


def test_one_of_the_modules_files_reads_that_module() -> None:
    trace = formats.load(files_of(MODULES[4])["buffer-assignment"])
    assert trace.name == MODULES[4]
    with pytest.raises(TraceError, match="not this file's module"):
        formats.load(files_of(MODULES[4])["live-range"], module="train_step")


def test_values_sharing_bytes_at_other_offsets_are_merged(tmp_path: Path) -> None:
    """A value inside another's bytes at another offset, live at the same time (not what XLA
    writes today): merged, not counted twice."""
    folder = tmp_path / "dump"
    folder.mkdir()
    name = "module_0001.jit_f.gpu_after_optimizations"
    (folder / f"{name}-live-range.txt").write_text(
        "HloLiveRange (max 3):\n  InstructionSequence:\n    0:p\n    1:a\n    2:b\n"
        "  BufferLiveRange:\n    p{}:0-3\n    a{}:1-3\n    b{}:2-3\n"
        "  Live ranges at 2 (peak):\n")
    (folder / f"{name}-buffer-assignment.txt").write_text(
        "BufferAssignment:\n"
        "allocation 0: size 256, parameter 0, shape |f32[64]| at ShapeIndex {}:\n"
        " value: <0 p @0> (size=256,offset=0): f32[64]{0}\n"
        "allocation 1: size 1024, maybe-live-out:\n"
        " value: <1 a @0> (size=1024,offset=0): f32[256]{0}\n"
        " value: <2 b @0> (size=512,offset=256): f32[128]{0}\n")
    trace = formats.load(folder, view="buffers")
    xla = trace.metadata["xla"]
    assert xla["overlap_merges"] == 1 and xla["buffers"] == 2
    assert trace.peak_live()[0] == 1280 and xla["alignment"] == 256


# ============================================================================ bad input
def cut(path: Path, keep: float | None = None, lines: int | None = None) -> None:
    text = path.read_text()
    if lines is not None:
        path.write_text("".join(text.splitlines(keepends=True)[:lines]))
    else:
        path.write_bytes(text.encode()[: int(len(text) * (keep or 0.5))])


def cut_ranges(path: Path) -> None:
    """Cut a live-range file in the middle of its buffer live ranges."""
    text = path.read_text()
    path.write_text(text[: text.index("BufferLiveRange:") + 300])


def assert_one_line_exit_2(folder: Path, *args: object, expect: str) -> None:
    before = sorted(p.name for p in folder.iterdir())
    for command in (("info", folder), ("fidelity", folder)):
        status, out, err = cli(*command, *args)
        assert status == 2, (command, out, err)
        assert out == "" and err.count("\n") == 1 and err.startswith("allocsim: error: ")
        assert expect in err, err
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing written


def test_a_folder_with_no_dump_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello\n")
    assert_one_line_exit_2(tmp_path, expect="is a directory that holds no trace")


def test_a_dump_with_crlf_line_ends_reads_as_the_one_xla_wrote(tmp_path: Path) -> None:
    """Issue 25 item 9: a dump copied through Windows (CRLF line ends) was refused as having
    no header; it says the same as the LF files, so it reads to the same trace."""
    folder = tmp_path / "crlf"
    folder.mkdir()
    for path in DUMP.iterdir():
        (folder / path.name).write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    assert b"\r\n" in next(folder.iterdir()).read_bytes()
    for module in MODULES:
        want, got = load(module), load(module, folder)
        assert got.equals(want, metadata=False)
        assert got.metadata["xla"] == want.metadata["xla"]


def test_a_cut_live_range_file(tmp_path: Path) -> None:
    files = copy_module(tmp_path)
    cut_ranges(files["live-range"])
    assert_one_line_exit_2(files["live-range"].parent, expect="live-range.txt: no 'Live "
                                                              "ranges at' section")


def test_a_missing_live_range_file(tmp_path: Path) -> None:
    files = copy_module(tmp_path)
    files["live-range"].unlink()
    assert_one_line_exit_2(files["live-range"].parent, expect="has no live-range file")


@pytest.mark.parametrize("how, remove, expect", [
    ("mid-line", (), "the last line is incomplete"),
    ("lines", (), "allocations add up to"),
    ("lines", ("memory-usage-report",), "-values.txt says"),
    ("lines", ("memory-usage-report", "buffer-assignment-values"), "has no values"),
    ("after-value", ("memory-usage-report", "buffer-assignment-values"),
     "of the live-range file is in no allocation"),
])
def test_a_cut_buffer_assignment_file(tmp_path: Path, how: str, remove: tuple[str, ...],
                                      expect: str) -> None:
    files = copy_module(tmp_path)
    path = files["buffer-assignment"]
    if how == "mid-line":
        cut(path, 0.5)
    elif how == "lines":
        cut(path, lines=20)   # ends with an allocation line
    else:
        cut(path, lines=4)    # ends after a value line
    for kind in remove:
        files[kind].unlink()
    assert_one_line_exit_2(path.parent, expect=expect)


def test_an_unknown_module_on_the_command_line(tmp_path: Path) -> None:
    copy_module(tmp_path)
    assert_one_line_exit_2(tmp_path / "dump", "--module", "nope",
                           expect="no module 'nope' in the dump (modules: "
                                  "module_0000.jit_train_step)")


def test_a_cut_module_among_others_names_the_way_out(tmp_path: Path) -> None:
    files = copy_module(tmp_path, MODULES[0])
    copy_module(tmp_path, MODULES[4])
    cut_ranges(files["live-range"])
    status, _, err = cli("info", files["live-range"].parent)
    assert status == 2 and "--module NAME" in err
    status, out, _ = cli("info", files["live-range"].parent, "--module", "rnn_scan")
    assert status == 0 and "incomplete" in out


# ============================================================================ fidelity
def schema() -> dict:
    path = resources.files("allocsim.sim.output") / "schemas" / "xla-fidelity.schema.json"
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("module", MODULES)
def test_fidelity_json_validates_against_its_schema(module: str) -> None:
    status, out, err = cli("fidelity", DUMP, "--module", module, "--json")
    assert err == ""
    data = json.loads(out)
    validator = Draft202012Validator(schema())
    Draft202012Validator.check_schema(schema())
    assert not list(validator.iter_errors(data))
    assert status == data["exit_status"] == 0 and data["plan_within_xla"]
    assert data["temp"]["plan_bytes"] <= data["temp"]["xla_bytes"]
    assert data["temp"]["peak_live"] <= data["temp"]["plan_bytes"]
    assert [p["policy"] for p in data["policies"]] == ["bfc", "best-fit", "pytorch", "cupy"]
    for key in data:
        broken = copy.deepcopy(data)
        del broken[key]
        assert list(validator.iter_errors(broken)), key
    broken = copy.deepcopy(data)
    broken["temp"]["plan_bytes"] = "1MiB"
    assert list(validator.iter_errors(broken))


def test_fidelity_text() -> None:
    status, out, _ = cli("fidelity", DUMP, "--module", "train_step")
    assert status == 0
    assert "XLA temp allocation" in out and "offline plan" in out
    assert "peak live (lower bound)" in out
    for policy in ("bfc", "best-fit", "pytorch", "cupy"):
        assert re.search(rf"^    {policy} +\S+", out, re.M), policy
    assert out.rstrip().endswith("(exit 0)")


def test_fidelity_exit_1_when_the_plan_needs_more() -> None:
    trace = load("rnn_scan")
    trace.metadata["xla"] = dict(trace.metadata["xla"], temp_bytes=1000)
    report = xla_fidelity(trace, policies=["bfc"])
    assert report.exit_status == 1 and "more than XLA's temp allocation (exit 1)" in \
        report.text()


def test_info_lists_the_modules() -> None:
    status, out, _ = cli("info", DUMP)
    assert status == 0
    holds = [line for line in out.splitlines() if line.strip().startswith("holds")]
    # None is read: the runtime view replays one module, named with --module (issue 26)
    assert len(holds) == len(MODULES) and sum("(read)" in h for h in holds) == 0
    assert "choose one with --module NAME" in out
    status, out, _ = cli("info", DUMP, "--module", "rnn_scan")
    holds = [line for line in out.splitlines() if line.strip().startswith("holds")]
    assert status == 0 and len(holds) == len(MODULES) and sum("(read)" in h for h in holds) == 1


# ============================================================================ with jax
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_a_fresh_dump_from_this_jax_reads(tmp_path: Path) -> None:
    """The files this jax writes still read (catches a change of XLA's text formats)."""
    import make_xla_dumps

    make_xla_dumps.make(tmp_path / "fresh")
    for module in list_modules(tmp_path / "fresh"):
        assert module.problem is None, module.problem
        trace = load(module.key, tmp_path / "fresh")
        assert trace.peak_live()[0] <= trace.metadata["xla"]["total_bytes"]
        assert xla_fidelity(trace, policies=["bfc"]).exit_status == 0


def test_an_empty_last_allocation_without_values_is_not_a_cut_file(tmp_path: Path) -> None:
    # XLA:TPU (libtpu 0.0.42.1) ends an assignment with a 0-byte VMEM temp that holds no value
    # (a jitted exp/sin/matmul chain on f32[8192,8192]); a file cut after a header of a
    # non-empty allocation is still refused.
    from allocsim.traces.formats.xla.dump_files import parse_assignment
    text = ("BufferAssignment:\n"
            "allocation 0: size 268435456, parameter 0, shape |f32[8192,8192]| at ShapeIndex {}:\n"
            " value: <25 x.1 @0> (size=268435456,offset=0): f32[8192,8192]{1,0:T(8,128)}\n"
            "allocation 1: size 512, output shape is |f32[]|, maybe-live-out:\n"
            " value: <28 fusion @0> (size=512,offset=0): f32[]{:T(128)}\n"
            "allocation 2: size 0, color 1, preallocated-temp:\n")
    assignment = parse_assignment(text, tmp_path / "a.txt")
    assert [a.size for a in assignment.allocations] == [268435456, 512, 0]
    with pytest.raises(TraceError, match="allocation 2 has no values"):
        parse_assignment(text.replace("size 0, color 1", "size 512, color 1"), tmp_path / "a.txt")
