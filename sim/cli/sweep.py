"""``allocsim sweep``: its arguments beside its handler, over :mod:`allocsim.sim.sweeps`.

    allocsim sweep FILE.toml [--executor local|dask://HOST:PORT] [--workers N]
                   [--retry-errors] [--output FILE.jsonl] [--no-progress]
                   [--report] [--max-slowdown X]

Exit status: 0 when every cell ran ok, 1 when some failed, 130 when interrupted (Ctrl-C; 143
for SIGTERM; either says how to resume), 2 for a mistake in what was given (a bad sweep file,
an ``--output`` that is not a results file, a results file another sweep is writing: one
``allocsim: error:`` line).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from allocsim.printable import printable
from allocsim.sim.cli.common import (
    accept_dash_digit_values,
    add_output_option,
    examples,
    float_argument,
    int_argument,
    max_slowdown_option,
    workers_option,
)
from allocsim.sim.questions.compare import DEFAULT_MAX_SLOWDOWN
from allocsim.sim.sweeps.grid import SweepDefinition, load_definition
from allocsim.sim.sweeps.run import RESUME_HINT, run_sweep
from allocsim.sim.sweeps.store import latest_records, load_results
from allocsim.sim.sweeps.summary import best_policies, best_policies_text

__all__ = ["add_sweep_arguments", "cmd_sweep", "register"]

HELP = "a grid of traces × policies × devices × capacities, in parallel, resumable (local cores " \
       "or a Dask cluster)"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``sweep`` command to the ``allocsim`` parser's subcommands."""
    parser = subparsers.add_parser(
        "sweep", help=HELP,
        epilog=examples("allocsim sweep docs/examples/grid.toml -o results.jsonl",
                        "allocsim sweep docs/examples/grid.toml -o results.jsonl --report"))
    add_sweep_arguments(parser)
    # Interrupted before or after the cells run (while loading, say): the boundary's one line.
    parser.set_defaults(func=cmd_sweep, on_interrupt=RESUME_HINT)


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``allocsim sweep`` arguments."""
    accept_dash_digit_values(parser)
    parser.add_argument("definition", metavar="FILE.toml", help="the sweep file")
    parser.add_argument("--executor", default="local", metavar="local|dask://HOST:PORT",
                        help="where cells run: local processes (default) or an existing Dask "
                             "cluster (needs the dask extra)")
    parser.add_argument("--workers", type=int_argument, metavar="N",
                        help="local worker processes (default: one per core)")
    parser.add_argument("--retry-errors", action="store_true",
                        help="rerun cells that recorded an error (default: skip them)")
    add_output_option(parser, dest="output", metavar="FILE.jsonl",
                      help="results file (default: the sweep file's `output`)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--report", action="store_true",
                        help="run nothing; print the best policy per trace from the results file")
    parser.add_argument("--max-slowdown", type=float_argument, default=DEFAULT_MAX_SLOWDOWN,
                        metavar="X",
                        help="slowdown budget of the best-policy table (default "
                             f"{DEFAULT_MAX_SLOWDOWN}; inf = none)")


def _recorded(sweep: SweepDefinition, path: Path) -> tuple[set[str], list[dict[str, Any]]]:
    """The grid's cell keys and the results file's records of those cells."""
    keys = {cell.key for cell in sweep.cells()}
    return keys, [r for r in load_results(path) if r["cell"] in keys]


def cmd_sweep(args: argparse.Namespace) -> int:
    """``allocsim sweep``: 0 when every cell ran ok, 1 when some failed, 130 (143) when
    interrupted by Ctrl-C (SIGTERM)."""
    budget = max_slowdown_option(args.max_slowdown)
    workers = workers_option(args.workers)
    sweep = load_definition(args.definition)
    path = Path(args.output) if args.output else sweep.output
    if args.report:
        keys, records = _recorded(sweep, path)
        print(f"{printable(path)}: {len(latest_records(records)):,} of {len(keys):,} cells "
              "recorded")
        print(best_policies_text(best_policies(records, max_slowdown=budget)))
        return 0
    summary = run_sweep(sweep, executor=args.executor, workers=workers,
                        progress=not args.no_progress, retry_errors=args.retry_errors,
                        output=path)
    print(summary.text())
    if summary.interrupted:
        return summary.exit_status
    _, records = _recorded(sweep, path)
    print()
    print(best_policies_text(best_policies(records, max_slowdown=budget)))
    return 1 if summary.failed else 0
