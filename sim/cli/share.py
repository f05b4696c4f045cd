"""``allocsim share``: several processes sharing one device."""

from __future__ import annotations

import argparse
from pathlib import Path

from allocsim.sim.cli.common import (
    add_device_options,
    add_output_option,
    add_reading_options,
    context_option,
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
from allocsim.sim.questions.share import (
    OutsideMemory,
    expand_processes,
    parse_share_spec,
    share,
    share_json,
    with_outside,
)


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
    p.add_argument("--process-context", metavar="SIZE", default="0",
                   help="each process's own CUDA context, taken from the device when it starts "
                        "and held until it exits; a process that cannot get it fails to start "
                        "(an OOM of that process). Default 0 (none); real cards: 0.3-0.5 GiB")
    p.add_argument("--first-step-load", metavar="SIZE", default="0",
                   help="what each process loads lazily at its first event (module images, "
                        "library kernels), held until it exits; refused, the process dies "
                        "there. Default 0 (none)")
    add_output_option(p, dest="out", metavar="DIR",
                      help="directory for share.json and share.png (default: write nothing)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_reading_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    device = device_from_args(args)
    # Sizes resolved here, once: the run gets bytes.
    outside = OutsideMemory(context_bytes=context_option(args.process_context,
                                                         "--process-context"),
                            first_step_bytes=context_option(args.first_step_load,
                                                            "--first-step-load"))
    specs = [parse_share_spec(text) for text in args.specs]
    traces = [load_trace(spec.trace, args) for spec in specs]
    traces, specs = expand_processes(traces, specs)
    if outside:
        specs = with_outside(specs, outside)
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
