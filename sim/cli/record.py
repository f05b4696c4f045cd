"""``allocsim record``: run a Python program and record its CuPy allocations."""

from __future__ import annotations

import argparse
import sys

from allocsim.policies import format_size
from allocsim.sim.cli.common import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("record", help="run a Python program and record its CuPy allocations",
                       description="allocsim record -o run.npz -- python train.py args: "
                                   "installs a CuPy memory hook, runs the script, writes a "
                                   "native trace (time, size, stream, call site). From your "
                                   "own code: `with allocsim.traces.record.cupy('run.npz'): "
                                   "...`.")
    p.add_argument("-o", "--output", required=True, help="trace file to write (.npz, .csv, ...)")
    p.add_argument("--log", help="also write the raw hook calls as a CuPy JSON-lines log")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- python script.py args")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from allocsim.traces.record import run_script  # imports the recorder only when recording
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UserError("record: give the program after --, e.g. "
                        "allocsim record -o run.npz -- python train.py")
    trace = run_script(command, args.output, log=args.log, require_cupy=True)
    peak, _ = trace.peak_live()
    print(f"wrote {args.output}: {len(trace):,} events, peak live {format_size(peak)}",
          file=sys.stderr)
    return 0
