"""CuPy's memory settings as one typed value: which pool (``MemoryPool``, ``MemoryAsyncPool``,
none) and ``CUPY_GPU_MEMORY_LIMIT`` as a share of the card (cupy/cuda/memory.pyx: the pool's
set_limit; MemoryAsyncPool's limit is its release threshold, UINT64_MAX when unset); written
back as the lines a user pastes and as the model's spec. The names are spelled here only."""

from __future__ import annotations

from dataclasses import dataclass

from allocsim.policies.settings.pytorch import NEVER_RELEASE

MEMORY_LIMIT = "CUPY_GPU_MEMORY_LIMIT"
POOLS = ("default", "async", "none")
_SET_ALLOCATOR = {"async": "cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)",
                  "none": "cupy.cuda.set_allocator(None)"}


@dataclass(frozen=True)
class CuPySettings:
    """``pool`` default | async | none, ``limit_fraction`` of the card (0: no limit)."""

    pool: str = "default"
    limit_fraction: float = 0.0

    @classmethod
    def from_env(cls, text: str) -> CuPySettings:
        """``CUPY_GPU_MEMORY_LIMIT=N%`` (bytes need the card: refused) and
        ``pool=default|async|none`` words."""
        values: dict[str, object] = {}
        for word in text.split():
            name, equals, value = word.partition("=")
            if name == MEMORY_LIMIT and equals:
                if not value.endswith("%"):
                    raise ValueError(f"{MEMORY_LIMIT}: give it as a share of the card, e.g. "
                                     f"50%; got {value!r}")
                try:
                    fraction = float(value[:-1]) / 100
                except ValueError:
                    raise ValueError(f"{MEMORY_LIMIT}: bad value {value!r}") from None
                if not 0 <= fraction <= 1:
                    raise ValueError(f"memory limit fraction out of range: {fraction}")
                values["limit_fraction"] = fraction
            elif name == "pool" and value in POOLS:
                values["pool"] = value
            else:
                raise ValueError(f"cupy: unknown setting {word!r}; known: {MEMORY_LIMIT}=N%, "
                                 "pool=default|async|none")
        return cls(**values)  # type: ignore[arg-type]

    def to_env(self) -> str:
        """The words :meth:`from_env` reads back to these settings."""
        words = []
        if self.limit_fraction:
            words.append(f"{MEMORY_LIMIT}={self.limit_fraction * 100!r}%")
        if self.pool != "default":
            words.append(f"pool={self.pool}")
        return " ".join(words)

    def paste(self, capacity: int | None = None) -> list[str]:
        """The environment variable, then the code that picks the pool."""
        lines = []
        if self.limit_fraction:
            lines.append(f"{MEMORY_LIMIT}={self.limit_fraction * 100:.4g}%")
        if self.pool in _SET_ALLOCATOR:
            lines.append(_SET_ALLOCATOR[self.pool])
        return lines

    def spec(self, capacity: int | None = None) -> str:
        """The model's spec: ``cupy`` (MemoryPool), ``cuda-async`` (the async pool, whose
        limit is its release threshold: needs the card's ``capacity``), ``on-demand``."""
        if self.pool == "none":
            return "on-demand"
        if self.pool == "async":
            if self.limit_fraction:
                if capacity is None:
                    raise ValueError("cupy: an async pool's limit needs a card")
                return f"cuda-async:release_threshold={int(self.limit_fraction * capacity)}"
            return f"cuda-async:release_threshold={NEVER_RELEASE}"
        if self.limit_fraction:
            return f"cupy:fraction={self.limit_fraction}"
        return "cupy"


__all__ = ["MEMORY_LIMIT", "CuPySettings"]
