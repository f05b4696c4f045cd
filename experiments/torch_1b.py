"""The question at full size (docs/pytorch.md, "PyTorch jobs at full size, without a GPU"): does a
1.3B-parameter GPT training step fit on an RTX 4090 (24 GB), an A100 40 GB and an H100 80 GB,
what card does it need, and which setting to paste?

    python -m experiments.torch_1b -o DIR [--targets rtx4090-24g a100-40g h100-80g]
                                          [--precisions fp32 bf16]

For each precision (fp32; bf16 autocast, ``MIXED=bf16``) and target it records
``tests/torch_programs/gpt_adamw.py 2048 24 16 8 1024 32000`` (24 blocks of width 2048, 16
heads, a 32,000-way head, AdamW, two steps of batch 8 x 1024) with ``allocsim record
--framework pytorch --target TARGET`` (``DIR/PRECISION-TARGET.npz``), then asks, on the target's
own profile (its capacity and the memory its CUDA context holds): ``compare --policies
pytorch`` (fits under the defaults?), ``min-capacity --policies pytorch
pytorch:expandable_segments=true`` and ``tune --framework pytorch`` (the setting to paste).
Prints one markdown table (docs/pytorch.md's) and the seconds each step took; no GPU is used.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from allocsim.policies import format_size
from allocsim.sim.cli.main import main as allocsim

PROGRAM = Path(__file__).resolve().parents[1] / "tests" / "torch_programs" / "gpt_adamw.py"
SIZES = ["2048", "24", "16", "8", "1024", "32000"]
PRECISIONS = {"fp32": {}, "bf16 autocast": {"MIXED": "bf16"}}  # the table's name: environment
EXPANDABLE = "pytorch:expandable_segments=true"


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = allocsim(list(argv))
    return status, out.getvalue(), err.getvalue()


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def one(target: str, precision: str, out: Path, seconds: dict[str, float]) -> list[str]:
    """The table row for one target and precision."""
    trace = out / f"{precision.split()[0]}-{target}.npz"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "allocsim", "record", "--framework", "pytorch",
                    "--target", target, "-o", str(trace), "--", sys.executable, str(PROGRAM),
                    *SIZES], env={**os.environ, **PRECISIONS[precision]}, check=True,
                   stderr=subprocess.DEVNULL)
    seconds["record"] += time.perf_counter() - start
    start = time.perf_counter()
    status, text, err = _cli("compare", str(trace), "--policies", "pytorch", "--device", target,
                             "--json")
    assert status == 0, err
    run = json.loads(text)["results"][0]
    fits = (f"yes, {_gib(run['peak_reserved'])} reserved" if run["completed"]
            else f"no ({run['ooms']} OOMs)")
    seconds["compare"] += time.perf_counter() - start
    start = time.perf_counter()
    status, text, err = _cli("min-capacity", str(trace), "--policies", "pytorch", EXPANDABLE,
                             "--device", target, "--json")
    assert status == 0, err
    answers = {a["policy"]: a for a in json.loads(text)["answers"]}
    minimum = [_gib(answers[p]["min_capacity"]) + ("" if answers[p]["monotone"]
                                                   else " (not monotone)")
               for p in ("pytorch", EXPANDABLE)]
    seconds["min-capacity"] += time.perf_counter() - start
    start = time.perf_counter()
    status, text, err = _cli("tune", str(trace), "--framework", "pytorch", "--device", target,
                             "--json")
    if status == 0:
        answer = json.loads(text)["answer"]
        paste = "; ".join(f"`{line}`" for line in answer["paste"]) or "the defaults"
        tune = f"{paste} ({_gib(answer['setting']['peak_reserved'])} reserved)"
    elif status == 1 and text.strip():  # peak live over the card: no setting can fit
        step = json.loads(text)["next_step"]
        tune = (f"none fits: peak live {format_size(step['peak_live'])} is more than the "
                f"card's {format_size(step['memory'])}: no allocator setting fits")
    else:
        tune = "error: " + (err.strip().splitlines() or ["?"])[-1]
    seconds["tune"] += time.perf_counter() - start
    status, text, _ = _cli("info", str(trace), "--json")
    peak = format_size(int(json.loads(text)["peak_live"])) if status == 0 else "?"
    return [target, precision, peak.replace("GiB", " GiB"), fits, *minimum, tune]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", required=True, help="folder for the recordings")
    parser.add_argument("--targets", nargs="+", default=["rtx4090-24g", "a100-40g", "h100-80g"])
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"],
                        default=["fp32", "bf16"])
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seconds = dict.fromkeys(("record", "compare", "min-capacity", "tune"), 0.0)
    rows = [one(target, precision, out, seconds)
            for precision in PRECISIONS if precision.split()[0] in args.precisions
            for target in args.targets]
    print("| target (`--target`) | precision | recorded peak live | `pytorch` defaults: fits? "
          "| min capacity, defaults | min capacity, expandable segments | `tune`: paste |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("seconds (wall, all rows): " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
