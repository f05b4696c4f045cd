"""The JAX recorder counts device buffers, not Array objects (issue 26.4): a second Array that
views a buffer (``device_put`` to the device it is on, ``addressable_data``) allocates nothing,
``device_put`` of a numpy array is one allocation, a donated array sharded over several devices
hands its shard to the output, and the end check counts a viewed buffer once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed: the JAX recorder needs it")
jnp = pytest.importorskip("jax.numpy")

import allocsim.traces.record  # noqa: E402
from allocsim.traces.model import OP_ALLOC, OP_FREE  # noqa: E402


def events(trace) -> list[tuple[int, int, int, str]]:
    return [(int(trace.op[i]), int(trace.id[i]), int(trace.size[i]),
             trace.tag_name(int(trace.tag[i])) or "") for i in range(len(trace))]


def test_device_put_of_a_numpy_array_is_one_allocation():
    host = np.ones((256, 256), np.float32)
    with allocsim.traces.record.jax(None) as recorder:
        on_device = jax.device_put(host)
        committed = jax.device_put(host, jax.devices()[0])
    assert events(recorder.trace) == [(OP_ALLOC, 0, host.nbytes, "device_put"),
                                      (OP_ALLOC, 1, host.nbytes, "device_put")]
    del on_device, committed


def test_device_put_to_the_device_an_array_is_on_reuses_its_buffer():
    x = jnp.arange(4096.0)  # uncommitted: device_put commits it without a copy
    with allocsim.traces.record.jax(None) as recorder:
        start = len(recorder)
        y = jax.device_put(x, jax.devices()[0])
        assert y is not x and y.unsafe_buffer_pointer() == x.unsafe_buffer_pointer()
        assert len(recorder) == start  # no copy recorded
        del x
        assert len(recorder) == start  # y still holds the buffer
        del y
    trace = recorder.trace
    assert events(trace)[-1][0] == OP_FREE and events(trace)[-1][2] == 16384
    assert trace.metadata["end_check"]["match"]


def test_a_viewed_buffer_is_counted_once_by_the_end_check():
    x = jax.device_put(np.ones(1000, np.float32), jax.devices()[0])
    with allocsim.traces.record.jax(None) as recorder:
        view = x.addressable_data(0)  # a second Array on the same buffer
        assert view is not x and view.unsafe_buffer_pointer() == x.unsafe_buffer_pointer()
    end = recorder.trace.metadata["end_check"]
    assert end["match"], end
    assert end["live_arrays_bytes"] == end["recorded_live_bytes"]
    del view, x


def test_deleting_one_view_frees_the_buffer_once():
    x = jnp.arange(1000.0)
    with allocsim.traces.record.jax(None) as recorder:
        y = jax.device_put(x, jax.devices()[0])
        x.delete()  # the views share one buffer: y is deleted with it
        assert y.is_deleted()
        del x, y
    frees = [e for e in events(recorder.trace) if e[0] == OP_FREE]
    assert [e[2] for e in frees] == [4000]


# ------------------------------------------------------------------ several devices
FOUR_DEVICES = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import allocsim.traces.record
    from allocsim.traces.model import OP_ALLOC
    devices = int(sys.argv[1])
    mesh = jax.make_mesh((devices,), ("d",))
    def step(w, x):
        return w - 0.01 * (jnp.tanh(x @ w.T).T @ x)
    update = jax.jit(step, donate_argnums=(0,))
    w = jax.device_put(np.ones((1024, 1024), np.float32), NamedSharding(mesh, P("d")))
    x = jax.device_put(np.ones((64, 1024), np.float32), NamedSharding(mesh, P()))
    temp = update.lower(w, x).compile().memory_analysis().temp_size_in_bytes
    with allocsim.traces.record.jax(None) as recorder:
        for _ in range(4):
            w = update(w, x)
        jax.block_until_ready(w)
    trace = recorder.trace
    tags = [trace.tag_name(int(t)) for t in trace.tag]
    outputs = sum(1 for op, tag in zip(trace.op, tags)
                  if op == OP_ALLOC and not tag.endswith("/temp") and tag != "%s")
    print(json.dumps({"peak": int(trace.peak_live()[0]), "temp": int(temp),
                      "shard": 1024 * 1024 * 4 // devices, "x": 64 * 1024 * 4,
                      "output_allocs": outputs, "end": trace.metadata["end_check"]}))
""")


def run_on_host_devices(devices: int) -> dict:
    from allocsim.traces.record.jax_recorder.recorder import PROLOGUE_TAG
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    done = subprocess.run([sys.executable, "-c", FOUR_DEVICES % PROLOGUE_TAG, str(devices)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_donated_array_sharded_over_four_devices_hands_its_shard_to_the_output():
    """It recorded each step's output as new (``_pointer()`` of a sharded array is None): the
    peak then held the old and the new parameters' shard at once."""
    four = run_on_host_devices(4)
    assert four["output_allocs"] == 0, four
    assert four["peak"] == four["shard"] + four["x"] + four["temp"], four
    assert four["end"]["match"], four


def aligned_host_array(n: int, align: int = 64) -> np.ndarray:
    raw = np.zeros(n * 4 + align, np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset:offset + n * 4].view(np.float32)


def test_two_device_puts_of_one_numpy_array_are_two_buffers():
    """XLA:CPU may alias a 64-byte-aligned numpy array's memory (both Arrays then have its
    pointer); on a GPU each device_put is a buffer of its own, and so is each in the trace."""
    host = aligned_host_array(4096)
    with allocsim.traces.record.jax(None) as recorder:
        a = jax.device_put(host)
        b = jax.device_put(host, jax.devices()[0])
    trace = recorder.trace
    assert [e[0] for e in events(trace)] == [OP_ALLOC, OP_ALLOC]
    assert trace.metadata["end_check"]["match"], trace.metadata["end_check"]
    del a, b


def test_device_put_of_parameters_onto_the_sharding_they_have_is_no_transient():
    """``device_put(params, sharding)`` onto the one device they are on: no copy, so no
    transient of the parameters' size (it was recorded as one)."""
    from jax.sharding import NamedSharding, PartitionSpec
    mesh = jax.make_mesh((1,), ("d",))
    params = {"w": jnp.ones((256, 256)), "b": jnp.zeros(256)}
    with allocsim.traces.record.jax(None) as recorder:
        start = recorder.live_bytes()
        placed = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
        del params
        assert recorder.live_bytes() == start
    assert recorder.trace.peak_live()[0] == start
    assert recorder.trace.metadata["end_check"]["match"]
    del placed
