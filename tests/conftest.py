"""Shared pytest setup: the helpers (policy_checks, fake_gpu) are imported from this folder;
the ``implementation`` fixture runs a test on both implementations."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["python", "native"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once on the Python models (``ALLOCSIM_NATIVE=0``) and once on the native
    core (skipped, saying why, where it is not built): one suite over both implementations,
    as CPython's test_heapq runs over py_heapq and c_heapq. Modules whose tests replay whole
    runs take it with ``pytestmark = pytest.mark.usefixtures("implementation")``."""
    from allocsim.sim.kernel.native import core
    from allocsim.sim.kernel.native import implementation as which

    if request.param == "native":
        monkeypatch.setenv("ALLOCSIM_NATIVE", "1")
        if core() is None:
            pytest.skip(f"the native core is not in use here: {which()}")
    else:
        monkeypatch.setenv("ALLOCSIM_NATIVE", "0")
    return str(request.param)
