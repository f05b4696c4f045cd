"""Why a setting ``allocsim tune`` found does better than the defaults on this trace: which
rule of the allocator it changes, told with the run's own figures.

Each sentence is built from the two replays (the defaults' and the setting's RunResult JSON:
device calls, internal and external fragmentation at the peaks, the first OOM) and from the
trace's request sizes (how many requests a max_split_size makes oversize, how many distinct
block sizes a rounding table leaves). Where the defaults ran out of memory, the verdict of
:func:`~allocsim.sim.questions.explain.explain_oom` at that request says whether it was a real
shortage or fragmentation, and where the fragmentation was (its verdict rule, on a replay
stopped at that request).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from allocsim.policies import format_size, parse_policy
from allocsim.policies.pytorch.caching import (
    PyTorchCachingAllocator,
    get_allocation_size,
    parse_roundup_power2_divisions,
    round_size,
)
from allocsim.policies.settings import PyTorchSettings
from allocsim.policies.settings.cupy import MEMORY_LIMIT
from allocsim.policies.settings.jax import ALLOCATOR, MEM_FRACTION, PREALLOCATE
from allocsim.policies.settings.tensorflow import ALLOW_GROWTH, GARBAGE_COLLECTION
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice
from allocsim.sim.kernel.engine import ProcessReplay
from allocsim.sim.questions.explain import verdict
from allocsim.sim.questions.tune.search import Trial
from allocsim.sim.questions.tune.space import distinct_sizes, exact_size, fraction_text
from allocsim.traces.model import OP_ALLOC, Trace

f = format_size


def _calls(r: dict[str, Any]) -> str:
    return f"{r['device_mallocs']:,} device allocations and {r['device_frees']:,} frees"


def _fragmentation(r: dict[str, Any]) -> str:
    return (f"{f(r['external_fragmentation'])} free inside reserved memory at its peak "
            f"(external), {f(r['internal_fragmentation'])} handed out beyond the requests at "
            "peak live (internal: rounding, unsplit remainders)")


def oom_verdict(trace: Trace, spec: str, device: DeviceProfile) -> str | None:
    """explain-oom's verdict (:func:`~allocsim.sim.questions.explain.verdict`) and reason for
    the first request ``spec`` fails on ``device``: the replay stops there. (Not
    :func:`~allocsim.sim.questions.explain.explain_oom` itself: its what-if replays and the
    offline plan would cost more than the whole search on a long trace.)"""
    run = ProcessReplay(trace, parse_policy(spec), SimulatedDevice(device), stop_on_oom=True,
                        call_log=False)
    run.advance(len(trace))
    oom = run.report.first_oom
    if oom is None:
        return None
    policy = run.policy
    needed = (get_allocation_size(round_size(oom.size, policy.divisions))
              if isinstance(policy, PyTorchCachingAllocator) else None)
    kind, reason = verdict(device.capacity, oom.allocated, oom.size, policy.bytes_in_use,
                           oom.reserved, oom.largest_free, needed)
    return f"{kind}: {reason}"


def _conf(key: str, value: Any) -> str:
    """One PyTorch setting as PYTORCH_CUDA_ALLOC_CONF writes it (``max_split_size_mb:128``)."""
    return PyTorchSettings(**{key: value}).to_alloc_conf()


def _pytorch(key: str, value: Any, trace: Trace, best: dict[str, Any], base: dict[str, Any],
             capacity: int | None) -> str:
    sizes = distinct_sizes(trace)
    if key == "backend":
        return ("backend:cudaMallocAsync hands every request to CUDA's stream-ordered pool "
                "(PyTorch sets its release threshold to UINT64_MAX, so freed memory stays in "
                f"the pool and is reused in 2 MiB chunks without PyTorch's 2/20 MiB segments): "
                f"{_calls(best)} against the caching allocator's {_calls(base)}")
    if key == "expandable_segments":
        return ("expandable_segments grows one virtual segment per stream and pool in 2/20 MiB "
                "pages instead of a fresh cudaMalloc'd segment per miss, so free space at the "
                f"end of the segment joins the next request: the defaults left "
                f"{f(base['external_fragmentation'])} free inside reserved memory at their peak, "
                f"the setting {f(best['external_fragmentation'])}")
    if key == "max_split_size_mb":
        limit = int(value) << 20
        all_sizes = trace.size[trace.op == OP_ALLOC]
        oversize = int((all_sizes >= limit).sum())
        distinct = sum(1 for s in sizes if round_size(s) >= limit)
        return (f"{_conf(key, value)}: blocks of {value} MiB or more are no longer split "
                f"for smaller requests, and on a miss those cached oversize blocks are freed "
                f"first; {oversize:,} of the trace's {len(all_sizes):,} requests ({distinct} "
                f"distinct sizes) are that large; device calls {_calls(base)} → {_calls(best)}")
    if key == "roundup_power2_divisions":
        table = parse_roundup_power2_divisions(str(value))
        before = len({round_size(s) for s in sizes})
        after = len({round_size(s, table) for s in sizes})
        return (f"{_conf(key, value)} rounds requests up to steps between powers "
                f"of two: the trace's {before:,} block sizes become {after:,}, so a freed block "
                "fits later requests more often; internal fragmentation at peak live "
                f"{f(base['internal_fragmentation'])} → {f(best['internal_fragmentation'])}")
    if key == "per_process_memory_fraction":
        cap = "" if capacity is None else f" = {f(int(value * capacity))}"
        return (f"set_per_process_memory_fraction({value:g}) caps what the allocator holds at "
                f"{value:g} × the card{cap}: a new segment past it is refused, the allocator "
                "frees its unsplit cached blocks and retries (device frees "
                f"{base['device_frees']:,} → {best['device_frees']:,})")
    if key == "garbage_collection_threshold":
        return (f"{_conf(key, value)} releases the oldest cached blocks "
                f"whenever reserved memory passes {value} × the allowed memory, before asking "
                "for a new segment")
    return f"{key}={value}"


def _jax(key: str, value: Any, best: dict[str, Any], base: dict[str, Any],
         capacity: int | None) -> str:
    if key == "preallocate" and not value:
        return (f"{PREALLOCATE}=false: the allocator grows as the job needs "
                "(BFC in doubling regions) instead of taking the whole fraction of the card at "
                f"the first allocation; peak reserved {f(base['peak_reserved'])} → "
                f"{f(best['peak_reserved'])}")
    if key == "fraction" and capacity is None:
        return (f"{MEM_FRACTION}={fraction_text(value)}: the allocator may use "
                f"{value:g} of the card instead of 0.75, so a smaller card holds the job")
    if key == "fraction":
        return (f"{MEM_FRACTION}={fraction_text(value)}: the allocator's limit "
                f"is {value:g} × the card ({f(int(value * capacity))} of this card), the least "
                "that completes under these settings")
    if key == "allocator" and value == "platform":
        return (f"{ALLOCATOR}=platform: no cache, every buffer is a cudaMalloc "
                f"and cudaFree: {_calls(best)}")
    if key == "allocator":
        return (f"{ALLOCATOR}=cuda_async: CUDA's stream-ordered pool in 2 MiB "
                f"chunks instead of BFC: {_calls(best)}")
    return f"{key}={value}"


def _tensorflow(key: str, value: Any, best: dict[str, Any], base: dict[str, Any],
                capacity: int | None) -> str:
    if key == "allow_growth":
        return (f"{ALLOW_GROWTH}=true: BFC starts with a 2 MiB region and doubles it "
                "as needed instead of taking its whole limit at the first allocation; peak "
                f"reserved {f(base['peak_reserved'])} → {f(best['peak_reserved'])}")
    if key == "garbage_collection":
        return (f"{GARBAGE_COLLECTION}=false: when growth fails, BFC no longer "
                "frees its wholly free regions and retries")
    if key == "memory_fraction":
        limit = "" if capacity is None else f" ({int(value * capacity) >> 20} MiB)"
        return (f"a memory limit of {value:g} × the card{limit}: the least BFC completes with "
                "under these settings")
    return f"{key}={value}"


def _cupy(key: str, value: Any, best: dict[str, Any], base: dict[str, Any],
          capacity: int | None) -> str:
    if key == "pool" and value == "async":
        return ("MemoryAsyncPool: CUDA's stream-ordered pool in 2 MiB chunks instead of CuPy's "
                f"best-fit pool that splits every block: {_calls(best)}")
    if key == "pool":
        return f"no pool (set_allocator(None)): every buffer is a cudaMalloc: {_calls(best)}"
    if key == "limit_fraction":
        return (f"{MEMORY_LIMIT}={value * 100:.4g}%: at the limit the pool frees its "
                "cached blocks and retries; device frees "
                f"{base['device_frees']:,} → {best['device_frees']:,}")
    return f"{key}={value}"


def why(trace: Trace, best: Trial, defaults: Trial, device: DeviceProfile, *,
        card: bool, default_spec: str) -> list[str]:
    """The reasons, one sentence each: the defaults' failure first (explain-oom's verdict),
    then the rule each changed setting changes, then the overall memory and time."""
    capacity = device.capacity if card else None
    base, mine = defaults.result, best.result
    lines: list[str] = []
    if card and not defaults.completed:
        share = _default_share(best.setting.framework)
        peak = trace.peak_live()[0]
        if share and share * device.capacity < peak:
            # explain-oom's verdict weighs the whole card; the defaults never use it all.
            lines.append(f"the defaults run out of memory: their limit, {share:g} × the card = "
                         f"{exact_size(int(share * device.capacity))}, is below the trace's peak "
                         f"live {exact_size(peak)}: no allocator completes inside it")
        else:
            verdict = oom_verdict(trace, default_spec, device)
            if verdict:
                lines.append("the defaults run out of memory: " + verdict)
    if not best.setting.values:
        lines.append("the defaults are already the best setting found within the budget")
        return lines
    explain: dict[str, Callable[..., str]] = {
        "jax": _jax, "tensorflow": _tensorflow, "cupy": _cupy}
    for key, value in best.setting.values:
        if best.setting.framework == "pytorch":
            lines.append(_pytorch(key, value, trace, mine, base, capacity))
        else:
            lines.append(explain[best.setting.framework](key, value, mine, base, capacity))
    if card:
        lines.append(f"overall: peak reserved {exact_size(defaults.peak_reserved)} → "
                     f"{exact_size(best.peak_reserved)}, modelled allocator time "
                     f"{defaults.alloc_time_s * 1e3:.3g} → {best.alloc_time_s * 1e3:.3g} ms; "
                     f"the setting's own run: {_fragmentation(mine)}")
    else:
        lines.append(f"overall: smallest card {_card(defaults)} → {_card(best)}")
    return lines


def _default_share(name: str) -> float:
    """The share of the card a framework's defaults limit themselves to (JAX: 0.75)."""
    return 0.75 if name == "jax" else 0.0


def _card(trial: Trial) -> str:
    return "none" if trial.min_capacity is None else exact_size(trial.min_capacity)
