"""The TPU runtime's settings: none that change memory. Measured on a v5e
(experiments/tpu/README.md): the runtime takes all of HBM whatever ``XLA_PYTHON_CLIENT_*``
say, so the value is empty, with the same shape as the other frameworks' for the commands
that handle any of them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TpuSettings:
    """No field: the TPU runtime has one behaviour (policies/tpu.py)."""

    @classmethod
    def from_env(cls, text: str) -> TpuSettings:
        """Nothing to read; a setting given is refused, since it would change nothing."""
        if text.split():
            raise ValueError(f"tpu: the TPU runtime reads no allocator setting, got "
                             f"{text.strip()!r}")
        return cls()

    def to_env(self) -> str:
        return ""

    def paste(self, capacity: int | None = None) -> list[str]:
        return []

    def spec(self, capacity: int | None = None) -> str:
        return "tpu"


__all__ = ["TpuSettings"]
