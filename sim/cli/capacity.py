"""``allocsim min-capacity``: the smallest device each policy runs the trace on."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from allocsim.errors import UserInputError
from allocsim.policies import DEFAULT_POLICIES
from allocsim.sim.cli.common import (
    JAX_SAMPLE,
    add_device_options,
    add_output_option,
    add_reading_options,
    device_for_traces,
    examples,
    load_trace,
    plain_progress,
    print_json,
    print_written,
    size_option,
)
from allocsim.sim.output.files import write_json
from allocsim.sim.output.next_step import does_not_fit, next_step
from allocsim.sim.output.ownership import guard
from allocsim.sim.output.tables import capacity_text
from allocsim.sim.questions.capacity.minimum import MIN_CAPACITY_KIND, min_capacities
from allocsim.sim.questions.compare import normalize_spec, trace_facts


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("min-capacity", help="the smallest device each policy runs the trace on",
                       epilog=examples(
                           "allocsim min-capacity default --policies bfc pytorch",
                           f"allocsim min-capacity {JAX_SAMPLE} --resolution 256KiB -o results"))
    p.add_argument("trace", help="trace file, or 'default' for the bundled one")
    p.add_argument("--policies", nargs="+", metavar="SPEC",
                   help=f"policy specs (default: {' '.join(DEFAULT_POLICIES)})")
    p.add_argument("--resolution", default="1MiB", help="answer to this precision (default 1MiB)")
    add_device_options(p, capacity=False, purpose=" for costs and granularity")
    add_output_option(p, dest="out", metavar="DIR",
                      help="directory for min_capacity.json (default: write nothing)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_reading_options(p)
    p.set_defaults(func=run)


def _searching(policy: str) -> None:
    print(f"  searching {policy} ...", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if args.out:    # refused before the search, not after it
        guard(Path(args.out) / "min_capacity.json", "min-capacity")
    trace = load_trace(args.trace, args)
    device = device_for_traces(args, [trace])
    policies = [str(normalize_spec(p)) for p in (args.policies or DEFAULT_POLICIES)]
    resolution = size_option(args.resolution, "--resolution")
    if trace.peak_live()[0] <= 0:
        # Every capacity "fits" a trace that never holds a byte: an answer would be the search's
        # first step, a number that says nothing about the trace.
        what = "no events" if len(trace) == 0 else f"{len(trace):,} events but no live bytes"
        raise UserInputError(f"{args.trace or trace.name}: holds {what}: there is no minimum "
                             "capacity to find")
    with plain_progress("min-capacity") as log:   # stderr not a terminal: a line every 10 s
        seen: list[str] = []

        def show(policy: str) -> None:
            seen.append(policy)
            if sys.stderr.isatty():
                if not args.json:
                    _searching(policy)
            else:
                log.update(f"searching {policy} (policy {len(seen)}/{len(policies)})")
        answers = min_capacities(trace, policies, device, resolution=resolution,
                                 progress=show)
    data = {"kind": MIN_CAPACITY_KIND, "trace": trace_facts(trace), "device": device.label,
            "context_bytes": answers[0].context_bytes if answers else 0,
            "resolution": resolution,
            "answers": [a.to_json_dict() for a in answers]}
    # A card named (not the default profile for costs) that the job's peak live is over.
    named = args.device is not None or args.device_profile is not None
    step = next_step(trace, device) if named and does_not_fit(trace, device) else None
    if step is not None:
        data["next_step"] = step.to_json_dict()
    written = Path(args.out) / "min_capacity.json" if args.out else None
    if written is not None:
        write_json(data, written, kind="min-capacity")
    if args.json:
        print_json(data)
        if written is not None:
            print_written([written], to_stderr=True)
        return 0
    print(capacity_text(trace_facts(trace), device, resolution, answers,
                        xla_tpu=trace.metadata.get("xla_tpu")))
    if step is not None:
        print(f"\non {device.label}, " + "\n".join(step.lines()))
    if written is not None:
        print_written([written])
    return 0
