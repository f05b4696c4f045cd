"""When nothing fits, the next step (issue 37, item 7).

What is held here: when a trace's peak live is over the card's memory (its capacity less the
device's own share), compare, tune and min-capacity (with a card named) say so, list the
largest holders at the peak and one line each for a smaller batch, remat and bf16, with how
each is estimated; the estimates follow from the recording by the stated arithmetic; tune
ends with status 1 (a finding), not an input error.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from allocsim.sim.cli.main import main
from allocsim.sim.kernel.device import resolve_device
from allocsim.traces.model import Trace

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO / "sim" / "output" / "schemas"


def training(steps: int = 3) -> Trace:
    """A 40 MiB parameter block kept throughout (never freed), 8 MiB optimizer state, and per
    step two 16 MiB activations of two layers that come and go: peak live 40 + 8 + 32 = 80 MiB."""
    events: list[tuple[int, str, int, int | None, str]] = [(0, "alloc", 1, 40 * MiB, "weights"),
                                                    (1, "alloc", 2, 8 * MiB, "optimizer/state")]
    t, ident = 10, 10
    for _ in range(steps):
        acts = []
        for layer in (1, 2):
            events.append((t, "alloc", ident, 16 * MiB, f"forward/layer{layer}/act"))
            acts.append(ident)
            ident += 1
            t += 1
        for a in acts:
            events.append((t, "free", a, None, ""))
            t += 1
    columns = [(time, op, i, size) for time, op, i, size, _ in events]
    trace = Trace.from_events(columns, name="training")
    names = sorted({tag for *_, tag in events if tag})
    trace.tags = names
    trace.tag[:] = [names.index(tag) if tag else -1 for *_, tag in events]
    return trace


def test_the_estimates_follow_from_the_recording() -> None:
    from allocsim.sim.output.next_step import does_not_fit, next_step
    trace = training()
    assert trace.peak_live()[0] == 80 * MiB
    device = resolve_device(None, "64MiB", None)
    assert does_not_fit(trace, device)
    step = next_step(trace, device)
    assert step.over == 16 * MiB
    assert [k for k, _ in step.holders] == ["weights", "forward/act", "optimizer/state"]
    assert step.stays == 48 * MiB and step.scales == 32 * MiB
    by = {e.what: e for e in step.estimates}
    assert "0.50× today's batch" in by["batch"].line          # (64 − 48) / 32
    assert by["remat"].peak_live == 48 * MiB + 16 * MiB       # stays + the largest layer's
    assert by["bf16"].peak_live == 40 * MiB
    assert "assumes the recording is f32" in by["bf16"].line
    assert "assumed from lifetimes and tags" in "\n".join(step.lines())


def test_the_context_counts_against_the_card() -> None:
    from allocsim.sim.output.next_step import does_not_fit
    trace = training()
    roomy = resolve_device(None, "96MiB", None)
    assert not does_not_fit(trace, roomy)
    from dataclasses import replace
    assert does_not_fit(trace, replace(roomy, context_bytes=32 * MiB))


def test_tune_says_what_holds_the_peak_and_ends_with_status_1(capsys) -> None:
    assert main(["tune", "default", "--framework", "pytorch", "--capacity", "1GiB"]) == 1
    out = capsys.readouterr().out
    assert "nothing fits: peak live 1.53GiB is more than the card's 1.00GiB" in out
    assert "largest holders at the peak" in out and "optimizer/state" in out
    for what in ("smaller batch:", "remat", "bf16"):
        assert what in out
    assert main(["tune", "default", "--framework", "pytorch", "--capacity", "1GiB",
                 "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    jsonschema.validate(data, json.loads((SCHEMAS / "tune.schema.json").read_text()))
    assert data["next_step"]["over"] > 0


def test_compare_adds_the_next_step_after_its_verdict(capsys) -> None:
    assert main(["compare", "default", "--capacity", "1GiB"]) == 0
    out = capsys.readouterr().out
    assert out.index("winner: none") < out.index("nothing fits") < out.index("bf16")
    assert main(["compare", "default", "--capacity", "1GiB", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    jsonschema.validate(data, json.loads((SCHEMAS / "compare.schema.json").read_text()))
    assert data["next_step"]["holders"][0]["kind"] == "optimizer/state"
    assert main(["compare", "default", "--capacity", "4GiB", "--json"]) == 0
    assert "next_step" not in json.loads(capsys.readouterr().out)


def test_min_capacity_on_a_named_card_that_is_too_small(capsys) -> None:
    argv = ["min-capacity", "default", "--policies", "pytorch", "--device", "t4-16g",
            "--context", "14GiB"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "on t4-16g, nothing fits" in out and "smaller batch" in out
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    jsonschema.validate(data, json.loads((SCHEMAS / "min-capacity.schema.json").read_text()))
    assert data["next_step"]["memory"] == 1 << 30


def test_the_user_guide_shows_what_nothing_fits_prints(capsys, monkeypatch) -> None:
    """The guide's example is real output: rerun, it prints the same."""
    import re
    command = "allocsim tune default --framework pytorch --capacity 1GiB"
    guide = (REPO / "docs" / "user-guide.md").read_text()
    block = re.search(r"\$ " + re.escape(command) + r"\n(.*?)\n```", guide, flags=re.S)
    assert block, command
    monkeypatch.chdir(REPO)
    assert main(command.split()[1:]) == 1
    assert capsys.readouterr().out.rstrip() == block.group(1).rstrip()
