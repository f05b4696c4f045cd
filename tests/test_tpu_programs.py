"""Whole JAX programs on a TPU v5e, predicted without the chip and measured on it.

experiments/tpu/programs.py holds six programs of the kinds users run (an LSTM loop without
donation, an init/train/eval script of four executables, a conv net, a bf16 mixture of experts,
a remat decoder, a step near HBM's limit), written once against three verbs so that the chip
(experiments/tpu/program_probe.py) and allocsim's TPU Program (traces/record/tpu_program.py)
run the same Python. The predictions were committed before each chip run
(tests/data/tpu/programs/predicted.json, then predicted-2.json); the chip's records are
beside them (JAX 0.10.2, libtpu 0.0.42.1). The first group holds the committed predictions to
the chip's records (no libtpu needed); the second makes the predictions again (needs libtpu).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data" / "tpu" / "programs"
PROGRAMS = ("lstm-nodonate", "init-train-eval", "conv-adam", "moe-bf16", "decoder-remat",
            "near-hbm")
BELOW = 256 * 1024          # the margin: 256 KiB less must not run
HAS_LIBTPU = importlib.util.find_spec("jax") is not None and \
    importlib.util.find_spec("libtpu") is not None


def _predicted(round_: int) -> dict[str, Any]:
    name = "predicted.json" if round_ == 1 else f"predicted-{round_}.json"
    return json.loads((DATA / name).read_text())["predictions"]


def _chip(name: str, capacity: int | None = None) -> dict[str, Any]:
    file = f"{name}.json" if capacity is None else f"{name}-{capacity}.json"
    for folder in (DATA / "round2", DATA):
        if (folder / file).exists():
            return json.loads((folder / file).read_text())
    raise FileNotFoundError(file)


@pytest.mark.parametrize("name", PROGRAMS)
def test_peak_in_use_and_scratch_predicted_without_the_chip_are_the_chips(name: str) -> None:
    chip = _chip(name)["stages"]["end"]
    predicted = _predicted(1)[name]
    assert predicted["peak_bytes_in_use"] == chip["peak_bytes_in_use"]
    assert predicted["peak_bytes_reserved"] == chip["peak_bytes_reserved"]


@pytest.mark.parametrize("name", PROGRAMS)
def test_min_capacity_runs_on_the_chip_and_256_kib_less_does_not(name: str) -> None:
    answer = _predicted(2)[name]["min_capacity"]
    at = _chip(name, answer)
    assert at["ran"], at.get("error")
    below = _chip(name, answer - BELOW)
    assert not below["ran"]
    assert "RESOURCE_EXHAUSTED" in below["error"]
    # the ballast left the program exactly the HBM asked for
    assert at["stages"]["ballast"]["bytes_limit"] - at["ballast"] == answer


def test_the_first_answers_held_code_and_scratch_the_runtime_gives_up_when_idle() -> None:
    # Round 1 answered with every loaded executable's code and the scratch held throughout:
    # it ran, but four programs whose peak falls between calls also ran 256 KiB below it.
    # Round 2 holds them through each call only (traces/tpu_needed.py).
    first, second = _predicted(1), _predicted(2)
    loose = [n for n in PROGRAMS if _chip(n, first[n]["min_capacity"] - BELOW)["ran"]]
    assert loose == ["init-train-eval", "conv-adam", "moe-bf16", "near-hbm"]
    assert all(second[n]["min_capacity"] < first[n]["min_capacity"] for n in loose)
    assert second["lstm-nodonate"]["min_capacity"] == first["lstm-nodonate"]["min_capacity"]


needs_libtpu = pytest.mark.skipif(not HAS_LIBTPU, reason="needs jax and libtpu (pip install -e "
                                  "'.[jax-tpu]'): XLA:TPU compiles only with libtpu")


@needs_libtpu
@pytest.mark.parametrize("name", ["lstm-nodonate", "init-train-eval", "conv-adam", "moe-bf16"])
def test_the_prediction_made_again_is_the_chips(name: str) -> None:
    from experiments.tpu.program_predictions import predict
    again = predict(name)
    chip = _chip(name)["stages"]["end"]
    assert again["peak_bytes_in_use"] == chip["peak_bytes_in_use"]
    assert again["peak_bytes_reserved"] == chip["peak_bytes_reserved"]
    assert _chip(name, again["min_capacity"])["ran"]
    assert not _chip(name, again["min_capacity"] - BELOW)["ran"]


# ---------------------------------------------------------------------- scripts with eager ops
# experiments/tpu/scripts: plain JAX scripts with eager ops between the jitted ones (a typed
# key made and split, jnp.zeros, eager adds, batches drawn with jax.random), recorded unchanged
# with record --framework jax --target tpu-v5e (tests/data/tpu/scripts/predicted.json, written
# before the chip ran them), then run unchanged on the chip.
SCRIPTS = DATA.parent / "scripts"


def _script(name: str, capacity: int | None = None) -> dict[str, Any]:
    file = f"{name}.json" if capacity is None else f"{name}-{capacity}.json"
    return json.loads((SCRIPTS / file).read_text())


def _script_predicted(name: str) -> dict[str, Any]:
    return json.loads((SCRIPTS / "predicted.json").read_text())["predictions"][name]


@pytest.mark.parametrize("name", ["eager_mix", "eval_loop"])
def test_a_scripts_scratch_recorded_for_the_tpu_is_the_chips(name: str) -> None:
    assert _script_predicted(name)["peak_bytes_reserved"] == \
        _script(name)["stages"]["end"]["peak_bytes_reserved"]


def test_the_eager_script_runs_at_its_answer_and_not_256_kib_below() -> None:
    answer = _script_predicted("eager_mix")["min_capacity"]
    assert _script("eager_mix", answer)["ran"]
    assert not _script("eager_mix", answer - BELOW)["ran"]


# Known gaps, measured on the chip and not yet explained (docs/jax.md, "Scripts with eager
# ops"); strict, so that a fix shows here.
@pytest.mark.xfail(strict=True, reason="the chip held 2,065,408 B more at the eager script's "
                   "peak than the recording says (an x-sized buffer: the host batch's transfer?)")
def test_the_eager_scripts_peak_in_use_is_the_chips() -> None:
    assert _script_predicted("eager_mix")["peak_bytes_in_use"] == \
        _script("eager_mix")["stages"]["end"]["peak_bytes_in_use"]


@pytest.mark.xfail(strict=True, reason="the chip refused to load a program at the answer of a "
                   "script of 15 executables (RuntimeProgramAllocationFailure)")
def test_the_eval_loop_runs_at_its_answer() -> None:
    assert _script("eval_loop", _script_predicted("eval_loop")["min_capacity"])["ran"]

