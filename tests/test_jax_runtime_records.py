"""The JAX recorder keeps a TPU runtime's own allocation records beside its trace
(traces/record/jax_recorder/runtime_records.py): NAME.runtime.npz, read from a profiler session
it runs for the recording; on other platforms it starts none and says why."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

jax = pytest.importorskip("jax", reason="jax is not installed: the JAX recorder needs it")
jnp = pytest.importorskip("jax.numpy")

import allocsim.traces.record  # noqa: E402
from allocsim.traces.formats import load  # noqa: E402
from allocsim.traces.record.jax_recorder.runtime_records import RuntimeRecords, beside  # noqa: E402

MIDRUN = Path(__file__).parent / "data" / "tpu" / "midrun"   # a TPU profile the chip wrote


def test_the_runtimes_records_go_beside_the_trace_by_its_name() -> None:
    assert beside("/x/run.npz") == Path("/x/run.runtime.npz")
    # every dot but the extension's is the name's: my.run.v2 is not my (issue 56, item 5)
    assert beside("/x/my.run.v2.npz") == Path("/x/my.run.v2.runtime.npz")
    assert beside("/x/run.trace.jsonl") == Path("/x/run.trace.runtime.npz")
    assert beside("/x/run.jsonl.gz") == Path("/x/run.runtime.npz")
    assert beside("/x/run") == Path("/x/run.runtime.npz")


def test_a_file_at_the_records_path_that_is_not_their_earlier_copy_is_refused_first(
        tmp_path: Path) -> None:
    from allocsim.errors import UserInputError
    from allocsim.traces.formats import save
    from allocsim.traces.model import Trace
    other = Trace.from_columns([0, 1], [0, 1], [0, 0], [512, 512], name="another recording")
    save(other, tmp_path / "run.runtime.npz")        # another recording's own name
    before = (tmp_path / "run.runtime.npz").read_bytes()
    with pytest.raises(UserInputError, match="not an earlier copy"):
        RuntimeRecords(tmp_path / "run.npz")
    assert (tmp_path / "run.runtime.npz").read_bytes() == before
    (tmp_path / "notes.runtime.npz").write_text("my notes")      # not a trace at all
    with pytest.raises(UserInputError, match="not an earlier copy"):
        RuntimeRecords(tmp_path / "notes.npz")
    mine = Trace.from_columns([0, 1], [0, 1], [0, 0], [512, 512], runtime_records_of="r.npz")
    save(mine, tmp_path / "r.runtime.npz")           # this recording's earlier records
    RuntimeRecords(tmp_path / "r.npz")


def test_off_a_tpu_no_profiler_session_is_started_and_the_trace_says_why(tmp_path: Path) -> None:
    out = tmp_path / "run.npz"
    with allocsim.traces.record.jax(out):
        jnp.ones((64, 64)).block_until_ready()
    note = load(out).metadata["runtime_records"]["note"]
    assert note.startswith("not taken: the cpu runtime writes no allocation records")
    assert not beside(out).exists()


def test_a_tpu_sessions_records_are_read_and_written_beside_the_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The session's folder holds what the chip wrote in a real run (the profiler itself
    # cannot run here without a TPU: start and stop are the only parts not exercised).
    records = RuntimeRecords(tmp_path / "run.npz")
    records.folder = tmp_path / "session"
    shutil.copytree(MIDRUN, records.folder)
    monkeypatch.setattr(jax.profiler, "stop_trace", lambda: None)
    trace = records.stop(recorded_peak=123)
    assert trace is not None and not records.folder
    kept = load(tmp_path / "run.runtime.npz")
    expected = load(MIDRUN)
    assert len(kept) == len(expected) == records.summary["records"]
    assert (kept.size == expected.size).all() and (kept.op == expected.op).all()
    assert records.summary["recorder_peak_live"] == 123
    assert records.summary["runtime_peak_in_use"] > 0
    assert not (tmp_path / "session").exists()          # the session's folder is removed


def test_a_session_that_cannot_start_is_noted_not_raised(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    def busy(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Only one profile may be run at a time.")
    monkeypatch.setattr(jax.profiler, "start_trace", busy)
    records = RuntimeRecords(tmp_path / "run.npz")
    records.start("tpu")
    assert records.folder is None
    assert "could not start" in records.summary["note"]
    assert records.stop(recorded_peak=0) is None


# -- recorded on the chip (experiments/tpu/record_on_chip.sh: jax 0.10.2, libtpu 0.0.42.1) ----
CHIP = Path(__file__).parent / "data" / "tpu" / "recorder"


@pytest.mark.parametrize("run", ["train", "train-nojit"])
def test_on_the_chip_the_recorder_kept_the_runtimes_records_and_the_model_places_them(
        run: str) -> None:
    from allocsim.sim.questions.fidelity.tpu import tpu_fidelity
    recording = load(CHIP / f"{run}.npz")
    runtime = load(CHIP / f"{run}.runtime.npz")
    summary = recording.metadata["runtime_records"]
    assert summary["file"] == f"{run}.runtime.npz"
    assert summary["records"] == len(runtime)
    assert summary["recorder_peak_live"] == recording.peak_live()[0]
    assert summary["runtime_peak_in_use"] == runtime.peak_live()[0]
    report = tpu_fidelity(runtime)
    assert report.matched == report.total == len(runtime)
