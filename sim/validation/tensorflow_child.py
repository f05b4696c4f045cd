"""The child process of the ``tensorflow`` backend: a trace replayed on TensorFlow's CPU BFC.

Run as ``python -m allocsim.sim.validation.tensorflow_child EVENTS.npz LOGDIR RESULT.json
MAX_OOMS`` by :mod:`allocsim.sim.validation.tensorflow_backend`, which sets
``TF_CPU_ALLOCATOR_USE_BFC=true`` (and ``TF_CPU_BFC_MEM_LIMIT_IN_MB``) in its environment:
TensorFlow reads them once, when its CPU allocator is first made, so they must be set before
TensorFlow is imported — hence a process of its own.

What it does: starts the profiler (``tf.profiler.experimental.start(LOGDIR)``), then for
every event of ``EVENTS.npz`` (columns ``op``, ``id``, ``size``) allocates, for an alloc, a
uint8 tensor of exactly ``size`` bytes with ``tf.raw_ops.Empty(init=False)`` — one
allocation, nothing written — kept by buffer id, and for a free drops it (the dict holds the
only reference, so the buffer goes back to the allocator at once; eager CPU execution is
synchronous). The op's shape argument is a 64-byte-aligned numpy int32 array, which
TensorFlow wraps without copying, so no shape tensor is allocated beside the buffer (TensorFlow
may still copy it, seen once at the start of some runs: that 4-byte request is in the profile
too, and the comparison replays it). A refusal (``ResourceExhaustedError``) is an OOM: counted, the
buffer's free skipped; after ``MAX_OOMS`` refusals the replay stops (each costs TensorFlow's
10-second retry wait). Then it stops the profiler (which writes the ``.xplane.pb``), drops
what is still live (unrecorded: the trace did not free it) and writes ``RESULT.json``:
``ooms`` (event indices), ``stopped_at`` (event index or null), ``allocs`` (successful),
``versions``, ``replay_s``.

Imports only numpy and tensorflow, both in :func:`main`.
"""

from __future__ import annotations

import json
import platform
import sys
import time


def main(argv: list[str]) -> int:
    events_path, logdir, result_path, max_ooms_text = argv
    max_ooms = int(max_ooms_text)
    import numpy as np
    import tensorflow as tf

    columns = np.load(events_path)
    ops, ids, sizes = (columns[k].tolist() for k in ("op", "id", "size"))
    alloc_op = int(columns["alloc_op"])
    # A 64-byte-aligned int32[1]: TensorFlow wraps aligned numpy memory instead of copying it
    # into a tensor of its own, so the shape argument costs the allocator nothing.
    raw = np.zeros(128, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    shape = raw[start:start + 4].view(np.int32)
    empty = tf.raw_ops.Empty
    uint8 = tf.uint8
    exhausted = tf.errors.ResourceExhaustedError
    live: dict[int, object] = {}
    ooms: list[int] = []
    stopped_at: int | None = None
    allocs = 0
    tf.profiler.experimental.start(logdir)
    began = time.perf_counter()
    try:
        for i in range(len(ops)):
            if ops[i] == alloc_op:
                size = sizes[i]
                if size <= 0:
                    continue
                shape[0] = size
                try:
                    live[ids[i]] = empty(shape=shape, dtype=uint8, init=False)
                    allocs += 1
                except exhausted:
                    ooms.append(i)
                    if len(ooms) >= max_ooms:
                        stopped_at = i
                        break
            else:
                live.pop(ids[i], None)
    finally:
        replay_s = time.perf_counter() - began
        tf.profiler.experimental.stop()
        live.clear()    # after the profile: what the trace leaves live is not its doing
    versions = {"tensorflow": str(tf.__version__), "numpy": str(np.__version__),
                "python": platform.python_version(), "platform": platform.platform()}
    with open(result_path, "w") as out:
        json.dump({"ooms": ooms, "stopped_at": stopped_at, "allocs": allocs,
                   "versions": versions, "replay_s": round(replay_s, 6)}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
