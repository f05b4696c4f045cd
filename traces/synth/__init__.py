"""Seeded generators of realistic synthetic allocation traces.

Four workloads, each a function returning a :class:`~allocsim.traces.model.Trace` and registered in
:data:`GENERATORS` under a short kind name:

- ``training``    -- a static-shape DNN training loop (the project's default trace);
- ``transformer`` -- transformer training with a different sequence length every step;
- ``kvcache``     -- LLM inference serving with KV caches that grow token by token;
- ``random``      -- sizes and lifetimes drawn from distributions (the null model).

Every generator is deterministic: the same parameters and ``seed`` give identical columns, and
the trace's metadata (``params``) holds everything needed to regenerate it. Every trace is valid:
ids are never reused, every free closes a live buffer and carries its size, times never
decrease. Use::

    from allocsim.traces.synth import generate, parse_params
    trace = generate("transformer", seed=1, events=100_000)
    trace = generate("kvcache", **parse_params("kvcache", ["bytes_per_token=8KiB", "layers=32"]))

A trace too large to hold (``training`` and ``transformer``, ``pattern=eager``: up to 1e10
events) is written to an ``.npz`` block by block, the same trace as ``generate`` makes::

    from allocsim.traces.synth import plan, save_streamed
    save_streamed(plan("transformer", events=500_000_000), "big.npz")
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from allocsim.ascii_numbers import decimal_number
from allocsim.errors import UserInputError
from allocsim.traces.model import Trace
from allocsim.traces.synth import kvcache as _kvcache
from allocsim.traces.synth import random_workload as _random
from allocsim.traces.synth import training as _training
from allocsim.traces.synth import transformer as _transformer
from allocsim.traces.synth._common import _CHECKING, _PLANNING, ParamsChecked, describe
from allocsim.traces.synth.rendering import (
    STREAM_ABOVE_EVENTS,
    Planned,
    StreamedFacts,
    SynthPlan,
    save_streamed,
)

__all__ = [
    "GENERATORS",
    "STREAM_ABOVE_EVENTS",
    "GeneratorInfo",
    "StreamedFacts",
    "SynthPlan",
    "check",
    "generate",
    "kvcache",
    "parse_params",
    "plan",
    "random_workload",
    "save_streamed",
    "training",
    "transformer",
]

training = _training.training
transformer = _transformer.transformer
kvcache = _kvcache.kvcache
random_workload = _random.random_workload


@dataclass(frozen=True)
class GeneratorInfo:
    """One registered generator: ``params`` maps name -> (type, default, help).

    ``sizes`` names the int parameters that are byte sizes: those also accept "64MiB", "1.5GB".
    """

    name: str
    function: Callable[..., Trace]
    description: str
    params: dict[str, tuple[type, Any, str]]
    sizes: frozenset[str] = frozenset()

    def is_size(self, param: str) -> bool:
        return param in self.sizes


def _info(name: str, module: Any, function: Callable[..., Trace]) -> GeneratorInfo:
    first_line = module.__doc__.strip().splitlines()[0]
    params = describe(function, module.HELP)
    sizes = frozenset(getattr(module, "SIZE_PARAMS", ()))
    if not sizes <= set(params):
        raise AssertionError(f"{name}: SIZE_PARAMS names unknown parameters")
    return GeneratorInfo(name, function, first_line, params, sizes)


GENERATORS: dict[str, GeneratorInfo] = {
    info.name: info for info in (
        _info("training", _training, training),
        _info("transformer", _transformer, transformer),
        _info("kvcache", _kvcache, kvcache),
        _info("random", _random, random_workload),
    )
}


def _lookup(kind: str) -> GeneratorInfo:
    try:
        return GENERATORS[kind]
    except KeyError:
        raise UserInputError(f"unknown synthetic workload {kind!r}; known kinds: "
                         f"{', '.join(sorted(GENERATORS))}") from None


def _check_names(info: GeneratorInfo, names: Iterable[str]) -> None:
    unknown = [n for n in names if n not in info.params]
    if unknown:
        raise UserInputError(f"{info.name}: unknown parameter {unknown[0]!r}; known parameters: "
                         f"{', '.join(sorted(info.params))}")


def generate(kind: str, *, seed: int = 0, **params: Any) -> Trace:
    """Generate a ``kind`` trace (see :data:`GENERATORS`) with ``params`` over the defaults.

    String values are converted as :func:`parse_params` does, so CLI input can pass straight
    through. Raises ValueError (one line) for an unknown kind or parameter or a bad value.
    """
    info = _lookup(kind)
    _check_names(info, params)
    values = {name: _convert(info, name, value) if isinstance(value, str) else value
              for name, value in params.items()}
    if int(seed) < 0:  # numpy's generators take seeds >= 0
        raise UserInputError(f"{kind}: the seed must be a whole number >= 0, got {seed}")
    return info.function(seed=int(seed), **values)


def check(kind: str, *, seed: int | str = 0, **params: Any) -> None:
    """Raise what :func:`generate` would for these arguments (one line), generating nothing:
    a sweep checks every synthetic trace of its grid this way before any cell runs."""
    token = _CHECKING.set(True)
    try:
        generate(kind, seed=int(seed), **params)
    except ParamsChecked:
        return
    except ValueError as err:
        if isinstance(err, UserInputError):
            raise
        raise UserInputError(f"{kind}: {err}") from None
    finally:
        _CHECKING.reset(token)


def plan(kind: str, *, seed: int = 0, **params: Any) -> SynthPlan | Trace:
    """The ``kind`` trace :func:`generate` makes, not yet rendered where it can be streamed
    (``training`` and ``transformer`` with ``pattern=eager``: a :class:`SynthPlan`, held to
    :data:`~allocsim.traces.synth._common.MAX_STREAMED_EVENTS` rather than the in-memory
    limit; :func:`save_streamed` writes it block by block), else the Trace itself."""
    token = _PLANNING.set(True)
    try:
        return generate(kind, seed=seed, **params)
    except Planned as handed:
        return handed.plan
    finally:
        _PLANNING.reset(token)


def parse_params(kind: str, items: Iterable[str]) -> dict[str, Any]:
    """``["layers=24", "bytes_per_token=8KiB"]`` -> ``{"layers": 24, "bytes_per_token": 8192}``.

    Values are converted to the declared types: ints accept underscores and exact scientific
    notation ("1_000_000", "1e6"); size parameters also accept units ("512KiB", "64MiB",
    "1.5GB"; KiB/K = 1024, KB = 1000); ``none`` clears an optional parameter.
    """
    info = _lookup(kind)
    result: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UserInputError(f"{kind}: expected key=value, got {item!r}")
        _check_names(info, [name])
        result[name] = _convert(info, name, text.strip())
    return result


def _convert(info: GeneratorInfo, name: str, text: str) -> Any:
    kind, default, _ = info.params[name]
    if text.lower() in ("none", "null", "") and default is None:
        return None
    try:
        if kind is int:
            return _parse_size(text) if info.is_size(name) else _parse_int(text)
        if kind is float:
            return decimal_number(text.replace("_", ""))
        if kind is bool:
            return _parse_bool(text)
        return kind(text)
    except ValueError as err:
        raise UserInputError(f"{info.name}: bad value for {name}: {err}") from None


_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gib": 1024**3, "gb": 1000**3,
    "t": 1024**4, "tib": 1024**4, "tb": 1000**4,
}
_SIZE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]+)?(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*$")


def _parse_size(text: str) -> int:
    """Bytes in "4096", "1_048_576", "512KiB", "64MiB", "1.5GB" (binary K/KiB, decimal KB)."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise UserInputError(f"not a size: {text!r} (examples: 4096, 512KiB, 64MiB, 1.5GB)")
    value = float(match.group(1).replace("_", "")) * _UNITS[unit]
    if not value.is_integer():
        raise UserInputError(f"not a whole number of bytes: {text!r}")
    return int(value)


def _parse_int(text: str) -> int:
    """An integer, allowing underscores and exact scientific notation ("1e6")."""
    if not text.isascii():   # int() takes "١٢٨" (allocsim/ascii_numbers.py)
        raise UserInputError(f"not an integer in ASCII digits: {text!r}")
    cleaned = text.replace("_", "")
    try:
        return int(cleaned)
    except ValueError:
        pass
    try:
        value = float(cleaned)
    except ValueError:
        value = float("nan")
    if not value.is_integer():
        raise UserInputError(f"not an integer: {text!r}")
    return int(value)


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise UserInputError(f"not a boolean: {text!r}")
