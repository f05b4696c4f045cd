"""Results that regenerate byte for byte on any machine: no absolute path, no home, no host.

:func:`machine_details` lists every string of a results dict that names this machine — an
absolute path (``/work/...``, ``C:\\...``), the repository's own location, the user's home or
or the host name — so that the runner refuses to write them (a results.json committed from one
machine must be what a clean clone elsewhere regenerates).
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_ABSOLUTE = re.compile(r"(?:^|[\s'\"(=])(/(?:[\w.\-]+/)+[\w.\-]*|[A-Za-z]:\\\\[\w\\.\-]+)")


def _markers() -> list[str]:
    found = [str(ROOT), str(Path.home())]
    try:
        found.append(socket.gethostname())
    except OSError:     # no host name: nothing of it to find
        pass
    return [m for m in found if len(m) >= 4]


def machine_details(value: Any, where: str = "results") -> list[str]:
    """``where: text`` for each string in ``value`` that names this machine."""
    out: list[str] = []
    markers = _markers()
    if isinstance(value, dict):
        for key, item in value.items():
            out += machine_details(item, f"{where}.{key}")
    elif isinstance(value, list):
        for k, item in enumerate(value):
            out += machine_details(item, f"{where}[{k}]")
    elif isinstance(value, str):
        if _ABSOLUTE.search(value) or any(m in value for m in markers):
            out.append(f"{where}: {value[:80]!r}")
    return out
