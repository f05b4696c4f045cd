"""A trace's buffers as a device holds them: on a TPU a plain buffer of ``n`` bytes is ``u8[n]``.

A trace from a GPU, a CPU or a generator gives each buffer's bytes; a TPU lays every array out
in tiles (:mod:`allocsim.traces.tpu_layout`), so on a TPU the same buffer takes the bytes of a
``u8[n]`` array: 512 B up to 512 bytes, then whole 1024-byte tiles — what ``allocsim validate
--backend jax`` allocates on the chip, where the ``tpu`` model then holds the runtime's bytes
in use exactly (experiments/tpu/validate-on-chip.json). A TPU's own profile already records
on-device sizes (``sizes_on_device`` in its metadata) and is left as it is.

Both engines take a trace through :func:`buffers_on_device` where a run starts (the Python
``ProcessReplay`` and the native core's ``open_run``), and so does the capacity search's oracle
(whose lower bound is the trace's peak live), so every policy on a TPU sees the same buffers and
peak live is the bytes the chip would hold.
"""

from __future__ import annotations

import weakref

import numpy as np

from allocsim.sim.kernel.device_profile import TPU_PROFILES, DeviceProfile
from allocsim.traces.model import Trace
from allocsim.traces.tpu_layout import u8_buffer_sizes

__all__ = ["SIZES_ON_DEVICE", "buffers_on_device", "is_tpu"]

SIZES_ON_DEVICE = "sizes_on_device"      # trace metadata: sizes are already the device's
TPU_NAMES = frozenset(profile.name for profile in TPU_PROFILES)
_SIZED: weakref.WeakKeyDictionary[Trace, Trace] = weakref.WeakKeyDictionary()


def is_tpu(profile: DeviceProfile) -> bool:
    """A built-in TPU profile (at any capacity: ``tpu-v5e@8.00GiB`` too)."""
    return profile.name in TPU_NAMES


def buffers_on_device(trace: Trace, profile: DeviceProfile) -> Trace:
    """``trace`` with each buffer at the bytes ``profile``'s device takes for it: on a TPU the
    ``u8[n]`` size (unless the trace's sizes are the device's already), elsewhere unchanged.
    The same trace object is mapped once (kept while the trace lives)."""
    if not is_tpu(profile) or trace.metadata.get(SIZES_ON_DEVICE):
        return trace
    sized = _SIZED.get(trace)
    if sized is None:
        sizes = np.asarray(trace.size)   # a free's size is its buffer's: mapped alike
        mapped = u8_buffer_sizes(sizes).astype(sizes.dtype)
        meta = dict(trace.metadata)
        meta[SIZES_ON_DEVICE] = "tpu: each buffer of n bytes as u8[n] (traces/tpu_layout.py)"
        sized = Trace(time_ns=trace.time_ns, op=trace.op, id=trace.id, size=mapped,
                      stream=trace.stream, process=trace.process, tag=trace.tag,
                      tags=list(trace.tags), metadata=meta)
        _SIZED[trace] = sized
    return sized
