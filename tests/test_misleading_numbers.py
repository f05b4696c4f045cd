"""A number allocsim prints is exact or refused: live bytes past a 64-bit count, a device
profile whose own share leaves the allocators nothing, a negative limit read off a trace
(issue 36, items 13, 14 and 18)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from one_line import refused

from allocsim.sim.cli.main import main
from allocsim.traces import formats
from allocsim.traces.model import Trace, TraceError
from allocsim.traces.validate import first_live_overflow, validate

EiB = 1 << 60


# -- 13. live bytes past int64 -------------------------------------------------------------

def four_buffers_of_2_61_bytes() -> Trace:
    return Trace.from_events([(i, "alloc", i, 2 * EiB) for i in range(4)]
                             + [(9, "free", 0, 2 * EiB)])


def test_four_live_2_61_byte_buffers_are_refused_at_the_event_that_passes_int64() -> None:
    trace = four_buffers_of_2_61_bytes()
    assert first_live_overflow(trace) == (3, 8 * EiB)
    with pytest.raises(TraceError) as err:
        validate(trace, source="big.csv")
    assert str(err.value).startswith("big.csv: event 3: the live bytes reach "
                                     "9,223,372,036,854,775,808")


def test_three_of_them_are_exact() -> None:
    trace = Trace.from_events([(i, "alloc", i, 2 * EiB) for i in range(3)])
    assert first_live_overflow(trace) is None
    assert validate(trace)[0] is trace


def test_frees_in_between_keep_the_live_bytes_in_range() -> None:
    events = []
    for i in range(8):     # 8 allocations of 2 EiB, never more than two live
        events += [(2 * i, "alloc", i, 2 * EiB)]
        if i:
            events += [(2 * i + 1, "free", i - 1, None)]
    assert first_live_overflow(Trace.from_events(events)) is None


@pytest.mark.parametrize("command", [["info"], ["compare"], ["min-capacity"],
                                     ["tune", "--framework", "pytorch"]])
def test_every_command_refuses_such_a_trace_naming_file_and_event(capsys, tmp_path: Path,
                                                                  command):
    path = tmp_path / "big.csv"
    formats.save(four_buffers_of_2_61_bytes(), path)
    name, *rest = command
    line = refused(capsys, name, path, *rest)
    assert f"{path}: event 3: the live bytes reach" in line, line


# -- 14. a device profile's share is held to --context's rule ------------------------------

@pytest.mark.parametrize("context", [1 << 30, (1 << 30) + 1, 1 << 64])
def test_a_profile_whose_context_is_not_below_its_capacity_is_refused(capsys, tmp_path: Path,
                                                                      context: int):
    trace = tmp_path / "t.csv"
    trace.write_text("time_ns,op,id,size\n0,alloc,1,64\n1,free,1,64\n")
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"name": "x", "capacity": 1 << 30, "context_bytes": context}))
    rule = "is no less than the device's 1.00GiB: nothing is left for the allocators"
    line = refused(capsys, "compare", trace, "--device-profile", profile)
    assert "field 'context_bytes'" in line and rule in line, line
    line = refused(capsys, "compare", trace, "--capacity", "1GiB", "--context", str(context))
    assert "--context" in line and rule in line, line


def test_a_profile_whose_context_leaves_something_runs(capsys, tmp_path: Path):
    trace = tmp_path / "t.csv"
    trace.write_text("time_ns,op,id,size\n0,alloc,1,64\n1,free,1,64\n")
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"name": "x", "capacity": 1 << 30,
                                   "context_bytes": (1 << 30) - (64 << 20)}))
    assert main(["compare", str(trace), "--device-profile", str(profile)]) == 0


def test_a_run_that_held_nothing_shows_no_utilization(capsys, tmp_path: Path):
    # A 2**63-1 byte request is refused at once: 0 B reserved, 0 B allocated. The table said
    # "util 100.0%, frag 0.0%" of nothing, as if the fit were perfect.
    path = tmp_path / "huge.csv"
    path.write_text(f"time_ns,op,id,size\n0,alloc,1,{(1 << 63) - 1}\n10,free,1,\n")
    assert main(["compare", str(path), "--policies", "cupy", "bfc"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith(("cupy ", "bfc "))]
    assert len(rows) == 2
    for row in rows:
        assert row[1:7] == ["NO", "0B", "0B", "-", "-", "1"], row
    assert "100.0%" not in " ".join(" ".join(r) for r in rows)
