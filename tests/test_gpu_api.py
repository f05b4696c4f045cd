"""The fakes that stand in for CuPy and PyTorch offer only API the real libraries have.

The record (tests/data/gpu_api.json) was read off real CuPy and PyTorch by tests/gpu_api.py;
the first two tests hold the fakes to it on every machine, the last two check the record
against the CuPy or PyTorch installed here, when there is one (neither needs a GPU to import).
"""

from __future__ import annotations

import json

import pytest
from fake_gpu import FakeCupy, FakeTorch
from gpu_api import RECORD, describe, parameters, public_paths

RECORDED = json.loads(RECORD.read_text())


def _mismatches(fake: object, library: str) -> list[str]:
    api = RECORDED[library]["api"]
    version = RECORDED[library]["version"]
    problems = []
    for path, value in public_paths(fake):
        real = api.get(path)
        if real is None:
            problems.append(f"{path}: not in the record (run python tests/gpu_api.py)")
        elif not real["exists"]:
            problems.append(f"{path}: {library} {version} has no such name")
        else:
            ours, theirs = parameters(value), real["parameters"]
            if ours is not None and theirs is not None and theirs[:len(ours)] != ours:
                problems.append(f"{path}: the fake takes {ours}, {library} {version} takes "
                                f"{theirs}")
    return problems


@pytest.mark.parametrize("fake, library", [(FakeCupy(), "cupy"), (FakeTorch(), "torch")],
                         ids=["cupy", "torch"])
def test_every_name_a_fake_offers_exists_in_the_real_library(fake, library) -> None:
    assert _mismatches(fake, library) == []


def test_a_fake_with_an_invented_name_or_parameter_is_caught() -> None:
    fake = FakeCupy()
    fake.cuda.runtime.errorMemoryAllocation = 2        # what the first fake had: no such name
    fake.cuda.runtime.malloc = lambda n: 0              # CuPy calls it "size"
    problems = _mismatches(fake, "cupy")
    assert any("errorMemoryAllocation" in p for p in problems)
    assert any(p.startswith("cuda.runtime.malloc:") and "['n']" in p for p in problems)


@pytest.mark.parametrize("library", ["cupy", "torch"])
def test_the_record_matches_the_library_installed_here(library) -> None:
    module = pytest.importorskip(library)
    recorded = RECORDED[library]
    if module.__version__ != recorded["version"]:
        pytest.skip(f"{library} {module.__version__} installed, record made from "
                    f"{recorded['version']}")
    assert describe(module, list(recorded["api"])) == recorded["api"]


def test_parameters_are_read_from_signatures_or_cython_docstrings() -> None:
    assert parameters(lambda size, device=None, *rest, **options: 0) == ["size", "device"]
    assert parameters(_doc_only("memset(intptr_t ptr, int value, size_t size)")) == [
        "ptr", "value", "size"]
    assert parameters(_doc_only("RawModule(str code=None, *, str path=None, "
                                "tuple options=())")) == ["code", "path", "options"]
    assert parameters(_doc_only("no signature here")) is None
    assert parameters(42) is None


def _doc_only(doc: str):
    """A callable whose signature cannot be read, only its docstring (as Cython's)."""
    class DocOnly:
        __doc__ = doc

        @property
        def __signature__(self):
            raise ValueError("no signature")

        def __call__(self):
            return None
    return DocOnly()
