"""JAX's GPU allocator settings (``XLA_PYTHON_CLIENT_*``) as one typed value: read from the
environment words a job runs with, written back as them, and as the ``jax`` preset's spec.

The names are spelled here and nowhere else; the rules are jax/_src/xla_bridge.py's
(``preallocate not in ('false', 'False', '0')``, ``float(memory_fraction)``, allocator
default|platform|bfc|cuda_async; XLA_CLIENT_MEM_FRACTION beside the deprecated
XLA_PYTHON_CLIENT_MEM_FRACTION is an error).
"""

from __future__ import annotations

from dataclasses import dataclass

from allocsim.policies.settings.environment import env_words, flag

PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
MEM_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
CLIENT_MEM_FRACTION = "XLA_CLIENT_MEM_FRACTION"
ALLOCATOR = "XLA_PYTHON_CLIENT_ALLOCATOR"
ALLOCATORS = ("bfc", "platform", "cuda_async")


def fraction_text(value: float) -> str:
    """``0.62`` → ``.62`` (as JAX's documentation writes it); ``1.0`` → ``1``; a fraction
    that three decimals would change is written in full, so what is pasted is what ran."""
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    text = text[1:] if text.startswith("0.") else text
    return text if float(text) == value else repr(value)


@dataclass(frozen=True)
class JaxSettings:
    """One choice of JAX's allocator settings: ``allocator`` bfc | platform | cuda_async,
    ``preallocate``, ``fraction`` of the card (JAX's defaults: bfc, true, 0.75)."""

    allocator: str = "bfc"
    preallocate: bool = True
    fraction: float = 0.75

    @classmethod
    def from_env(cls, text: str) -> JaxSettings:
        """The settings in ``VAR=VALUE`` words, as jax/_src/xla_bridge.py reads the
        environment; ValueError with one line for what JAX (or the model) refuses."""
        seen = env_words(text, "jax")
        if CLIENT_MEM_FRACTION in seen and MEM_FRACTION in seen:
            raise ValueError(f"{CLIENT_MEM_FRACTION} is specified together with "
                             f"{MEM_FRACTION}. Remove the latter one, it is deprecated.")
        values: dict[str, object] = {}
        for name, value in seen.items():
            if name == ALLOCATOR:
                allocator = value.lower()
                if allocator == "vmm":
                    raise ValueError(f"{ALLOCATOR}=vmm is a JAX allocator allocsim does not "
                                     "model")
                if allocator not in ("default", *ALLOCATORS):
                    raise ValueError(f'{ALLOCATOR} env var must be "default", "platform", '
                                     f'"bfc", or "cuda_async", got "{allocator}"')
                values["allocator"] = "bfc" if allocator == "default" else allocator
            elif name in (CLIENT_MEM_FRACTION, MEM_FRACTION):
                try:
                    fraction = float(value)
                except ValueError:
                    raise ValueError(f"{name}: could not convert string to float: "
                                     f"{value!r}") from None
                if not 0.0 < fraction <= 1.0:
                    raise ValueError(f"{name}={value}: a fraction of the card in (0, 1] is "
                                     "modelled")
                values["fraction"] = fraction
            elif name == PREALLOCATE:
                values["preallocate"] = value not in ("false", "False", "0")
            else:
                raise ValueError(f"jax: unknown setting {name!r}; known: {PREALLOCATE}, "
                                 f"{MEM_FRACTION} (or {CLIENT_MEM_FRACTION}), {ALLOCATOR}")
        return cls(**values)  # type: ignore[arg-type]

    def to_env(self) -> str:
        """The environment words that set these settings, those not at JAX's defaults ("" for
        the defaults); :meth:`from_env` reads them back to the same value."""
        default = JaxSettings()
        words = []
        if self.preallocate != default.preallocate:
            words.append(f"{PREALLOCATE}={flag(self.preallocate)}")
        if self.fraction != default.fraction:
            words.append(f"{MEM_FRACTION}={fraction_text(self.fraction)}")
        if self.allocator != default.allocator:
            words.append(f"{ALLOCATOR}={self.allocator}")
        return " ".join(words)

    def paste(self, capacity: int | None = None) -> list[str]:
        """The line a user pastes ([] for the defaults)."""
        env = self.to_env()
        return [env] if env else []

    def spec(self, capacity: int | None = None) -> str:
        """The ``jax`` preset's spec (every field written: tune's results are named by it)."""
        return (f"jax:allocator={self.allocator},preallocate={flag(self.preallocate)},"
                f"fraction={self.fraction}")


__all__ = ["ALLOCATOR", "MEM_FRACTION", "PREALLOCATE", "JaxSettings", "fraction_text"]
