"""``allocsim validate --backend jax`` (sim/validation/jax_backend.py): the comparison, fed a
real replay recorded on a v5e chip (tests/data/tpu/replay-sample-torch-cpu-mlp: the bundled
trace replayed as u8[n] arrays, its profile and memory_stats after every event); then on a
TPU, when one is here."""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from allocsim.sim.validation import jax_backend
from allocsim.sim.validation.errors import ValidatorError
from allocsim.sim.validation.validator import validate
from allocsim.traces.bundled import bundled_path

DATA = Path(__file__).parent / "data" / "tpu"
RECORDED = "replay-sample-torch-cpu-mlp"
SAMPLE = bundled_path("sample-torch-cpu-mlp.npz")


def recorded_child(name: str = RECORDED, *, corrupt_at: int | None = None) -> Any:
    """A stand-in for the child process: the chip's own profile and per-event stats."""
    log = json.loads((DATA / f"{name}.json").read_text())
    env = json.loads((DATA / "env.json").read_text())

    def run_child(trace: Any, folder: Path, max_ooms: int, timeout_s: Any) -> dict:
        shutil.copytree(DATA / name, folder / "logdir")
        events = log["events"]
        assert len(events) == len(trace)
        in_use = [e["stats"]["bytes_in_use"] for e in events]
        if corrupt_at is not None:
            in_use[corrupt_at] += 512
        return {"in_use": in_use, "reserved": [0] * len(events),
                "on_device": [e["on_device"] for e in events if e["op"] == "alloc"],
                "wall_ns": [0] * len(events), "ooms": [], "stopped_at": None,
                "limit": env["stats_before_any_array"]["bytes_limit"],
                "start_stats": env["stats_before_any_array"], "device": "TPU v5 lite (tpu)",
                "platform": "tpu", "versions": {k: env[k] for k in ("jax", "jaxlib", "libtpu")},
                "replay_s": 0.0}
    return run_child


@pytest.fixture
def chip_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jax_backend, "require_jax", lambda: None)
    monkeypatch.setattr(jax_backend, "_run_child", recorded_child())


def test_the_chips_replay_passes_every_check(chip_replay: None) -> None:
    report = validate(SAMPLE, backend="jax")
    failed = [c for c in report.checks if c.ok is False]
    assert not failed, failed
    names = {c.name for c in report.checks}
    assert {"places", "in use after each call", "in use", "reserved"} <= names
    assert "libtpu" in report.device


def test_a_byte_the_model_does_not_hold_fails_the_in_use_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jax_backend, "require_jax", lambda: None)
    monkeypatch.setattr(jax_backend, "_run_child", recorded_child(corrupt_at=100))
    report = validate(SAMPLE, backend="jax")
    in_use = next(c for c in report.checks if c.name == "in use")
    assert in_use.ok is False


def test_a_trace_is_simulated_at_its_u8_sizes_on_the_chip(chip_replay: None) -> None:
    log = json.loads((DATA / f"{RECORDED}.json").read_text())
    report = validate(SAMPLE, backend="jax")
    peak = next(m for m in report.metrics if m.name == "peak in use")
    chip_peak = max(e["stats"]["bytes_in_use"] for e in log["events"]) - 26_624
    assert peak.measured == chip_peak
    assert peak.simulated == chip_peak


def test_no_capacity_can_be_given_to_the_tpu_runtime(chip_replay: None) -> None:
    with pytest.raises(ValidatorError, match="takes all of HBM"):
        validate(SAMPLE, backend="jax", capacity="1GiB")


@functools.cache
def jax_platform() -> str | None:
    """JAX's first device's platform, asked in a process of its own: a TPU opened here would
    be held by this process and refused to the backend's child."""
    if importlib.util.find_spec("jax") is None:
        return None
    done = subprocess.run([sys.executable, "-c", "import jax; print(jax.devices()[0].platform)"],
                          capture_output=True, text=True, timeout=300, check=False)
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout else None


def test_without_a_tpu_the_backend_says_so_in_one_line() -> None:
    platform = jax_platform()
    if platform is None:
        pytest.skip("the jax extra is not installed")
    if platform == "tpu":
        pytest.skip("a TPU is here: the refusal is for machines without one")
    with pytest.raises(ValidatorError, match="needs a TPU"):
        validate("default", backend="jax")


def test_on_a_tpu_the_bundled_trace_validates() -> None:
    if jax_platform() != "tpu":
        pytest.skip("needs a TPU: JAX has none here (the chip's own records are checked "
                    "above)")
    report = validate(SAMPLE, backend="jax")
    assert all(c.ok is not False for c in report.checks)
