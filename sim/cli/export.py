"""``allocsim export-snapshot``: a policy's simulated run as a PyTorch memory snapshot."""

from __future__ import annotations

import argparse

from allocsim.errors import UserInputError
from allocsim.printable import printable
from allocsim.sim.cli.common import (
    add_device_options,
    add_output_option,
    add_reading_options,
    device_from_args,
    load_trace,
)
from allocsim.sim.output.export import export_snapshot
from allocsim.sim.output.ownership import is_allocsim_trace, refuse_unless_ours


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export-snapshot",
                       help="a policy's simulated run as a PyTorch memory snapshot "
                            "(for memory_viz)")
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
    refuse_unless_ours(args.output, "a snapshot", is_allocsim_trace)
    device = device_from_args(args)
    trace = load_trace(args.trace, args)
    path = export_snapshot(trace, args.policy, device, args.output)
    print(f"wrote {printable(path)}: open it at https://pytorch.org/memory_viz (drag and drop)")
    return 0
