"""The profiler .xplane.pb importer (traces/formats/xla/xplane.py over xla/xplane_proto.py).

The real files under tests/data/xplane/ are TensorFlow 2.21 CPU runs with
TF_CPU_ALLOCATOR_USE_BFC=true (made by tests/make_xplane.py). JAX on a GPU cannot be recorded
here: its shape — the BFC allocators of the GPUs (``GPU_0_bfc``) in the host plane
``/host:CPU`` beside a ``/device:GPU:0`` plane, with the documented stats — is built with the
same writer (``encode_xspace``) and read back.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import pytest

from allocsim.sim.cli.main import main
from allocsim.traces import formats
from allocsim.traces.formats.xla.xplane import PROLOGUE_TAG
from allocsim.traces.formats.xla.xplane_proto import encode_xspace, read_xspace
from allocsim.traces.model import OP_ALLOC, OP_FREE, TraceError

DATA = Path(__file__).parent / "data" / "xplane"
DEFAULT = DATA / "tf-cpu-default.xplane.pb"
LIMITED = DATA / "tf-cpu-100mb.xplane.pb"
OOM = DATA / "tf-cpu-oom.xplane.pb"
TF_ALLOCATOR = "bfc_cpu_allocator_for_gpu"


def run_cli(*argv: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def record(kind: str, offset_ps: int, addr: int, requested: int, chunk: int, in_use: int,
           allocator: str = "GPU_0_bfc", limit: int = 1 << 30, **extra: object) -> dict:
    stats: dict[str, object] = {
        "allocator_name": allocator, "bytes_reserved": 0, "bytes_allocated": in_use,
        "bytes_available": limit - in_use, "fragmentation": 0.0, "peak_bytes_in_use": in_use,
        "requested_bytes": requested, "allocation_bytes": chunk, "addr": addr}
    stats.update(extra)
    name = "MemoryAllocation" if kind == "alloc" else "MemoryDeallocation"
    return {"name": name, "offset_ps": offset_ps, "stats": stats}


def jax_gpu_profile() -> bytes:
    """The JAX-on-GPU shape: two GPU allocators in the host plane, op events around them."""
    base0, base1 = 0x7F00_0000_0000, 0x7F10_0000_0000
    events = [
        {"name": "PjitFunction(f)", "offset_ps": 0, "stats": {"tf_op": "ignored"}},
        record("alloc", 1_000, base0, 1000, 1024, 1024, tf_op="jit(f)/dot_general",
               shape="f32[16,16]", region_type="output", data_type=11, id=3),
        record("alloc", 2_000, base0 + 1024, 4096, 4096, 5120, tf_op="jit(f)/add",
               shape="f32[32,32]"),
        record("alloc", 2_500, base1, 512, 512, 512, allocator="GPU_1_bfc"),
        record("free", 3_000, base0, 1000, 1024, 4096),
    ]
    return encode_xspace([
        {"id": 0, "name": "/host:CPU", "lines": [
            {"id": 1, "name": "python", "timestamp_ns": 5_000, "events": events}]},
        {"id": 1, "name": "/device:GPU:0", "lines": [
            {"id": 2, "name": "Stream #1", "timestamp_ns": 5_000,
             "events": [{"name": "fusion", "offset_ps": 10, "stats": {"flops": 3}}]}]},
    ])


# ------------------------------------------------------------------ the real TF files
@pytest.mark.parametrize(("path", "limit"), [(DEFAULT, 64 << 30), (LIMITED, 100 << 20),
                                             (OOM, 4 << 20)])
def test_real_tensorflow_profiles_read(path: Path, limit: int) -> None:
    trace = formats.load(path)
    meta = trace.metadata
    assert meta["format"] == "xplane" and meta["allocator"] == TF_ALLOCATOR
    assert meta["bfc_memory_limit"] == limit
    assert meta["plane"] == "/host:CPU"
    refs = meta["reference_events"]
    assert len(refs) == len(trace) and meta["prologue_events"] == 0   # traced from the start
    assert [r["event"] for r in refs] == list(range(len(trace)))
    assert (trace.time_ns[1:] >= trace.time_ns[:-1]).all()
    # the allocator's running total continues from record to record
    in_use = 0
    for r in refs:
        in_use += r["chunk"] if r["action"] == "alloc" else -r["chunk"]
        assert r["in_use"] == in_use and r["available"] + r["in_use"] == limit
    allocs = trace.op == OP_ALLOC
    assert [r["requested"] for r in refs if r["action"] == "alloc"] == \
        trace.size[allocs].tolist()
    assert any(t.startswith("MatMul [") for t in trace.tags) or path == OOM
    assert meta["listing"] == [f"allocator {TF_ALLOCATOR}: {len(refs):,} records (replayed)"]


def test_info_lists_the_allocators() -> None:
    code, out, _ = run_cli("info", DEFAULT)
    assert code == 0
    assert f"holds       allocator {TF_ALLOCATOR}: " in out and "(replayed)" in out


def test_log_folder_reads_the_newest_run(tmp_path: Path) -> None:
    profile = tmp_path / "logs" / "plugins" / "profile"
    (profile / "2025_01_01_10_00_00").mkdir(parents=True)
    (profile / "2025_01_02_09_00_00").mkdir()
    shutil.copy(OOM, profile / "2025_01_01_10_00_00" / "host.xplane.pb")
    shutil.copy(DEFAULT, profile / "2025_01_02_09_00_00" / "host.xplane.pb")
    trace = formats.load(tmp_path / "logs")
    assert trace.metadata["bfc_memory_limit"] == 64 << 30
    assert "run 2025_01_02_09_00_00 (newest of 2)" in trace.metadata["listing"]
    # a run folder itself picks that run
    older = formats.load(profile / "2025_01_01_10_00_00")
    assert older.metadata["bfc_memory_limit"] == 4 << 20


def test_a_keras_tensorboard_log_folder_is_read_from_its_train_profile(tmp_path: Path) -> None:
    """Keras' TensorBoard(log_dir, profile_batch=...) writes LOG_DIR/train/plugins/profile/RUN/
    HOST.xplane.pb beside LOG_DIR/validation/: the log folder itself is what a user passes."""
    run = tmp_path / "logs" / "train" / "plugins" / "profile" / "2025_03_04_05_06_07"
    run.mkdir(parents=True)
    (tmp_path / "logs" / "validation").mkdir()
    shutil.copy(OOM, run / "host.xplane.pb")
    trace = formats.load(tmp_path / "logs")
    assert trace.metadata["bfc_memory_limit"] == 4 << 20
    assert "run 2025_03_04_05_06_07" in trace.metadata["listing"]


@pytest.mark.parametrize("name", ["host.pb", "profile", "run.bin"])
def test_a_profile_is_recognised_by_its_content_whatever_its_name(tmp_path: Path,
                                                                   name: str) -> None:
    shutil.copy(OOM, tmp_path / name)
    assert formats.format_for(tmp_path / name, OOM.read_bytes()[:8192]) == "xplane"
    trace = formats.load(tmp_path / name)
    assert trace.metadata["bfc_memory_limit"] == 4 << 20


def test_another_protobuf_is_not_taken_for_a_profile(tmp_path: Path) -> None:
    """0x0A opens many protobufs; a first message not named like a profiler plane is not one."""
    other = b"\x0a\x0c\x08\x01\x12\x08not-a-pl" + bytes(40)
    with pytest.raises(TraceError, match="unrecognised trace format"):
        formats.format_for(tmp_path / "model.pb", other)


# ------------------------------------------------------------------ JAX on GPU (synthetic)
def test_jax_gpu_shape_default_allocator_and_choice(tmp_path: Path) -> None:
    path = tmp_path / "gpu.xplane.pb"
    path.write_bytes(jax_gpu_profile())
    trace = formats.load(path)
    meta = trace.metadata
    assert meta["allocator"] == "GPU_0_bfc" and meta["allocators"] == {"GPU_0_bfc": 3,
                                                                       "GPU_1_bfc": 1}
    assert meta["listing"] == ["allocator GPU_0_bfc: 3 records (replayed)",
                               "allocator GPU_1_bfc: 1 records"]
    assert trace.op.tolist() == [OP_ALLOC, OP_ALLOC, OP_FREE]
    assert trace.size.tolist() == [1000, 4096, 1000]
    assert trace.tag_name(int(trace.tag[0])) == "jit(f)/dot_general f32[16,16]"
    assert trace.time_ns.tolist() == [0, 1, 2]
    other = formats.load(path, allocator="GPU_1_bfc")
    assert len(other) == 1 and other.metadata["listing"][1].endswith("(replayed)")


def test_writer_output_is_what_tensorflow_parses() -> None:
    xplane_pb2 = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")
    space = xplane_pb2.XSpace()
    space.ParseFromString(jax_gpu_profile())
    assert [p.name for p in space.planes] == ["/host:CPU", "/device:GPU:0"]
    names = {k: m.name for k, m in space.planes[0].event_metadata.items()}
    first = space.planes[0].lines[0].events[1]
    assert names[first.metadata_id] == "MemoryAllocation" and first.offset_ps == 1_000
    # and our reader agrees with protobuf on a real file
    real = xplane_pb2.XSpace()
    real.ParseFromString(DEFAULT.read_bytes())
    ours = read_xspace(DEFAULT.read_bytes(), lambda name: True)
    assert [len(e) for _, _, _, e in ours[0].lines] == \
        [len(line.events) for line in real.planes[0].lines]


def test_ties_follow_the_bytes_allocated_chain(tmp_path: Path) -> None:
    """Two threads' records at the same picosecond, in file order opposite to the
    allocator's: the chain (previous in_use + chunk) decides."""
    a, b = 0x1000_0000, 0x1000_0400
    lines = [{"id": 1, "name": "t1", "timestamp_ns": 0, "events": [
                record("alloc", 0, a, 1024, 1024, 1024),
                record("alloc", 5_000, b + 1024, 256, 256, 2304)]},
             {"id": 2, "name": "t2", "timestamp_ns": 0, "events": [
                record("alloc", 5_000, b, 1024, 1024, 2048)]}]
    path = tmp_path / "ties.xplane.pb"
    path.write_bytes(encode_xspace([{"name": "/host:CPU", "lines": lines}]))
    trace = formats.load(path)
    assert [r["addr"] for r in trace.metadata["reference_events"]] == [a, b, b + 1024]
    assert trace.metadata["time_ties"] == 1


def test_mid_run_start_gets_a_prologue(tmp_path: Path) -> None:
    events = [record("free", 0, 0x2000, 300, 512, 1024),       # allocated before recording
              record("alloc", 10, 0x3000, 100, 256, 1280)]
    path = tmp_path / "mid.xplane.pb"
    path.write_bytes(encode_xspace([{"name": "/host:CPU", "lines": [
        {"name": "python", "events": events}]}]))
    trace = formats.load(path)
    assert trace.metadata["prologue_events"] == 1
    assert trace.tag_name(int(trace.tag[0])) == PROLOGUE_TAG
    assert trace.op.tolist() == [OP_ALLOC, OP_FREE, OP_ALLOC] and trace.size[0] == 300
    assert [r["event"] for r in trace.metadata["reference_events"]] == [1, 2]


# ------------------------------------------------------------------ bad input: one line, exit 2
def bad(tmp_path: Path, *argv: object) -> str:
    code, out, err = run_cli(*argv)
    assert code == 2, (code, out, err)
    assert err.count("\n") == 1 and err.startswith("allocsim: error: ")
    return err


def test_log_folder_without_profile(tmp_path: Path) -> None:
    (tmp_path / "logs" / "plugins" / "profile").mkdir(parents=True)
    (tmp_path / "logs" / "events.out.tfevents.1.host").write_bytes(b"")
    assert "no profile in this log folder" in bad(tmp_path, "info", tmp_path / "logs")


def test_xplane_without_memory_records(tmp_path: Path) -> None:
    path = tmp_path / "ops.xplane.pb"
    path.write_bytes(encode_xspace([{"name": "/host:CPU", "lines": [
        {"name": "python", "events": [{"name": "MatMul", "offset_ps": 1}]}]}]))
    err = bad(tmp_path, "info", path)
    assert "no BFC memory records" in err and "TF_CPU_ALLOCATOR_USE_BFC" in err
    with pytest.raises(TraceError):
        formats.load(path)


def test_unknown_allocator_lists_the_known_ones(tmp_path: Path) -> None:
    err = bad(tmp_path, "info", DEFAULT, "--allocator", "GPU_0_bfc")
    assert "no allocator 'GPU_0_bfc'" in err and f"{TF_ALLOCATOR} (235 records)" in err


def test_truncated_protobuf(tmp_path: Path) -> None:
    path = tmp_path / "cut.xplane.pb"
    data = DEFAULT.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert "truncated or damaged" in bad(tmp_path, "fidelity", path)


def test_an_address_past_64_bits_is_one_line_naming_it(tmp_path: Path) -> None:
    huge = 10**19    # a uint64 stat past int64: read as int64 it would wrap to a negative
    events = [record("alloc", 1_000, huge, 1024, 1024, 1024),
              record("free", 2_000, huge, 1024, 1024, 0)]
    path = tmp_path / "huge.xplane.pb"
    path.write_bytes(encode_xspace([{"id": 0, "name": "/host:CPU", "lines": [
        {"id": 1, "name": "python", "timestamp_ns": 5_000, "events": events}]}]))
    message = bad(tmp_path, "fidelity", path)
    assert "10,000,000,000,000,000,000" in message and "event 0" in message
