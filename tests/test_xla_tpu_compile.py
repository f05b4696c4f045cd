"""compile_for(target="tpu-v5e") (traces/record/xla_tpu.py): a JAX step compiled for a TPU
with libtpu and no TPU, replayed as the TPU runtime holds it, against what the chip held for the
same step (tests/data/tpu/exec-matmul.json: JAX 0.10.2, libtpu 0.0.42.1, a v5e). Skips without
libtpu (pip install -e ".[jax-tpu]"), saying so."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from allocsim.errors import UserInputError

DATA = Path(__file__).parent / "data" / "tpu"

if importlib.util.find_spec("jax") is None or importlib.util.find_spec("libtpu") is None:
    pytest.skip("needs jax and libtpu (pip install -e '.[jax-tpu]'): XLA:TPU compiles only "
                "with libtpu", allow_module_level=True)


def _matmul_step():  # type: ignore[no-untyped-def]
    import jax
    import jax.numpy as jnp

    def chain(a, b):  # type: ignore[no-untyped-def]
        return jnp.tanh(a @ b) @ b + a

    shape = jax.ShapeDtypeStruct((4096, 4096), jnp.float32)
    return chain, [shape, shape]


def test_a_step_compiled_without_a_tpu_holds_what_the_chip_held() -> None:
    from allocsim.sim.kernel.device_profile import resolve_device
    from allocsim.sim.kernel.engine import replay
    from allocsim.traces.record.xla_tpu import compile_for
    chip = json.loads((DATA / "exec-matmul.json").read_text())
    step, args = _matmul_step()
    trace = compile_for(step, args)
    facts = trace.metadata["xla_tpu"]
    analysis = chip["memory_analysis"]
    assert all(facts["memory_analysis"][k] == analysis[f"{k}_size_in_bytes"]
               for k in facts["memory_analysis"])      # XLA:TPU's plan, byte for byte
    result = replay(trace, "tpu", resolve_device("tpu-v5e"))
    assert result.peak_allocated == chip["stages"]["ran"]["peak_bytes_in_use"] - 26_624
    assert facts["scratch_bytes"] == chip["stages"]["ran"]["peak_bytes_reserved"] == 0
    assert facts["libtpu"] and trace.metadata["sizes_on_device"]


def test_a_topology_libtpu_does_not_know_is_one_line() -> None:
    from allocsim.traces.record.xla_tpu import compile_for
    step, args = _matmul_step()
    with pytest.raises(UserInputError, match="does not know it"):
        compile_for(step, args, topology="v99x:7x7")


def test_a_step_larger_than_hbm_is_one_line() -> None:
    import jax
    import jax.numpy as jnp

    from allocsim.traces.record.xla_tpu import compile_for
    step, _ = _matmul_step()
    huge = jax.ShapeDtypeStruct((40000, 40000), jnp.float32)   # 6.4 GB each, 3 live
    with pytest.raises(UserInputError, match=r"does not compile for tpu-v5e.*memory"):
        compile_for(step, [huge, huge])


def test_a_slice_of_four_chips_compiles_and_each_device_holds_the_replicated_step() -> None:
    # v5e:2x2 takes libtpu's own host bounds (one chip's (1,1,1) would not hold it); the
    # arguments are replicated, so each of the four devices holds what one chip holds.
    from allocsim.traces.record.xla_tpu import compile_for
    step, args = _matmul_step()
    one = compile_for(step, args)
    four = compile_for(step, args, topology="v5e:2x2")
    facts = four.metadata["xla_tpu"]
    assert (facts["topology"], facts["devices"]) == ("v5e:2x2", 4)
    for key in ("argument", "output", "alias", "temp"):
        assert facts["memory_analysis"][key] == one.metadata["xla_tpu"]["memory_analysis"][key]
    assert len(four) == len(one)
