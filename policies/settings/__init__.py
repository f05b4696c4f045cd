"""The frameworks' allocator settings as typed values, one per framework, each read from and
written back to the framework's own form (an environment variable's value, a snapshot's
record) and turned into the registry spec of the model that stands for it. Every command,
``tune`` and ``fidelity`` use these; the settings' names are spelled in these modules only."""

from allocsim.policies.settings.cupy import CuPySettings
from allocsim.policies.settings.jax import JaxSettings
from allocsim.policies.settings.pytorch import PyTorchSettings
from allocsim.policies.settings.tensorflow import TensorFlowSettings
from allocsim.policies.settings.tpu import TpuSettings

__all__ = ["CuPySettings", "JaxSettings", "PyTorchSettings", "TensorFlowSettings",
           "TpuSettings"]
