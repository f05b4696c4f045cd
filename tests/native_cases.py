"""The cases the native core is held to the Python models on (tests/test_native_differential.py
and the policy suites parametrised over both implementations), and the Python side's runs.

The Python run is a ProcessReplay driven as :func:`allocsim.sim.kernel.engine.replay` drives
it, with the policy's ``malloc`` wrapped to record every answer: the same RunResult replay()
gives, and the address of every block handed out, in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from allocsim.policies import parse_policy
from allocsim.policies.tpu import TpuRuntimeAllocator
from allocsim.policies.units import round_up
from allocsim.sim.kernel import native
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice, resolve_device
from allocsim.sim.kernel.engine import TIMELINE_POINTS, ProcessReplay
from allocsim.sim.kernel.results import RunResult
from allocsim.traces import synth
from allocsim.traces.bundled import load_bundled_traces
from allocsim.traces.model import Trace

TPU_SPECS = ("tpu", "tpu:runtime_bytes=0", "tpu:granule=4096")
# Every setting of the native families: growth, fractions, back-off (a limit above the
# device, fraction 1 with the device's 512-byte granules over BFC's 256), preallocation's
# sizes, BFC's garbage collection and split slack, best-fit's trim, pages and an alignment
# that is not a power of two (the Python general path), and the jax presets that resolve to
# these.
NATIVE_SPECS = (
    "preallocate", "preallocate:fraction=0.05", "preallocate:fraction=1.0",
    "best-fit", "best-fit:page=4MiB,trim=true", "best-fit:trim=true", "best-fit:alignment=768",
    "bfc", "bfc:allow_growth=false", "bfc:garbage_collection=true",
    "bfc:fragmentation_fraction=0.1", "bfc:memory_limit=100GiB", "bfc:fraction=1.0",
    "bfc:fraction=0.5,garbage_collection=true", "jax", "jax:preallocate=false",
    "jax:fraction=0.5", "pytorch", "pytorch:per_process_memory_fraction=0.5",
    "pytorch:per_process_memory_fraction=1.0",
    "pytorch:garbage_collection_threshold=0.6",   # no fraction set: no collection (PyTorch's gate)
    "pytorch:max_split_size_mb=64", "pytorch:max_split_size_mb=20,max_non_split_rounding_mb=64",
    "pytorch:roundup_power2_divisions=4", "pytorch:roundup_power2_divisions=[256:1;512:2;>:8]",
    "pytorch:max_non_split_rounding_mb=64",
    "pytorch:garbage_collection_threshold=0.6,per_process_memory_fraction=0.8",
    "pytorch:garbage_collection_threshold=0.3,per_process_memory_fraction=1.0,"
    "max_split_size_mb=40",
    "pytorch:max_split_size_mb=32,roundup_power2_divisions=2,per_process_memory_fraction=0.5",
    "on-demand", "jax:allocator=platform",
    "buddy", "buddy:release=true", "buddy:min_block=4096,arena=8MiB",
    "buddy:arena=1GiB,release=true",
    # Expandable segments with each setting that changes its paths: the fraction's limit on
    # the segment size, max_split_size (the walk's rejections; no release_available), the
    # divisions' rounding, garbage collection (which never runs with expandable segments).
    "pytorch:expandable_segments=true",
    "pytorch:expandable_segments=true,per_process_memory_fraction=0.5",
    "pytorch:expandable_segments=true,max_split_size_mb=64",
    "pytorch:expandable_segments=true,roundup_power2_divisions=4,max_non_split_rounding_mb=64",
    "pytorch:expandable_segments=true,garbage_collection_threshold=0.6,"
    "per_process_memory_fraction=0.8",
    # CuPy's pool: no limit, a fraction of the device and a fixed limit (the free_all_blocks
    # retries of the limit and of a refused cudaMalloc).
    "cupy", "cupy:fraction=0.5", "cupy:limit=64MiB",
    # The stream-ordered pool: release at every free or never (per-stream ownership), a
    # threshold, growth chunks and alignment, preallocation, and JAX's presets of it.
    "cuda-async", "cuda-async:sync=none", "cuda-async:release_threshold=64MiB",
    "cuda-async:fraction=1.0", "cuda-async:chunk=4MiB,alignment=1024",
    "cuda-async:sync=none,fraction=0.5,preallocate=true",
    "jax:allocator=cuda_async", "jax:allocator=cuda_async,preallocate=false",
    "jax:allocator=cuda_async,fraction=0.5",
    # The TPU runtime: its v5e bytes at the top, none, and a coarser granule (on these GPU
    # profiles the heap fits only where the device has no share of its own; TPU_SPECS run on
    # TPU profiles too, tpu_capacities).
    *TPU_SPECS,
)
# The settings of the policies the core took last (expandable segments, cupy, cuda-async, tpu).
NEWER_SPECS = NATIVE_SPECS[NATIVE_SPECS.index("pytorch:expandable_segments=true"):]
GENERATED = (("training", {"steps": 3, "layers": 3}), ("transformer", {"steps": 3}),
             ("kvcache", {"requests": 12}), ("random", {"events": 3000, "live": 200}),
             ("random", {"events": 3000, "live": 200, "streams": 3}))
SEEDS = (0, 1)


def need_core() -> None:
    if native.core() is None:
        pytest.skip(f"the native core is not in use here: {native.implementation()}")


def traces() -> Iterator[tuple[str, Trace]]:
    """(label, trace): every bundled trace and each generator at small sizes, seeded."""
    for trace in load_bundled_traces():
        yield trace.name, trace
    for kind, params in GENERATED:
        for seed in SEEDS:
            streams = f"-streams{params['streams']}" if "streams" in params else ""
            yield f"{kind}{streams}-seed{seed}", synth.generate(kind, seed=seed, **params)
    yield "regions-freed", regions_freed()
    yield "gc-cycles", gc_cycles()


def regions_freed() -> Trace:
    """Three growing BFC regions (2, 4, 8 MiB) wholly freed, then 15 MiB: on a 16 MiB device
    Extend fails and garbage collection frees the three regions (bfc.py's
    DeallocateFreeRegions); without it, an OOM."""
    mib = 1 << 20
    return Trace.from_events([(0, "alloc", 1, mib), (1, "alloc", 2, 3 * mib),
                              (2, "alloc", 3, 7 * mib), (3, "free", 1, mib),
                              (4, "free", 2, 3 * mib), (5, "free", 3, 7 * mib),
                              (6, "alloc", 4, 15 * mib), (7, "free", 4, 15 * mib)],
                             name="regions-freed")


def gc_cycles(cycles: int = 80) -> Trace:
    """On :func:`gc_cycles_device` (16 MiB, 4 MiB of it the context's): 1 MiB, freed, then
    11.75 MiB, freed, ``cycles`` times. BFC with garbage_collection asks for its whole limit
    (16 MiB), which the device refuses, and backs off to one region of 11.66 MiB for the 1 MiB;
    the 11.75 MiB fits no chunk, so Extend fails, the region is freed and Extend fails again:
    an OOM. Every cycle's first Extend succeeds without growing the region size, so doubles it
    (bfc.py's Extend): past 62 cycles it is above 2**63 (an int64 would wrap to 0 and spin)."""
    mib = 1 << 20
    big = 11 * mib + 3 * mib // 4
    rows: list[tuple] = []
    for cycle in range(cycles):
        at = 4 * cycle
        rows += [(at, "alloc", 2 * cycle, mib), (at + 1, "free", 2 * cycle, mib),
                 (at + 2, "alloc", 2 * cycle + 1, big), (at + 3, "free", 2 * cycle + 1, big)]
    return Trace.from_events(rows, name="gc-cycles")


def gc_cycles_device() -> DeviceProfile:
    return resolve_device("a100-80g").device_with(16 << 20, 4 << 20)


def capacities(trace: Trace) -> list[DeviceProfile]:
    """A roomy device with its own share (a100-80g's 512 MiB context), one just above the
    trace's peak live bytes (growth's back-off and tight fits) and one below it (OOMs, BFC's
    failed Extend and garbage collection), both without a share; then the device's share at
    the edges: one whose context leaves just the tight room (the policies' limits are of the
    whole capacity, so BFC asks for more than the device has and backs off every time) and
    one the context fills (every device call refused)."""
    peak = max(1, trace.peak_live()[0])
    base = resolve_device("a100-80g")
    if trace.name in ("regions-freed", "gc-cycles"):
        tight, small = 16 << 20, 12 << 20
    else:
        tight, small = peak * 9 // 8 + (4 << 20), max(1 << 20, peak * 3 // 4)
    share = 64 << 20
    return [base, _without_share(base, tight), _without_share(base, small),
            base.device_with(tight + share, share),
            # a share past the capacity: more than device_with allows, on purpose
            replace(base.device_with(small), context_bytes=small + (2 << 20))]


def _without_share(base: DeviceProfile, capacity: int) -> DeviceProfile:
    return base.device_with(capacity, 0)


def python_run(trace: Trace, spec: str, profile: DeviceProfile, *,
               stop_on_oom: bool = False) -> tuple[RunResult, list[int]]:
    """The Python models' RunResult and every malloc's answer (-1 for None)."""
    run = ProcessReplay(trace, parse_policy(spec), SimulatedDevice(profile),
                        stop_on_oom=stop_on_oom)
    addresses: list[int] = []
    malloc = run.policy.malloc

    def recording(size: int, stream: int = 0) -> int | None:
        address = malloc(size, stream)
        addresses.append(-1 if address is None else address)
        return address

    run.policy.malloc = recording               # type: ignore[method-assign]
    while run.next_index < run.n and not run.stopped:
        run.advance(run.n)
    return run.result(profile.label), addresses


def native_run(trace: Trace, spec: str, profile: DeviceProfile, *,
               stop_on_oom: bool = False) -> tuple[RunResult, list[int]]:
    """The native core's RunResult and every malloc's answer; fails if it declines the run."""
    addresses: list[int] = []
    result = native.native_replay(trace, parse_policy(spec), profile, stop_on_oom=stop_on_oom,
                                  progress=None, timeline_points=TIMELINE_POINTS,
                                  step=1 << 18, record_addresses=addresses)
    assert result is not None, f"the native core declined {spec} on {trace.name}"
    return result, addresses


# -- the tpu policy: TPU devices, its compactions and the layout of HBM ----------------------
def tpu_capacities(trace: Trace) -> list[DeviceProfile]:
    """The v5e as it is (a heap of 15.75 GB: no compaction), one just above the trace's peak
    live bytes (holes that do not fit: compactions) and one below it (OOMs), each with the
    runtime's 26,624 bytes as the device's share, as on the chip."""
    v5e = resolve_device("tpu-v5e")
    peak = max(1, trace.peak_live()[0])
    return [v5e] + [v5e.device_with(round_up(room, 512) + v5e.context_bytes, v5e.context_bytes)
                    for room in (peak * 9 // 8 + (1 << 20), max(1 << 20, peak * 3 // 4))]


def python_tpu_state(policy: TpuRuntimeAllocator) -> dict[str, Any]:
    """The Python model's compaction counters and blocks (address, size, in use)."""
    return {"num_compactions": policy.num_compactions,
            "compaction_moved_bytes": policy.compaction_moved_bytes,
            "compaction_s": policy.compaction_s, "blocks": list(policy.blocks())}


def native_tpu_state(state: dict[str, Any]) -> dict[str, Any]:
    """The same of the core's state (its ``policy_state``)."""
    extra = state["policy_state"]
    blocks = extra["blocks"]
    return {"num_compactions": extra["num_compactions"],
            "compaction_moved_bytes": extra["compaction_moved_bytes"],
            "compaction_s": extra["compaction_s"],
            "blocks": list(zip(blocks["address"].tolist(), blocks["size"].tolist(),
                               [bool(used) for used in blocks["used"].tolist()]))}


def native_offsets(state: dict[str, Any]) -> dict[int, int]:
    """Each live buffer's handle -> its offset in HBM now, from the core's blocks (the heap
    starts at HBM's offset 0, and its first block at the heap's base)."""
    blocks = state["policy_state"]["blocks"]
    addresses, handles = blocks["address"].tolist(), blocks["handle"].tolist()
    return {handle: address - addresses[0] for address, handle, used
            in zip(addresses, handles, blocks["used"].tolist()) if used}


def assert_same_tpu_state(python: TpuRuntimeAllocator, state: dict[str, Any], where: str) -> None:
    """The compaction counters and every block alike, and each live handle at the same
    offset in both."""
    assert python_tpu_state(python) == native_tpu_state(state), where
    for handle, offset in native_offsets(state).items():
        assert python.hbm_offset(handle) == offset, f"{where}: handle {handle}"


def tpu_runs(trace: Trace, spec: str, profile: DeviceProfile
             ) -> tuple[RunResult, RunResult, list[int], list[int]]:
    """Both implementations' whole runs of the tpu policy (RunResult and handles), their
    compaction counters and blocks held alike at the end; (python, native, their handles)."""
    python_result, python_handles = python_run(trace, spec, profile)
    native_result, native_handles = native_run(trace, spec, profile)
    python = ProcessReplay(trace, parse_policy(spec), SimulatedDevice(profile))
    python.advance(python.n)
    core = native.open_run(trace, parse_policy(spec), profile, stop_on_oom=False,
                           timeline_points=TIMELINE_POINTS)
    assert core is not None, f"the native core declined {spec} on {trace.name}"
    core.advance(core.n)
    assert isinstance(python.policy, TpuRuntimeAllocator)
    assert_same_tpu_state(python.policy, core.state(), f"{trace.name} | {spec} | {profile.label}")
    return python_result, native_result, python_handles, native_handles


def tpu_run(trace: Trace, spec: str, profile: DeviceProfile, implementation: str
            ) -> tuple[RunResult, dict[str, Any]]:
    """One implementation's run of the tpu policy: its RunResult and its compaction counters
    and blocks (:func:`python_tpu_state`'s shape)."""
    if implementation == "python":
        python = ProcessReplay(trace, parse_policy(spec), SimulatedDevice(profile))
        python.advance(python.n)
        assert isinstance(python.policy, TpuRuntimeAllocator)
        return python.result(profile.label), python_tpu_state(python.policy)
    result, _ = native_run(trace, spec, profile)
    core = native.open_run(trace, parse_policy(spec), profile, stop_on_oom=False,
                           timeline_points=TIMELINE_POINTS)
    assert core is not None, f"the native core declined {spec} on {trace.name}"
    core.advance(core.n)
    return result, native_tpu_state(core.state())
