"""Tests for allocsim.traces.record: the CuPy hook recorder (driven directly, as CuPy would call
it), run_script, the torch profiler recorder (skipped without torch) and the bundled samples."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import allocsim.traces.record
from allocsim.traces.formats import load
from allocsim.traces.formats.cupy_log import read_cupy_log
from allocsim.traces.model import OP_ALLOC, OP_FREE
from allocsim.traces.record import cupy_hook
from allocsim.traces.record.cupy_hook import TraceRecorderHook, active_recorder, run_script
from allocsim.traces.validate import validate

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "traces" / "data"
SAMPLES = ["sample-torch-cpu-mlp.npz", "sample-torch-cpu-transformer.npz"]


def drive(hook: TraceRecorderHook) -> None:
    """The callbacks CuPy makes for: a pool miss + malloc, a malloc, a free, a malloc that
    reuses the freed address, and a free of a buffer malloc'ed before recording."""
    hook.alloc_postprocess(device_id=0, mem_size=1024, mem_ptr=4096)
    hook.malloc_postprocess(device_id=0, size=1000, mem_size=1024, mem_ptr=4096, pmem_id=11)
    hook.malloc_postprocess(device_id=0, size=24, mem_size=512, mem_ptr=8192, pmem_id=12)
    hook.free_postprocess(device_id=0, mem_size=1024, mem_ptr=4096, pmem_id=11)
    hook.malloc_postprocess(device_id=0, size=700, mem_size=1024, mem_ptr=4096, pmem_id=13)
    hook.free_postprocess(device_id=0, mem_size=512, mem_ptr=65536, pmem_id=9)


def test_importing_traces_record_imports_neither_cupy_nor_torch():
    code = ("import sys, allocsim.traces.record; "
            "assert 'cupy' not in sys.modules and 'torch' not in sys.modules, 'imported'")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert allocsim.traces.record.TraceRecorderHook is TraceRecorderHook


def test_hook_callbacks_make_the_right_trace():
    streams = iter([0, 0, 7, 7, 7, 0])
    hook = TraceRecorderHook(stream=lambda: next(streams))
    drive(hook)
    assert len(hook) == 6
    trace = hook.build_trace()
    assert trace.op.tolist() == [OP_ALLOC, OP_ALLOC, OP_ALLOC, OP_FREE, OP_ALLOC, OP_FREE]
    assert trace.size.tolist() == [512, 1000, 24, 1000, 700, 512]  # prologue buffer first
    assert trace.id.tolist() == [3, 0, 1, 0, 2, 3]
    assert trace.stream.tolist() == [0, 0, 1, 0, 1, 0]
    assert np.all(np.diff(trace.time_ns) >= 0) and trace.time_ns[0] == 0
    meta = trace.metadata
    assert meta["recorder"].startswith("allocsim TraceRecorderHook")
    assert meta["prologue_events"] == 1 and meta["synthetic_times"] is False
    assert meta["reference_events"] == [{"action": "segment_alloc", "addr": 4096,
                                         "size": 1024, "stream": 0, "time_ns": 0, "event": 1}]
    # The call site is this test (the first frame outside the recorder package).
    site = trace.tag_name(int(trace.tag[1]))
    assert site is not None and site.endswith(":drive")
    assert "test_recorders.py:" in site
    validate(trace)


def test_hook_without_call_sites_or_events():
    hook = TraceRecorderHook(call_sites=False)
    assert len(hook.build_trace()) == 0
    drive(hook)
    assert set(hook.build_trace().tag.tolist()) == {-1, 0}  # only the prologue's tag


def test_context_manager_writes_trace_and_log(tmp_path):
    out, log = tmp_path / "run.npz", tmp_path / "run.cupy.jsonl"
    with allocsim.traces.record.cupy(out, log=log, metadata={"workload": "test"}) as hook:
        assert active_recorder() is hook
        drive(hook)
    assert active_recorder() is None
    trace = load(out)
    assert len(trace) == 6 and trace.metadata["workload"] == "test"
    assert trace.equals(hook.trace, metadata=False)
    # The log reads back (by content) as the same events.
    from_log = load(log)
    assert from_log.metadata["format"] == "cupy-log" and from_log.metadata["workload"] == "test"
    for column in ("op", "id", "size", "stream", "time_ns"):
        assert np.array_equal(getattr(from_log, column), getattr(trace, column)), column
    assert [from_log.tag_name(int(t)) for t in from_log.tag] == \
           [trace.tag_name(int(t)) for t in trace.tag]
    again = read_cupy_log(log.read_bytes(), str(log), "run")
    assert again.metadata["reference_events"] == trace.metadata["reference_events"]


def test_context_manager_saves_csv_on_error(tmp_path):
    out = tmp_path / "partial.csv"
    with pytest.raises(RuntimeError):
        with allocsim.traces.record.cupy(out) as hook:
            hook.malloc_postprocess(device_id=0, size=8, mem_size=512, mem_ptr=1, pmem_id=1)
            raise RuntimeError("the program failed")
    assert load(out).n_allocs == 1


SCRIPT = """\
import sys
from allocsim.traces.record.cupy_hook import active_recorder

def allocate(hook, n):
    for i in range(n):
        hook.malloc_postprocess(device_id=0, size=100 + i, mem_size=512, mem_ptr=512 * (i + 1),
                                pmem_id=i + 1)
    for i in range(n):
        hook.free_postprocess(device_id=0, mem_size=512, mem_ptr=512 * (i + 1), pmem_id=i + 1)

hook = active_recorder()
assert hook is not None
assert sys.argv[1:] == ["--steps", "3"], sys.argv
allocate(hook, int(sys.argv[2]))
if __name__ == "__main__":
    raise SystemExit(EXIT)
"""


def write_script(folder: Path, exit_code: int) -> Path:
    path = folder / "fake_train.py"
    path.write_text(SCRIPT.replace("EXIT", str(exit_code)))
    return path


@pytest.fixture
def quiet_without_cupy():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "CuPy is not importable", RuntimeWarning)
        yield


def test_run_script_records_a_script(tmp_path, quiet_without_cupy):
    script = write_script(tmp_path, 0)
    out = tmp_path / "out.npz"
    saved_argv = list(sys.argv)
    trace = run_script(["python", str(script), "--steps", "3"], out)
    assert sys.argv == saved_argv
    assert trace.size.tolist() == [100, 101, 102, 100, 101, 102]
    loaded = load(out)
    assert loaded.equals(trace)
    assert loaded.metadata["script"] == str(script)
    assert loaded.metadata["argv"] == ["python", str(script), "--steps", "3"]
    assert {loaded.tag_name(int(t)).rsplit(":", 1)[1] for t in loaded.tag} == {"allocate"}
    # Also through the package-level entry point, without the interpreter name.
    assert len(allocsim.traces.record.run_script([str(script), "--steps", "3"], out)) == 6


def test_run_script_saves_then_reraises_a_failure(tmp_path, quiet_without_cupy):
    script = write_script(tmp_path, 3)
    out = tmp_path / "out.jsonl"
    with pytest.raises(SystemExit) as stopped:
        run_script([sys.executable, str(script), "--steps", "3"], out)
    assert stopped.value.code == 3
    assert len(load(out)) == 6


def test_run_script_argument_errors(tmp_path):
    with pytest.raises(ValueError):
        run_script(["python"], tmp_path / "x.npz")
    with pytest.raises(FileNotFoundError):
        run_script(["python", str(tmp_path / "missing.py")], tmp_path / "x.npz")


@pytest.mark.skipif(cupy_hook.CUPY_AVAILABLE, reason="CuPy is installed")
def test_run_script_warns_without_cupy(tmp_path):
    script = write_script(tmp_path, 0)
    with pytest.warns(RuntimeWarning, match="CuPy is not importable"):
        run_script([str(script), "--steps", "3"], tmp_path / "x.npz")


def test_record_torch(tmp_path):
    torch = pytest.importorskip("torch")
    from allocsim.traces.record.torch.profiler import record_torch

    def work(n: int) -> None:
        layer = torch.nn.Linear(32, 64)
        for _ in range(n):
            layer(torch.randn(8, 32)).sum().backward()

    out = tmp_path / "torch.npz"
    trace = record_torch(work, 2, output=out, metadata={"workload": "linear"})
    loaded = load(out)
    assert loaded.equals(trace)
    meta = loaded.metadata
    assert meta["torch"] == torch.__version__ and meta["workload"] == "linear"
    assert meta["recorder"].startswith("allocsim record_torch") and meta["device"] == "cpu"
    assert meta["function"].endswith("work")
    assert loaded.n_allocs > 0 and any(t.startswith("aten::") for t in loaded.tags)
    with pytest.raises(ValueError):
        record_torch(work, 1, output=None, device="tpu")


FAKE_CUPY = {
    "cupy/__init__.py": "__version__ = '0.0-fake'\nfrom cupy import cuda\n",
    "cupy/cuda/__init__.py": (
        "from cupy.cuda import memory_hook\n"
        "class _Stream:\n    ptr = 1234\n"
        "def get_current_stream():\n    return _Stream()\n"),
    # CuPy's registry, and a pool that calls the hooks as SingleDeviceMemoryPool does.
    "cupy/cuda/memory_hook.py": (
        "_hooks = {}\n"
        "def get_memory_hooks():\n    return _hooks\n"
        "class MemoryHook:\n"
        "    name = 'MemoryHook'\n"
        "    def __enter__(self):\n"
        "        if self.name in _hooks:\n            raise KeyError(self.name)\n"
        "        _hooks[self.name] = self\n        return self\n"
        "    def __exit__(self, *_):\n        del _hooks[self.name]\n"
        "def pool_malloc(size, ptr):\n"
        "    for hook in list(_hooks.values()):\n"
        "        hook.malloc_postprocess(device_id=0, size=size, mem_size=512, mem_ptr=ptr,\n"
        "                                pmem_id=ptr)\n"
        "def pool_free(ptr):\n"
        "    for hook in list(_hooks.values()):\n"
        "        hook.free_postprocess(device_id=0, mem_size=512, mem_ptr=ptr, pmem_id=ptr)\n"),
    "use_pool.py": (
        "import sys, allocsim.traces.record\n"
        "from allocsim.traces.formats import load\n"
        "from allocsim.traces.record import cupy_hook\n"
        "from cupy.cuda import memory_hook\n"
        "assert cupy_hook.CUPY_AVAILABLE\n"
        "assert issubclass(cupy_hook.TraceRecorderHook, memory_hook.MemoryHook)\n"
        "with allocsim.traces.record.cupy(sys.argv[1]):\n"
        "    assert list(memory_hook.get_memory_hooks()) == ['allocsim-trace-recorder']\n"
        "    memory_hook.pool_malloc(8, 4096)\n"
        "    memory_hook.pool_free(4096)\n"
        "assert not memory_hook.get_memory_hooks()\n"
        "trace = load(sys.argv[1])\n"
        "assert trace.metadata['cupy'] == '0.0-fake', trace.metadata\n"
        "assert trace.metadata['stream_handles'] == {'0': 1234}, trace.metadata\n"
        "assert [trace.tag_name(int(t)) for t in trace.tag] == "
        "['use_pool.py:9:<module>', 'use_pool.py:10:<module>'], trace.tags\n"),
}


def test_with_cupy_importable_the_hook_is_a_memory_hook(tmp_path):
    """With a stand-in CuPy package on the path: subclassing, CuPy-style registration in
    the with-block, the current stream and call sites outside CuPy's frames."""
    for name, text in FAKE_CUPY.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "use_pool.py", str(tmp_path / "out.npz")],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.gpu
def test_cupy_recorder_on_a_gpu(tmp_path):
    cupy = pytest.importorskip("cupy")
    out = tmp_path / "gpu.npz"
    with allocsim.traces.record.cupy(out):
        a = cupy.ones((1024, 1024), dtype=cupy.float32)
        b = a * 2
        del a
        float(b.sum())
    trace = load(out)
    assert trace.n_allocs >= 3 and trace.metadata["cupy"] == cupy.__version__


@pytest.mark.parametrize("name", SAMPLES)
def test_bundled_samples_load_and_are_valid(name):
    path = DATA / name
    assert path.stat().st_size < 1_000_000
    trace = load(path)  # native .npz: strict validation
    meta = trace.metadata
    assert meta["name"] == name[:-4] and meta["source"] == f"traces/data/{name}"
    assert meta["recorder"].startswith("allocsim record_torch")
    assert meta["torch"].startswith("2.") and meta["script"] == "experiments/record_samples.py"
    assert meta["device"] == "cpu" and meta["format"] == "torch-profiler"
    assert trace.n_allocs > 200 and trace.n_frees > 200
    assert trace.peak_live()[0] > 1_000_000
    assert any(tag.startswith("aten::") for tag in trace.tags)
