"""``allocsim report``: one self-contained HTML page from results files."""

from __future__ import annotations

import argparse

from allocsim.atomic_files import refuse_overwriting_input
from allocsim.errors import UserInputError
from allocsim.printable import printable
from allocsim.sim.cli.common import (
    TORCH_SAMPLE,
    add_output_option,
    command_progress,
    examples,
    print_written,
)
from allocsim.sim.output.html_report import write_report
from allocsim.sim.output.report_input import load_results


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="one self-contained HTML page from results files",
                       epilog=examples(
                           f"allocsim compare {TORCH_SAMPLE} -o results && "
                           f"allocsim min-capacity {TORCH_SAMPLE} -o results",
                           "allocsim report results/results.json results/min_capacity.json "
                           "-o report.html"))
    p.add_argument("results", nargs="+", help="results.json of compare --out, min_capacity.json")
    add_output_option(p, dest="output", metavar="FILE", default="report.html",
                      help="the page to write (default report.html)")
    p.add_argument("--title", default="allocsim report", help="the page's title")
    p.add_argument("--figures", action="store_true",
                   help="also draw the PNG figures into the page (matplotlib; slower: the "
                        "page's own charts show the same)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # -o naming one of the results files it reads (by any spelling: ./results.json, a link).
    refuse_overwriting_input(args.output, args.results)
    if not str(args.output).lower().endswith(".html"):
        # The page is HTML; under another name (results.json, notes.txt) it would replace a
        # file that the ownership check (by suffix, sim/output/ownership.py) cannot tell for a
        # report, and a .json name ended there in a TypeError.
        raise UserInputError(f"{printable(args.output)}: a report is an HTML page: name it "
                             ".html")
    with command_progress("report") as progress:
        progress.update(f"reading {len(args.results)} results file"
                        + ("s" * (len(args.results) != 1)))
        documents = load_results(args.results)
        progress.update("drawing the figures and writing the page" if args.figures
                        else "writing the page")
        path = write_report(documents, args.output, args.title, figures=args.figures)
    print_written([path])
    return 0
