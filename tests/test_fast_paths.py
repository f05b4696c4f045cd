"""The replay's fast paths give the results the plain code gave (issue 17, "Speed").

tests/data/fast_paths.json holds, for every policy (and the settings that pick another hot
path) on every bundled trace and on each generator at small sizes with a few seeds, on a roomy
and a tight device, the SHA-256 of ``replay(...).to_json_dict(timeline=True)`` recorded before
the speed work by tests/make_fast_path_refs.py. A case whose input trace changed (a generator
edited since) is reported as such rather than blamed on the policy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import make_fast_path_refs as refs

# Every test here runs on both implementations (tests/conftest.py's `implementation`).
pytestmark = pytest.mark.usefixtures("implementation")

REFERENCES: dict[str, dict[str, str]] = json.loads(refs.REFS.read_text())
TRACES = dict(refs.traces())


def test_the_references_cover_every_case() -> None:
    expected = {refs.case_key(label, policy, device, capacity)
                for label in TRACES for policy in refs.POLICIES
                for device, capacity in refs.DEVICES}
    assert expected == set(REFERENCES)


@pytest.mark.parametrize("label", sorted(TRACES))
def test_replay_matches_the_recorded_results(label: str) -> None:
    trace = TRACES[label]
    digest = refs.trace_digest(trace)
    differ = []
    for policy in refs.POLICIES:
        for device, capacity in refs.DEVICES:
            expected = REFERENCES[refs.case_key(label, policy, device, capacity)]
            if expected["trace"] != digest:
                pytest.skip(f"{label}: the input trace changed since the references were "
                            "recorded (a generator was edited); the policies are not judged")
            if refs.result_digest(trace, policy, device, capacity) != expected["result"]:
                differ.append(f"{policy} on {device}:{capacity or ''}")
    assert not differ, f"{label}: results changed for {differ}"
