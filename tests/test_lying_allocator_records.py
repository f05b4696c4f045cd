"""A profile's native copy whose allocator records lie (issue 56, item 8): ``allocsim fidelity``
refuses it in one line naming the file and the record, exit 2, never a traceback
(traces/allocator_records.py). The copies are made from real ones: a TPU runtime's records
beside a JAX recording (tests/data/tpu/recorder) and TensorFlow's BFC profile
(tests/data/xplane)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from allocsim.traces.formats import load, save
from tests.one_line import refused

DATA = Path(__file__).parent / "data"
TPU = DATA / "tpu" / "recorder" / "train-nojit.runtime.npz"
BFC = DATA / "xplane" / "tf-cpu-default.xplane.pb"

Lie = Callable[[dict[str, Any]], None]


def _past_the_trace(meta: dict[str, Any]) -> None:
    meta["reference_events"][3]["event"] = 10**9


def _null_field(name: str) -> Lie:
    def lie(meta: dict[str, Any]) -> None:
        meta["reference_events"][2][name] = None
    return lie


def _no_limit_no_available(meta: dict[str, Any]) -> None:
    meta.pop("bfc_memory_limit", None)
    meta["reference_events"][0].pop("available")


def _zero_limit_null_available(meta: dict[str, Any]) -> None:
    meta["bfc_memory_limit"] = 0
    meta["reference_events"][0]["available"] = None


def _segment_map(meta: dict[str, Any]) -> None:
    meta["reference_events"][1]["action"] = "segment_map"


LIES: dict[str, Lie] = {
    "an event index past the trace": _past_the_trace,
    "a null address": _null_field("addr"),
    "a null in-use": _null_field("in_use"),
    "a null chunk": _null_field("chunk"),
    "no bytes limit and no available": _no_limit_no_available,
    "limit 0 with available null": _zero_limit_null_available,
    "an action the allocator does not record": _segment_map,
}


def _lying_copy(tmp_path: Path, source: Path, lie: Lie) -> Path:
    trace = load(source)
    meta = copy.deepcopy(trace.metadata)
    lie(meta)
    trace.metadata.clear()
    trace.metadata.update(meta)
    out = tmp_path / "lying.npz"
    save(trace, out)
    return out


@pytest.mark.parametrize("source", [TPU, BFC], ids=["tpu-runtime-records", "bfc-profile"])
@pytest.mark.parametrize("what", sorted(LIES))
def test_allocator_records_that_lie_are_one_line(capsys: Any, tmp_path: Path, source: Path,
                                                 what: str) -> None:
    if what == "no bytes limit and no available" and source is BFC:
        pytest.skip("a BFC profile is one by its bytes limit: without it, it is not a BFC "
                    "profile (a refusal of its own, covered by test_bfc_fidelity)")
    lying = _lying_copy(tmp_path, source, LIES[what])
    before = lying.read_bytes()
    line = refused(capsys, "fidelity", lying)
    assert "lying.npz" in line
    assert lying.read_bytes() == before


def test_the_true_records_still_replay(capsys: Any) -> None:
    from allocsim.sim.cli.main import main
    assert main(["fidelity", str(TPU)]) == 0
