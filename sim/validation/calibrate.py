"""``allocsim calibrate``: measure a GPU's allocation costs and granularity into a device profile.

Times cudaMalloc / cudaFree over a range of sizes (median of several calls each), fits
``base + per_gib × GiB`` by least squares for :class:`~allocsim.sim.kernel.device.CostModel`,
and infers the allocation granularity from how cudaMemGetInfo's free bytes move for small
allocations. The result is a JSON device profile that ``compare --device-profile FILE`` uses
instead of the built-in guesses. The measurement core (:func:`measure_profile`) takes its device
calls as injected callables, so it is tested on the host with fakes; :func:`calibrate` wires it
to CuPy (imported lazily). The ``allocsim calibrate`` command is :mod:`allocsim.sim.cli.calibrate`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from allocsim.policies import format_size
from allocsim.policies.units import round_up
from allocsim.sim.kernel.device import CostModel, DeviceProfile
from allocsim.sim.validation.cuda_device import CudaVMM
from allocsim.sim.validation.errors import ValidatorError
from allocsim.sim.validation.gpu import gpu_facts, require_gpu
from allocsim.sim.validation.provenance import now, slug

MiB = 1 << 20
GiB = 1 << 30

DEFAULT_CALIBRATION_SIZES = (512, 4 << 10, 64 << 10, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB,
                             1 * GiB)
GRANULARITY_PROBES = (1, 512, 1 * MiB, 2 * MiB + 1)
# How the driver packs small cudaMallocs (not modelled yet: the data to model it from).
PACKING_SIZES = (512, 4 << 10, 64 << 10, 256 << 10, 1 * MiB)
PACKING_COUNT = 64
_CANDIDATE_GRANULARITIES = tuple(512 << k for k in range(18))   # 512 B .. 64 MiB


@dataclass
class DeviceCalls:
    """The device calls calibration measures, injectable so the core is testable with fakes.

    ``malloc(nbytes) -> handle`` (raises on failure), ``free(handle)``, ``mem_info() ->
    (free bytes, total bytes)``, ``clock_ns()`` a monotonic clock, ``synchronize()`` waits for
    the device; ``name`` and ``versions`` describe the device for the profile's notes.
    """

    malloc: Callable[[int], Any]
    free: Callable[[Any], None]
    mem_info: Callable[[], tuple[int, int]]
    clock_ns: Callable[[], int] = time.perf_counter_ns
    synchronize: Callable[[], None] = lambda: None
    name: str = "device"
    versions: dict[str, str] = field(default_factory=dict)
    map_granularity: int | None = None


@dataclass
class LatencySample:
    """Median wall time of cudaMalloc and cudaFree of one size."""

    size: int
    malloc_s: float
    free_s: float
    repeats: int


@dataclass
class Calibration:
    """What calibration measured, and the device profile made from it."""

    profile: DeviceProfile
    latencies: list[LatencySample]
    footprints: dict[int, float]       # probe size -> bytes cudaMemGetInfo moved per allocation
    date: str
    packing: dict[int, PackingCurve] = field(default_factory=dict)

    def profile_json(self) -> dict[str, Any]:
        """The profile file's content: exactly what :meth:`DeviceProfile.from_dict` reads."""
        return self.profile.as_dict()

    def write(self, path: str | Path) -> Path:
        from allocsim.sim.output.files import write_json
        write_json(self.profile_json(), path, kind="device-profile")
        return Path(path)

    def measurements_json(self) -> dict[str, Any]:
        return {"date": self.date, "latencies": [asdict(s) for s in self.latencies],
                "footprints": {str(k): v for k, v in self.footprints.items()},
                "packing": {str(k): curve.as_dict() for k, curve in self.packing.items()},
                "profile": self.profile_json()}


@dataclass
class PackingCurve:
    """Device bytes in use (the drop of cudaMemGetInfo's free bytes since the start) after each
    of ``count`` cudaMallocs of one size, then after each cudaFree of them in the same order:
    how the driver packs small allocations into pages, and whether it gives pages back."""

    size: int
    after_malloc: list[int]
    after_free: list[int]

    def as_dict(self) -> dict[str, Any]:
        moves = [b - a for a, b in zip([0, *self.after_malloc], self.after_malloc) if b != a]
        return {"size": self.size, "count": len(self.after_malloc),
                "after_malloc": self.after_malloc, "after_free": self.after_free,
                "pages_taken": len(moves), "page_sizes": sorted(set(moves)),
                "left_after_freeing_all": self.after_free[-1] if self.after_free else 0}


def measure_packing(calls: DeviceCalls, sizes: Sequence[int] = PACKING_SIZES,
                    count: int = PACKING_COUNT) -> dict[int, PackingCurve]:
    """A :class:`PackingCurve` per size (sizes that would not fit twice over are left out)."""
    curves: dict[int, PackingCurve] = {}
    for size in sizes:
        if 2 * size * count > calls.mem_info()[0]:
            continue
        calls.synchronize()
        start = calls.mem_info()[0]
        handles, after_malloc, after_free = [], [], []
        for _ in range(count):
            handles.append(calls.malloc(size))
            after_malloc.append(int(start - calls.mem_info()[0]))
        for handle in handles:
            calls.free(handle)
            calls.synchronize()
            after_free.append(int(start - calls.mem_info()[0]))
        curves[int(size)] = PackingCurve(int(size), after_malloc, after_free)
    return curves


def fit_linear(sizes: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``seconds ≈ base + per_gib × size / GiB``: ``(base, per_gib)``."""
    x = np.asarray(sizes, dtype=np.float64) / GiB
    y = np.asarray(seconds, dtype=np.float64)
    if len(x) == 0:
        return 0.0, 0.0
    if len(x) == 1 or np.ptp(x) == 0:
        return float(y.mean()), 0.0
    design = np.column_stack([np.ones_like(x), x])
    (base, slope), *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(base), float(slope)


def granularity_from_footprints(footprints: dict[int, float]) -> int | None:
    """The smallest power-of-two quantum g (512 B .. 64 MiB) with round_up(size, g) at least
    the footprint of every probe of 1 MiB and more — smaller probes are sub-allocated by the
    driver and say little. None if no probe is large enough or none moved."""
    large = {size: used for size, used in footprints.items() if size >= MiB and used > 0}
    if not large:
        return None
    for g in _CANDIDATE_GRANULARITIES:
        # A 1% margin absorbs unrelated activity seen by cudaMemGetInfo.
        if all(round_up(size, g) >= used * 0.99 for size, used in large.items()):
            return g
    return _CANDIDATE_GRANULARITIES[-1]


def measure_profile(calls: DeviceCalls, *, sizes: Sequence[int] = DEFAULT_CALIBRATION_SIZES,
                    repeats: int = 5, probes: Sequence[int] = GRANULARITY_PROBES,
                    probe_count: int = 16, name: str | None = None,
                    date: str | None = None) -> Calibration:
    """Measure latency over ``sizes`` (median of ``repeats``), fit the cost model, measure the
    granularity with ``probe_count`` allocations of each probe size, make a profile."""
    if repeats < 1:
        raise ValidatorError("calibrate: repeats must be at least 1")
    date = date or now()
    _, total = calls.mem_info()
    # The first call of a process pays for context set-up: measure after one warm-up.
    calls.free(calls.malloc(MiB))
    calls.synchronize()
    latencies: list[LatencySample] = []
    skipped: list[int] = []
    for size in sorted({int(s) for s in sizes}):
        if size > 0.8 * calls.mem_info()[0]:
            skipped.append(size)
            continue
        malloc_times, free_times = [], []
        for _ in range(repeats):
            calls.synchronize()
            start = calls.clock_ns()
            handle = calls.malloc(size)
            middle = calls.clock_ns()
            calls.free(handle)
            calls.synchronize()
            end = calls.clock_ns()
            malloc_times.append((middle - start) / 1e9)
            free_times.append((end - middle) / 1e9)
        latencies.append(LatencySample(size, float(np.median(malloc_times)),
                                       float(np.median(free_times)), repeats))
    if not latencies:
        raise ValidatorError("calibrate: no size fitted in free device memory")
    malloc_base, malloc_slope = fit_linear([s.size for s in latencies],
                                           [s.malloc_s for s in latencies])
    free_base, free_slope = fit_linear([s.size for s in latencies], [s.free_s for s in latencies])
    clamped = [label for label, value in (("malloc base", malloc_base),
                                          ("malloc per GiB", malloc_slope),
                                          ("free base", free_base), ("free per GiB", free_slope))
               if value < 0]
    malloc_base, malloc_slope, free_base, free_slope = (max(0.0, v) for v in (
        malloc_base, malloc_slope, free_base, free_slope))

    footprints: dict[int, float] = {}
    for size in probes:
        calls.synchronize()
        before = calls.mem_info()[0]
        handles = [calls.malloc(size) for _ in range(probe_count)]
        calls.synchronize()
        after = calls.mem_info()[0]
        for handle in handles:
            calls.free(handle)
        footprints[int(size)] = (before - after) / probe_count
    granularity = granularity_from_footprints(footprints)
    packing = measure_packing(calls)

    where = f"{calls.name}" + (f" ({', '.join(f'{k} {v}' for k, v in calls.versions.items())})"
                               if calls.versions else "")
    span = f"{format_size(latencies[0].size)}..{format_size(latencies[-1].size)}"
    cost_note = (f"calibrated by allocsim calibrate on {where} at {date}: cudaMalloc/cudaFree "
                 f"wall time, median of {repeats} per size over {len(latencies)} sizes "
                 f"({span}), least-squares fit base + per_gib × GiB; map/unmap not measured "
                 f"(set equal to malloc/free)")
    if clamped:
        cost_note += f"; negative fits clamped to 0: {', '.join(clamped)}"
    if skipped:
        cost_note += f"; sizes skipped (no room): {', '.join(format_size(s) for s in skipped)}"
    moved = ", ".join(f"{format_size(s)} -> {format_size(v)}" for s, v in footprints.items())
    source = (f"{where}, measured {date} by allocsim calibrate: capacity = cudaMemGetInfo total "
              f"({format_size(total)}); granularity {format_size(granularity or 512)} from how "
              f"cudaMemGetInfo's free bytes moved per allocation ({probe_count} each: {moved})"
              + ("" if granularity else " — no probe moved it, 512 B kept")
              + "; map granularity "
              + (f"{format_size(calls.map_granularity)} (cuMemGetAllocationGranularity)"
                 if calls.map_granularity else "2 MiB assumed (not measured)"))
    costs = CostModel(malloc_base_s=malloc_base, malloc_per_gib_s=malloc_slope,
                      free_base_s=free_base, free_per_gib_s=free_slope,
                      map_base_s=malloc_base, map_per_gib_s=malloc_slope,
                      unmap_base_s=free_base, source=cost_note)
    profile = DeviceProfile(name=name or f"{slug(calls.name).lower()}-calibrated",
                            capacity=int(total), granularity=int(granularity or 512),
                            map_granularity=int(calls.map_granularity or 2 * MiB), costs=costs,
                            source=source)
    return Calibration(profile=profile, latencies=latencies, footprints=footprints, date=date,
                       packing=packing)


def cupy_device_calls() -> DeviceCalls:
    """:class:`DeviceCalls` on the current CUDA device through CuPy (NoGPUError without one)."""
    cp = require_gpu("allocsim calibrate", "")
    rt = cp.cuda.runtime
    name, versions = gpu_facts(cp)
    map_granularity = None
    try:
        map_granularity = CudaVMM(int(rt.getDevice())).granularity
    except ValidatorError:
        pass
    return DeviceCalls(malloc=lambda n: rt.malloc(n), free=lambda p: rt.free(p),
                       mem_info=lambda: tuple(int(v) for v in rt.memGetInfo()),  # type: ignore
                       synchronize=rt.deviceSynchronize, name=name,
                       versions={k: v for k, v in versions.items()
                                 if k in ("cupy", "cuda_runtime", "nvidia_driver")},
                       map_granularity=map_granularity)


def calibrate(sizes: Sequence[int] = DEFAULT_CALIBRATION_SIZES, repeats: int = 5, *,
              name: str | None = None, calls: DeviceCalls | None = None,
              output: str | Path | None = None) -> Calibration:
    """Measure the current GPU (or ``calls``) and return the calibration; with ``output``,
    write the device-profile JSON there (read by ``--device-profile``)."""
    calibration = measure_profile(calls or cupy_device_calls(), sizes=sizes, repeats=repeats,
                                  name=name)
    if output is not None:
        calibration.write(output)
    return calibration
