"""DynaPipe's simulator in the native benchmark (benchmarks/dynapipe.py): fed the trace's
events in order, each free given the block its malloc returned, timed only when its file is
given, and a wrong file is one line naming it. DynaPipe's own file is not in this repository,
so a stand-in with its interface (``TorchCachingAllocatorSimulator(max_memory_mbytes)``,
``malloc(size, stream)`` → block, ``free(block)``, ``peak_backend_allocated_bytes``) records
what it is asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocsim.sim.kernel.native import core
from allocsim.traces.model import Trace
from benchmarks import dynapipe
from benchmarks import native as bench_native

STAND_IN = '''
from dataclasses import dataclass


@dataclass
class Block:
    size: int
    stream: int


class TorchCachingAllocatorSimulator:
    def __init__(self, max_memory_mbytes):
        self.max_memory = max_memory_mbytes * 1e6
        self.calls = []
        self.held = 0
        self.peak_backend_allocated_bytes = 0

    def malloc(self, size, stream=0):
        self.calls.append(("malloc", size, stream))
        self.held += size
        self.peak_backend_allocated_bytes = max(self.peak_backend_allocated_bytes, self.held)
        return Block(size, stream)

    def free(self, block):
        self.calls.append(("free", block.size, block.stream))
        self.held -= block.size
'''


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    path = tmp_path / "allocation_simulator.py"
    path.write_text(STAND_IN)
    return path


def test_each_free_hands_back_the_block_its_malloc_returned(stand_in: Path) -> None:
    trace = Trace.from_events([(0, "alloc", 1, 100), (1, "alloc", 2, 300),
                               (2, "free", 1, 100), (3, "alloc", 3, 50),
                               (4, "free", 3, 50), (5, "free", 2, 300)])
    simulator = dynapipe.dynapipe_runner(trace, dynapipe.load_simulator(stand_in))()
    assert simulator.calls == [("malloc", 100, 0), ("malloc", 300, 0), ("free", 100, 0),
                               ("malloc", 50, 0), ("free", 50, 0), ("free", 300, 0)]
    assert dynapipe.peak_reserved(simulator) == 400
    assert simulator.max_memory >= 1e18         # a device no replay here fills


@pytest.mark.parametrize(("content", "says"), [
    (None, "no such file"),
    ("x = 1\n", "has no TorchCachingAllocatorSimulator"),
    ("import no_such_module_here\n", "cannot import it"),
])
def test_a_wrong_file_is_one_line_naming_it(tmp_path: Path, content: str | None,
                                             says: str) -> None:
    path = tmp_path / "allocation_simulator.py"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as stopped:
        dynapipe.load_simulator(path)
    message = str(stopped.value)
    assert message.startswith(str(path)) and says in message and "\n" not in message


@pytest.mark.skipif(core() is None, reason="the native core is not built")
def test_pytorch_is_set_against_the_measured_simulator_only_when_its_file_is_given(
        stand_in: Path, capsys: pytest.CaptureFixture) -> None:
    from allocsim.traces import synth

    trace = synth.generate("random", seed=0, events=2000, live=40)
    profile = bench_native.bench_profile("a100-80g", None)
    without = bench_native.measure_speed(trace, ["pytorch"], profile, repeat=1)
    assert "DynaPipe" not in capsys.readouterr().out
    assert "dynapipe_x" not in without[-1]
    rows = bench_native.measure_speed(trace, ["pytorch"], profile, repeat=1,
                                      dynapipe=str(stand_in))
    out = capsys.readouterr().out
    measured = next(row for row in rows if row["policy"] == "DynaPipe's simulator")
    assert measured["events"] == len(trace) and measured["cpu_s"] > 0
    pytorch = rows[-1]
    assert pytorch["dynapipe_x"] == pytest.approx(measured["cpu_s"] / pytorch["cpu_s"])
    assert "DynaPipe's simulator, measured" in out and "estimate" not in out


def test_the_replay_benchmark_measures_it_beside_its_floor_or_says_estimated(
        stand_in: Path, capsys: pytest.CaptureFixture) -> None:
    from allocsim.traces import synth
    from benchmarks import replay as bench_replay

    trace = synth.generate("random", seed=1, events=2000, live=40)
    estimated = bench_replay.measure_speed(trace, ["pytorch"], "a100-80g", repeat=1)
    out = capsys.readouterr().out
    assert "estimated" in out and "measured" not in out
    assert "dynapipe_x" not in estimated[-1] and "dynapipe_x_estimated" in estimated[-1]
    rows = bench_replay.measure_speed(trace, ["pytorch"], "a100-80g", repeat=1,
                                      dynapipe=str(stand_in))
    out = capsys.readouterr().out
    measured = next(row for row in rows if row["policy"] == "DynaPipe's simulator")
    assert measured["events"] == len(trace) and measured["floor_ratio"] > 0
    assert rows[-1]["dynapipe_x"] == pytest.approx(measured["seconds"] / rows[-1]["seconds"])
    assert "DynaPipe's simulator, measured" in out and "estimated" not in out
