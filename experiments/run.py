"""Run an experiment: ``python -m experiments.run NAME`` (or ``--all``; ``--check`` only holds
the READMEs to their results.json, running nothing; ``--verify`` regenerates each in a
temporary folder and diffs it against the committed results.json and README.md: the
command that shows the committed results are what a clean clone produces; it also holds each
population.json to its population.toml, experiments/preallocate_vs_grow/verify.py, and
experiments/README.md's numbers and verdict words to the data, experiments/runner/summary.py;
``--check`` does the cheap part of both: README sections against their JSON, the summary,
each figure against the digest of the JSON it was drawn from, experiments/runner/figure_data.py,
and the summary's sensitivity table against experiments/sensitivity.json, which ``--verify``
measures again: experiments/runner/sensitivity.py).

An experiment is a folder ``experiments/NAME/`` with ``experiment.toml`` (what to run) and
``README.md`` (the claim, the setup, the verdict — written by a person). Running it writes
``results.json`` and figures next to them and rewrites the part of README.md between
``<!-- results:start -->`` and ``<!-- results:end -->`` with the tables, so the numbers in the
write-up are always the ones the command produced. The code is in ``experiments/runner/``:
``execute`` (definition → results), ``render`` (results → figures, README section),
``readme_check`` (README ↔ results.json).

``experiment.toml``::

    title = "..."
    device = "a100-40g"            # profile; optional "capacity" overrides its size
    policies = ["jax", "bfc", "offline"]
    min_capacity = true            # also find each policy's minimum capacity per trace
    resolution = "auto"             # or a size; auto = about 1/1024 of the trace's peak live

    [[traces]]                     # a generated trace ...
    label = "training"
    generate = "training"
    params = { steps = 10 }
    [[traces]]                     # ... or a file (relative to the repository root)
    label = "mlp (recorded)"
    file = "traces/data/sample-torch-cpu-mlp.npz"
    optional = true                # skip (and say so) when the file is absent
    note = "CPU-recorded temps"    # printed under every table that shows this trace

    [[scenarios]]                  # processes sharing one device (optional)
    label = "two JAX defaults"
    capacity = "24GiB"
    processes = ["training:jax", "training:jax@10ms"]   # TRACE_LABEL[:POLICY][@START]
    both_orders = true             # also run them in reversed start order, shown side by side

    [sensitivity]                  # is the winner an artefact of the guessed costs or budget?
    cost_scale = [0.25, 1, 4]      # multiply every device-call cost (cudaMalloc/Free, map/unmap)
    max_slowdown = [1.05, 1.10, 1.25]   # the winner rule's slowdown budgets to try

The method keys (issue 15): ``[sensitivity]`` records each trace's winner under every cost
scale × budget (results.json ``sensitivity``) and puts one line under its table: "winner: X at
every cost and budget tried" or "winner depends on costs/budget: X at ×0.25/1.05x, ...; Y at
...". ``both_orders`` reverses the start order (the k-th earliest start goes to the process
that started k-th latest; simultaneous starts are handed over in reverse) and adds the
reversed outcome as columns (results.json scenario ``reversed``). When a definition uses any
of these keys, a ``note``, or ``trace_kinds = true``, results.json lists the traces
(``traces``: label, kind, source, note) and every table states each trace's kind —
``recorded`` (a ``file``) or ``generated`` (``generate``): in the comparison's header line and
as a ``source`` column of the minimum-capacity and scenario tables. A definition using none of
them gives byte-for-byte the results.json and README section it gave before these keys.

Quoted numbers. The verdict is written by a person, so tests/test_experiment_readmes.py holds
it to the results (experiments/runner/readme_check.py): the results section must be exactly
what results.json renders now, and every size or percentage the ``## Verdict`` section writes
("+14%", "1.13 GiB", "2–20 MiB") must be a number of that rendered section at the precision
written ("19%" matches "+18.8%", "0.84 GiB" matches "855.49MiB"; the sign is not compared).
Numbers that do not come from the tables — a ratio worked out by hand, the literature, facts
about real GPUs — are declared in the README, ``<!-- numbers: 22% (2.61 vs 3.36 GiB),
59–82% (STAlloc) -->`` (the parenthesised text explains and is not parsed); a declared number
the verdict no longer writes is an error too, so the list stays short and reviewable.
A quoted number is also bound to its subject (experiments/runner/readme_bind.py): where its
clause names a policy ("PyTorch's allocator", `bfc`), a trace (its label, or a name declared
in ``<!-- traces: NAME = LABEL; ... -->``) or a quantity ("peak live", "utilization", "smallest
device"), the number must be that subject's in the tables — swapping two policies' numbers
fails although both are in the tables.

Keys added for issue 30 (each changes nothing unless used): a trace's ``compare = false``
(sized only) and ``kind`` ("compiled"); ``compiled_table = true`` (XLA:GPU's memory_analysis
of each compiled trace); ``[[contrasts]]`` (pairs differing in one thing, min/median/max of
each change: experiments/runner/contrasts.py); ``[[spreads]]`` (each policy's headroom over a
set of traces); ``[[offset_sweeps]]`` and ``[[fraction_grids]]`` (two jobs whose steady phases
overlap, start offsets swept; MEM_FRACTION pairs: experiments/runner/sweeps.py). Results never
hold a machine detail (experiments/runner/portable.py): trace files are named as written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from allocsim.sim.output.files import write_json
from experiments.preallocate_vs_grow.population import population_problems
from experiments.preallocate_vs_grow.verify import population_regeneration_problems
from experiments.runner.execute import HERE, ROOT, execute, load_traces
from experiments.runner.figure_data import figure_problems
from experiments.runner.readme_check import readme_problems
from experiments.runner.render import END, START, figure_names, figures, markdown, update_readme
from experiments.runner.sensitivity import (
    regeneration_problems as sensitivity_regeneration_problems,
)
from experiments.runner.sensitivity import sensitivity_problems
from experiments.runner.summary import summary_problems
from experiments.runner.verify import regenerate

__all__ = ["END", "HERE", "ROOT", "START", "load_traces", "main", "run_experiment"]


def run_experiment(name: str | Path, *, quiet: bool = False) -> dict[str, Any]:
    """Run ``experiments/NAME`` (or any folder holding an experiment.toml)."""
    folder = Path(name) if Path(name).is_dir() else HERE / str(name)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr))
    results = execute(folder, say)
    write_json(results, folder / "results.json", kind="experiment")
    written = figures(results, folder)
    update_readme(folder / "README.md", markdown(results, written))
    return results


def drawn_from_data(folder: Path) -> list[str]:
    """Each committed figure of ``folder`` that does not name its committed JSON's digest."""
    problems = []
    if (folder / "results.json").exists():
        names = figure_names(json.loads((folder / "results.json").read_text()))
        problems += figure_problems(folder, "results.json", names)
    if (folder / "population.json").exists():
        problems += figure_problems(folder, "population.json", ["population.png"])
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run allocsim experiments")
    parser.add_argument("names", nargs="*", help="experiment folders under experiments/")
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--check", action="store_true",
                        help="run nothing: hold each README to its results.json")
    parser.add_argument("--verify", action="store_true",
                        help="regenerate each experiment in a temporary folder and diff its "
                             "results.json and README.md against the committed ones")
    args = parser.parse_args(argv)
    names = (sorted(p.parent.name for p in HERE.glob("*/experiment.toml")) if args.all
             else args.names)
    if not names:
        parser.error("name an experiment or use --all")
    folders = [Path(name) if Path(name).is_dir() else HERE / name for name in names]
    populations = [f for f in folders if (f / "population.toml").exists()]
    if args.check:
        problems = [line for folder in folders for line in readme_problems(folder)]
        problems += [line for folder in populations for line in population_problems(folder)]
        problems += [line for folder in folders for line in drawn_from_data(folder)]
        problems += summary_problems(HERE / "README.md") + sensitivity_problems()
        print("\n".join(problems) or f"{len(names)} README(s) agree with their results.json"
              + (f" and {len(populations)} with their population.json" if populations else ""))
        return 1 if problems else 0
    if args.verify:
        differ = []
        for name, folder in zip(names, folders):
            diff = regenerate(folder, lambda fresh: run_experiment(fresh, quiet=True))
            if diff:
                differ.append(name)
                sys.stdout.write(diff)
        stale = []
        for folder in populations:
            problems = population_regeneration_problems(folder)
            if problems:
                stale.append(folder.name)
                print("\n".join(problems))
        summary = summary_problems(HERE / "README.md")
        summary += [line for folder in folders for line in drawn_from_data(folder)]
        summary += sensitivity_problems() + sensitivity_regeneration_problems()
        print("\n".join(summary) if summary else "experiments/README.md and every figure agree "
              "with the data")
        print(f"{len(names) - len(differ)} of {len(names)} experiment(s) regenerate as "
              "committed" + (f"; differ: {', '.join(differ)}" if differ else "")
              + f"; {len(populations) - len(stale)} of {len(populations)} population(s) are "
              "what their definitions make" + (f"; stale: {', '.join(stale)}" if stale else ""))
        return 1 if differ or stale or summary else 0
    for name in names:
        run_experiment(name)
        print(f"experiments/{name}: results.json, figures and README tables updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
