"""``allocsim explain-oom TRACE``: its parser beside its handler, over
:func:`allocsim.sim.questions.explain.explain_oom`."""

from __future__ import annotations

import argparse

from allocsim.policies.registry import alloc_conf_spec
from allocsim.sim.cli.common import (
    add_reading_options,
    device_from_args,
    examples,
    int_argument,
    load_trace,
    print_json,
)
from allocsim.sim.kernel.device import DEFAULT_PROFILE
from allocsim.sim.questions.explain import MAX_SPLIT_SIZES_MB, explain_oom

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``explain-oom`` to ``allocsim``'s subcommands (sets ``func``)."""
    p = subparsers.add_parser(
        "explain-oom", help="was an OOM a real shortage or fragmentation, and what would "
                            "have completed",
        description="At the first failing request: live, reserved, cached-but-free bytes and "
                    "the largest free block; the verdict (real shortage or fragmentation); "
                    "and which allocator settings would have completed at the same "
                    "capacity. A PyTorch snapshot with a recorded OOM needs no other "
                    "argument; any other trace takes --policy and --device/--capacity.",
        epilog=examples("allocsim explain-oom default --policy pytorch --capacity 1600MiB",
                        "allocsim explain-oom default --alloc-conf max_split_size_mb:128 "
                        "--capacity 1600MiB"))
    p.add_argument("trace", help="trace file, or a PyTorch snapshot with a recorded OOM")
    p.add_argument("--policy", metavar="SPEC",
                   help="the policy that ran out of memory (default pytorch; for a snapshot "
                        "with a recorded OOM, the recorded settings)")
    p.add_argument("--alloc-conf", metavar="CONF",
                   help="the pytorch policy from a PYTORCH_CUDA_ALLOC_CONF string as-is")
    p.add_argument("--device", help=f"device profile (default {DEFAULT_PROFILE})")
    p.add_argument("--capacity", help="device capacity, e.g. 24GiB")
    p.add_argument("--device-profile", help="a device-profile JSON file")
    p.add_argument("--max-split-sizes", nargs="+", type=int_argument, metavar="MB",
                   help="max_split_size_mb values to try (default "
                        f"{' '.join(map(str, MAX_SPLIT_SIZES_MB))})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_reading_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``allocsim explain-oom TRACE``: exit 0 with the explanation."""
    trace = load_trace(args.trace, args)
    spec = args.policy
    if args.alloc_conf:
        spec = str(alloc_conf_spec(args.alloc_conf))
    device = None
    if args.device or args.capacity or args.device_profile:
        device = device_from_args(args)
    sizes = tuple(args.max_split_sizes) if args.max_split_sizes else MAX_SPLIT_SIZES_MB
    explanation = explain_oom(trace, spec, device, max_split_sizes_mb=sizes)
    if args.json:
        print_json(explanation.to_json_dict())
    else:
        print(explanation.text())
    return 0
