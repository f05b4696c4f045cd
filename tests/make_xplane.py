"""Make the real TensorFlow profiles under tests/data/xplane/ (``python tests/make_xplane.py``).

Each run is a fresh process with TensorFlow's CPU allocator switched to BFC
(``TF_CPU_ALLOCATOR_USE_BFC=true``) and the profiler started before the program's first tensor,
so the ``.xplane.pb`` holds every request the BFC allocator saw (the ``midrun`` ones start it
later, on purpose):

- ``tf-cpu-default.xplane.pb``: a small MLP, 5 steps of SGD (GradientTape), the default limit;
- ``tf-cpu-100mb.xplane.pb``: the same at ``TF_CPU_BFC_MEM_LIMIT_IN_MB=100``;
- ``tf-cpu-oom.xplane.pb``: a program that asks for more than a 4 MiB limit allows;
- ``tf-cpu-midrun.xplane.pb``: the MLP with the profiler started at step 3 of 5 (mid-run:
  parameters, data and the allocator's regions exist before the first record);
- ``tf-cpu-keras-midrun.xplane.pb``: a Keras CNN profiled as ``TensorBoard(profile_batch=(3,
  5))`` does it (the profiler starts at training batch 3, stops after batch 5);
- ``tf-cpu-100mb-midrun.xplane.pb``: the mid-run MLP at ``TF_CPU_BFC_MEM_LIMIT_IN_MB=100``;
- ``tf-cpu-keras-midrun-2.xplane.pb``: the mid-run Keras CNN again, another process (its
  regions at other addresses: in the kept file a 16 MiB and a 4 MiB region lie 4 KiB apart);
- ``tf-cpu-keras-midrun-3.xplane.pb``: the mid-run Keras CNN once more (the kept file held free
  bytes in two gaps between recorded chunks at its first record: 1 of 14 fresh runs did).

The state at the first record varies run to run, so a remade mid-run file is another case.

``record("keras", ...)`` (a small Keras CNN, ``fit`` for 2 epochs) is not kept as a file: the
tests run it live where TensorFlow is installed (tests/test_bfc_fidelity.py).

Only the host plane is kept and only the allocator's own events (MemoryAllocation /
MemoryDeallocation), re-serialised with the ``protobuf`` package, so the files stay small;
everything else the profiler wrote (op events, Python trace) is dropped. Needs TensorFlow;
the tests read the files without it. ``--keep-logdir DIR`` also leaves one full TensorBoard
log folder there.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent / "data" / "xplane"

PROGRAM = r'''
import os, sys
import numpy as np
import tensorflow as tf
logdir, kind = sys.argv[1], sys.argv[2]
midrun = kind.endswith("-midrun")     # the profiler starts once the program is under way
kind = kind.removesuffix("-midrun")
tf.random.set_seed(0)


def small_cnn():
    x = np.random.default_rng(0).normal(size=(512, 16, 16, 1)).astype("float32")
    y = np.random.default_rng(1).integers(0, 10, size=512)
    model = tf.keras.Sequential([
        tf.keras.Input((16, 16, 1)), tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(), tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(10)])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return x, y, model


profiling = not midrun and kind != "keras-batches"
if profiling:
    tf.profiler.experimental.start(logdir)
try:
    if kind == "mlp":
        # a two-layer MLP, 5 steps of SGD by hand (tensors up to 512 KiB, so BFC grows)
        x = tf.random.normal((256, 128))
        y = tf.random.normal((256, 10))
        w1 = tf.Variable(tf.random.normal((128, 512)))
        w2 = tf.Variable(tf.random.normal((512, 10)))
        for step in range(5):
            if midrun and step == 2:
                tf.profiler.experimental.start(logdir)
                profiling = True
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((tf.nn.relu(x @ w1) @ w2 - y) ** 2)
            for var, grad in zip((w1, w2), tape.gradient(loss, (w1, w2))):
                var.assign_sub(0.01 * grad)
    elif kind == "keras":
        # a small Keras CNN trained for 2 epochs with fit(): the issue's Keras case
        x, y, model = small_cnn()
        model.fit(x, y, epochs=2, batch_size=64, verbose=0)
    elif kind == "keras-batches":
        # profiled as Keras' TensorBoard(profile_batch=(3, 5)) does it — the profiler started
        # at training batch 3 and stopped after batch 5, mid-run — with a callback of the same
        # two calls (the TensorBoard callback itself needs the tensorboard package)
        x, y, model = small_cnn()

        def begin(batch, logs=None):
            if batch == 3:
                tf.profiler.experimental.start(logdir)

        def end(batch, logs=None):
            if batch == 5:
                tf.profiler.experimental.stop()

        board = tf.keras.callbacks.LambdaCallback(on_train_batch_begin=begin,
                                                  on_train_batch_end=end)
        model.fit(x, y, epochs=1, batch_size=64, verbose=0, callbacks=[board])
    else:
        kept = []
        try:
            for i in range(64):
                kept.append(tf.ones((256, 1024 + 8 * i)))   # ~1 MiB each, until refused
                kept[-1] = kept[-1] + 1.0
        except tf.errors.ResourceExhaustedError:
            print("oom as intended", file=sys.stderr)
finally:
    if profiling:
        tf.profiler.experimental.stop()
'''


def record(kind: str, env_extra: dict[str, str], logdir: str) -> Path:
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPP_MIN_LOG_LEVEL="2",
               CUDA_VISIBLE_DEVICES="", TF_ENABLE_ONEDNN_OPTS="0", **env_extra)
    subprocess.run([sys.executable, "-c", PROGRAM, logdir, kind], env=env, check=True)
    found = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
                   + glob.glob(os.path.join(logdir, "train", "plugins", "profile", "*",
                                            "*.xplane.pb")))
    if not found:
        raise SystemExit(f"no .xplane.pb under {logdir}")
    return Path(found[-1])


def shrink(source: Path, target: Path) -> None:
    """Keep the planes' memory events only (and the metadata they use)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(source.read_bytes())
    out = xplane_pb2.XSpace()
    for plane in space.planes:
        keep = {k for k, m in plane.event_metadata.items()
                if m.name in ("MemoryAllocation", "MemoryDeallocation")}
        lines = []
        for line in plane.lines:
            events = [e for e in line.events if e.metadata_id in keep]
            if events:
                lines.append((line, events))
        if not lines:
            continue
        new = out.planes.add()
        new.id, new.name = plane.id, plane.name
        used_stats: set[int] = set()
        for line, events in lines:
            copy = new.lines.add()
            copy.id, copy.name, copy.timestamp_ns = line.id, line.name, line.timestamp_ns
            for event in events:
                copy.events.add().CopyFrom(event)
                used_stats.update(s.metadata_id for s in event.stats)
                used_stats.update(s.ref_value for s in event.stats
                                  if s.WhichOneof("value") == "ref_value")
        for k in keep:
            new.event_metadata[k].CopyFrom(plane.event_metadata[k])
        for k in used_stats:
            new.stat_metadata[k].CopyFrom(plane.stat_metadata[k])
    target.write_bytes(out.SerializeToString())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-logdir", help="also leave one full log folder here")
    args = parser.parse_args()
    HERE.mkdir(parents=True, exist_ok=True)
    runs = [("tf-cpu-default", "mlp", {}),
            ("tf-cpu-100mb", "mlp", {"TF_CPU_BFC_MEM_LIMIT_IN_MB": "100"}),
            ("tf-cpu-oom", "oom", {"TF_CPU_BFC_MEM_LIMIT_IN_MB": "4"}),
            ("tf-cpu-midrun", "mlp-midrun", {}),
            ("tf-cpu-keras-midrun", "keras-batches", {}),
            ("tf-cpu-100mb-midrun", "mlp-midrun", {"TF_CPU_BFC_MEM_LIMIT_IN_MB": "100"}),
            ("tf-cpu-keras-midrun-2", "keras-batches", {}),
            ("tf-cpu-keras-midrun-3", "keras-batches", {})]
    for name, kind, extra in runs:
        with tempfile.TemporaryDirectory() as logdir:
            found = record(kind, extra, logdir)
            shrink(found, HERE / f"{name}.xplane.pb")
            print(f"{name}: {found.stat().st_size:,} bytes -> "
                  f"{(HERE / f'{name}.xplane.pb').stat().st_size:,}")
            if args.keep_logdir and kind == "mlp" and not extra:
                import shutil
                shutil.copytree(logdir, args.keep_logdir, dirs_exist_ok=True)


if __name__ == "__main__":
    main()
