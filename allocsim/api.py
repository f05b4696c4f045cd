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
file) whose one line the command would print. Importing :mod:`allocsim` does not import this
module: its names are loaded on first use (``allocsim/__init__.py``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from allocsim.frameworks import canonical_framework
from allocsim.policies import PolicySpec
from allocsim.sim.kernel import engine
from allocsim.sim.kernel.device_profile import DeviceProfile, resolve_device
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
    return formats.load(resolve_trace_name(os.fspath(path)), strict=strict, **options)


def device(name: str | None = None, *, capacity: str | int | None = None,
           profile_file: str | Path | None = None) -> DeviceProfile:
    """The device ``--device NAME`` (default: the default profile), ``--capacity SIZE`` (bytes,
    or text such as ``"24GiB"``) and ``--device-profile FILE`` name."""
    return resolve_device(name, capacity, profile_file)


def replay(trace: TraceLike, policy: str | PolicySpec, device: DeviceLike = None, *,
           stop_on_oom: bool = False) -> RunResult:
    """``trace`` replayed through ``policy`` (a spec such as ``"bfc:allow_growth=false"``) on a
    fresh ``device``: peak reserved and allocated, fragmentation, modelled allocator time, the
    first OOM, the timeline (:class:`~allocsim.sim.kernel.results.RunResult`). The run goes on
    after an OOM unless ``stop_on_oom``."""
    return engine.replay(_trace(trace), policy, _device(device), stop_on_oom=stop_on_oom)


def compare(trace: TraceLike, policies: Sequence[str | PolicySpec] | None = None,
            device: DeviceLike = None, *,
            max_slowdown: float | None = DEFAULT_MAX_SLOWDOWN) -> Comparison:
    """``trace`` replayed through each policy on ``device``, and the winner with the reason
    (:class:`~allocsim.sim.questions.compare.Comparison`; the rule is in
    :mod:`~allocsim.sim.questions.compare`). ``policies``: default, the recording's own
    framework's settings, as ``allocsim compare`` weighs them. ``max_slowdown``: the most a
    winner's allocator time may slow the run (None: no budget)."""
    loaded = _trace(trace)
    profile = _device(device)
    choice = (generic_choice([str(normalize_spec(p)) for p in policies]) if policies
              else default_choice(loaded, profile))
    return compare_question.compare(loaded, choice.specs, profile, max_slowdown=max_slowdown,
                                    choice=choice)


def min_capacity(trace: TraceLike, policy: str | PolicySpec, device: DeviceLike = None, *,
                 resolution: int = minimum.MiB) -> minimum.CapacityAnswer:
    """The smallest capacity, a multiple of ``resolution`` bytes, at which ``trace`` completes
    under ``policy``, with ``device``'s costs, granularity and own share
    (:class:`~allocsim.sim.questions.capacity.minimum.CapacityAnswer`)."""
    return minimum.min_capacity(_trace(trace), normalize_spec(policy), _device(device),
                                resolution=resolution)


def tune(trace: TraceLike, framework: str, device: DeviceLike = None, *,
         max_slowdown: float | None = DEFAULT_MAX_SLOWDOWN, current: str | None = None,
         seed: int = 0) -> recommend.TuneResult:
    """The setting of ``framework`` (``"pytorch"``, ``"jax"``, ``"tensorflow"``, ``"cupy"``) to
    paste for ``trace``: on ``device``'s card, or, with no device, the smallest card and the
    setting that fits it (:class:`~allocsim.sim.questions.tune.recommend.TuneResult`; its
    ``paste`` holds the lines). ``current``: the setting the job runs with now, as the
    framework writes it, replayed beside the others. The same inputs and ``seed`` give the
    same answer."""
    card = device is not None
    name = canonical_framework(framework) or framework     # "torch", "tf": as --framework
    return recommend.tune(_trace(trace), name, _device(device), card=card,
                          max_slowdown=max_slowdown, seed=seed, current=current)


def _trace(trace: TraceLike) -> Trace:
    return trace if isinstance(trace, Trace) else load(trace)


def _device(given: DeviceLike) -> DeviceProfile:
    return given if isinstance(given, DeviceProfile) else resolve_device(given)


__all__ = ["DeviceLike", "TraceLike", "compare", "device", "load", "min_capacity", "replay",
           "tune"]
