"""A record of the real CuPy and PyTorch API that the validator's fakes stand in for.

The validator's GPU backends are tested on this machine against fakes (tests/fake_gpu.py). A
fake that offers a name the real library lacks lets a bug through unseen — CuPy's runtime module
has no ``errorMemoryAllocation``, and the first fake had one. So every public name a fake
offers is looked up in the real library, with its parameter names, and the answers are kept in
tests/data/gpu_api.json; tests/test_gpu_api.py holds the fakes to that record in every run
(no GPU, CuPy or PyTorch needed) and checks the record against whatever CuPy or PyTorch is
installed.

Regenerate the record where the libraries import (CuPy imports without a GPU; PyTorch's CPU
build has the ``torch.cuda`` functions)::

    python tests/gpu_api.py            # writes tests/data/gpu_api.json
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RECORD = Path(__file__).parent / "data" / "gpu_api.json"
MISSING = object()


def public_paths(obj: Any, prefix: str = "", depth: int = 4) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every public name reachable from a fake: the attributes of
    namespaces, and the names a class defines itself (not inherited ones, not dunders)."""
    if isinstance(obj, types.SimpleNamespace):
        names = dict(vars(obj))
    elif inspect.isclass(obj):
        names = {n: v for n, v in vars(obj).items() if not n.startswith("_")}
    else:   # an instance of a fake class: its class's names and its own attributes
        names = {n: v for n, v in vars(type(obj)).items() if not n.startswith("_")}
        names.update({n: v for n, v in getattr(obj, "__dict__", {}).items()
                      if not n.startswith("_")})
    test_only = getattr(obj, "_test_only", ())
    for name, value in sorted(names.items()):
        if name.startswith("_") or name in test_only:
            continue
        path = f"{prefix}{name}"
        yield path, value
        is_container = isinstance(value, types.SimpleNamespace) or (
            not callable(value) and hasattr(value, "__dict__")) or inspect.isclass(value)
        if depth > 1 and is_container and not _is_exception(value):
            yield from public_paths(value, path + ".", depth - 1)


def _is_exception(value: Any) -> bool:
    return inspect.isclass(value) and issubclass(value, BaseException)


def parameters(obj: Any) -> list[str] | None:
    """The parameter names of a callable (``self`` and ``*args``/``**kwargs`` left out), from
    its signature or, for a Cython function, from the first line of its docstring; None when
    it is not a callable or none can be read."""
    if not callable(obj) or _is_exception(obj):
        return None
    target = obj
    if inspect.isclass(obj):
        init_doc = (getattr(obj.__init__, "__doc__", None) or "").strip()
        target = obj.__init__ if init_doc.startswith(f"{obj.__name__}.__init__(") else obj
    try:
        signature = inspect.signature(target)
        return [p.name for p in signature.parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):
        pass
    first_line = (getattr(target, "__doc__", None) or "").strip().splitlines()[:1]
    match = re.match(r"[\w.]*\((.*)\)", first_line[0]) if first_line else None
    if match is None:
        return None
    names = []
    for part in match.group(1).split(","):
        part = part.split("=")[0].strip()
        if not part or part in ("*", "self") or part.startswith("*"):
            continue
        names.append(part.split()[-1])      # "size_t size" -> "size"
    return names


def lookup(root: Any, path: str) -> Any:
    value = root
    for name in path.split("."):
        value = getattr(value, name, MISSING)
        if value is MISSING:
            return MISSING
    return value


def describe(root: Any, paths: list[str]) -> dict[str, Any]:
    """What the real library ``root`` has at each path: absent, or present with its
    parameter names (None for a value or an exception class)."""
    out: dict[str, Any] = {}
    for path in paths:
        value = lookup(root, path)
        out[path] = {"exists": False} if value is MISSING else {
            "exists": True, "parameters": parameters(value)}
    return out


def fake_paths() -> dict[str, list[str]]:
    """The public paths of each fake library."""
    from fake_gpu import FakeCupy, FakeTorch
    return {"cupy": [p for p, _ in public_paths(FakeCupy())],
            "torch": [p for p, _ in public_paths(FakeTorch())]}


def build_record() -> dict[str, Any]:
    """The record for the libraries installed here (a library that does not import is left
    out with the reason)."""
    record: dict[str, Any] = {}
    for library, paths in fake_paths().items():
        try:
            module = __import__(library)
        except Exception as err:
            record[library] = {"unavailable": f"{type(err).__name__}: {err}"}
            continue
        record[library] = {"version": module.__version__, "api": describe(module, paths)}
    return record


def main() -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    sys.path.insert(0, str(Path(__file__).parent.parent))
    old = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    record = build_record()
    for library, entry in record.items():
        if "unavailable" in entry and library in old:
            print(f"{library}: not importable here, its old record kept ({entry['unavailable']})")
            record[library] = old[library]
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    for library, entry in record.items():
        print(f"{library} {entry.get('version', '?')}: {len(entry.get('api', {}))} names "
              f"-> {RECORD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
