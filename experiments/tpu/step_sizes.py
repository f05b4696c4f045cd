"""jit, donation and remat on the chip, at four model sizes (issue 40's first broken finding).

    python -m experiments.tpu.step_sizes            # rewrite step-sizes.json and README.md's table
    python -m experiments.tpu.step_sizes --check    # recompute; exit 1 if either differs

Reads what experiments/tpu/step_sizes_on_chip.sh recorded (tests/data/tpu/steps/): the GPT
step of experiments/gpt_step.py at four sizes (``small``, the reviewer's ``mid`` block, 125M,
350M; batch 8 x 512 tokens, f32, SGD with momentum), each in four forms, each form in a
process of its own: op by op (``eager``), ``jit``, ``jit`` with the state donated, and that with
every block rematerialised. For each it takes the chip's ``memory_stats()`` after two steps and
replays the runtime's own records through the ``tpu`` model.

What a form needs of HBM on a TPU is its peak in use **plus** its scratch: XLA's temp is not
allocated there but held as ``bytes_reserved`` while the program is loaded (findings.py), so
the footprint compared below is ``peak_bytes_in_use + peak_bytes_reserved`` less the runtime's
own 26,624 B. Every verdict word is computed here; the population is these 16 runs on one v5e
chip (JAX 0.10.2, libtpu 0.0.42.1), not a sample of programs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from allocsim.atomic_files import write_text
from allocsim.sim.questions.fidelity.tpu import tpu_fidelity
from allocsim.traces import formats
from experiments.runner.marked import with_between

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "tests" / "data" / "tpu" / "steps"
RESULTS = HERE / "step-sizes.json"
README = HERE / "README.md"
START, END = "<!-- step-sizes:start -->", "<!-- step-sizes:end -->"
RUNTIME_BYTES = 26_624
SIZES = ("small", "mid", "125m", "350m")
FORMS = ("eager", "jit", "jit-donate", "jit-remat-donate")
MB = 1e6


def _run(name: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    last = record["stages"].get("step2")
    trace = formats.load(DATA / f"{name}.npz")
    report = tpu_fidelity(trace)
    row: dict[str, Any] = {
        "run": name, "size": record["size"], "form": record["form"], "dims": record["dims"],
        "vocab": record["vocab"], "versions": record["versions"],
        "placed": record["stages"]["placed"]["bytes_in_use"] - RUNTIME_BYTES,
        "records": report.total, "records_matched": report.matched,
        "first_divergence": report.first_divergence}
    if last is None:   # the form did not complete: the runtime's message, verbatim
        error = record.get("error", "")
        row["oom"] = next((line.strip() for line in error.splitlines()
                           if "Attempting to allocate" in line), error.strip()[-300:])
        return row
    in_use = last["peak_bytes_in_use"] - RUNTIME_BYTES
    scratch = last["peak_bytes_reserved"]
    row.update(peak_in_use=in_use, scratch=scratch, footprint=in_use + scratch,
               step_s=record["step_s"][-1])
    if "memory_analysis" in record:
        analysis = record["memory_analysis"]
        row.update(temp=analysis["temp_size_in_bytes"],
                   code=analysis["generated_code_size_in_bytes"])
    return row


def _share() -> dict[str, Any]:
    holder = json.loads((DATA / "share-holder.json").read_text())
    second = json.loads((DATA / "share-second.json").read_text())
    return {"holder_ran": "error" not in holder, "second_refused": "error" in second,
            "second_error": second.get("error", "")}


def compute() -> dict[str, Any]:
    rows = [_run(f"{size}-{form}") for size in SIZES for form in FORMS]
    by = {(r["size"], r["form"]): r for r in rows}
    per_size = []
    for size in SIZES:
        eager, jit, donate, remat = (by[(size, form)] for form in FORMS)
        per_size.append({
            "size": size,
            "eager_oom": "oom" in eager,
            # jit's footprint over op by op's (op by op that ran out of HBM: below 1 by
            # construction, the chip's limit standing in for its need)
            "jit_over_eager": None if "oom" in eager
            else round(jit["footprint"] / eager["footprint"], 4),
            "donation_in_use_change": donate["peak_in_use"] - jit["peak_in_use"],
            "donation_scratch_change": donate["scratch"] - jit["scratch"],
            "donation_footprint_change": donate["footprint"] - jit["footprint"],
            "remat_footprint_change": remat["footprint"] - donate["footprint"],
            "remat_scratch_change": remat["scratch"] - donate["scratch"]})
    complete = [r for r in rows if "oom" not in r]
    return {
        "population": "the GPT step of experiments/gpt_step.py at 4 sizes x 4 forms, one "
                      "process each, on one TPU v5e chip",
        "versions": rows[0]["versions"], "rows": rows, "per_size": per_size,
        "jit_below_eager_everywhere": all(s["eager_oom"] or s["jit_over_eager"] < 1
                                          for s in per_size),
        "donation_lowers_in_use_everywhere": all(s["donation_in_use_change"] < 0
                                                 for s in per_size),
        "donation_raises_scratch_everywhere": all(s["donation_scratch_change"] > 0
                                                  for s in per_size),
        "donation_lowers_footprint_everywhere": all(s["donation_footprint_change"] < 0
                                                    for s in per_size),
        "remat_lowers_footprint_everywhere": all(s["remat_footprint_change"] < 0
                                                 for s in per_size),
        "model_places_every_complete_run": all(r["records_matched"] == r["records"]
                                               for r in complete),
        "complete_runs": len(complete), "share": _share()}


def _mb(n: int | None) -> str:
    return "—" if n is None else f"{n / MB:,.1f}"


def _word(flag: bool, yes: str, no: str) -> str:
    return yes if flag else no


def markdown(found: dict[str, Any]) -> str:
    lines = ["",
             "| size | form | peak in use (MB) | scratch (MB) | footprint (MB) | "
             "tpu model: records placed |", "|---|---|---:|---:|---:|---|"]
    for row in found["rows"]:
        placed = f"{row['records_matched']:,}/{row['records']:,}"
        if "oom" in row:
            lines.append(f"| {row['size']} | {row['form']} | out of HBM: {row['oom']} | | | "
                         f"{placed} |")
            continue
        lines.append(f"| {row['size']} | {row['form']} | {_mb(row['peak_in_use'])} | "
                     f"{_mb(row['scratch'])} | {_mb(row['footprint'])} | {placed} |")
    sizes = found["per_size"]
    ratios = [s["jit_over_eager"] for s in sizes if s["jit_over_eager"] is not None]
    ooms = [s["size"] for s in sizes if s["eager_oom"]]
    lines += [
        "",
        f"Population: {found['population']} (jax {found['versions']['jax']}, libtpu "
        f"{found['versions']['libtpu']}). Footprint = peak in use + scratch (both less the "
        "runtime's 26,624 B).",
        "",
        "- **jit against op by op**: jit "
        + _word(found["jit_below_eager_everywhere"], "needs less at every size",
                "does not need less at every size")
        + f" (footprint {min(ratios):.2f}–{max(ratios):.2f}× op by op's"
        + (f"; op by op ran out of HBM at {', '.join(ooms)}" if ooms else "") + "). "
        "The CPU recording behind \"jit alone raises the smallest device\" does not carry "
        "to a TPU at any of these sizes.",
        "- **donation**: "
        + _word(found["donation_lowers_in_use_everywhere"], "lowers peak in use at every size",
                "does not lower peak in use at every size") + ", "
        + _word(found["donation_raises_scratch_everywhere"], "raises scratch at every size",
                "does not raise scratch at every size") + ", and "
        + _word(found["donation_lowers_footprint_everywhere"],
                "lowers the footprint at every size", "does not lower the footprint at every "
                "size") + " ("
        + ", ".join(f"{s['size']} {_mb(s['donation_footprint_change'])} MB" for s in sizes)
        + ").",
        "- **remat** (with donation): "
        + _word(found["remat_lowers_footprint_everywhere"], "lowers the footprint at every size",
                "does not lower the footprint at every size") + " ("
        + ", ".join(f"{s['size']} {_mb(s['remat_footprint_change'])} MB" for s in sizes)
        + "); its scratch changes by "
        + ", ".join(f"{_mb(s['remat_scratch_change'])}" for s in sizes) + " MB.",
        "- **the tpu model** places "
        + _word(found["model_places_every_complete_run"], "every record", "not every record")
        + f" of the {found['complete_runs']} runs that completed. "
        + " ".join(f"{r['size']} {r['form']} (out of HBM): its records match up to record "
                  f"{r['first_divergence']['record']:,}, the first free after the request the "
                  "runtime refused; the runtime compacted before refusing (the model now does "
                  "too) but records no refused request, so the replay cannot know when."
                  for r in found["rows"] if "oom" in r and r["first_divergence"]),
        "- **two processes on one chip**: the second "
        + _word(found["share"]["second_refused"], "is refused", "is not refused")
        + f" while the first holds it (`{found['share']['second_error'][:110]}…`): on a TPU "
        "the sharing question of two jobs on one card does not arise.",
        ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    found = compute()
    results = json.dumps(found, indent=1, sort_keys=True) + "\n"
    readme = with_between(README.read_text(), START, END, markdown(found),
                          "## jit, donation and remat at four sizes, on the chip")
    if args.check:
        stale = [p.name for p, text in ((RESULTS, results), (README, readme))
                 if not p.exists() or p.read_text() != text]
        if stale:
            print(f"stale: {', '.join(stale)} (run python -m experiments.tpu.step_sizes)")
            return 1
        print("step-sizes.json and README.md agree with the chip's records")
        return 0
    write_text(RESULTS, results)
    write_text(README, readme)
    print(f"wrote {RESULTS.relative_to(HERE.parents[1])} and README.md's table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
