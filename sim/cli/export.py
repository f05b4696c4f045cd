"""``allocsim export-snapshot``: a policy's simulated run as a PyTorch memory snapshot."""

from __future__ import annotations

import argparse
import sys

from allocsim.atomic_files import refuse_overwriting_input
from allocsim.errors import UserInputError
from allocsim.printable import printable
from allocsim.sim.cli.common import (
    add_device_options,
    add_output_option,
    add_reading_options,
    device_from_args,
    examples,
    load_trace,
    print_written,
)
from allocsim.sim.output.export import simulate_snapshot, write_snapshot
from allocsim.sim.output.ownership import claim_unless_foreign, is_allocsim_trace
from allocsim.traces.bundled import resolve_trace_name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export-snapshot",
                       help="a policy's simulated run as a PyTorch memory snapshot "
                            "(for memory_viz)",
                       epilog=examples(
                           "allocsim export-snapshot default --policy bfc -o bfc.pickle"))
    p.add_argument("trace", help="trace file, or 'default' for the bundled one")
    p.add_argument("--policy", default="pytorch", help="policy spec (default pytorch)")
    add_device_options(p)
    add_output_option(p, dest="output", metavar="FILE", required=True, help="the .pickle to write")
    add_reading_options(p)
    p.set_defaults(func=run)


SNAPSHOT_SUFFIXES = (".pickle", ".pkl")


def run(args: argparse.Namespace) -> int:
    if not str(args.output).lower().endswith(SNAPSHOT_SUFFIXES):
        # memory_viz and torch.cuda.memory._load_snapshot read a pickle; a .txt or .json
        # name would hold one under a name that promises something else.
        raise UserInputError(f"{args.output}: a snapshot is a pickle: name it .pickle (or "
                             ".pkl)")
    # A snapshot is itself a trace allocsim reads, and one it wrote: without this, -o naming
    # the input (by any spelling: ./s.pickle, a link) replaced it with its own replay.
    refuse_overwriting_input(args.output, [resolve_trace_name(args.trace),
                                           getattr(args, "device_profile", None)])
    claim = claim_unless_foreign(args.output, "a snapshot", is_allocsim_trace)
    device = device_from_args(args)
    trace = load_trace(args.trace, args)
    replay = simulate_snapshot(trace, args.policy, device)
    note = replay.failure_note(f"{printable(args.trace)}: the run under {args.policy} on "
                               f"{device.label}")
    if replay.shown_events == 0 and note is not None:
        raise UserInputError(f"{note}: every allocation fails, so there is nothing to export "
                             "(give a larger --capacity)")
    write_snapshot(replay, claim)
    if note is not None:
        print(f"allocsim: note: {note}; the snapshot shows each failed request as an oom "
              "entry and leaves its buffer out", file=sys.stderr)
    print_written([args.output], "open it at https://pytorch.org/memory_viz (drag and drop)")
    return 0
