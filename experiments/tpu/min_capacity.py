"""min-capacity's answer for a TPU step against the chip: does it run at the HBM allocsim says?

    python -m experiments.tpu.min_capacity            # rewrite README.md's table
    python -m experiments.tpu.min_capacity --check    # recompute; exit 1 if it differs

The predictions (experiments/tpu/min-capacity-predicted.json) are ``min-capacity --policies
tpu`` at 512 B resolution of the jitted GPT step (experiments/gpt_step.py; batch 8 × 512, the
state donated, two steps) compiled without a chip (``compile_for(target="tpu-v5e")``;
tests/test_xla_tpu_compile.py recomputes the small one). experiments/tpu/min_capacity_on_chip.sh
gave the step on the chip exactly each capacity around them (a ballast fills the rest of HBM,
experiments/tpu/min_capacity_probe.py; records in tests/data/tpu/min-capacity). Each verdict
word is computed here; the population is two steps (two model sizes) on one v5e chip.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from experiments.runner.marked import with_between

HERE = Path(__file__).parent
DATA = HERE.parents[1] / "tests" / "data" / "tpu" / "min-capacity"
PREDICTED = HERE / "min-capacity-predicted.json"
README = HERE / "README.md"
START, END = "<!-- min-capacity:start -->", "<!-- min-capacity:end -->"
HEADING = "## min-capacity's answer, run on the chip"


def compute() -> dict[str, Any]:
    """Per size: the answer, each capacity tried (its offset from the answer, the steps run,
    the refusal) and what they show."""
    predictions = json.loads(PREDICTED.read_text())["predictions"]
    found: dict[str, Any] = {}
    for size, predicted in predictions.items():
        answer = predicted["min_capacity"]
        tried = []
        for path in sorted(DATA.glob(f"{size}-*.json")):
            record = json.loads(path.read_text())
            tried.append({"capacity": record["capacity"], "offset": record["capacity"] - answer,
                          "ran_steps": record["ran_steps"], "steps": record["steps"],
                          "refusal": record.get("error", "")})
        tried.sort(key=lambda t: t["capacity"])
        ran = [t["capacity"] for t in tried if t["ran_steps"] == t["steps"]]
        refused = [t["capacity"] for t in tried if t["ran_steps"] < t["steps"]]
        chip_minimum_above = max((c for c in refused if not ran or c < min(ran)), default=None)
        found[size] = {"answer": answer, "first_prediction": predicted["first_prediction"],
                       "tried": tried,
                       "runs_at_answer": answer in ran,
                       "over_by_at_most": (answer - chip_minimum_above - 512
                                           if chip_minimum_above is not None else None),
                       "first_prediction_runs": predicted["first_prediction"] in ran}
    return found


def render(found: dict[str, Any]) -> str:
    lines = ["| step | capacity − answer | steps run | the runtime's refusal |",
             "|---|---:|---:|---|"]
    for size, f in found.items():
        for t in f["tried"]:
            lines.append(f"| GPT {size} | {t['offset']:+,} B | {t['ran_steps']}/{t['steps']} | "
                         f"{t['refusal'][:90] or '—'} |")
    lines.append("")
    for size, f in found.items():
        runs = "runs" if f["runs_at_answer"] else "**does not run**"
        over = ("" if f["over_by_at_most"] is None else
                f", at most {f['over_by_at_most']:,} B above the chip's own minimum")
        first = ("ran" if f["first_prediction_runs"] else
                 f"was refused ({f['first_prediction'] - f['answer']:+,} B from the answer)")
        lines.append(f"- GPT {size}: at allocsim's answer ({f['answer']:,} B) the step {runs} on "
                     f"the chip{over}; the earlier rule's answer {first}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = README.read_text()
    new = with_between(text, START, END, render(compute()), HEADING)
    if args.check:
        if new != text:
            print("experiments/tpu/README.md's min-capacity table differs from the records",
                  file=sys.stderr)
            return 1
        return 0
    from allocsim.atomic_files import write_text
    write_text(README, new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
