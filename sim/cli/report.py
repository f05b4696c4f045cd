"""``allocsim report``: one self-contained HTML page from results files."""

from __future__ import annotations

import argparse

from allocsim.printable import printable
from allocsim.sim.cli.common import add_output_option
from allocsim.sim.output.html_report import write_report
from allocsim.sim.output.report_input import load_results


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="one self-contained HTML page from results files")
    p.add_argument("results", nargs="+", help="results.json of compare --out, min_capacity.json")
    add_output_option(p, dest="output", metavar="FILE", default="report.html",
                      help="the page to write (default report.html)")
    p.add_argument("--title", default="allocsim report", help="the page's title")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path = write_report(load_results(args.results), args.output, args.title)
    print(f"wrote {printable(path)}")
    return 0
