"""``allocsim baseline`` and ``allocsim check``: figures recorded once, re-checked in CI."""

from __future__ import annotations

import argparse

from allocsim.policies import DEFAULT_POLICIES
from allocsim.sim.cli.common import (
    TORCH_SAMPLE,
    accept_dash_digit_values,
    add_device_options,
    add_output_option,
    device_from_args,
    examples,
    print_written,
    tolerance_option,
)
from allocsim.sim.output.files import write_json
from allocsim.sim.output.ownership import guard
from allocsim.sim.questions.regress import check_baseline, make_baseline
from allocsim.traces.bundled import resolve_trace_name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("baseline", help="record the figures of traces × policies for CI checks",
                       epilog=examples(
                           f"allocsim baseline {TORCH_SAMPLE} --policies bfc pytorch "
                           "-o baseline.json"))
    p.add_argument("traces", nargs="+", help="trace files")
    p.add_argument("--policies", nargs="+", metavar="SPEC",
                   help=f"policy specs (default: {' '.join(DEFAULT_POLICIES)})")
    add_device_options(p)
    add_output_option(p, dest="output", metavar="FILE", required=True,
                      help="baseline JSON to write")
    p.set_defaults(func=run_baseline)

    p = sub.add_parser("check", help="re-run a baseline; exit 1 if anything got worse",
                       epilog=examples(
                           f"allocsim baseline {TORCH_SAMPLE} -o baseline.json && "
                           "allocsim check baseline.json --tolerance 1%"))
    p.add_argument("baseline", help="a baseline JSON written by `allocsim baseline`")
    p.add_argument("--tolerance", default="1%",
                   help="relative slack, e.g. 1%% or 0.01 (default 1%%)")
    accept_dash_digit_values(p)
    p.set_defaults(func=run_check)


def run_baseline(args: argparse.Namespace) -> int:
    guard(args.output, "baseline")
    device = device_from_args(args)
    traces = [resolve_trace_name(t) for t in args.traces]
    document = make_baseline(traces, args.policies or DEFAULT_POLICIES, device, args.output)
    write_json(document, args.output, kind="baseline")
    print_written([args.output], f"{len(document['cells'])} cells ({len(args.traces)} traces × "
                                 f"{len(document['policies'])} policies) on {device.label}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    tolerance = tolerance_option(args.tolerance)
    outcome = check_baseline(args.baseline, tolerance)
    print(outcome.text())
    return 0 if outcome.ok else 1
