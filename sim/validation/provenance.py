"""When and where a validation or calibration ran, as its report or profile records it: the
date, the versions of what ran it, and the file-safe names its outputs are filed under."""

from __future__ import annotations

import platform
import re
from datetime import datetime, timezone

import numpy as np


def slug(text: str) -> str:
    """``text`` as a file name: runs of anything but letters, digits, ``.``, ``_`` and ``-``
    become ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "report"


def host_versions() -> dict[str, str]:
    """The versions a host run records."""
    return {"numpy": np.__version__, "python": platform.python_version(),
            "platform": platform.platform()}


def now() -> str:
    """The time now, UTC, to the second (ISO 8601): the date a report records."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")

