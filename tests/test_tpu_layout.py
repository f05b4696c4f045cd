"""The TPU's array layouts (traces/tpu_layout.py): hand-worked cases of each rule, then every
array the chip sized (tests/data/tpu/sizes.json: 416 arrays, v5e, JAX 0.10.2, libtpu 0.0.42.1)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from allocsim.errors import UserInputError
from allocsim.traces.tpu_layout import tpu_layout, u8_buffer_bytes, u8_buffer_sizes

SIZES = Path(__file__).parent / "data" / "tpu" / "sizes.json"
XLA_TYPE = {"float32": "f32", "int32": "s32", "uint32": "u32", "bfloat16": "bf16",
            "float16": "f16", "int16": "s16", "int8": "s8", "uint8": "u8", "bool": "pred",
            "int4": "s4"}


def test_a_vector_takes_power_of_two_tiles_of_at_least_512_bytes() -> None:
    assert tpu_layout("f32[100]").bytes == 512           # one (128) tile
    assert tpu_layout("f32[129]").bytes == 1024          # one (256) tile
    assert tpu_layout("f32[1025]").bytes == 8192         # two (1024) tiles
    assert tpu_layout("u8[2049]").bytes == 3072          # three (1024) tiles
    assert tpu_layout("f32[]").bytes == 512              # a scalar is one tile


def test_a_matrix_is_tiled_8_by_128_and_small_rows_take_short_tiles() -> None:
    assert tpu_layout("f32[1000,1000]").bytes == 4_096_000
    assert tpu_layout("f32[9,128]").bytes == 8192        # 9 rows: two 8-row tiles
    three_rows = tpu_layout("f32[3,5]")
    assert (three_rows.tile, three_rows.bytes) == ((4, 128), 2048)


def test_the_cheapest_pair_of_dimensions_is_tiled() -> None:
    column = tpu_layout("f32[1024,1]")                   # the 1-wide dimension goes second
    assert (column.minor_to_major, column.bytes) == ((0, 1), 4096)
    cube = tpu_layout("f32[3,5,7]")                      # 3 rows pad less than 5
    assert (cube.layout, cube.bytes) == ("f32[3,5,7]{2,0,1:T(4,128)}", 10240)


def test_narrow_types_pack_rows_and_may_take_a_4_KiB_tile() -> None:
    assert tpu_layout("bf16[17,129]").bytes == 12288
    assert tpu_layout("s8[64,64]").tile == (32, 128)     # ties go to the taller tile
    assert tpu_layout("s8[1000,1000]").tile == (8, 128)  # 1000 rows pad less in 8s
    assert tpu_layout("s8[1000,1000]").layout == "s8[1000,1000]{1,0:T(8,128)(4,1)}"


def test_a_plain_buffer_is_a_u8_array() -> None:
    assert [u8_buffer_bytes(n) for n in (1, 512, 513, 1536, 2560)] == [512, 512, 1024, 2048,
                                                                        3072]
    column = np.array([0, 4, 600, 2048, 2049], dtype=np.int64)
    assert u8_buffer_sizes(column).tolist() == [0, 512, 1024, 2048, 3072]
    assert u8_buffer_bytes(1500) == tpu_layout("u8[1500]").bytes
    assert tpu_layout("u8[1500]").layout == "u8[1500]{0:T(1024)(128)(4,1)}"


@pytest.mark.parametrize("text, problem", [
    ("f32[3,x]", "is not a whole number"), ("float32[3]", "unknown element type"),
    ("f64[3]", "was not measured"), ("f32(3)", "not XLA's notation"),
    ("f32[²]", "is not a whole number")])
def test_a_shape_that_is_not_xlas_is_one_line(text: str, problem: str) -> None:
    with pytest.raises(UserInputError, match=re.escape(problem)):
        tpu_layout(text)


def _recorded() -> list[dict]:
    return json.loads(SIZES.read_text())


def test_every_array_the_chip_sized_has_the_rules_bytes_and_layout() -> None:
    arrays = _recorded()
    assert len(arrays) == 416
    wrong = []
    for array in arrays:
        text = f"{XLA_TYPE[array['dtype']]}[{','.join(map(str, array['shape']))}]"
        got = tpu_layout(text)
        found = re.search(r"major_to_minor=\(([^)]*)\), tiling=\(\(([^)]*)\)", array["format"])
        assert found is not None
        major_to_minor = tuple(int(v) for v in found.group(1).split(",") if v.strip())
        tile = tuple(int(v) for v in found.group(2).split(",") if v.strip())
        if (got.bytes, got.minor_to_major, got.tile) != (array["bytes"],
                                                         tuple(reversed(major_to_minor)), tile):
            wrong.append((text, array["bytes"], got.bytes))
    assert not wrong


def test_the_size_command_prints_bytes_and_layouts(capsys: pytest.CaptureFixture[str]) -> None:
    from allocsim.sim.cli.main import main
    assert main(["size", "--device", "tpu-v5e", "--json", "f32[17,129]", "pred[100]"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == [
        {"shape": "f32[17,129]", "bytes": 24576, "layout": "f32[17,129]{1,0:T(8,128)}",
         "nbytes": 8772},
        {"shape": "pred[100]", "bytes": 512, "layout": "pred[100]{0:T(512)(128)(4,1)}",
         "nbytes": 100}]


@pytest.mark.parametrize("argv, problem", [
    (["size", "f32[3,5]", "f32[3,x]"], "dimension 'x'"),
    (["size", "--device", "a100-80g", "f32[3]"], "not a TPU")])
def test_the_size_command_refuses_in_one_line_and_prints_nothing(
        argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    from allocsim.sim.cli.main import main
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert problem in captured.err and len(captured.err.strip().splitlines()) == 1


def test_on_a_tpu_device_every_policy_sees_u8_buffers_as_the_chip_held_them() -> None:
    from allocsim.sim.kernel.device_profile import resolve_device
    from allocsim.sim.kernel.engine import replay
    from allocsim.traces.bundled import bundled_path
    from allocsim.traces.formats import load
    log = json.loads((SIZES.parent / "replay-sample-torch-cpu-mlp.json").read_text())
    chip_peak = max(e["stats"]["bytes_in_use"] for e in log["events"]) - 26_624
    trace = load(str(bundled_path("sample-torch-cpu-mlp.npz")))
    for policy in ("tpu", "bfc"):
        assert replay(trace, policy, resolve_device("tpu-v5e")).peak_allocated == chip_peak
    assert replay(trace, "bfc", resolve_device("a100-80g")).peak_allocated < chip_peak


def test_the_column_form_of_the_u8_rule_is_the_rule() -> None:
    sizes = np.arange(-2, 5000, dtype=np.int64)
    assert u8_buffer_sizes(sizes).tolist() == [u8_buffer_bytes(int(n)) if n > 0 else int(n)
                                               for n in sizes]
