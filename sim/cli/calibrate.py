"""``allocsim calibrate``: measure this GPU's allocation costs and granularity into a device
profile, the command over :func:`allocsim.sim.validation.calibrate.calibrate`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from allocsim.policies import format_size
from allocsim.printable import printable
from allocsim.sim.cli.common import (
    add_output_option,
    examples,
    int_argument,
    print_written,
    size_option,
)
from allocsim.sim.output.files import write_json
from allocsim.sim.output.ownership import guard
from allocsim.sim.validation.calibrate import DEFAULT_CALIBRATION_SIZES, calibrate


def register(subparsers: Any) -> None:
    """Add ``calibrate`` to an argparse subparsers object (``func`` = :func:`cmd_calibrate`)."""
    p = subparsers.add_parser(
        "calibrate", help="measure this GPU's allocation costs and granularity into a profile",
        description="Measure cudaMalloc/cudaFree latency over sizes and the allocation "
                    "granularity seen by cudaMemGetInfo; write a device profile for "
                    "compare --device-profile.",
        epilog=examples("allocsim calibrate -o my-gpu.json --measurements raw.json",
                        "allocsim calibrate -o my-gpu.json && allocsim compare default "
                        "--device-profile my-gpu.json"))
    add_output_option(p, dest="output", metavar="FILE",
                      help="profile JSON to write (default: print it)")
    p.add_argument("--name", help="the profile's name (default: the GPU's name + -calibrated)")
    p.add_argument("--sizes", nargs="+", metavar="SIZE",
                   help="sizes to time (default: " + " ".join(
                       format_size(s, 0) for s in DEFAULT_CALIBRATION_SIZES) + ")")
    p.add_argument("--repeats", type=int_argument, default=5,
                   help="calls per size (median; default 5)")
    p.add_argument("--measurements", metavar="FILE",
                   help="also write the raw measurements (latency per size, footprints, how "
                        "small allocations pack into pages) here")
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Run ``allocsim calibrate``: write (or print) the profile; 0 once it is measured."""
    if args.output:
        guard(args.output, "device-profile")
    if args.measurements:
        guard(args.measurements, "calibrate-measurements")
    sizes = ([size_option(s, "--sizes") for s in args.sizes] if args.sizes
             else list(DEFAULT_CALIBRATION_SIZES))
    calibration = calibrate(sizes, args.repeats, name=args.name, output=args.output)
    if args.measurements:
        write_json(calibration.measurements_json(), args.measurements,
                   kind="calibrate-measurements")
        # without -o the profile's JSON is standard output: the line goes to stderr then
        print_written([args.measurements], "the raw measurements", to_stderr=not args.output)
    profile = calibration.profile
    if args.output:
        costs = profile.costs
        print_written([args.output],
                      f"{printable(profile.label)}, {format_size(profile.capacity)}, "
                      f"granularity {format_size(profile.granularity)}; cudaMalloc "
                      f"{costs.malloc_base_s * 1e6:.1f} µs + "
                      f"{costs.malloc_per_gib_s * 1e6:.1f} µs/GiB, cudaFree "
                      f"{costs.free_base_s * 1e6:.1f} µs + {costs.free_per_gib_s * 1e6:.1f} "
                      "µs/GiB")
    else:
        json.dump(calibration.profile_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0
