"""The Python API in one place: ``allocsim.load``, ``replay``, ``compare``, ``min_capacity``,
``tune`` (and ``device``, to name the card once).

Each function is a thin call of the function its command runs — :func:`traces.formats.load
<allocsim.traces.formats.load>`, :func:`sim.kernel.engine.replay
<allocsim.sim.kernel.engine.replay>`, :func:`sim.questions.compare.compare
<allocsim.sim.questions.compare.compare>`, :func:`sim.questions.capacity.minimum.min_capacity
<allocsim.sim.questions.capacity.minimum.min_capacity>`, :func:`sim.questions.tune.recommend.tune
<allocsim.sim.questions.tune.recommend.tune>` — with the command line's defaults, so that
``allocsim.compare(trace, device="a100-40g")`` is the answer ``allocsim compare FILE --device
a100-40g --json`` prints (tests/test_python_api.py holds each to its command). What it adds
is only the conveniences a notebook wants, and what it leaves out is the command line's own
(progress lines, files written, the next step when nothing fits):

- a trace argument may be a :class:`~allocsim.traces.model.Trace` or a path (``"default"``:
  the bundled trace), loaded as :func:`load` does;
- a device argument may be a :class:`~allocsim.sim.kernel.device_profile.DeviceProfile`, a
  profile's name (``"a100-40g"``; ``allocsim devices`` lists them) or None, the default
  profile — what ``--device`` gives, and nothing more: ``device("a100-80g", capacity="24GiB")``
  is ``--device a100-80g --capacity 24GiB``. (With no ``--device``, ``compare`` on the command
  line takes a TPU profile's chip, or the GPU a trace was compiled for; here, name it.)

A user's mistake (a file that is no trace, an unknown device or policy) raises the
:class:`~allocsim.errors.UserInputError` (a :class:`~allocsim.traces.model.TraceError` for a
file) whose one line the command would print. Each argument is checked here, at the edge,
before anything runs: one of the wrong type (a number as a policy, a float as a number of
bytes, ``True`` as a size) raises a :class:`TypeError`, one out of range (a capacity of −1, a
granularity of 0, ``max_slowdown=nan``) a ``UserInputError`` (a :class:`ValueError`); either
names the argument in one line (``"resolution: ..."``, ``"device.granularity: ..."``).
Importing :mod:`allocsim` does not import this module: its names are loaded on first use
(``allocsim/__init__.py``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Iterable
from pathlib import Path

from allocsim.errors import UserInputError
from allocsim.frameworks import canonical_framework
from allocsim.policies import PolicySpec
from allocsim.policies.units import format_size, parse_size
from allocsim.sim.kernel import engine
from allocsim.sim.kernel.device_profile import (
    MAX_CALL_SECONDS,
    MAX_GRANULARITY,
    MAX_PROFILE_CAPACITY,
    CostModel,
    DeviceProfile,
    check_capacity,
    resolve_device,
)
from allocsim.sim.kernel.results import RunResult
from allocsim.sim.questions import compare as compare_question
from allocsim.sim.questions.capacity import minimum
from allocsim.sim.questions.compare import DEFAULT_MAX_SLOWDOWN, Comparison, normalize_spec
from allocsim.sim.questions.framework_settings import default_choice, generic_choice
from allocsim.sim.questions.tune import recommend
from allocsim.traces import formats
from allocsim.traces.bundled import resolve_trace_name
from allocsim.traces.model import Trace

TraceLike = Trace | str | os.PathLike[str]
DeviceLike = DeviceProfile | str | None


def load(path: str | os.PathLike[str], *, strict: bool | None = None,
         **options: object) -> Trace:
    """The trace in the file (or folder) at ``path``, validated; ``"default"`` is the bundled
    trace. ``strict``: fail on the first anomaly of a recording (default: repair and report,
    for other tools' files; native files are always strict). ``options`` go to the format's
    reader, as the command line's reading options do (``device_index=1``, ``module=...``,
    ``view="buffers"``, ``steps=2``, ``allocator=...``, ``start_state="unrecorded"``)."""
    _check_path(path, "path")
    if strict is not None and not isinstance(strict, bool):
        raise TypeError(f"strict: expected True, False or None, got {_shown(strict)}")
    return formats.load(resolve_trace_name(os.fspath(path)), strict=strict, **options)


def device(name: str | None = None, *, capacity: str | int | None = None,
           profile_file: str | Path | None = None) -> DeviceProfile:
    """The device ``--device NAME`` (default: the default profile), ``--capacity SIZE`` (bytes,
    or text such as ``"24GiB"``) and ``--device-profile FILE`` name."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name: expected a device's name such as 'a100-40g' or None, "
                        f"got {_shown(name)}")
    if profile_file is not None:
        _check_path(profile_file, "profile_file")
    nbytes = None if capacity is None else _capacity(capacity)
    return resolve_device(name, nbytes, profile_file)


def replay(trace: TraceLike, policy: str | PolicySpec, device: DeviceLike = None, *,
           stop_on_oom: bool = False) -> RunResult:
    """``trace`` replayed through ``policy`` (a spec such as ``"bfc:allow_growth=false"``) on a
    fresh ``device``: peak reserved and allocated, fragmentation, modelled allocator time, the
    first OOM, the timeline (:class:`~allocsim.sim.kernel.results.RunResult`). The run goes on
    after an OOM unless ``stop_on_oom``."""
    _check_policy(policy, "policy")
    if not isinstance(stop_on_oom, bool):
        raise TypeError(f"stop_on_oom: expected True or False, got {_shown(stop_on_oom)}")
    profile = _device(device)
    return engine.replay(_trace(trace), policy, profile, stop_on_oom=stop_on_oom)


def compare(trace: TraceLike, policies: Iterable[str | PolicySpec] | None = None,
            device: DeviceLike = None, *,
            max_slowdown: float | None = DEFAULT_MAX_SLOWDOWN) -> Comparison:
    """``trace`` replayed through each policy on ``device``, and the winner with the reason
    (:class:`~allocsim.sim.questions.compare.Comparison`; the rule is in
    :mod:`~allocsim.sim.questions.compare`). ``policies``: default, the recording's own
    framework's settings, as ``allocsim compare`` weighs them. ``max_slowdown``: the most a
    winner's allocator time may slow the run (None or ``inf``: no budget)."""
    given = _policies(policies)
    budget = _max_slowdown(max_slowdown)
    profile = _device(device)
    loaded = _trace(trace)
    choice = (generic_choice([str(normalize_spec(p)) for p in given]) if given
              else default_choice(loaded, profile))
    return compare_question.compare(loaded, choice.specs, profile, max_slowdown=budget,
                                    choice=choice)


def min_capacity(trace: TraceLike, policy: str | PolicySpec, device: DeviceLike = None, *,
                 resolution: int = minimum.MiB) -> minimum.CapacityAnswer:
    """The smallest capacity, a multiple of ``resolution`` bytes, at which ``trace`` completes
    under ``policy``, with ``device``'s costs, granularity and own share
    (:class:`~allocsim.sim.questions.capacity.minimum.CapacityAnswer`)."""
    _check_policy(policy, "policy")
    step = _whole_number(resolution, "resolution")
    if not 1 <= step <= MAX_PROFILE_CAPACITY:
        raise UserInputError(f"resolution: must be from 1 byte to "
                             f"{format_size(MAX_PROFILE_CAPACITY)}, e.g. 1048576 (1 MiB); "
                             f"got {step:,}")
    profile = _device(device)
    return minimum.min_capacity(_trace(trace), normalize_spec(policy), profile,
                                resolution=step)


def tune(trace: TraceLike, framework: str, device: DeviceLike = None, *,
         max_slowdown: float | None = DEFAULT_MAX_SLOWDOWN, current: str | None = None,
         seed: int = 0) -> recommend.TuneResult:
    """The setting of ``framework`` (``"pytorch"``, ``"jax"``, ``"tensorflow"``, ``"cupy"``) to
    paste for ``trace``: on ``device``'s card, or, with no device, the smallest card and the
    setting that fits it (:class:`~allocsim.sim.questions.tune.recommend.TuneResult`; its
    ``paste`` holds the lines). ``current``: the setting the job runs with now, as the
    framework writes it, replayed beside the others. The same inputs and ``seed`` give the
    same answer."""
    if not isinstance(framework, str):
        raise TypeError(f"framework: expected a framework's name such as 'pytorch', "
                        f"got {_shown(framework)}")
    if current is not None and not isinstance(current, str):
        raise TypeError(f"current: expected the framework's setting as text or None, "
                        f"got {_shown(current)}")
    budget = _max_slowdown(max_slowdown)
    chosen_seed = _whole_number(seed, "seed", "a whole number (an int)")
    card = device is not None
    profile = _device(device)
    name = canonical_framework(framework) or framework     # "torch", "tf": as --framework
    return recommend.tune(_trace(trace), name, profile, card=card,
                          max_slowdown=budget, seed=chosen_seed, current=current)


# The checks at the edge. A wrong type is a TypeError, a value out of range a UserInputError
# (a ValueError); each message is one line that starts with the argument's name.

def _shown(value: object) -> str:
    """``value`` in an error line: its type and a short repr on one line."""
    text = " ".join(repr(value).split())
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _check_path(path: object, what: str) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what}: expected a path (str or os.PathLike), got {_shown(path)}")


_BYTES = "a whole number of bytes (an int)"


def _whole_number(value: object, what: str, kind: str = _BYTES) -> int:
    """``value`` as a plain int: an int or another integer type (numpy's), never a bool."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"{what}: expected {kind}, got {_shown(value)}")


def _capacity(value: object) -> int:
    """``device(capacity=...)``: bytes (an int, or a float with no fraction such as 24e9) or a
    size such as ``"24GiB"``, from 1 byte to the largest device allocsim models."""
    if isinstance(value, str):
        try:
            nbytes = parse_size(value)
        except UserInputError as err:
            raise UserInputError(f"capacity: {err}") from None
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise UserInputError(f"capacity: not a whole number of bytes: {value!r}")
        nbytes = int(value)
    else:
        nbytes = _whole_number(value, "capacity",
                               f"{_BYTES} or a size such as '24GiB'")
    return check_capacity(nbytes, "capacity")


def _check_policy(spec: object, what: str) -> None:
    if not isinstance(spec, (str, PolicySpec)):
        raise TypeError(f"{what}: expected a policy spec such as 'bfc' or "
                        f"'bfc:allow_growth=false', or a PolicySpec, got {_shown(spec)}")


def _policies(given: object) -> list[str | PolicySpec]:
    """``compare(policies=...)``: None (the default settings) or a list of policy specs."""
    if given is None:
        return []
    if isinstance(given, (str, bytes, PolicySpec)) or not isinstance(given, Iterable):
        raise TypeError(f"policies: expected a list of policy specs such as ['bfc', "
                        f"'best-fit'] or None, got {_shown(given)}")
    specs = list(given)
    for index, spec in enumerate(specs):
        _check_policy(spec, f"policies[{index}]")
    return specs


def _max_slowdown(value: object) -> float | None:
    """The slowdown budget, as ``--max-slowdown``: a factor >= 1; None or ``inf``: none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"max_slowdown: expected a number (a factor >= 1) or None, "
                        f"got {_shown(value)}")
    factor = float(value)
    if math.isnan(factor) or factor < 1:
        raise UserInputError(f"max_slowdown: must be a factor >= 1 (e.g. 1.1), or None or "
                             f"inf for no budget; got {value!r}")
    return None if math.isinf(factor) else factor


def _trace(trace: TraceLike) -> Trace:
    if isinstance(trace, Trace):
        return trace
    if not isinstance(trace, (str, os.PathLike)):
        raise TypeError(f"trace: expected a Trace or a path to a trace file, "
                        f"got {_shown(trace)}")
    return load(trace)


def _device(given: DeviceLike) -> DeviceProfile:
    if isinstance(given, DeviceProfile):
        return _checked_profile(given)
    if given is not None and not isinstance(given, str):
        raise TypeError(f"device: expected a DeviceProfile, a device's name such as "
                        f"'a100-40g', or None, got {_shown(given)}")
    return resolve_device(given)


def _checked_profile(profile: DeviceProfile) -> DeviceProfile:
    """A profile the user built, held to the ranges a profile file is (its capacity, its
    granularities, its own share, its call costs), with its sizes as plain ints."""
    if not isinstance(profile.name, str):
        raise TypeError(f"device.name: expected a str, got {_shown(profile.name)}")
    capacity = _whole_number(profile.capacity, "device.capacity")
    check_capacity(capacity, "device.capacity")
    sizes: dict[str, int] = {"capacity": capacity}
    for key in ("granularity", "map_granularity"):
        value = _whole_number(getattr(profile, key), f"device.{key}")
        if not 1 <= value <= MAX_GRANULARITY:
            raise UserInputError(f"device.{key}: must be from 1 byte to "
                                 f"{format_size(MAX_GRANULARITY)}; got {value:,}")
        sizes[key] = value
    context = _whole_number(profile.context_bytes, "device.context_bytes")
    if not 0 <= context < capacity:
        raise UserInputError(f"device.context_bytes: must be from 0 to less than the "
                             f"capacity ({capacity:,} bytes); got {context:,}")
    sizes["context_bytes"] = context
    if profile.own_capacity is not None:
        own = _whole_number(profile.own_capacity, "device.own_capacity")
        check_capacity(own, "device.own_capacity")
        sizes["own_capacity"] = own
    if not isinstance(profile.costs, CostModel):
        raise TypeError(f"device.costs: expected a CostModel, got {_shown(profile.costs)}")
    for field in dataclasses.fields(CostModel):
        seconds = getattr(profile.costs, field.name)
        if field.name == "source":
            continue
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"device.costs.{field.name}: expected a number of seconds, "
                            f"got {_shown(seconds)}")
        if not (math.isfinite(seconds) and 0 <= seconds <= MAX_CALL_SECONDS):
            raise UserInputError(f"device.costs.{field.name}: must be a number of seconds "
                                 f"from 0 to {MAX_CALL_SECONDS:g}; got {seconds!r}")
    if all(type(getattr(profile, key)) is int for key in sizes):
        return profile
    return dataclasses.replace(profile, capacity=capacity, granularity=sizes["granularity"],
                               map_granularity=sizes["map_granularity"], context_bytes=context,
                               own_capacity=sizes.get("own_capacity"))


__all__ = ["DeviceLike", "TraceLike", "compare", "device", "load", "min_capacity", "replay",
           "tune"]
