"""Which settings ``allocsim compare`` weighs by default: the recording's own framework's.

A user with a PyTorch snapshot asks which ``PYTORCH_CUDA_ALLOC_CONF`` to set, not whether
TensorFlow's BFC or a buddy allocator would do better; a JAX user asks about
``XLA_PYTHON_CLIENT_*``. So, unless policies are named (``--policies``), compare replays the
framework's own settings, each written as the user would paste it:

- PyTorch (a snapshot, a profiler trace, allocsim's torch recorder): the defaults,
  ``expandable_segments:True``, one ``max_split_size_mb`` and one
  ``roundup_power2_divisions`` of those ``tune`` searches, and ``backend:cudaMallocAsync``;
- JAX: the defaults (BFC preallocating 75% of the card), ``XLA_PYTHON_CLIENT_PREALLOCATE=false``,
  ``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` and ``XLA_PYTHON_CLIENT_MEM_FRACTION=.9``;
- TensorFlow: BFC with ``TF_FORCE_GPU_ALLOW_GROWTH`` off (the default) and on;
- CuPy: the default pool, the async pool, no pool;
- a TPU (a TPU profile, or ``--device`` a TPU): the TPU runtime, which JAX's settings do not
  change.

The settings are tune's (:mod:`~allocsim.sim.questions.tune.space`): the same registry spec
stands for each, and the same paste lines come out. A trace that names no framework (a
synthetic one) gets the generic policies, and the comparison says which it compared and why.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from allocsim.policies import DEFAULT_POLICIES, parse_policy
from allocsim.policies.settings import (
    CuPySettings,
    JaxSettings,
    PyTorchSettings,
    TensorFlowSettings,
    TpuSettings,
)
from allocsim.policies.settings.pytorch import ALLOC_CONF, ASYNC
from allocsim.sim.kernel.device import DeviceProfile
from allocsim.sim.kernel.device_buffers import is_tpu
from allocsim.sim.questions.tune.space import (
    FRAMEWORK,
    PyTorch,
    Setting,
    describe,
    distinct_sizes,
    max_split_candidates,
    trace_framework,
)
from allocsim.traces.model import Trace

TPU = "tpu"
TPU_DEVICE = "tpu-v5e"     # the device a TPU profile is compared on when none is named
JAX_FRACTION = 0.9
DISPLAY = {"pytorch": "PyTorch", "jax": "JAX", "tensorflow": "TensorFlow", "cupy": "CuPy"}
ROUNDUP = "4"
# A TensorFlow op type in a profile's tag: CamelCase (``AddV2 [256,128]``,
# ``sequential/dense/MatMul [..]``); JAX's annotations are ``jit(step)/...`` and XLA's op names
# lower case (``fusion.3``).
_TF_OP = re.compile(r"^(?:[\w.-]+/)*[A-Z][A-Za-z0-9]+(?: \[|$)")
_JAX_OP = re.compile(r"(?:^|/)p?jit[(_]")


@dataclass(frozen=True)
class Candidate:
    """One setting compare replays: the spec it runs as, how the user writes it."""

    spec: str                   # the registry spec replayed
    label: str                  # the table's name for it: the paste text or "X defaults"
    paste: tuple[str, ...]      # the lines to paste; () for the defaults

    def to_json_dict(self) -> dict[str, Any]:
        return {"policy": self.spec, "label": self.label, "paste": list(self.paste)}


@dataclass(frozen=True)
class Choice:
    """What compare weighs for one trace and why: a framework's settings, or the generic
    policies (``framework`` None)."""

    framework: str | None
    why: str
    candidates: tuple[Candidate, ...]

    @property
    def specs(self) -> list[str]:
        return [c.spec for c in self.candidates]

    def label(self, spec: str) -> str:
        """The table's name for ``spec`` (the spec itself when it is not a candidate)."""
        return next((c.label for c in self.candidates if c.spec == spec), spec)

    def paste(self, spec: str) -> tuple[str, ...] | None:
        """The lines to paste for ``spec``; None when it is no framework setting."""
        if self.framework is None:
            return None
        return next((c.paste for c in self.candidates if c.spec == spec), None)

    def sentence(self) -> str:
        """The "compared:" line: what was compared and why."""
        if self.framework is None:
            return f"compared: {self.why}"
        what = ("the TPU runtime's allocator (JAX's allocator settings do not apply on a TPU)"
                if self.framework == TPU else
                f"{DISPLAY.get(self.framework, self.framework)}'s own settings")
        return f"compared: {what}, because {self.why} (--policies SPEC... compares others)"

    def to_json_dict(self) -> dict[str, Any]:
        return {"name": self.framework, "why": self.why,
                "settings": [c.to_json_dict() for c in self.candidates]}


def _tags(trace: Trace) -> list[str]:
    return [str(name) for name in trace.tags if name]


def _xplane_framework(trace: Trace) -> tuple[str, str]:
    """TensorFlow or JAX for a profiler ``.xplane.pb``, and the evidence (both write the same
    BFC records; the op names in the tags tell them apart)."""
    tags = _tags(trace)
    jax_ops = [t for t in tags if _JAX_OP.search(t)]
    if jax_ops:
        return "jax", f"its ops are JAX's ({jax_ops[0]!r})"
    tf_ops = [t for t in tags if _TF_OP.match(t)]
    if tf_ops or "tensorflow" in str(trace.metadata.get("source", "")).lower():
        example = f" ({tf_ops[0]!r})" if tf_ops else ""
        return "tensorflow", f"the profile's ops are TensorFlow's{example}"
    return "jax", "a profiler trace whose ops name no framework (taken as JAX's)"


def framework_of(trace: Trace, device: DeviceProfile) -> tuple[str | None, str]:
    """The framework whose settings answer for ``trace`` on ``device`` (None: none is said)
    and the evidence, a clause."""
    meta = trace.metadata
    on_tpu = meta.get("memory_runtime") == TPU
    if is_tpu(device):
        return TPU, (f"the device {device.label} is a TPU (JAX there runs the TPU runtime)"
                     if not on_tpu else "the profile was recorded on a TPU (its frees carry "
                     f"no sizes), compared on {device.label}")
    if on_tpu:      # a TPU job asked about on a GPU: JAX's GPU settings
        return "jax", (f"the profile was recorded by JAX on a TPU and is compared on a GPU, "
                       f"{device.label} (--device tpu-v5e compares the TPU runtime)")
    fmt = str(meta.get("format", ""))
    if fmt == "xplane":
        return _xplane_framework(trace)
    name = trace_framework(trace)
    if name is None:
        source = str(meta.get("source", ""))
        what = "a synthetic trace" if source.startswith("synth:") else "the trace"
        return None, f"{what} names no framework"
    how = (f"the trace is a {fmt} recording" if fmt else
           f"the trace was recorded by {str(meta.get('recorder') or name).split(' (')[0]}")
    return name, how


def _candidate(setting: Setting, capacity: int | None = None) -> Candidate:
    fw = FRAMEWORK[setting.framework]
    # The spec as the registry prints it: what a replay's result is named by.
    spec = str(parse_policy(fw.spec(setting, capacity)))
    return Candidate(spec, describe(setting, capacity), tuple(fw.paste(setting, capacity)))


def _pytorch_settings(trace: Trace) -> list[Setting]:
    fw = FRAMEWORK["pytorch"]
    assert isinstance(fw, PyTorch)
    choices = [PyTorchSettings(), PyTorchSettings(expandable_segments=True)]
    splits = max_split_candidates(trace)
    if splits:     # the middle of tune's candidates: a value that splits some but not all
        choices.append(PyTorchSettings(max_split_size_mb=splits[len(splits) // 2]))
    choices.append(PyTorchSettings(roundup_power2_divisions=ROUNDUP))
    choices.append(PyTorchSettings(backend=ASYNC))
    settings = [fw.setting_of(choice) for choice in choices]
    # Drop a choice that cannot change this trace's replay (tune's sharing rule): its row
    # would repeat another's under a different name.
    sizes = distinct_sizes(trace)
    kept: list[Setting] = []
    seen: set[Setting] = set()
    for setting in settings:
        canonical = fw.canonical(setting, trace, sizes)
        if canonical not in seen:
            seen.add(canonical)
            kept.append(setting)
    return kept


def _settings(name: str, trace: Trace) -> list[Setting]:
    fw = FRAMEWORK[name]
    if name == "pytorch":
        return _pytorch_settings(trace)
    if name == "jax":
        choices: list[Any] = [JaxSettings(), JaxSettings(preallocate=False),
                              JaxSettings(allocator="platform"), JaxSettings(fraction=JAX_FRACTION)]
    elif name == "tensorflow":
        choices = [TensorFlowSettings(), TensorFlowSettings(allow_growth=True)]
    else:
        choices = [CuPySettings(), CuPySettings(pool="async"), CuPySettings(pool="none")]
    return [fw.setting_of(choice) for choice in choices]


def default_choice(trace: Trace, device: DeviceProfile) -> Choice:
    """The settings compare weighs for ``trace`` when none are named."""
    name, why = framework_of(trace, device)
    if name is None:
        return generic_choice(DEFAULT_POLICIES, f"the generic policies, because {why} "
                              "(record your job, or name policies with --policies)")
    if name == TPU:
        return Choice(TPU, why, (Candidate(TpuSettings().spec(), "TPU runtime", ()),))
    candidates = tuple(_candidate(s, device.capacity) for s in _settings(name, trace))
    return Choice(name, why, candidates)


def generic_choice(specs: Sequence[str], why: str = "the policies named with --policies"
                   ) -> Choice:
    """Named policies, compared as they are."""
    return Choice(None, why, tuple(Candidate(s, s, ()) for s in specs))


def with_alloc_confs(choice: Choice, confs: Sequence[tuple[str, str]]) -> Choice:
    """``choice`` and the ``--alloc-conf`` policies (``(text, spec)``), each pasted as given."""
    extra = tuple(Candidate(spec, f"{ALLOC_CONF}={text}", (f"{ALLOC_CONF}={text}",))
                  for text, spec in confs if spec not in choice.specs)
    return Choice(choice.framework, choice.why, choice.candidates + extra)


def tpu_profiles_only(traces: Sequence[Trace]) -> bool:
    """Every trace is a TPU profile (then a TPU is the device to compare on)."""
    return bool(traces) and all(t.metadata.get("memory_runtime") == TPU for t in traces)


__all__ = [
    "TPU_DEVICE",
    "Candidate",
    "Choice",
    "default_choice",
    "framework_of",
    "generic_choice",
    "tpu_profiles_only",
    "with_alloc_confs",
]
