"""Each figure names the data it was drawn from (issue 40: the figures' data was in no check).

A PNG's bytes depend on the matplotlib and libpng builds, so figures are not compared byte
for byte. Instead every figure the runner or a population draws carries, in a PNG text chunk
(:data:`KEY`), the digest of the JSON document it was drawn from (results.json or
population.json, :func:`digest`); :func:`figure_problems` holds each committed figure to the
committed JSON beside it — a figure drawn from other numbers, or one drawn before the data
changed, is a problem. ``python -m experiments.run --check`` and ``--verify`` run it.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path
from typing import Any

KEY = "allocsim-data"
_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def digest(data: Any) -> str:
    """The digest of a JSON document's content (key order and layout do not count)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def png_metadata(data: Any) -> dict[str, str]:
    """What to hand ``savefig(metadata=...)`` so that the figure names ``data``."""
    return {KEY: digest(data)}


def png_text(path: Path) -> dict[str, str]:
    """The text chunks (tEXt, zTXt, iTXt) of the PNG at ``path``."""
    blob = path.read_bytes()
    if not blob.startswith(_SIGNATURE):
        return {}
    found, at = {}, len(_SIGNATURE)
    while at + 8 <= len(blob):
        length, kind = struct.unpack(">I4s", blob[at:at + 8])
        body = blob[at + 8:at + 8 + length]
        at += 12 + length
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            found[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            found[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed, rest = rest[0], rest[2:]
            _, _, rest = rest.partition(b"\0")      # language tag
            _, _, text = rest.partition(b"\0")      # translated keyword
            found[key.decode("utf-8")] = (zlib.decompress(text) if compressed
                                          else text).decode("utf-8")
        elif kind == b"IEND":
            break
    return found


def figure_problems(folder: Path, data_file: str, figures: list[str]) -> list[str]:
    """Each of ``figures`` in ``folder`` that does not name ``data_file``'s content."""
    data_path = folder / data_file
    if not data_path.exists():
        return []
    want = digest(json.loads(data_path.read_text()))
    problems = []
    for name in figures:
        path = folder / name
        if not path.exists():
            problems.append(f"{folder.name}/{name}: missing (drawn from {data_file})")
            continue
        named = png_text(path).get(KEY)
        if named != want:
            problems.append(f"{folder.name}/{name}: drawn from "
                            f"{'unnamed data' if named is None else named}, not the "
                            f"committed {data_file} ({want}); redraw it")
    return problems
