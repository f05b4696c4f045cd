"""What ``allocsim tune`` may set, per framework: each framework's real settings, as the user
writes them, and the registry spec of the model that stands for them.

A :class:`Setting` is one choice of a framework's settings in the framework's own names
(``expandable_segments``, ``XLA_PYTHON_CLIENT_MEM_FRACTION`` …); :meth:`Framework.spec` turns
it into a registry spec string (``pytorch:expandable_segments=true``, ``jax:fraction=0.62``)
— the only door into policies/ this room uses — and :meth:`Framework.paste` into the line a
user pastes. Each framework lists its *discrete* settings (searched exhaustively), its one
*fraction* (a share of the card, searched by :mod:`allocsim.sim.questions.tune.search`), and
the settings it has that no model implements (:attr:`Framework.not_modelled`, printed).

:meth:`Framework.parse_current` reads the setting a job runs with today as the framework's
own parser would (PyTorch's ``PYTORCH_CUDA_ALLOC_CONF`` grammar through
``policies.pytorch.settings.parse_alloc_conf``; JAX's ``xla_bridge`` environment rules;
TensorFlow's ``gpu_bfc_allocator`` and CuPy's ``CUPY_GPU_MEMORY_LIMIT``) and refuses what it
would refuse, in one line.

Sources followed for the defaults and the mappings: pytorch/pytorch
c10/cuda/CUDACachingAllocator.cpp and CUDAMallocAsyncAllocator.cpp (the async backend sets
the pool's release threshold to UINT64_MAX: it never gives memory back); jax-ml/jax
jax/_src/xla_bridge.py (``XLA_PYTHON_CLIENT_*``: allocator default|platform|bfc|cuda_async,
``preallocate not in ('false', 'False', '0')``, ``float(memory_fraction)``); tensorflow
gpu_bfc_allocator.cc (TF_FORCE_GPU_ALLOW_GROWTH, TF_ENABLE_GPU_GARBAGE_COLLECTION default on;
allow_growth off: one region of the limit); cupy/cupy cupy/cuda/memory.pyx (MemoryPool's
set_limit, ``CUPY_GPU_MEMORY_LIMIT`` as bytes or ``N%``, MemoryAsyncPool whose set_limit is
the release threshold, UINT64_MAX when unset).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace
from itertools import product
from typing import Any, ClassVar

import numpy as np

from allocsim.errors import UserInputError
from allocsim.policies import format_size, parse_policy
from allocsim.policies.pytorch.caching import (
    get_allocation_size,
    parse_roundup_power2_divisions,
    round_size,
)
from allocsim.policies.settings import (
    CuPySettings,
    JaxSettings,
    PyTorchSettings,
    TensorFlowSettings,
)
from allocsim.policies.settings.cupy import POOLS
from allocsim.policies.settings.jax import fraction_text
from allocsim.policies.settings.pytorch import ALLOC_CONF, ASYNC, NATIVE
from allocsim.traces.model import OP_ALLOC, Trace

MiB = 1 << 20
FRAMEWORKS = ("pytorch", "jax", "tensorflow", "cupy")


class TuneInputError(UserInputError):
    """A setting, framework or combination the framework (or tune) does not accept."""


Values = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Setting:
    """One choice of a framework's settings (the framework's names; defaults left out)."""

    framework: str
    values: Values = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.values).get(key, default)

    def with_values(self, **changes: Any) -> Setting:
        merged = dict(self.values)
        merged.update(changes)
        return FRAMEWORK[self.framework].make(merged)

    @property
    def label(self) -> str:
        """``key=value`` pairs in the framework's names, or ``defaults``."""
        if not self.values:
            return "defaults"
        return ",".join(f"{k}={_show(v)}" for k, v in self.values)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _defaults(settings: type, but: tuple[str, ...] = ()) -> dict[str, Any]:
    """What tune searches of a settings value: its fields (but ``but``) at their defaults, in
    the value's order."""
    return {f.name: f.default for f in fields(settings) if f.name not in but}


class Framework:
    """A framework's settings: what is searched, the spec each choice stands for, the line to
    paste. Subclasses fill the class attributes and the four methods."""

    name = ""
    settings: ClassVar[Any] = None          # the typed value's class (policies/settings/)
    defaults: ClassVar[dict[str, Any]] = {}
    fraction_key = ""                       # the share-of-the-card setting ("" = none)
    not_modelled: tuple[str, ...] = ()
    evidence = ""                           # what the models were checked against

    def make(self, values: dict[str, Any]) -> Setting:
        """The setting with ``values`` (defaults dropped, keys in declared order)."""
        unknown = [k for k in values if k not in self.defaults]
        if unknown:
            raise TuneInputError(f"{self.name} has no setting {unknown[0]!r}; its settings: "
                                 f"{', '.join(self.defaults)}")
        kept = tuple((k, values[k]) for k in self.defaults
                     if k in values and values[k] != self.defaults[k])
        return Setting(self.name, kept)

    def default(self) -> Setting:
        return Setting(self.name)

    def full(self, setting: Setting) -> dict[str, Any]:
        return {**self.defaults, **dict(setting.values)}

    def discrete(self, trace: Trace, capacity: int | None) -> Iterator[Setting]:
        raise NotImplementedError

    def fraction_applies(self, setting: Setting) -> bool:
        """Whether the fraction changes anything under this setting's other choices."""
        return bool(self.fraction_key)

    def value(self, setting: Setting) -> Any:
        """The framework's typed settings value (policies/settings/) ``setting`` stands for."""
        return self.settings(**self.full(setting))

    def setting_of(self, value: Any) -> Setting:
        """The tune setting a settings value is (its searched fields)."""
        return self.make({k: v for k, v in asdict(value).items() if k in self.defaults})

    def spec(self, setting: Setting, capacity: int | None = None) -> str:
        """The registry spec of the model that stands for ``setting``."""
        return str(self._ask(lambda: self.value(setting).spec(capacity)))

    def paste(self, setting: Setting, capacity: int | None = None) -> list[str]:
        """The lines to paste (environment first, then code); [] for the defaults."""
        return list(self._ask(lambda: self.value(setting).paste(capacity)))

    def parse_current(self, text: str) -> Setting:
        """The setting a job runs with today, as the framework reads ``text``."""
        return self.setting_of(self._ask(lambda: self.settings.from_env(text)))

    @staticmethod
    def _ask(question: Any) -> Any:
        """A settings value's answer; its one-line refusal as tune's."""
        try:
            return question()
        except ValueError as err:
            raise TuneInputError(str(err)) from None

    def modelled_as(self, setting: Setting, capacity: int | None = None) -> tuple[Any, ...]:
        """What the model runs for ``setting``: the policy and its exact parameters, the
        preset resolved — settings with equal keys replay identically. (Not the spec's
        printed form: the registry prints sizes rounded to whole MiB or GiB.)"""
        resolved = parse_policy(self.spec(setting, capacity)).resolved()
        return (resolved.name, resolved.params)


# ================================================================================ PyTorch
ROUNDUP_CHOICES = ("", "2", "4", "8", "16", "[256:1,512:2,1024:4,>:8]", "[64:8,>:2]")


def max_split_candidates(trace: Trace) -> list[int]:
    """max_split_size_mb values worth trying on this trace: 20 (PyTorch's smallest), the
    powers of two from 32 MiB, and the quartiles of the requests over 20 MiB, each below the
    largest segment the trace makes (at or beyond it nothing is oversize: as unset)."""
    largest = _largest_segment(trace)
    values = {20}
    mb = 32
    while mb * MiB < largest:
        values.add(mb)
        mb *= 2
    sizes = trace.size[trace.op == OP_ALLOC]
    large = sizes[sizes > 20 * MiB]
    if len(large):
        for q in np.quantile(large, (0.25, 0.5, 0.75)):
            values.add(int(-(-int(q) // MiB)))
    return sorted(v for v in values if v * MiB <= largest)


def _largest_segment(trace: Trace) -> int:
    """The largest segment any request of the trace gets on a miss (1–10 MiB requests get
    20 MiB segments, so this is not always the largest request's)."""
    return _largest_block(distinct_sizes(trace), None)


class PyTorch(Framework):
    name = "pytorch"
    settings = PyTorchSettings
    # tune's fraction 0.0 is "none" (it searches fractions in (0, 1]); the value's is None
    # (PyTorch's 0.0 is a limit of 0 bytes).
    defaults: ClassVar[dict[str, Any]] = {
        **_defaults(PyTorchSettings, but=("max_non_split_rounding_mb",)),
        "per_process_memory_fraction": 0.0}

    def value(self, setting: Setting) -> PyTorchSettings:
        fraction = setting.get(self.fraction_key) or None
        return replace(super().value(setting), per_process_memory_fraction=fraction)

    def setting_of(self, value: Any) -> Setting:
        return super().setting_of(replace(
            value, per_process_memory_fraction=value.per_process_memory_fraction or 0.0))
    fraction_key = "per_process_memory_fraction"
    not_modelled = (
        "backend:cudaMallocAsync with per_process_memory_fraction (the async backend's "
        "limit on requested bytes)", "max_non_split_rounding_mb (not searched)",
        "pinned_* and release_lock_on_cudamalloc (host side, no device placement)",
        "record_stream / several streams' cross-stream frees, CUDA graph pools")
    evidence = ("checked against real recordings: `allocsim fidelity` replays PyTorch "
                "snapshots and compares every segment_alloc/free/map/unmap the model makes "
                "with the recorded ones")

    def discrete(self, trace: Trace, capacity: int | None) -> Iterator[Setting]:
        splits = [0, *max_split_candidates(trace)]
        for expandable, split, roundup in product((False, True), splits, ROUNDUP_CHOICES):
            yield self.setting_of(PyTorchSettings(expandable_segments=expandable,
                                                  max_split_size_mb=split,
                                                  roundup_power2_divisions=roundup))
        yield self.setting_of(PyTorchSettings(backend=ASYNC))

    def fraction_applies(self, setting: Setting) -> bool:
        return self.value(setting).backend == NATIVE

    def parse_current(self, text: str) -> Setting:
        """``PYTORCH_CUDA_ALLOC_CONF=...`` (or the bare value) as PyTorch parses it, plus
        ``per_process_memory_fraction=F`` (set in code) as an extra item."""
        body = text.strip()
        fraction = 0.0
        match = re.search(r"(?:^|[\s;])per_process_memory_fraction\s*=\s*([^\s;]+)", body)
        if match:
            try:
                fraction = float(match.group(1))
            except ValueError:
                raise TuneInputError("per_process_memory_fraction: expected a number in "
                                     f"(0, 1], got {match.group(1)!r}") from None
            if not 0.0 < fraction <= 1.0:
                raise TuneInputError("set_per_process_memory_fraction: invalid fraction "
                                     f"{fraction:g}, has to be in (0, 1]")
            body = (body[:match.start()] + body[match.end():]).strip(" ;")
        conf = self._ask(lambda: PyTorchSettings.from_alloc_conf(body))
        for key in conf.changed():
            if key not in self.defaults or key == self.fraction_key:
                raise TuneInputError(f"{ALLOC_CONF}: {key} is modelled but not searched by "
                                     "tune; leave it out")
        return self.setting_of(replace(conf, per_process_memory_fraction=fraction or None))

    # -- sharing: settings that cannot change the outcome on this trace ------------------
    def canonical(self, setting: Setting, trace: Trace, sizes: list[int]) -> Setting:
        """The setting with every choice that cannot change this trace's replay dropped:
        a divisions table that rounds each of the trace's sizes as the defaults do; outside
        expandable segments, a max_split_size above every block this trace can make (no
        block is oversize: every rule that reads max_split_size decides as unset, and the
        OOM path's release of oversize blocks finds none); a GC threshold without a fraction
        (PyTorch runs GC only when a fraction is set) or with expandable segments (GC frees
        only unsplit blocks, and a block of an expandable segment always has a neighbour, if
        only the segment's unmapped rest: pytorch/oom.py's garbage_collect_cached_blocks
        returns at once there)."""
        v = self.value(setting)
        if v.backend != NATIVE:
            return setting
        table = v.roundup_power2_divisions
        if table and all(round_size(s, parse_roundup_power2_divisions(table)) == round_size(s)
                         for s in sizes):
            v = replace(v, roundup_power2_divisions="")
        split = v.max_split_size_mb
        if (split and not v.expandable_segments
                and split * MiB > _largest_block(sizes, v.roundup_power2_divisions or None)):
            v = replace(v, max_split_size_mb=0)
        if v.garbage_collection_threshold and (v.per_process_memory_fraction is None
                                               or v.expandable_segments):
            v = replace(v, garbage_collection_threshold=0.0)
        return self.setting_of(v)


def _largest_block(sizes: list[int], table: str | None) -> int:
    """The largest block any request of ``sizes`` can live in outside expandable segments:
    the largest segment a miss makes (a block never outgrows the segment it was cut
    from)."""
    divisions = parse_roundup_power2_divisions(table) if table else None
    return max((get_allocation_size(round_size(s, divisions)) for s in sizes), default=0)


# ==================================================================================== JAX
class Jax(Framework):
    name = "jax"
    settings = JaxSettings
    defaults: ClassVar[dict[str, Any]] = _defaults(JaxSettings)
    fraction_key = "fraction"
    not_modelled = ("XLA_PYTHON_CLIENT_ALLOCATOR=vmm",
                    "XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB (collective memory)",
                    "XLA's own buffer assignment inside one executable (the trace's buffers "
                    "are taken as given)")
    evidence = ("BFC checked against JAX's/TensorFlow's recorded BFC decisions "
                "(`bfc_fidelity`) and XLA buffer assignment against the offline plan "
                "(`xla_fidelity`); preallocation and cuda_async follow the source, not a "
                "recording")

    def discrete(self, trace: Trace, capacity: int | None) -> Iterator[Setting]:
        for allocator in ("bfc", "cuda_async"):
            for preallocate in (True, False):
                yield self.setting_of(JaxSettings(allocator=allocator, preallocate=preallocate))
        yield self.setting_of(JaxSettings(allocator="platform"))

    def fraction_applies(self, setting: Setting) -> bool:
        v = self.value(setting)
        return v.allocator == "bfc" or (v.allocator == "cuda_async" and v.preallocate)


# ============================================================================= TensorFlow
class TensorFlow(Framework):
    name = "tensorflow"
    settings = TensorFlowSettings
    defaults: ClassVar[dict[str, Any]] = _defaults(TensorFlowSettings)
    fraction_key = "memory_fraction"
    not_modelled = ("TF_GPU_ALLOCATOR=cuda_malloc_async",
                    "the memory TensorFlow leaves to the system by default (the whole card is "
                    "taken as the limit)", "BFC's 10-second wait for other threads' frees")
    evidence = ("BFC checked against TensorFlow's real BFC allocator run on the CPU "
                "(`validate --backend tensorflow`) and recorded BFC decisions (`bfc_fidelity`)")

    def discrete(self, trace: Trace, capacity: int | None) -> Iterator[Setting]:
        for growth, collect in product((False, True), (True, False)):
            yield self.setting_of(TensorFlowSettings(allow_growth=growth,
                                                     garbage_collection=collect))


# =================================================================================== CuPy
class CuPy(Framework):
    name = "cupy"
    settings = CuPySettings
    defaults: ClassVar[dict[str, Any]] = _defaults(CuPySettings)
    fraction_key = "limit_fraction"
    not_modelled = ("MemoryAsyncPool's soft cap at its limit (its release threshold is "
                    "modelled; pool trimming is assumed at every free, the most it can do)",
                    "PinnedMemoryPool (host memory)")
    evidence = ("not checked against a recording of CuPy's pool: the model follows "
                "cupy/cuda/memory.pyx")

    def discrete(self, trace: Trace, capacity: int | None) -> Iterator[Setting]:
        for pool in POOLS:
            yield self.setting_of(CuPySettings(pool=pool))

    def fraction_applies(self, setting: Setting) -> bool:
        return self.value(setting).pool in ("default", "async")


FRAMEWORK: dict[str, Framework] = {f.name: f for f in (PyTorch(), Jax(), TensorFlow(), CuPy())}


def framework(name: str) -> Framework:
    """The framework called ``name``; one line naming the known ones otherwise."""
    try:
        return FRAMEWORK[name.strip().lower()]
    except KeyError:
        raise TuneInputError(f"unknown framework {name!r}; known: {', '.join(FRAMEWORKS)}"
                             ) from None


def trace_framework(trace: Trace) -> str | None:
    """Which framework recorded ``trace`` (None: synthetic or not said)."""
    meta = trace.metadata
    fmt = str(meta.get("format", ""))
    recorder = str(meta.get("recorder", "")).lower()
    if fmt.startswith("torch") or "torch" in meta or "record_torch" in recorder:
        return "pytorch"
    if "jax" in meta or "jax" in recorder or fmt == "xla-dump":
        return "jax"
    if fmt == "cupy-log" or "cupy" in recorder:
        return "cupy"
    if fmt == "xplane":
        return "tensorflow" if "tensorflow" in str(meta.get("source", "")).lower() else "jax"
    return None


def distinct_sizes(trace: Trace) -> list[int]:
    """The distinct request sizes of the trace (what rounding rules see)."""
    sizes = trace.size[trace.op == OP_ALLOC]
    return [int(s) for s in np.unique(sizes) if s > 0]


def exact_size(nbytes: int) -> str:
    """Bytes as MiB with one decimal (``1,642.0 MiB``): settings often differ by a few MiB,
    which a rounded GiB figure hides."""
    return f"{nbytes / MiB:,.1f} MiB"


def describe(setting: Setting, capacity: int | None) -> str:
    """The setting as pasted, or ``defaults``."""
    lines = FRAMEWORK[setting.framework].paste(setting, capacity)
    return " ; ".join(lines) if lines else f"{setting.framework} defaults"


__all__ = ["FRAMEWORK", "FRAMEWORKS", "Framework", "Setting", "TuneInputError", "describe",
           "distinct_sizes", "exact_size", "format_size", "fraction_text", "framework",
           "trace_framework"]
