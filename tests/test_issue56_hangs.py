"""Issue 56, items 6 and 12: input that hung or crashed, each now answered (or refused in one
line, exit 2, no traceback) within seconds.

- ``allocsim size`` of a rank-1000 shape took minutes (every pair of dimensions was tried);
  it answers at once, with the answers of the pair-by-pair rule (checked here against it);
- a sweep results file with a line nested 100,000 deep was a RecursionError on resuming and
  on ``--report``: it is refused naming the file and the line;
- an xplane whose timestamps sit at both ends of int64 printed numpy's RuntimeWarning (two
  more lines) before its one error line: the one line is all there is.
"""

from __future__ import annotations

import json
import math
import random
import time
import warnings
from pathlib import Path

import pytest

from allocsim.sim.cli.main import main
from allocsim.traces.formats.xla.xplane_proto import encode_xspace
from allocsim.traces.tpu_layout import (
    GRANULE,
    LANES,
    TYPE_BITS,
    _row_choices,
    parse_shape,
    tpu_layout,
)
from tests.one_line import refused

# ------------------------------------------------------------------ 1. allocsim size, rank 1000


def pair_by_pair(text: str) -> tuple[tuple[int, ...], tuple[int, int], int]:
    """The rule as it was written first: every pair of dimensions and row count tried
    (minor_to_major, tile, bytes); the fewest bytes, then the own order, then the taller tile,
    then the first pair tried."""
    dtype, dims = parse_shape(text)
    bits, rank = TYPE_BITS[dtype], len(dims)
    best = None
    for second in range(rank):
        for minor in range(rank):
            if second == minor:
                continue
            majors = [d for d in range(rank) if d not in (second, minor)]
            order = (*majors, second, minor)
            for rows in _row_choices(dims[second], bits):
                tiles = (math.prod(dims[d] for d in majors) * -(-dims[second] // rows)
                         * -(-dims[minor] // LANES))
                size = -(-(tiles * rows * LANES * bits // 8) // GRANULE) * GRANULE
                key = (size, order != tuple(range(rank)), -rows)
                if best is None or key < best[0]:
                    best = (key, order, rows)
    assert best is not None
    (size, _, _), order, rows = best
    return tuple(reversed(order)), (rows, LANES), size


def test_the_fast_rule_gives_the_pair_by_pair_answers() -> None:
    rng = random.Random(56)
    sizes = [0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 32, 33, 64, 65, 127, 128, 129, 256, 257, 1000,
             1 << 40]
    for _ in range(3000):
        rank = rng.choice([2, 2, 3, 3, 4, 5, 7])
        dims = [rng.choice(sizes) if rng.random() < 0.7 else rng.randint(1, 300)
                for _ in range(rank)]
        if 0 in dims and rng.random() < 0.8:
            dims = [d or 1 for d in dims]
        text = f"{rng.choice(list(TYPE_BITS))}[{','.join(map(str, dims))}]"
        got = tpu_layout(text)
        assert (got.minor_to_major, got.tile, got.bytes) == pair_by_pair(text), text


@pytest.mark.parametrize("dims", [[1] * 1000, list(range(1, 1001)), [1, 2, 3, 128, 129] * 200],
                         ids=["ones", "distinct", "repeated"])
def test_size_of_rank_1000_answers_within_2_s(capsys, dims: list[int]) -> None:
    shape = f"f32[{','.join(map(str, dims))}]"
    start = time.perf_counter()
    code = main(["size", "--json", shape])
    elapsed = time.perf_counter() - start
    out = capsys.readouterr().out
    assert code == 0 and elapsed < 2.0, elapsed
    (answer,) = json.loads(out)
    assert answer["shape"] == shape
    if dims == [1] * 1000:   # one element: one (1, 128) tile in the array's own order
        order = ",".join(str(d) for d in reversed(range(1000)))
        assert answer == {"shape": shape, "bytes": 512, "nbytes": 4,
                          "layout": f"{shape}{{{order}:T(1,128)}}"}


def test_a_shape_past_any_printable_byte_count_is_one_line(capsys) -> None:
    shape = f"f32[{','.join([str(1 << 40)] * 400)}]"     # 2^16000 elements
    start = time.perf_counter()
    line = refused(capsys, "size", shape)
    assert time.perf_counter() - start < 2.0
    assert "more than 4,300 digits" in line


# ------------------------------------------------------------------ 2. a results file nested deep

RECORD = {"cell": "synth:random?events=300&seed=1 | bfc | a100-80g | default",
          "trace": "synth:random?events=300&seed=1", "policy": "bfc", "device": "a100-80g",
          "capacity": None, "status": "error", "error": "TraceError: x", "result": None}
NESTED = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def grid(tmp_path: Path) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text('[grid]\ntraces = ["synth:random?events=300&seed=1"]\npolicies = ["bfc"]\n')
    return path


@pytest.mark.parametrize("nested", [NESTED, '{"cell":"a","result":' + NESTED + "}"],
                         ids=["array", "inside-a-record"])
@pytest.mark.parametrize("report", [False, True], ids=["resume", "report"])
def test_a_results_line_nested_100000_deep_is_one_line_naming_it(capsys, tmp_path: Path,
                                                                 grid: Path, nested: str,
                                                                 report: bool) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(RECORD, separators=(",", ":")) + "\n" + nested + "\n")
    before = results.read_bytes()
    argv = ["sweep", grid, "--output", results, "--workers", "1", "--no-progress"]
    start = time.perf_counter()
    line = refused(capsys, *argv, *(["--report"] if report else []))
    assert time.perf_counter() - start < 5.0
    assert f"{results}" in line and "line 2 is nested too deeply" in line
    assert results.read_bytes() == before


# ------------------------------------------------------------------ 3. xplane times at int64's ends


def memory_record(kind: str, in_use: int) -> dict:
    name = "MemoryAllocation" if kind == "alloc" else "MemoryDeallocation"
    stats = {"allocator_name": "GPU_0_bfc", "bytes_reserved": 0, "bytes_allocated": in_use,
             "bytes_available": (1 << 30) - in_use, "fragmentation": 0.0,
             "peak_bytes_in_use": 1024, "requested_bytes": 1024, "allocation_bytes": 1024,
             "addr": 4096}
    return {"name": name, "offset_ps": 0, "stats": stats}


@pytest.mark.parametrize("command", ["info", "fidelity"])
def test_xplane_times_at_both_ends_of_int64_are_one_line(capsys, tmp_path: Path,
                                                         command: str) -> None:
    lines = [{"id": 1, "name": "early", "timestamp_ns": -(1 << 63),
              "events": [memory_record("alloc", 1024)]},
             {"id": 2, "name": "late", "timestamp_ns": (1 << 63) - 1,
              "events": [memory_record("free", 0)]}]
    path = tmp_path / "ends.xplane.pb"
    path.write_bytes(encode_xspace([{"id": 0, "name": "/host:CPU", "lines": lines}]))
    with warnings.catch_warnings(record=True) as caught:   # pytest keeps them off stderr
        warnings.simplefilter("always")
        line = refused(capsys, command, path)
    assert [str(w.message) for w in caught] == []       # numpy's RuntimeWarning: 2 lines more
    assert str(path) in line and "event 1" in line and "64-bit nanoseconds" in line
