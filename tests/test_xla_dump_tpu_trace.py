"""An XLA:TPU dump read as a trace (traces/formats/xla/dump.py) holds what the TPU runtime
holds: the temp as scratch (``xla_tpu.scratch_bytes``), not as a buffer. The dump is of
experiments/tpu/programs.py's init-train-eval program (libtpu 0.0.42.1), whose executables'
scratch the chip reserved (tests/data/tpu/programs/predicted.json, exact there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocsim.traces.formats import load
from allocsim.traces.formats.xla.tpu_scratch import hbm_temp_bytes, hbm_temp_holds_arrays

DUMP = Path(__file__).parent / "data" / "xla" / "tpu"
PREDICTED = Path(__file__).parent / "data" / "tpu" / "programs" / "predicted.json"


def _scratch_on_chip(module: str) -> int:
    executables = json.loads(PREDICTED.read_text())["predictions"]["init-train-eval"][
        "executables"]
    return next(e["scratch_bytes"] for e in executables if e["name"].startswith(f"jit_{module}."))


@pytest.mark.parametrize("module", ["init", "init_opt", "train", "evaluate"])
def test_a_tpu_dumps_temp_is_the_runtimes_scratch_not_a_buffer(module: str) -> None:
    trace = load(str(DUMP), module=module)
    facts = trace.metadata["xla_tpu"]
    assert facts["scratch_bytes"] == _scratch_on_chip(module)   # 114,688 / 0 / 0 / 114,688
    assert facts["module"] == f"jit_{module}"
    assert not any("temp" in (t or "") for t in trace.tags)     # no temp buffer in the events
    assert "generated code" in facts["not_modelled"]


def test_a_temp_of_tuples_alone_is_not_reserved() -> None:
    # train's HBM temp holds only address tables of async copies: memory_analysis() counts no
    # temp there and the chip reserved none (conv-adam, grad-* of tests/data/tpu/scratch too).
    text = next(DUMP.glob("*jit_train*-buffer-assignment.txt")).read_text()
    assert hbm_temp_bytes(text) > 0
    assert not hbm_temp_holds_arrays(text)
    evaluate = next(DUMP.glob("*jit_evaluate*-buffer-assignment.txt")).read_text()
    assert hbm_temp_holds_arrays(evaluate)
