"""The input limit every reader keeps: the most bytes a trace file may hold once decompressed."""

from __future__ import annotations

import os

from allocsim.traces.model import TraceError

__all__ = ["DEFAULT_MAX_INPUT_BYTES", "MAX_INPUT_ENV", "max_input_bytes", "too_large"]

MAX_INPUT_ENV = "ALLOCSIM_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 2 << 30   # 2 GiB of file (after decompression): ~60M events of CSV


def max_input_bytes() -> int:
    """The most bytes a trace file may hold once decompressed, ``ALLOCSIM_MAX_INPUT_BYTES``
    or 2 GiB. Readers hold the file in memory (a few times its size while parsing), so a
    larger one — or a small ``.gz`` that expands to gigabytes — is refused up front."""
    text = os.environ.get(MAX_INPUT_ENV, "")
    return int(text) if text.isdigit() and int(text) > 0 else DEFAULT_MAX_INPUT_BYTES


def too_large(limit: int, source: str, what: str) -> TraceError:
    return TraceError(f"{what} more than {limit:,} bytes, the input limit (set "
                      f"{MAX_INPUT_ENV}=BYTES to lift it)", source=source)
