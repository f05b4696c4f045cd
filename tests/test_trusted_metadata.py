"""A trace's metadata is checked once, where the trace is loaded, against the shape
allocsim's readers write: a native file that carries other values under those keys is one
line naming the file and the key, not a TypeError in ``info``, a KeyError in ``fidelity`` or a
"limit -1.00TiB" (issue 36, items 11 and 14). Call-site line numbers no int can print are no
line numbers."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from one_line import refused
from snapshot_checks import block, entry, read, segment

from allocsim.sim.cli.main import main
from allocsim.traces import formats, synth
from allocsim.traces.metadata import check_metadata
from allocsim.traces.model import TraceError

XLA_DUMP = Path(__file__).parent / "data" / "xla" / "cpu"


def saved_with(tmp_path: Path, **metadata: Any) -> Path:
    trace = synth.generate("training", seed=1, events=200)
    trace.metadata.update(metadata)
    path = tmp_path / "t.npz"
    formats.save(trace, path)
    return path


@pytest.mark.parametrize(("metadata", "needle"), [
    ({"prologue_events": "x"}, "metadata 'prologue_events' must be a count, got 'x'"),
    ({"prologue_events": [1]}, "metadata 'prologue_events' must be a count"),
    ({"reference_events": 5}, "metadata 'reference_events' must be a list, got 5"),
    ({"reference_events": [{"action": "alloc", "event": 0}, 7]},
     "metadata 'reference_events'[1] must be an object, got 7"),
    ({"unrecorded_live_bytes": 3}, "metadata 'unrecorded_live_bytes' must be an object"),
    ({"devices": {"0": "x"}}, "metadata 'devices'['0'] must be a count, got 'x'"),
    ({"name": 5}, "metadata 'name' must be text, got 5"),
])
def test_info_refuses_metadata_of_another_shape_naming_file_and_key(capsys, tmp_path,
                                                                    metadata, needle):
    path = saved_with(tmp_path, **metadata)
    line = refused(capsys, "info", path)
    assert line.startswith(f"allocsim: error: {path}: ") and needle in line, line


@pytest.mark.parametrize(("metadata", "needle"), [
    ({"format": "xplane", "bfc_memory_limit": -1},
     "metadata 'bfc_memory_limit' must be a number of bytes from 0 to"),
    ({"format": "xplane", "bfc_memory_limit": "lots"},
     "metadata 'bfc_memory_limit' must be a number of bytes, got 'lots'"),
    ({"format": "xla-dump", "xla": {"module": "m", "platform": "cpu", "view": "buffers"}},
     "metadata 'xla' has no 'alignment'"),
    ({"format": "xla-dump", "xla": {"module": "m", "platform": "cpu", "alignment": 0}},
     "metadata 'xla'['alignment'] must be an alignment in bytes from 1"),
    ({"format": "torch-snapshot", "reference_events": [{"action": "alloc", "event": 0}]},
     "metadata 'reference_events'[0] has no 'addr'"),
])
@pytest.mark.parametrize("command", [["fidelity"], ["tune", "--framework", "pytorch"]])
def test_fidelity_and_tune_refuse_it_too(capsys, tmp_path, metadata, needle, command):
    path = saved_with(tmp_path, **metadata)
    name, *rest = command
    line = refused(capsys, name, path, *rest)
    assert needle in line, line


def test_what_the_readers_write_passes_and_survives_a_save(tmp_path: Path) -> None:
    trace = formats.load(XLA_DUMP, module="jit_train_step", view="buffers")
    path = tmp_path / "buffers.npz"
    formats.save(trace, path)
    again = formats.load(path)
    assert again.metadata["xla"]["alignment"] == trace.metadata["xla"]["alignment"]
    del again.metadata["xla"]["alignment"]
    with pytest.raises(TraceError, match="has no 'alignment'"):
        check_metadata(again.metadata, str(path))


# -- call-site line numbers ----------------------------------------------------------------

def test_a_snapshot_frame_line_no_int_can_print_is_no_line() -> None:
    frames = [{"filename": "train.py", "line": 10 ** 5000, "name": "step"}]
    trace = read({"segments": [segment(1 << 20, 2 << 20, [block(1 << 20, 2 << 20, 0,
                                                               "inactive")])],
                  "device_traces": [[entry("alloc", 1 << 20, 512, frames=frames),
                                     entry("free_requested", 1 << 20, 512),
                                     entry("free_completed", 1 << 20, 512)]]})
    assert trace.tags == ["train.py:0:step"]


def test_a_tag_with_a_5000_digit_line_exports_as_a_bare_tag(capsys, tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("time_ns,op,id,size,tag\n0,alloc,1,64,f.py:" + "9" * 5000 + ":g\n"
                    "1,free,1,64,\n")
    out = tmp_path / "x.pickle"
    assert main(["export-snapshot", str(path), "--policy", "pytorch", "-o", str(out)]) == 0, \
        capsys.readouterr().err
    frames = [f for seg in pickle.loads(out.read_bytes())["device_traces"][0]
              for f in seg.get("frames", [])]
    assert frames and all(isinstance(f["line"], int) and f["line"] < 1 << 31 for f in frames)


# -- a results file's names ------------------------------------------------------------------

def test_a_results_file_whose_trace_name_holds_a_lone_surrogate_is_one_line(capsys, tmp_path):
    # JSON's "\ud800" is a str Python holds but no UTF-8 text: matplotlib's title raised a
    # TypeError with a page of signature.
    out = tmp_path / "run"
    assert main(["compare", "default", "--policies", "bfc", "-o", str(out)]) == 0
    document = json.loads((out / "results.json").read_text())
    document["trace"]["name"] = "a\ud800b"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(document))
    line = refused(capsys, "report", edited, "-o", tmp_path / "r.html")
    assert line == (f"allocsim: error: {edited}: trace.name: not text (it holds a lone UTF-16 "
                    "surrogate)"), line
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("command", [["compare"], ["tune", "--framework", "pytorch"]])
def test_a_compile_target_of_another_shape_is_one_line(capsys, tmp_path, command):
    path = saved_with(tmp_path, xla_gpu={"target": "a100-80g", "device_memory_size": [1]})
    name, *rest = command
    line = refused(capsys, name, path, *rest)
    assert "metadata 'xla_gpu'['device_memory_size'] must be a number of bytes, got [1]" in line
