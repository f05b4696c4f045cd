"""Write, or check, a JSON file of reference results recorded from the code as it is: what the
test-reference generators (tests/make_*_refs.py) share. ``--check`` compares instead of
writing and names every case that differs (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_or_check(refs: dict[str, Any], path: Path, argv: list[str]) -> int:
    if "--check" in argv:
        old = json.loads(path.read_text())
        bad = [name for name in old if old[name] != refs.get(name)]
        for name in bad:
            print("differs:", name)
        return 1 if bad else 0
    path.write_text(json.dumps(refs, indent=0, sort_keys=True) + "\n")
    print(f"{len(refs)} cases → {path}")
    return 0
