"""TensorFlow's GPU allocator settings as one typed value: the two environment variables
gpu_bfc_allocator.cc reads (TF_FORCE_GPU_ALLOW_GROWTH, TF_ENABLE_GPU_GARBAGE_COLLECTION:
exactly ``true`` or ``false``) and the logical device's memory limit, set in code; written
back as them and as the ``bfc`` policy's spec. The names are spelled here only."""

from __future__ import annotations

from dataclasses import dataclass

from allocsim.policies.settings.environment import flag

MiB = 1 << 20
ALLOW_GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"
GARBAGE_COLLECTION = "TF_ENABLE_GPU_GARBAGE_COLLECTION"
_FIELDS = {ALLOW_GROWTH: "allow_growth", GARBAGE_COLLECTION: "garbage_collection"}


@dataclass(frozen=True)
class TensorFlowSettings:
    """``allow_growth`` (default off: one region of the limit), ``garbage_collection``
    (default on), ``memory_fraction`` of the card as the logical device's limit (0: none)."""

    allow_growth: bool = False
    garbage_collection: bool = True
    memory_fraction: float = 0.0

    @classmethod
    def from_env(cls, text: str) -> TensorFlowSettings:
        """``TF_FORCE_GPU_ALLOW_GROWTH`` / ``TF_ENABLE_GPU_GARBAGE_COLLECTION`` words, each
        exactly ``true`` or ``false`` (anything else TensorFlow logs as an error and ignores:
        refused here, since the job would not run with what was meant)."""
        values: dict[str, bool] = {}
        for word in text.split():
            name, equals, value = word.partition("=")
            if name not in _FIELDS or not equals:
                raise ValueError(f"tensorflow: unknown setting {word!r}; known: "
                                 + ", ".join(f"{k}=true|false" for k in _FIELDS))
            value = value.strip("'\"")
            if value not in ("true", "false"):
                raise ValueError(f"The {name} environment variable is set but could not be "
                                 f"parsed: {value!r} (TensorFlow accepts true or false)")
            values[_FIELDS[name]] = value == "true"
        return cls(**values)

    def to_env(self) -> str:
        """The environment words for the settings not at TensorFlow's defaults."""
        default = TensorFlowSettings()
        words = []
        if self.allow_growth != default.allow_growth:
            words.append(f"{ALLOW_GROWTH}={flag(self.allow_growth)}")
        if self.garbage_collection != default.garbage_collection:
            words.append(f"{GARBAGE_COLLECTION}={flag(self.garbage_collection)}")
        return " ".join(words)

    def limit_mb(self, capacity: int | None) -> int:
        """The logical device's memory limit in MiB for a card of ``capacity`` bytes."""
        if capacity is None:
            raise ValueError("tensorflow: a memory limit needs a card (--device or --capacity)")
        return max(1, int(self.memory_fraction * capacity) // MiB)

    def paste(self, capacity: int | None = None) -> list[str]:
        """The environment line, then the code that sets the memory limit."""
        env = self.to_env()
        lines = [env] if env else []
        if self.memory_fraction:
            lines.append("tf.config.set_logical_device_configuration(tf.config."
                         "list_physical_devices('GPU')[0], [tf.config."
                         f"LogicalDeviceConfiguration(memory_limit={self.limit_mb(capacity)})])")
        return lines

    def spec(self, capacity: int | None = None) -> str:
        """The ``bfc`` policy's spec (a memory limit needs the card's ``capacity``)."""
        params = [f"allow_growth={flag(self.allow_growth)}",
                  f"garbage_collection={flag(self.garbage_collection)}"]
        if self.memory_fraction:
            params.append(f"memory_limit={self.limit_mb(capacity)}MiB")
        return "bfc:" + ",".join(params)


__all__ = ["ALLOW_GROWTH", "GARBAGE_COLLECTION", "TensorFlowSettings"]
