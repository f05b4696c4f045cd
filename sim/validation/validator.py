"""The validator: replay a trace on real memory and measure how far the simulation was from it.

``allocsim compare`` names a winner from a simulation; this module checks that simulation
against reality. :func:`validate` replays the same trace event by event through a *backend*
and, after every event, compares what was measured with what the simulator
(:mod:`allocsim.sim.kernel.engine` on a :class:`~allocsim.sim.kernel.device.SimulatedDevice`,
exactly as ``compare`` runs it) says: reserved bytes, the event of the first OOM, device-call
counts and their time, and — where the policy object itself drives the memory — whether any two
live blocks ever overlapped. :func:`validate_results` does it for the winner of a ``compare``
results.json.

Backends (:data:`~allocsim.sim.validation.backends.BACKENDS`):

- ``host``: the policy object drives a :class:`HostDevice` whose ``reserve``/``map`` hand out
  numpy buffers behind fake addresses. Every live block is filled with a pattern unique to its
  allocation and checked when freed and at the end, so an overlapping or out-of-region
  placement shows up as corrupted data. The host device counts like the simulated one, so
  reserved bytes must agree byte for byte. Runs anywhere; it tests the validator and the
  policies' placement, not a GPU.
- ``policy``: the same on a GPU through CuPy (:class:`CupyDevice`): ``reserve`` is cudaMalloc,
  ``map`` is CUDA virtual memory (cuMemCreate/cuMemMap through ``libcuda`` with ctypes),
  patterns are written and checked by two small CUDA kernels, and device memory in use is
  read with cudaMemGetInfo after every event.
- ``cupy-pool``: CuPy's own MemoryPool replays the trace; ``used_bytes()``/``total_bytes()``
  after every event against the ``cupy`` model, byte for byte.
- ``cupy-raw``: cudaMalloc/cudaFree per buffer against ``on-demand``.
- ``cupy-async``: CuPy's MemoryAsyncPool (cudaMallocAsync) against ``cuda-async``.
- ``torch``: ``torch.cuda.caching_allocator_alloc``/``_delete`` against the ``pytorch`` model,
  ``memory_reserved()``/``memory_allocated()`` after every event, byte for byte.
- ``jax``: the TPU runtime's allocator through JAX, in a child process, against the ``tpu``
  model, record by record (:mod:`~allocsim.sim.validation.jax_backend`).
- ``tensorflow``: TensorFlow's BFC allocator on the CPU, in a child process, against the
  ``bfc`` model at TensorFlow's limit (:mod:`~allocsim.sim.validation.tensorflow_backend`):
  every allocator call from its profile (chunk size, place, bytes in use), and reserved / in
  use after every event. Needs TensorFlow, not a GPU.

CuPy (and torch) are imported only inside the GPU backends: importing this module never needs
them. Without a GPU every GPU backend raises :class:`NoGPUError`, one line, which the CLI
prints as ``allocsim: error: ...`` with exit status 2.

Where the pieces live, in :mod:`allocsim.sim.validation`: ``replay`` (the replay driver and the
simulated side), ``backends`` (the table of backends), ``host_device`` and ``cuda_device`` (the
devices a policy object drives), ``gpu_backends`` (the GPU replays), ``gpu`` (GPU facts and
helpers), ``report`` (the report: JSON, Markdown, figure), ``measured``, ``patterns``,
``spans``, ``errors``, ``provenance``; ``calibrate`` (``allocsim calibrate``). This module
chooses and runs a backend and the simulator for a trace and builds the report; the
``allocsim validate`` command is :mod:`allocsim.sim.cli.validate`.
"""

from __future__ import annotations

import json
import platform
from dataclasses import replace
from pathlib import Path
from typing import Any

from allocsim.errors import UserInputError
from allocsim.policies import PolicySpec, PolicySpecError, parse_policy, parse_size
from allocsim.policies.registry import alloc_conf_spec
from allocsim.policies.settings import PyTorchSettings
from allocsim.sim.kernel.device import DeviceProfile, resolve_device
from allocsim.sim.kernel.device_profile import check_capacity, read_label
from allocsim.sim.validation.backends import BACKENDS, DEFAULT_BACKEND, Backend
from allocsim.sim.validation.cuda_device import CudaVMM, CupyDevice
from allocsim.sim.validation.errors import NoGPUError, ValidatorError
from allocsim.sim.validation.gpu import (
    default_gpu_profile,
    free_memory_profile,
    require_gpu,
    torch_free_memory_profile,
)
from allocsim.sim.validation.gpu_backends import (
    run_cupy_async,
    run_cupy_pool,
    run_cupy_raw,
    run_policy,
    run_torch,
    torch_alloc_conf,
)
from allocsim.sim.validation.host_device import HostDevice
from allocsim.sim.validation.measured import CallLog, Corruption, Measured
from allocsim.sim.validation.patterns import count_pattern_errors, fill_pattern, pattern_word
from allocsim.sim.validation.provenance import host_versions
from allocsim.sim.validation.replay import Simulated, drive, simulate
from allocsim.sim.validation.report import (
    Check,
    ErrorStats,
    Metric,
    ValidationReport,
    build_report,
)
from allocsim.traces.formats.limits import read_input_text
from allocsim.traces.model import Trace, TraceError


def _capacity_bytes(capacity: int | str) -> int:
    """Bytes in the ``--capacity`` the validator is given; a malformed size is one line naming
    the option."""
    try:
        return parse_size(capacity)
    except UserInputError as err:
        raise ValidatorError(f"--capacity: {err}") from None


def _resolve_profile(device_profile: DeviceProfile | str | Path | None) -> DeviceProfile:
    if isinstance(device_profile, DeviceProfile):
        return device_profile
    if device_profile is not None and (str(device_profile).endswith(".json")
                                       or Path(str(device_profile)).is_file()):
        return resolve_device(profile_file=device_profile)
    return resolve_device(None if device_profile is None else str(device_profile))


def _resolve_spec(backend: Backend, policy: str | PolicySpec | None) -> PolicySpec:
    text = policy if policy is not None else backend.model
    if text is None:
        raise ValidatorError(f"backend {backend.name} replays a policy object: give one with "
                             f"--policy (e.g. --policy bfc)")
    try:
        return parse_policy(text)
    except PolicySpecError as err:
        if policy is None:
            raise ValidatorError(
                f"backend {backend.name} compares against the {backend.model!r} policy model, "
                f"which this installation does not have ({err})") from None
        raise


def _torch_model_spec(backend: Backend, capped: bool) -> PolicySpec:
    """The ``pytorch`` model with the settings the real caching allocator has here."""
    conf = torch_alloc_conf()
    if conf is None:
        spec = _resolve_spec(backend, None)
    else:
        try:
            spec = alloc_conf_spec(conf[1])
        except PolicySpecError as err:
            raise ValidatorError(f"{conf[0]}={conf[1]}: the pytorch model cannot take these "
                                 f"settings ({err})") from None
    if capped:
        settings = PyTorchSettings(**dict(spec.params))
        spec = parse_policy(replace(settings, per_process_memory_fraction=1.0).spec())
    return spec


def _load_trace(trace: Trace | str | Path) -> Trace:
    if isinstance(trace, Trace):
        return trace
    from allocsim.traces import formats
    from allocsim.traces.bundled import load_default_trace
    return load_default_trace() if str(trace) == "default" else formats.load(trace)


def validate(trace: Trace | str | Path, policy_spec: str | PolicySpec | None = None,
             backend: str = "host", device_profile: DeviceProfile | str | Path | None = None,
             capacity: int | str | None = None, *, patterns: bool = True) -> ValidationReport:
    """Replay ``trace`` through ``backend`` and the simulator; the report compares them.

    ``policy_spec`` is the policy simulated (and, for ``host``/``policy``, the object that
    drives the memory); the allocator backends default to their model (``cupy``,
    ``on-demand``, ``cuda-async``, ``pytorch``). ``device_profile`` is a profile, a profile
    name or a profile JSON file (default: the default profile); ``capacity`` overrides its
    size. On a GPU without ``capacity`` the simulated device gets the memory free at the
    start. Raises :class:`NoGPUError` for a GPU backend without a GPU and
    :class:`ValidatorError` (one line) for other mistakes.
    """
    if backend not in BACKENDS:
        raise ValidatorError(f"unknown backend {backend!r}; backends: {', '.join(BACKENDS)}")
    chosen = BACKENDS[backend]
    spec = _resolve_spec(chosen, policy_spec)
    # The simulated device is the memory the real backend has (given, or free on the GPU at
    # the start): a CUDA context there is already outside it, so the profile's share is not
    # taken again (issue 26.3).
    named = _resolve_profile(device_profile)
    size = None if capacity is None else check_capacity(_capacity_bytes(capacity), "--capacity")
    profile = named.device_with(None if size in (None, named.capacity) else size, context=0)
    if policy_spec is None and chosen.name == "torch":
        # The model is configured as the real allocator of this process is: by the allocator
        # settings in its environment, and, with a capacity, capped by its own setting
        # (set_per_process_memory_fraction: allowed = C), checked before any device call, so
        # the model fails the same way (no device call).
        spec = _torch_model_spec(chosen, capped=size is not None)
    elif policy_spec is None and size is not None and chosen.name == "cupy-pool":
        spec = _resolve_spec(chosen, f"cupy:limit={size}")     # pool.set_limit(size=capacity)
    trace = _load_trace(trace)
    if len(trace.processes()) > 1:
        raise ValidatorError(f"{trace.name}: the validator replays one process, and this trace "
                             f"has {len(trace.processes())}; extract one first")
    tolerance: int | None = None
    tf_run = None
    jax_run = None
    if chosen.name == "jax":
        from allocsim.sim.validation import jax_backend as jb
        jax_run = jb.run_jax(trace, size)
        trace = jax_run.replayed     # each buffer at the HBM its u8[n] array takes
        profile = jb.jax_profile(jax_run, None if device_profile is None else profile)
        if policy_spec is None:
            spec = parse_policy(jb.model_spec_text(jax_run.runtime_bytes))
        measured = jax_run.measured
    elif chosen.name == "tensorflow":
        from allocsim.sim.validation import tensorflow_backend as tfb
        tf_run = tfb.run_tensorflow(trace, size)
        trace = tf_run.replayed      # with TensorFlow's own calls, as its allocator saw them
        profile = tfb.tensorflow_profile(profile, tf_run.limit, device_profile is not None)
        if policy_spec is None:
            spec = parse_policy(tfb.model_spec_text(tf_run.limit))
        measured = tf_run.measured
    elif chosen.name == "host":
        measured = drive(trace, spec, HostDevice(profile), patterns=patterns)
        measured.device_name = f"host ({platform.machine() or 'cpu'}, numpy buffers)"
        measured.versions = host_versions()
        measured.notes.append("host backend: numpy buffers stand in for device memory; it "
                              "checks placements and the validator, not a GPU")
    else:
        cp = require_gpu() if chosen.name != "torch" else None
        if device_profile is None:
            # No profile asked for: the built-in one of this GPU, if there is one.
            profile = default_gpu_profile(cp) or profile
            if size is not None:
                profile = profile.device_with(size)
        if size is None and chosen.name != "policy":
            # No capacity given: simulate the memory that is free on the GPU right now.
            profile = (free_memory_profile(cp, profile) if cp is not None
                       else torch_free_memory_profile(profile))
        if chosen.name == "policy":
            measured, profile = run_policy(trace, spec, profile, patterns,
                                           capacity_given=size is not None)
        elif chosen.name == "cupy-pool":
            measured = run_cupy_pool(trace, profile, size)
        elif chosen.name == "cupy-raw":
            measured = run_cupy_raw(trace, profile)
        elif chosen.name == "cupy-async":
            measured = run_cupy_async(trace, profile, spec)
        else:
            measured = run_torch(trace, profile, size)
        tolerance = measured.granularity
    # TensorFlow's regions come from the host's allocator, which hands them out at falling
    # addresses; BFC's best fit breaks ties by address, so the simulation must place them
    # where the host did or it picks other chunks (issue 25.13).
    sim_device = (tfb.host_placed_device(profile, tf_run.regions) if tf_run is not None
                  else None)
    simulated = simulate(trace, spec, profile, sim_device)
    report = build_report(chosen, spec, trace, profile, simulated, measured,
                          device_name=measured.device_name, versions=measured.versions,
                          tolerance_bytes=tolerance)
    if tf_run is not None:
        from allocsim.sim.validation.tensorflow_backend import add_tensorflow_checks
        add_tensorflow_checks(report, tf_run)
    if jax_run is not None:
        from allocsim.sim.validation.jax_backend import add_jax_checks
        add_jax_checks(report, jax_run)
    return report


def validate_results(results: str | Path, backend: str = DEFAULT_BACKEND, *,
                     capacity: int | str | None = None,
                     device_profile: DeviceProfile | str | Path | None = None,
                     policy: str | None = None, patterns: bool = True) -> ValidationReport:
    """Validate the winner of a ``compare`` results.json on the trace it names.

    The trace is read from ``trace.source``, which must be a file — except for a bundled trace
    (``allocsim compare`` with no trace records its generator as the source), found by name and
    checked by its event and allocation counts; a file whose counts differ from the compared
    trace's is refused (it changed since). The simulated device is the
    one the comparison used (its name, capacity and granularities), unless ``device_profile``
    or ``capacity`` say otherwise. ``policy`` overrides the winner (e.g. to validate the
    runner-up). The allocator backends validate their own model, not the winner.
    """
    path = Path(results)
    try:
        data = json.loads(read_input_text(path, what="a results file"))
    except TraceError as err:  # not a regular file, too large, not UTF-8
        raise ValidatorError(str(err)) from None
    except OSError as err:
        raise ValidatorError(f"{results}: cannot read: {err.strerror or err}") from None
    except ValueError as err:
        raise ValidatorError(f"{results}: not JSON: {err}") from None
    except RecursionError:
        raise ValidatorError(f"{results}: not JSON: nested too deeply") from None
    if isinstance(data, list):
        if len(data) != 1:
            raise ValidatorError(f"{results}: holds {len(data)} comparisons; validate one trace "
                                 f"at a time")
        data = data[0]
    if not isinstance(data, dict) or "results" not in data or "trace" not in data:
        raise ValidatorError(f"{results}: not an allocsim compare results file")
    chosen = policy or data.get("winner")
    if BACKENDS.get(backend, BACKENDS["host"]).model is not None and policy is None:
        chosen = None   # the allocator backends compare against their own model
    elif not chosen:
        raise ValidatorError(f"{results}: the comparison has no winner "
                             f"({data.get('reason', 'no reason given')}); pick one with --policy")
    facts = data["trace"]
    source = str(facts.get("source", ""))
    if not source or not Path(source).is_file():
        bundled = bundled_match(facts)
        if bundled is None:
            raise ValidatorError(f"{results}: the compared trace's source {source!r} is not a "
                                 f"file (a generated trace?); run allocsim validate TRACE "
                                 f"--policy {chosen or 'P'} instead")
        source = str(bundled)
    trace = _load_trace(source)
    for key, value in (("events", len(trace)), ("allocs", trace.n_allocs)):
        if key in facts and int(facts[key]) != value:
            raise ValidatorError(f"{results}: {source} has {value:,} {key}, the compared trace "
                                 f"had {int(facts[key]):,}: the file changed since")
    profile = (_resolve_profile(device_profile) if device_profile is not None
               else _profile_from_results(data.get("device") or {}))
    if capacity is None and device_profile is None and BACKENDS.get(backend) is not None \
            and BACKENDS[backend].gpu:
        capacity = profile.capacity
    return validate(trace, chosen, backend, profile, capacity, patterns=patterns)


def bundled_match(facts: dict[str, Any]) -> Path | None:
    """The bundled trace a comparison ran on (``allocsim compare`` with no trace records the
    generator as its source, not the file): same name, events and allocations."""
    from allocsim.traces.bundled import bundled_path
    path = bundled_path(f"{facts.get('name', '')}.npz")
    if not path.is_file():
        return None
    trace = _load_trace(path)
    if (len(trace) != int(facts.get("events", -1))
            or trace.n_allocs != int(facts.get("allocs", -1))):
        return None
    return path


def _profile_from_results(device: dict[str, Any]) -> DeviceProfile:
    """The comparison's device: its named profile (for the costs), with the recorded sizes."""
    label = str(device.get("name") or "")
    name, own_capacity = read_label(label, int(device.get("capacity") or 0))
    try:
        profile = resolve_device(name or None)
    except ValueError:
        profile = DeviceProfile(label or "results-device", int(device.get("capacity") or 0),
                                source="from a compare results.json (costs: defaults)")
    return replace(profile, name=name or profile.name, own_capacity=own_capacity,
                   capacity=int(device.get("capacity") or profile.capacity),
                   granularity=int(device.get("granularity") or profile.granularity),
                   map_granularity=int(device.get("map_granularity") or profile.map_granularity))


# The validator's public API in one place (what ``from allocsim.sim.validation.validator import
# ...`` offered before the room was split into modules).
__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "Backend",
    "CallLog",
    "Check",
    "Corruption",
    "CudaVMM",
    "CupyDevice",
    "ErrorStats",
    "HostDevice",
    "Measured",
    "Metric",
    "NoGPUError",
    "Simulated",
    "ValidationReport",
    "ValidatorError",
    "build_report",
    "bundled_match",
    "count_pattern_errors",
    "drive",
    "fill_pattern",
    "pattern_word",
    "simulate",
    "torch_alloc_conf",
    "validate",
    "validate_results",
]

