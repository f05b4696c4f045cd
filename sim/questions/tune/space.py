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
from dataclasses import dataclass
from itertools import product
from typing import Any, ClassVar

import numpy as np

from allocsim.errors import UserInputError
from allocsim.policies import format_size, parse_policy
from allocsim.policies.pytorch.caching import (
    get_allocation_size,
    parse_alloc_conf,
    parse_roundup_power2_divisions,
    round_size,
)
from allocsim.traces.model import OP_ALLOC, Trace

MiB = 1 << 20
NEVER_RELEASE = 1 << 60          # a release threshold no card reaches (UINT64_MAX in CUDA)
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


def fraction_text(value: float) -> str:
    """``0.62`` → ``.62`` (as JAX's documentation writes it); ``1.0`` → ``1``."""
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text[1:] if text.startswith("0.") else text


class Framework:
    """A framework's settings: what is searched, the spec each choice stands for, the line to
    paste. Subclasses fill the class attributes and the four methods."""

    name = ""
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

    def spec(self, setting: Setting, capacity: int | None = None) -> str:
        raise NotImplementedError

    def paste(self, setting: Setting, capacity: int | None = None) -> list[str]:
        """The lines to paste (environment first, then code); [] for the defaults."""
        raise NotImplementedError

    def parse_current(self, text: str) -> Setting:
        raise NotImplementedError

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
    defaults: ClassVar[dict[str, Any]] = {
        "backend": "native", "expandable_segments": False, "max_split_size_mb": 0,
        "roundup_power2_divisions": "", "garbage_collection_threshold": 0.0,
        "per_process_memory_fraction": 0.0}
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
            yield self.make({"expandable_segments": expandable, "max_split_size_mb": split,
                             "roundup_power2_divisions": roundup})
        yield self.make({"backend": "cudaMallocAsync"})

    def fraction_applies(self, setting: Setting) -> bool:
        return setting.get("backend", "native") == "native"

    def spec(self, setting: Setting, capacity: int | None = None) -> str:
        v = self.full(setting)
        if v["backend"] == "cudaMallocAsync":
            return f"cuda-async:release_threshold={NEVER_RELEASE}"
        params = []
        if v["expandable_segments"]:
            params.append("expandable_segments=true")
        if v["max_split_size_mb"]:
            params.append(f"max_split_size_mb={v['max_split_size_mb']}")
        if v["roundup_power2_divisions"]:
            params.append("roundup_power2_divisions="
                          + v["roundup_power2_divisions"].replace(",", ";"))
        if v["garbage_collection_threshold"]:
            params.append(f"garbage_collection_threshold={v['garbage_collection_threshold']}")
        if v["per_process_memory_fraction"]:
            params.append(f"per_process_memory_fraction={v['per_process_memory_fraction']}")
        return "pytorch" + (":" + ",".join(params) if params else "")

    def paste(self, setting: Setting, capacity: int | None = None) -> list[str]:
        v = self.full(setting)
        conf = []
        if v["backend"] != "native":
            conf.append(f"backend:{v['backend']}")
        if v["expandable_segments"]:
            conf.append("expandable_segments:True")
        if v["max_split_size_mb"]:
            conf.append(f"max_split_size_mb:{v['max_split_size_mb']}")
        if v["roundup_power2_divisions"]:
            conf.append(f"roundup_power2_divisions:{v['roundup_power2_divisions']}")
        if v["garbage_collection_threshold"]:
            conf.append(f"garbage_collection_threshold:{v['garbage_collection_threshold']}")
        lines = []
        if conf:
            text = ",".join(conf)
            lines.append(f"PYTORCH_CUDA_ALLOC_CONF='{text}'" if "[" in text
                         else f"PYTORCH_CUDA_ALLOC_CONF={text}")
        if v["per_process_memory_fraction"]:
            lines.append("torch.cuda.set_per_process_memory_fraction("
                         f"{v['per_process_memory_fraction']:g})")
        return lines

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
        backend = "native"
        if re.search(r"backend\s*:\s*cudaMallocAsync", body):
            backend = "cudaMallocAsync"
            body = re.sub(r"backend\s*:\s*cudaMallocAsync\s*,?", "", body).rstrip(", ")
        try:
            params = parse_alloc_conf(body) if body.split("=", 1)[-1].strip("'\" ") else {}
        except ValueError as err:
            raise TuneInputError(str(err)) from None
        values: dict[str, Any] = {"backend": backend, "per_process_memory_fraction": fraction}
        for key, value in params.items():
            if key == "expandable_segments":
                values[key] = value == "true"
            elif key == "roundup_power2_divisions":
                values[key] = value.replace(";", ",")
            elif key == "garbage_collection_threshold":
                values[key] = float(value)
            elif key == "max_split_size_mb":
                values[key] = int(value)
            else:
                raise TuneInputError(f"PYTORCH_CUDA_ALLOC_CONF: {key} is modelled but not "
                                     "searched by tune; leave it out")
        return self.make(values)

    # -- sharing: settings that cannot change the outcome on this trace ------------------
    def canonical(self, setting: Setting, trace: Trace, sizes: list[int]) -> Setting:
        """The setting with every choice that cannot change this trace's replay dropped:
        a divisions table that rounds each of the trace's sizes as the defaults do; outside
        expandable segments, a max_split_size above every block this trace can make (no
        block is oversize: every rule that reads max_split_size decides as unset, and the
        OOM path's release of oversize blocks finds none); a GC threshold without a fraction
        (PyTorch runs GC only when a fraction is set)."""
        v = dict(setting.values)
        if setting.get("backend", "native") != "native":
            return setting
        table = v.get("roundup_power2_divisions")
        if table and all(round_size(s, parse_roundup_power2_divisions(table)) == round_size(s)
                         for s in sizes):
            v.pop("roundup_power2_divisions")
        split = v.get("max_split_size_mb")
        if (split and not v.get("expandable_segments")
                and split * MiB > _largest_block(sizes, v.get("roundup_power2_divisions"))):
            v.pop("max_split_size_mb")
        if v.get("garbage_collection_threshold") and not v.get("per_process_memory_fraction"):
            v.pop("garbage_collection_threshold")
        return self.make(v)


def _largest_block(sizes: list[int], table: str | None) -> int:
    """The largest block any request of ``sizes`` can live in outside expandable segments:
    the largest segment a miss makes (a block never outgrows the segment it was cut
    from)."""
    divisions = parse_roundup_power2_divisions(table) if table else None
    return max((get_allocation_size(round_size(s, divisions)) for s in sizes), default=0)


# ==================================================================================== JAX
class Jax(Framework):
    name = "jax"
    defaults: ClassVar[dict[str, Any]] = {"allocator": "bfc", "preallocate": True, "fraction": 0.75}
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
                yield self.make({"allocator": allocator, "preallocate": preallocate})
        yield self.make({"allocator": "platform"})

    def fraction_applies(self, setting: Setting) -> bool:
        v = self.full(setting)
        return v["allocator"] == "bfc" or (v["allocator"] == "cuda_async" and v["preallocate"])

    def spec(self, setting: Setting, capacity: int | None = None) -> str:
        v = self.full(setting)
        return (f"jax:allocator={v['allocator']},preallocate={str(v['preallocate']).lower()},"
                f"fraction={v['fraction']}")

    def paste(self, setting: Setting, capacity: int | None = None) -> list[str]:
        v = dict(setting.values)
        env = []
        if "preallocate" in v:
            env.append(f"XLA_PYTHON_CLIENT_PREALLOCATE={str(v['preallocate']).lower()}")
        if "fraction" in v:
            env.append(f"XLA_PYTHON_CLIENT_MEM_FRACTION={fraction_text(v['fraction'])}")
        if "allocator" in v:
            env.append(f"XLA_PYTHON_CLIENT_ALLOCATOR={v['allocator']}")
        return [" ".join(env)] if env else []

    def parse_current(self, text: str) -> Setting:
        """``VAR=VALUE`` words, as jax/_src/xla_bridge.py reads the environment."""
        values: dict[str, Any] = {}
        seen: dict[str, str] = {}
        for word in text.split():
            name, equals, value = word.partition("=")
            if not equals:
                raise TuneInputError(f"jax: expected VAR=VALUE, got {word!r}")
            seen[name] = value.strip("'\"")
        fractions = [seen[k] for k in ("XLA_CLIENT_MEM_FRACTION",
                                       "XLA_PYTHON_CLIENT_MEM_FRACTION") if k in seen]
        if len(fractions) == 2:
            raise TuneInputError("XLA_CLIENT_MEM_FRACTION is specified together with "
                                 "XLA_PYTHON_CLIENT_MEM_FRACTION. Remove the latter one, "
                                 "it is deprecated.")
        for name, value in seen.items():
            if name == "XLA_PYTHON_CLIENT_ALLOCATOR":
                allocator = value.lower()
                if allocator == "vmm":
                    raise TuneInputError("XLA_PYTHON_CLIENT_ALLOCATOR=vmm is a JAX allocator "
                                         "allocsim does not model")
                if allocator not in ("default", "platform", "bfc", "cuda_async"):
                    raise TuneInputError('XLA_PYTHON_CLIENT_ALLOCATOR env var must be '
                                         '"default", "platform", "bfc", or "cuda_async", '
                                         f'got "{allocator}"')
                values["allocator"] = "bfc" if allocator == "default" else allocator
            elif name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
                try:
                    fraction = float(value)
                except ValueError:
                    raise TuneInputError(f"{name}: could not convert string to float: "
                                         f"{value!r}") from None
                if not 0.0 < fraction <= 1.0:
                    raise TuneInputError(f"{name}={value}: a fraction of the card in (0, 1] "
                                         "is modelled")
                values["fraction"] = fraction
            elif name == "XLA_PYTHON_CLIENT_PREALLOCATE":
                values["preallocate"] = value not in ("false", "False", "0")
            else:
                raise TuneInputError(f"jax: unknown setting {name!r}; known: "
                                     "XLA_PYTHON_CLIENT_PREALLOCATE, "
                                     "XLA_PYTHON_CLIENT_MEM_FRACTION (or XLA_CLIENT_MEM_FRACTION),"
                                     " XLA_PYTHON_CLIENT_ALLOCATOR")
        return self.make(values)


# ============================================================================= TensorFlow
class TensorFlow(Framework):
    name = "tensorflow"
    defaults: ClassVar[dict[str, Any]] = {
        "allow_growth": False, "garbage_collection": True, "memory_fraction": 0.0}
    fraction_key = "memory_fraction"
    not_modelled = ("TF_GPU_ALLOCATOR=cuda_malloc_async",
                    "the memory TensorFlow leaves to the system by default (the whole card is "
                    "taken as the limit)", "BFC's 10-second wait for other threads' frees")
    evidence = ("BFC checked against TensorFlow's real BFC allocator run on the CPU "
                "(`validate --backend tensorflow`) and recorded BFC decisions (`bfc_fidelity`)")

    def discrete(self, trace: Trace, capacity: int | None) -> Iterator[Setting]:
        for growth, collect in product((False, True), (True, False)):
            yield self.make({"allow_growth": growth, "garbage_collection": collect})

    def _limit_mb(self, fraction: float, capacity: int | None) -> int:
        if capacity is None:
            raise TuneInputError("tensorflow: a memory limit needs a card (--device or "
                                 "--capacity)")
        return max(1, int(fraction * capacity) // MiB)

    def spec(self, setting: Setting, capacity: int | None = None) -> str:
        v = self.full(setting)
        params = [f"allow_growth={str(v['allow_growth']).lower()}",
                  f"garbage_collection={str(v['garbage_collection']).lower()}"]
        if v["memory_fraction"]:
            params.append(f"memory_limit={self._limit_mb(v['memory_fraction'], capacity)}MiB")
        return "bfc:" + ",".join(params)

    def paste(self, setting: Setting, capacity: int | None = None) -> list[str]:
        v = dict(setting.values)
        env = []
        if "allow_growth" in v:
            env.append(f"TF_FORCE_GPU_ALLOW_GROWTH={str(v['allow_growth']).lower()}")
        if "garbage_collection" in v:
            env.append("TF_ENABLE_GPU_GARBAGE_COLLECTION="
                       f"{str(v['garbage_collection']).lower()}")
        lines = [" ".join(env)] if env else []
        if v.get("memory_fraction"):
            limit = self._limit_mb(v["memory_fraction"], capacity)
            lines.append("tf.config.set_logical_device_configuration(tf.config."
                         "list_physical_devices('GPU')[0], [tf.config."
                         f"LogicalDeviceConfiguration(memory_limit={limit})])")
        return lines

    def parse_current(self, text: str) -> Setting:
        """``TF_FORCE_GPU_ALLOW_GROWTH`` / ``TF_ENABLE_GPU_GARBAGE_COLLECTION`` take exactly
        ``true`` or ``false`` (gpu_bfc_allocator.cc; anything else TensorFlow logs as an error
        and ignores — refused here, since the job would not run with what was meant)."""
        values: dict[str, Any] = {}
        keys = {"TF_FORCE_GPU_ALLOW_GROWTH": "allow_growth",
                "TF_ENABLE_GPU_GARBAGE_COLLECTION": "garbage_collection"}
        for word in text.split():
            name, equals, value = word.partition("=")
            if name not in keys or not equals:
                raise TuneInputError(f"tensorflow: unknown setting {word!r}; known: "
                                     + ", ".join(f"{k}=true|false" for k in keys))
            value = value.strip("'\"")
            if value not in ("true", "false"):
                raise TuneInputError(f"The {name} environment variable is set but could not "
                                     f"be parsed: {value!r} (TensorFlow accepts true or false)")
            values[keys[name]] = value == "true"
        return self.make(values)


# =================================================================================== CuPy
class CuPy(Framework):
    name = "cupy"
    defaults: ClassVar[dict[str, Any]] = {"pool": "default", "limit_fraction": 0.0}
    fraction_key = "limit_fraction"
    not_modelled = ("MemoryAsyncPool's soft cap at its limit (its release threshold is "
                    "modelled; pool trimming is assumed at every free, the most it can do)",
                    "PinnedMemoryPool (host memory)")
    evidence = ("not checked against a recording of CuPy's pool: the model follows "
                "cupy/cuda/memory.pyx")

    def discrete(self, trace: Trace, capacity: int | None) -> Iterator[Setting]:
        for pool in ("default", "async", "none"):
            yield self.make({"pool": pool})

    def fraction_applies(self, setting: Setting) -> bool:
        return setting.get("pool", "default") in ("default", "async")

    def spec(self, setting: Setting, capacity: int | None = None) -> str:
        v = self.full(setting)
        if v["pool"] == "none":
            return "on-demand"
        if v["pool"] == "async":
            if v["limit_fraction"]:
                if capacity is None:
                    raise TuneInputError("cupy: an async pool's limit needs a card")
                return f"cuda-async:release_threshold={int(v['limit_fraction'] * capacity)}"
            return f"cuda-async:release_threshold={NEVER_RELEASE}"
        if v["limit_fraction"]:
            return f"cupy:fraction={v['limit_fraction']}"
        return "cupy"

    def paste(self, setting: Setting, capacity: int | None = None) -> list[str]:
        v = self.full(setting)
        lines = []
        if v["limit_fraction"]:
            lines.append(f"CUPY_GPU_MEMORY_LIMIT={v['limit_fraction'] * 100:.4g}%")
        if v["pool"] == "async":
            lines.append("cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)")
        elif v["pool"] == "none":
            lines.append("cupy.cuda.set_allocator(None)")
        return lines

    def parse_current(self, text: str) -> Setting:
        """``CUPY_GPU_MEMORY_LIMIT=N%`` (or bytes: needs the card, refused here) and
        ``pool=default|async|none``."""
        values: dict[str, Any] = {}
        for word in text.split():
            name, equals, value = word.partition("=")
            if name == "CUPY_GPU_MEMORY_LIMIT" and equals:
                if not value.endswith("%"):
                    raise TuneInputError("CUPY_GPU_MEMORY_LIMIT: give it as a share of the "
                                         f"card, e.g. 50%; got {value!r}")
                try:
                    fraction = float(value[:-1]) / 100
                except ValueError:
                    raise TuneInputError(f"CUPY_GPU_MEMORY_LIMIT: bad value {value!r}") from None
                if not 0 <= fraction <= 1:
                    raise TuneInputError(f"memory limit fraction out of range: {fraction}")
                values["limit_fraction"] = fraction
            elif name == "pool" and value in ("default", "async", "none"):
                values["pool"] = value
            else:
                raise TuneInputError(f"cupy: unknown setting {word!r}; known: "
                                     "CUPY_GPU_MEMORY_LIMIT=N%, pool=default|async|none")
        return self.make(values)


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
