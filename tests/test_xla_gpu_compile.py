"""Issue 26 item 1: JAX programs compiled for a named GPU without one
(:func:`allocsim.traces.record.xla_gpu.compile_for`), replayed as JAX's runtime would.

Needs jax's CUDA plugin (``pip install '.[jax-gpu]'``, ~0.6 GB; CI installs only
``.[jax,tensorflow]``): every test here skips, saying so, without it. The compiles run in one
child process (the plugin must load with no device visible, before anything else imports jax)
that prints its findings as JSON; the tests read them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from xla_gpu_compiler import needs_cuda_plugin

from allocsim.sim.cli.main import main

pytestmark = needs_cuda_plugin

TARGETS = ["a100-40g", "a100-80g", "h100-80g", "h200-141g", "l4-24g", "rtx4090-24g", "t4-16g"]

CHILD = r'''
import json, sys
from allocsim.traces.record import xla_gpu
xla_gpu.prepare()
import jax
import jax.numpy as jnp
from allocsim.errors import UserInputError

OUT = sys.argv[1]
found = {}
params = {"w1": jax.ShapeDtypeStruct((512, 1024), jnp.float32),
          "w2": jax.ShapeDtypeStruct((1024, 512), jnp.float32)}
batch = jax.ShapeDtypeStruct((64, 512), jnp.float32)


def loss(p, x):
    return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - x) ** 2)


def train_step(p, x):
    value, grads = jax.value_and_grad(loss)(p, x)
    return jax.tree.map(lambda a, g: a - 0.01 * g, p, grads), value


def eval_step(p, x):
    return loss(p, x)


def summary(trace):
    return {"peak": int(trace.peak_live()[0]), "events": len(trace),
            "xla_gpu": trace.metadata["xla_gpu"],
            "tags": [trace.tag_name(int(t)) for t in trace.tag]}


for target in sys.argv[2].split(","):
    found[target] = summary(xla_gpu.compile_for(train_step, (params, batch), donate_argnums=0,
                                                target=target))
sched = xla_gpu.Schedule(steps=6, eval_step=eval_step, eval_args=(params, batch), eval_every=3,
                         batch_argnums=(1,))
found["schedule"] = summary(xla_gpu.compile_for(
    train_step, (params, batch), donate_argnums=0, target="h100-80g", schedule=sched,
    output=sys.argv[3], keep_dump=sys.argv[4]))
short = jax.ShapeDtypeStruct((32, 512), jnp.float32)
found["buckets"] = summary(xla_gpu.compile_for(
    train_step, (params, batch), donate_argnums=0, target="l4-24g",
    schedule=xla_gpu.Schedule(steps=4, buckets=((params, short),), batch_argnums=(1,))))
found["not_donated"] = summary(xla_gpu.compile_for(train_step, (params, batch),
                                                   target="h100-80g",
                                                   schedule=xla_gpu.Schedule(steps=2)))
found["fsdp4"] = summary(xla_gpu.compile_for(train_step, (params, batch), donate_argnums=0,
                                             target="h100-80g", devices=4,
                                             schedule=xla_gpu.Schedule(batch_argnums=(1,))))
# The same program on XLA:CPU: arguments, outputs and donation must agree; temps differ.
cpu = jax.jit(train_step, donate_argnums=0).lower(params, batch).compile().memory_analysis()
found["cpu"] = {k: int(getattr(cpu, k + "_size_in_bytes"))
                for k in ("argument", "output", "alias", "temp")}


def custom(x):
    return jax.ffi.ffi_call("allocsim_no_such_target", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


errors = {}
for name, call in {
    "unknown target": lambda: xla_gpu.compile_for(train_step, (params, batch), target="b300"),
    "cpu-only custom call": lambda: xla_gpu.compile_for(custom, (batch,), target="h100-80g"),
    "not an abstract argument": lambda: xla_gpu.compile_for(train_step, ("text", batch)),
}.items():
    try:
        call()
        errors[name] = None
    except UserInputError as err:
        errors[name] = str(err)
found["errors"] = errors
json.dump(found, open(OUT, "w"))
'''


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("xla_gpu")
    out = tmp / "found.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    subprocess.run([sys.executable, "-c", CHILD, str(out), ",".join(TARGETS),
                    str(tmp / "schedule.npz"), str(tmp / "dump")], env=env, check=True,
                   timeout=600)
    data = json.loads(out.read_text())
    data["tmp"] = str(tmp)
    return data


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_compiles_and_its_peak_is_memory_analysis(found: dict[str, Any],
                                                              target: str) -> None:
    result = found[target]
    (train,) = result["xla_gpu"]["executables"]
    assert result["xla_gpu"]["target"] == target
    assert result["peak"] == train["argument"] + train["temp"] + train["output"] - train["alias"]
    assert train["alias"] == train["argument"] - 64 * 512 * 4  # all but the batch donated


def test_the_gpu_and_cpu_agree_on_arguments_outputs_and_donation(found: dict[str, Any]) -> None:
    (gpu,) = found["h100-80g"]["xla_gpu"]["executables"]
    cpu = found["cpu"]
    assert (gpu["argument"], gpu["alias"]) == (cpu["argument"], cpu["alias"])
    # Outputs differ only by the output tuple's index table (8 B a pointer, 3 outputs on both).
    assert gpu["output"] - gpu["alias"] == cpu["output"] - cpu["alias"]


def test_a_schedule_of_train_and_eval_steps(found: dict[str, Any]) -> None:
    result = found["schedule"]
    train, evaluate = result["xla_gpu"]["executables"]
    tags = result["tags"]
    assert sum("preallocated temp" in t and "train_step" in t for t in tags) == 2 * 6
    assert sum("preallocated temp" in t and "eval_step" in t for t in tags) == 2 * 2
    # The eval step reads the train state: no argument of its own but the batch.
    assert sum(t.startswith("eval: argument") for t in tags) == 2 * 2
    assert sum(t.startswith("state: parameter") for t in tags) == 2 * 2  # w1, w2: alloc, free
    # Each step's new outputs are held until the next step of its kind: the loss of the last
    # eval lives through the train steps after it, the train step's loss through an eval.
    train_out = train["output"] - train["alias"]
    eval_out = evaluate["output"] - evaluate["alias"]
    assert result["peak"] == train["argument"] + max(train["temp"] + train_out + eval_out,
                                                     evaluate["temp"] + eval_out + train_out)


def test_length_buckets_alternate_their_executables(found: dict[str, Any]) -> None:
    result = found["buckets"]
    long, short = result["xla_gpu"]["executables"]
    assert long["argument"] - short["argument"] == 32 * 512 * 4
    temps = [t for t in result["tags"] if "preallocated temp" in t]
    assert len(temps) == 8  # 4 steps: allocated and freed


def test_without_donation_the_new_parameters_are_held_until_rebound(found: dict[str, Any]) -> None:
    result = found["not_donated"]
    (train,) = result["xla_gpu"]["executables"]
    assert train["alias"] == 0
    assert result["peak"] == train["argument"] + train["temp"] + train["output"]


def test_fsdp_over_four_devices_gives_one_devices_shard(found: dict[str, Any]) -> None:
    (one,) = found["h100-80g"]["xla_gpu"]["executables"]
    (sharded,) = found["fsdp4"]["xla_gpu"]["executables"]
    assert sharded["argument"] * 4 == one["argument"]
    assert found["fsdp4"]["xla_gpu"]["devices"] == 4
    assert "NCCL" in found["fsdp4"]["xla_gpu"]["not_modelled"]


@pytest.mark.parametrize("case, expect", [
    ("unknown target", "unknown GPU target 'b300' (known: a100-40g"),
    ("cpu-only custom call", "does not compile for h100-80g"),
    ("not an abstract argument", "has no shape and dtype"),
])
def test_bad_input_is_one_line(found: dict[str, Any], case: str, expect: str) -> None:
    message = found["errors"][case]
    assert message is not None and expect in message and "\n" not in message


def test_the_commands_take_what_it_writes(found: dict[str, Any]) -> None:
    tmp = Path(found["tmp"])
    assert main(["info", str(tmp / "schedule.npz")]) == 0
    assert main(["min-capacity", str(tmp / "schedule.npz"), "--policies", "bfc", "jax"]) == 0
    assert main(["info", str(tmp / "dump" / "train0")]) == 0
