"""The child process of the ``jax`` backend: a trace replayed on a JAX device (a TPU).

Run as ``python -m allocsim.sim.validation.jax_child EVENTS.npz LOGDIR RESULT.json MAX_OOMS``
by :mod:`allocsim.sim.validation.jax_backend`. A process of its own, so the runtime starts
fresh (only its own 26,624 B in use on a v5e) and nothing of the parent's JAX state is in HBM.

What it does: starts the profiler (``jax.profiler.start_trace(LOGDIR)``: the TPU runtime
writes one record per allocation and free), then for every event of ``EVENTS.npz`` (columns
``op``, ``id``, ``size``) puts, for an alloc, a ``u8[size]`` array on the device
(``jax.device_put`` of a host view, waited for) kept by buffer id, and for a free deletes it
(``Array.delete()``: the buffer goes back at once). After every event it reads
``memory_stats()``. A refusal (the runtime's ``RESOURCE_EXHAUSTED``) is an OOM: counted, the
buffer's free skipped; after ``MAX_OOMS`` refusals the replay stops. Then it stops the
profiler, deletes what is still live and writes ``RESULT.json``: ``in_use``, ``reserved``,
``limit`` (per event: ``bytes_in_use``, ``bytes_reserved``; the first ``bytes_limit``),
``on_device`` (per successful alloc), ``wall_ns`` (per event), ``ooms``, ``stopped_at``,
``start_stats``, ``device``, ``versions``, ``replay_s``.

Imports only numpy and jax, both in :func:`main`.
"""

from __future__ import annotations

import json
import platform
import sys
import time


def _versions(np: object, jax: object) -> dict[str, str]:
    import importlib.metadata as md
    versions = {"python": platform.python_version(), "platform": platform.platform()}
    for name in ("jax", "jaxlib", "libtpu", "numpy"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return versions


def main(argv: list[str]) -> int:
    events_path, logdir, result_path, max_ooms_text = argv
    max_ooms = int(max_ooms_text)
    import jax
    import numpy as np

    columns = np.load(events_path)
    ops, ids, sizes = (columns[k].tolist() for k in ("op", "id", "size"))
    alloc_op = int(columns["alloc_op"])
    device = jax.devices()[0]
    if device.platform != "tpu":
        print(f"backend jax needs a TPU: JAX's first device here is {device.platform} "
              f"({device.device_kind}), which keeps no allocation records", file=sys.stderr)
        return 3
    stats = device.memory_stats
    start_stats = {k: int(v) for k, v in (stats() or {}).items()}
    host = np.zeros(1 << 20, np.uint8)
    live: dict[int, object] = {}
    in_use: list[int] = []
    reserved: list[int] = []
    on_device: list[int] = []
    wall_ns: list[int] = []
    ooms: list[int] = []
    stopped_at: int | None = None
    jax.profiler.start_trace(logdir)
    began = time.perf_counter()
    try:
        for i in range(len(ops)):
            t0 = time.perf_counter_ns()
            if ops[i] == alloc_op:
                size = sizes[i]
                if size > 0:
                    if host.size < size:
                        host = np.zeros(max(size, 2 * host.size), np.uint8)
                    try:
                        array = jax.device_put(host[:size], device)
                        array.block_until_ready()
                        live[ids[i]] = array
                        on_device.append(
                            int(array.addressable_data(0).on_device_size_in_bytes()))
                    except Exception as err:   # the runtime's refusal is a measurement
                        if "RESOURCE_EXHAUSTED" not in str(err):
                            raise
                        ooms.append(i)
            else:
                array = live.pop(ids[i], None)
                if array is not None:
                    array.delete()   # type: ignore[attr-defined]
            wall_ns.append(time.perf_counter_ns() - t0)
            now = stats() or {}
            in_use.append(int(now.get("bytes_in_use", -1)))
            reserved.append(int(now.get("bytes_reserved", 0)))
            if len(ooms) >= max_ooms:
                stopped_at = i
                break
    finally:
        replay_s = time.perf_counter() - began
        jax.profiler.stop_trace()
        for array in live.values():
            array.delete()   # type: ignore[attr-defined]
        live.clear()
    result = {"in_use": in_use, "reserved": reserved, "on_device": on_device,
              "wall_ns": wall_ns, "ooms": ooms, "stopped_at": stopped_at,
              "limit": start_stats.get("bytes_limit"), "start_stats": start_stats,
              "device": f"{device.device_kind} ({device.platform})",
              "platform": device.platform, "versions": _versions(np, jax),
              "replay_s": round(replay_s, 6)}
    with open(result_path, "w") as out:
        json.dump(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
