"""The seeds' TPU claims, judged on what one v5e chip recorded (tests/data/tpu/).

    python -m experiments.tpu.findings            # rewrite findings.json and README.md's tables
    python -m experiments.tpu.findings --check    # recompute; exit 1 if either differs

Every number and verdict word below is computed here from the chip's records (JAX 0.10.2,
libtpu 0.0.42.1; recorded by experiments/tpu/chip_probe.py through run_on_chip.sh and
findings_on_chip.sh):

- **Preallocation**: ``memory_stats()`` before any array, after a 1 MiB array and after a
  1 GiB one, in a fresh process for each of JAX's GPU memory settings (prealloc-*.json).
- **Scratch, not temp**: for each compiled step (exec-*.json), XLA's ``memory_analysis()``
  temp against the runtime's ``peak_bytes_reserved`` after the first run, and what the run
  added to ``bytes_in_use`` against generated code + outputs − aliased.
- **Donation and remat**: the same steps with and without ``donate_argnums`` and with
  ``jax.checkpoint`` — bytes in use and scratch on the chip, at two model sizes.

The population is stated with each finding: these are the steps and settings the chip ran,
not a sample of programs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from allocsim.atomic_files import write_text
from experiments.runner.marked import with_between

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "tests" / "data" / "tpu"
RESULTS = HERE / "findings.json"
README = HERE / "README.md"
START, END = "<!-- findings:start -->", "<!-- findings:end -->"
RUNTIME_BYTES = 26_624
STEPS = ["exec-matmul", "exec-gpt-small-donate", "exec-gpt-small-nodonate",
         "exec-gpt-small-remat", "exec-gpt-125m-donate", "exec-gpt-125m-nodonate",
         "exec-gpt-125m-remat"]
SETTINGS = ["default", "preallocate-true-fraction-0.5", "preallocate-false",
            "allocator-platform"]
MB = 1e6


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return data


def preallocation() -> dict[str, Any]:
    rows = []
    for setting in SETTINGS:
        record = _load(f"prealloc-{setting}")
        before, first, big = (record[k] for k in ("before", "after_first_array", "after_1gib"))
        rows.append({
            "setting": setting, "env": record["env"],
            "reserved_after_first": first["bytes_reserved"],
            "limit": first["bytes_limit"],
            "in_use_after_first": first["bytes_in_use"],
            "in_use_is_runtime_plus_array": first["bytes_in_use"] == RUNTIME_BYTES + (1 << 20),
            "grew_by_1gib_exactly": big["bytes_in_use"] - first["bytes_in_use"] == 1 << 30,
            "before_in_use": before["bytes_in_use"]})
    none = all(r["reserved_after_first"] == 0 and r["in_use_is_runtime_plus_array"]
               and r["grew_by_1gib_exactly"] for r in rows)
    same_limit = len({r["limit"] for r in rows}) == 1
    return {"rows": rows, "preallocates": not none, "settings_change_limit": not same_limit}


def steps() -> dict[str, Any]:
    rows = []
    for name in STEPS:
        record = _load(name)
        analysis, stages = record["memory_analysis"], record["stages"]
        ran, placed = stages["ran"], stages["args_placed"]
        temp = analysis["temp_size_in_bytes"]
        scratch = ran["peak_bytes_reserved"]
        added = ran["bytes_in_use"] - placed["bytes_in_use"]
        expected = (analysis["generated_code_size_in_bytes"] + analysis["output_size_in_bytes"]
                    - analysis["alias_size_in_bytes"])
        rows.append({
            "step": name.removeprefix("exec-"), "config": record["config"],
            "argument": analysis["argument_size_in_bytes"],
            "output": analysis["output_size_in_bytes"], "alias": analysis["alias_size_in_bytes"],
            "code": analysis["generated_code_size_in_bytes"], "temp": temp,
            "scratch_reserved": scratch,
            "scratch_over_temp": round(scratch / temp, 4) if temp else None,
            "run_added_in_use": added, "code_plus_new_outputs": expected,
            "in_use_peak": ran["peak_bytes_in_use"]})
    with_temp = [r for r in rows if r["temp"]]
    scratch_below_temp = all(0 < r["scratch_reserved"] < r["temp"] for r in with_temp)
    off = [abs(r["run_added_in_use"] - r["code_plus_new_outputs"]) for r in rows]
    by = {r["step"]: r for r in rows}
    effects = []
    for size in ("small", "125m"):
        donate, plain, remat = (by[f"gpt-{size}-{k}"] for k in ("donate", "nodonate", "remat"))
        effects.append({
            "size": size,
            "donation_in_use_saved": plain["in_use_peak"] - donate["in_use_peak"],
            "donation_scratch_change": donate["scratch_reserved"] - plain["scratch_reserved"],
            "remat_scratch_saved": donate["scratch_reserved"] - remat["scratch_reserved"],
            "remat_code_change": remat["code"] - donate["code"]})
    return {"rows": rows, "scratch_below_temp": scratch_below_temp,
            "scratch_over_temp_range": [min(r["scratch_over_temp"] for r in with_temp),
                                        max(r["scratch_over_temp"] for r in with_temp)],
            "in_use_off_by_at_most": max(off), "effects": effects,
            "donation_always_saves": all(e["donation_in_use_saved"] > 0 for e in effects),
            "remat_always_saves_scratch": all(e["remat_scratch_saved"] > 0 for e in effects)}


def compute() -> dict[str, Any]:
    env = json.loads((DATA / "env.json").read_text())
    return {"chip": env["device_kind"], "jax": env["jax"], "libtpu": env["libtpu"],
            "preallocation": preallocation(), "steps": steps(),
            "not_measured": ["TensorFlow on a TPU (no TensorFlow on the lent chip)",
                             "XLA:GPU's plan of the same steps (needs the jax-gpu extra; "
                             "experiments/compilation has GPU plans of other steps)"]}


def _mb(n: int) -> str:
    return f"{n / MB:,.1f}"


def markdown(found: dict[str, Any]) -> str:
    pre, st = found["preallocation"], found["steps"]
    lines = [f"_Generated by `python -m experiments.tpu.findings` from the chip's records "
             f"({found['chip']}, JAX {found['jax']}, libtpu {found['libtpu']}); do not edit "
             "between the markers._", "",
             "**Preallocation** (population: JAX's four GPU memory settings, each in a fresh "
             "process on the chip):", "",
             "| setting | bytes_reserved after the first array | bytes_in_use = runtime + "
             "array | +1 GiB array = +1 GiB in use | bytes_limit |",
             "|---|---|---|---|---|"]
    for r in pre["rows"]:
        env = " ".join(f"{k}={v}" for k, v in r["env"].items()) or "(none set)"
        lines.append(f"| {r['setting']} (`{env}`) | {r['reserved_after_first']:,} | "
                     f"{'yes' if r['in_use_is_runtime_plus_array'] else 'no'} | "
                     f"{'yes' if r['grew_by_1gib_exactly'] else 'no'} | {r['limit']:,} |")
    verdict = ("does not preallocate under any of them" if not pre["preallocates"]
               else "preallocates under at least one")
    limit = ("and none changes bytes_limit" if not pre["settings_change_limit"]
             else "and some change bytes_limit")
    lines += ["", f"Verdict: the TPU runtime {verdict}, {limit}.", "",
              "**Scratch, donation, remat** (population: the seven compiled steps the chip "
              "ran, one process each; MB = 10^6 B):", "",
              "| step | arguments | outputs − aliased | code | temp (XLA) | scratch reserved "
              "(chip) | scratch/temp | run added to in use | code + new outputs |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in st["rows"]:
        ratio = "-" if r["scratch_over_temp"] is None else f"{r['scratch_over_temp']:.3f}"
        lines.append(f"| {r['step']} | {_mb(r['argument'])} | {_mb(r['output'] - r['alias'])} "
                     f"| {_mb(r['code'])} | {_mb(r['temp'])} | {_mb(r['scratch_reserved'])} | "
                     f"{ratio} | {_mb(r['run_added_in_use'])} | "
                     f"{_mb(r['code_plus_new_outputs'])} |")
    low, high = st["scratch_over_temp_range"]
    lines += ["", f"- XLA's temp is not allocated on a TPU: the runtime holds it as "
              f"`bytes_reserved`, {'below' if st['scratch_below_temp'] else 'not always below'} "
              f"the temp on every step that has one ({low:.3f}–{high:.3f} of it). What a run "
              f"adds to bytes in use is the generated code plus the outputs no donated argument "
              f"aliases, to within {st['in_use_off_by_at_most']:,} B on every step."]
    for e in st["effects"]:
        lines.append(f"- GPT {e['size']}: donation saves {_mb(e['donation_in_use_saved'])} MB "
                     f"of bytes in use (scratch {e['donation_scratch_change'] / MB:+,.1f} MB); "
                     f"remat saves {_mb(e['remat_scratch_saved'])} MB of scratch (code "
                     f"{e['remat_code_change'] / MB:+,.1f} MB).")
    donation = "both sizes" if st["donation_always_saves"] else "not every size"
    remat = "both sizes" if st["remat_always_saves_scratch"] else "not every size"
    lines += [f"- Donation saves bytes in use at {donation}; remat saves scratch at {remat}.",
              "", "Not measured: " + "; ".join(found["not_measured"]) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="recompute and compare with findings.json and README.md")
    args = parser.parse_args(argv)
    found = compute()
    text = json.dumps(found, indent=1) + "\n"
    readme = with_between(README.read_text(), START, END, markdown(found).removesuffix("\n"),
                          "## Findings")
    if args.check:
        same = RESULTS.read_text() == text and README.read_text() == readme
        print("findings agree with the chip's records" if same else
              "findings.json or README.md differ from what the records give: rerun "
              "python -m experiments.tpu.findings")
        return 0 if same else 1
    write_text(RESULTS, text)
    write_text(README, readme)
    print(f"wrote {RESULTS} and {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
