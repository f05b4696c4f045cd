"""Whether XLA:GPU's compiler is here (jax and its CUDA plugin), for the tests that compile
programs for a GPU without one; they skip, saying how to install it, where it is absent."""

from __future__ import annotations

import importlib.util

import pytest

# find_spec of "jax_plugins.xla_cuda12" raises when "jax_plugins" itself is absent.
HAVE_CUDA_PLUGIN = (importlib.util.find_spec("jax") is not None
                    and importlib.util.find_spec("jax_plugins") is not None
                    and importlib.util.find_spec("jax_plugins.xla_cuda12") is not None)

needs_cuda_plugin = pytest.mark.skipif(
    not HAVE_CUDA_PLUGIN,
    reason="the CUDA plugin of jax is not installed (pip install '.[jax-gpu]': "
           "jax[cuda12-local] + nvidia-cuda-nvcc-cu12, ~0.6 GB; it compiles for a GPU "
           "without one)")
