"""``allocsim share``: several processes sharing one device."""

from __future__ import annotations

import argparse
from pathlib import Path

from allocsim.sim.cli.common import (
    add_device_options,
    add_output_option,
    add_reading_options,
    device_from_args,
    examples,
    load_trace,
    print_json,
    print_written,
)
from allocsim.sim.output.figures import plot_share
from allocsim.sim.output.files import write_json
from allocsim.sim.output.ownership import guard
from allocsim.sim.output.tables import share_text
from allocsim.sim.questions.share import expand_processes, parse_share_spec, share, share_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("share", help="several processes sharing one device",
                       description="Each SPEC is TRACE[:POLICY][@START], e.g. run.npz:jax@2s "
                                   "(policy default: jax; TRACE 'default' = the bundled trace). "
                                   "Exit status 1 when some process runs out of memory.",
                       epilog=examples(
                           "allocsim share default:jax default:jax@10ms --capacity 6GiB",
                           "allocsim share default:bfc default:pytorch@1s --capacity 8GiB "
                           "-o results"))
    p.add_argument("specs", nargs="+", metavar="SPEC")
    add_device_options(p)
    add_output_option(p, dest="out", metavar="DIR",
                      help="directory for share.json and share.png (default: write nothing)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_reading_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    device = device_from_args(args)
    specs = [parse_share_spec(text) for text in args.specs]
    traces = [load_trace(spec.trace, args) for spec in specs]
    traces, specs = expand_processes(traces, specs)
    result = share(traces, specs, device)
    if args.out:
        out = Path(args.out)
        guard(out / "share.json", "share")   # both refused before either is written
        guard(out / "share.png")
        out.mkdir(parents=True, exist_ok=True)
        write_json(share_json(result, specs, device), out / "share.json", kind="share")
        plot_share(result, specs, device, out / "share.png")
    if args.json:
        print_json(share_json(result, specs, device))
    else:
        print(share_text(result, specs, device))
    if args.out:
        print_written([out / "share.json", out / "share.png"], to_stderr=args.json)
    return 0 if all(r.completed for r in result.results) else 1
