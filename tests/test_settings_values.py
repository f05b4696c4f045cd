"""A framework's allocator settings are one typed value each (policies/settings/): read from
the framework's own form, written back to it, pasted, and turned into the model's spec — and
every command, tune and fidelity go through it instead of writing ``key:value`` text."""

from __future__ import annotations

from dataclasses import replace

import pytest

from allocsim.policies import parse_policy
from allocsim.policies.registry import alloc_conf_spec
from allocsim.policies.settings import (
    CuPySettings,
    JaxSettings,
    PyTorchSettings,
    TensorFlowSettings,
    TpuSettings,
)
from allocsim.sim.questions.tune.space import framework

GiB = 1 << 30

PYTORCH = [
    PyTorchSettings(),
    PyTorchSettings(expandable_segments=True),
    PyTorchSettings(max_split_size_mb=128, roundup_power2_divisions="[256:1,512:2,>:8]"),
    PyTorchSettings(roundup_power2_divisions="4", garbage_collection_threshold=0.6,
                    per_process_memory_fraction=0.5),
    PyTorchSettings(per_process_memory_fraction=0.0),        # PyTorch's 0 bytes, not unset
    PyTorchSettings(max_non_split_rounding_mb=64, max_split_size_mb=20),
    PyTorchSettings(backend="cudaMallocAsync"),
]


@pytest.mark.parametrize("settings", PYTORCH, ids=str)
def test_pytorch_settings_read_back_what_they_write(settings):
    assert PyTorchSettings.from_alloc_conf(settings.to_alloc_conf()) == settings
    assert PyTorchSettings.from_alloc_conf(
        f"PYTORCH_CUDA_ALLOC_CONF={settings.to_alloc_conf()}") == settings


@pytest.mark.parametrize("settings", PYTORCH[:-1], ids=str)
def test_the_pasted_line_is_the_spec_that_ran(settings):
    # What a user pastes, read as PyTorch reads it, is the model the spec replays.
    conf = next((line.split("=", 1)[1].strip("'") for line in settings.paste()
                 if line.startswith("PYTORCH_CUDA_ALLOC_CONF=")), "")
    pasted = PyTorchSettings.from_alloc_conf(conf)
    fraction = settings.per_process_memory_fraction
    if fraction is not None:
        assert settings.paste()[-1] == f"torch.cuda.set_per_process_memory_fraction({fraction:g})"
        pasted = PyTorchSettings.from_alloc_conf(
            f"{conf},per_process_memory_fraction:{fraction}" if conf
            else f"per_process_memory_fraction:{fraction}")
    assert pasted == settings
    assert parse_policy(settings.spec()) == parse_policy(pasted.spec())
    if settings.per_process_memory_fraction is None:
        assert alloc_conf_spec(settings.to_alloc_conf()) == parse_policy(settings.spec())


def test_one_spelling_for_the_spec_and_the_paste():
    value = PyTorchSettings(expandable_segments=True, max_split_size_mb=256)
    assert value.spec() == "pytorch:expandable_segments=true,max_split_size_mb=256"
    assert value.paste() == ["PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,"
                             "max_split_size_mb:256"]
    assert PyTorchSettings(backend="cudaMallocAsync").spec().startswith("cuda-async:")


@pytest.mark.parametrize("settings", [s for s in PYTORCH if s.backend == "native"
                                      and s.per_process_memory_fraction is None
                                      and s.max_non_split_rounding_mb == 20], ids=str)
def test_a_snapshot_record_reads_back(settings):
    # A snapshot records the divisions as their 16-entry table, not the text that set it:
    # the same table reads back (and writes the same record).
    reading = PyTorchSettings.from_snapshot(settings.to_snapshot())
    assert not reading.not_modelled
    assert reading.settings.to_snapshot() == settings.to_snapshot()
    assert replace(reading.settings, roundup_power2_divisions="") == replace(
        settings, roundup_power2_divisions="")


@pytest.mark.parametrize("settings", [
    JaxSettings(), JaxSettings(preallocate=False), JaxSettings(allocator="platform"),
    JaxSettings(allocator="cuda_async", fraction=0.9), JaxSettings(fraction=0.123456)],
    ids=str)
def test_jax_settings_read_back_what_they_write(settings):
    assert JaxSettings.from_env(settings.to_env()) == settings


@pytest.mark.parametrize("settings", [
    TensorFlowSettings(), TensorFlowSettings(allow_growth=True),
    TensorFlowSettings(garbage_collection=False, allow_growth=True)], ids=str)
def test_tensorflow_settings_read_back_what_they_write(settings):
    assert TensorFlowSettings.from_env(settings.to_env()) == settings


@pytest.mark.parametrize("settings", [
    CuPySettings(), CuPySettings(pool="async"), CuPySettings(pool="none"),
    CuPySettings(limit_fraction=0.5), CuPySettings(pool="async", limit_fraction=0.25)],
    ids=str)
def test_cupy_settings_read_back_what_they_write(settings):
    assert CuPySettings.from_env(settings.to_env()) == settings


def test_the_tpu_runtime_has_no_setting():
    assert TpuSettings.from_env("") == TpuSettings() and TpuSettings().spec() == "tpu"
    with pytest.raises(ValueError, match="reads no allocator setting"):
        TpuSettings.from_env("XLA_PYTHON_CLIENT_MEM_FRACTION=.5")


def test_a_pasted_jax_fraction_is_the_fraction_simulated():
    # tune_share searches fractions to six places; the paste wrote three (.123 for 0.123456),
    # so the line a user pasted ran another job than the one simulated.
    jax = framework("jax")
    setting = jax.make({"fraction": 0.123456})
    assert jax.parse_current(jax.paste(setting)[0]) == setting
    assert jax.paste(jax.make({"fraction": 0.62})) == ["XLA_PYTHON_CLIENT_MEM_FRACTION=.62"]


@pytest.mark.parametrize("name", ["pytorch", "jax", "tensorflow", "cupy"])
def test_tune_writes_every_framework_through_its_value(name, monkeypatch):
    fw = framework(name)
    seen: list[object] = []
    for method in ("spec", "paste"):
        real = getattr(fw.settings, method)

        def spy(self, capacity=None, real=real):
            seen.append(self)
            return real(self, capacity)
        monkeypatch.setattr(fw.settings, method, spy)
    for setting in fw.discrete(_trace(), 4 * GiB):
        fw.spec(setting, 4 * GiB)
        fw.paste(setting, 4 * GiB)
        assert seen[-2:] == [fw.value(setting)] * 2


def test_every_command_writes_pytorch_settings_through_the_value(monkeypatch):
    from allocsim.sim.kernel.device import resolve_device
    from allocsim.sim.questions.explain import variant_specs
    from allocsim.sim.questions.fidelity.settings import settings_from_snapshot
    from allocsim.sim.questions.framework_settings import default_choice
    seen: list[str] = []
    real = PyTorchSettings.spec

    def spy(self, capacity=None):
        seen.append(real(self, capacity))
        return seen[-1]
    monkeypatch.setattr(PyTorchSettings, "spec", spy)
    alloc_conf_spec("expandable_segments:True")                       # --alloc-conf
    assert seen[-1] == "pytorch:expandable_segments=true"
    settings_from_snapshot(PyTorchSettings(max_split_size_mb=64).to_snapshot())   # fidelity
    assert seen[-1] == "pytorch:max_split_size_mb=64"
    before = len(seen)
    variant_specs(parse_policy("bfc"), (128,))                        # explain-oom's what-ifs
    assert seen[before:] == ["pytorch:expandable_segments=true", "pytorch:max_split_size_mb=128",
                             "pytorch:roundup_power2_divisions=4"]
    trace = _trace()
    trace.metadata["format"] = "torch-snapshot"
    before = len(seen)
    default_choice(trace, resolve_device())                           # compare's defaults
    assert len(seen) > before


def _trace():
    from allocsim.traces import synth
    return synth.generate("training", seed=1)
