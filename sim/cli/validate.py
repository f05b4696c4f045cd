"""``allocsim validate``: replay a trace on real memory and compare it with the simulation.

The command over :func:`allocsim.sim.validation.validator.validate` (a trace) and
:func:`~allocsim.sim.validation.validator.validate_results` (the winner of a ``compare``
results.json). Exit status: 0 every check passed, 1 a check failed, 2 an error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from allocsim.policies import parse_policy
from allocsim.sim.cli.common import (
    TORCH_SAMPLE,
    add_output_option,
    check_output_folder,
    examples,
    plain_progress,
    print_written,
)
from allocsim.sim.kernel.device import DeviceProfile, SimulatedDevice, resolve_device
from allocsim.sim.validation.backends import BACKENDS, DEFAULT_BACKEND
from allocsim.sim.validation.errors import ValidatorError
from allocsim.sim.validation.validator import validate, validate_results


def register(subparsers: Any) -> None:
    """Add ``validate`` to an argparse subparsers object (``func`` = :func:`cmd_validate`)."""
    p = subparsers.add_parser(
        "validate", help="replay a trace on real memory and compare with the simulation",
        description="Replay TRACE through a backend and through the simulator and compare "
                    "them after every event. RESULTS.json (from compare --out) validates its "
                    "winner on the trace it names. Exit status: 0 all checks passed, 1 a check "
                    "failed, 2 an error (no GPU, bad arguments).",
        epilog=examples(
            f"allocsim validate {TORCH_SAMPLE} --policy bfc --backend host",
            f"allocsim validate {TORCH_SAMPLE} --policy pytorch --backend host -o validation"))
    p.add_argument("input", help="trace file ('default' = the bundled trace), or a compare "
                                 "results.json")
    p.add_argument("--policy", metavar="SPEC",
                   help="the policy to validate (backends host and policy; required with a "
                        "trace); for the allocator backends, the model to compare with "
                        "(default: " + ", ".join(f"{b.name}: {b.model}" for b in
                                                 BACKENDS.values() if b.model) + ")")
    p.add_argument("--backend", default=DEFAULT_BACKEND, choices=list(BACKENDS),
                   help=f"what replays the trace (default {DEFAULT_BACKEND}; host needs no GPU)")
    p.add_argument("--capacity", help="device capacity, e.g. 24GiB (default: the profile's; on "
                                      "a GPU, the memory free at the start)")
    p.add_argument("--device", help="device profile for the simulation (see allocsim devices)")
    p.add_argument("--device-profile", help="a device-profile JSON file (from allocsim calibrate)")
    p.add_argument("--no-patterns", action="store_true",
                   help="do not write and check block patterns (faster, no overlap check)")
    add_output_option(p, dest="out", metavar="DIR",
                      help="directory for the report: JSON, Markdown and a PNG figure "
                           "(default: write nothing)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_validate)


# The backends that replay in a child process (its runtime started fresh), where the policy
# simulated is built only once the child is done: its values are checked before it starts.
CHILD_BACKENDS = {"jax": "tpu-v5e"}


def _check_policy(text: str, backend: str, profile: DeviceProfile | None) -> None:
    """Build ``--policy`` as the simulation will, on the device it will (the one given, or
    the backend's chip: the same granularities), so that a value its constructor refuses
    (``bfc:fraction=7``) is one line now, not after the child's replay."""
    base = profile if profile is not None else resolve_device(CHILD_BACKENDS[backend])
    parse_policy(text).build(SimulatedDevice(base.device_with(None, context=0)).view(0))


def cmd_validate(args: argparse.Namespace) -> int:
    """Run ``allocsim validate``: print the report (or write it), 0 if every check passed."""
    if args.out:    # a folder that cannot be written, before anything runs (issue 56.16)
        check_output_folder(args.out, folder=True)
    profile: DeviceProfile | None = None
    if args.device_profile:
        profile = resolve_device(profile_file=args.device_profile)
    elif args.device:
        profile = resolve_device(args.device)
    if args.policy is not None and args.backend in CHILD_BACKENDS:
        _check_policy(args.policy, args.backend, profile)
    patterns = not args.no_patterns
    # validate() has no progress hook: when stderr is not a terminal, a line every 10 s
    # while it runs (none for a run shorter than that) and one with the time at the end.
    with plain_progress("validate") as log:
        log.update(f"replaying {args.input} on {args.backend}")
        if args.input.lower().endswith(".json"):
            report = validate_results(args.input, args.backend, capacity=args.capacity,
                                      device_profile=profile, policy=args.policy,
                                      patterns=patterns)
        else:
            if args.policy is None and BACKENDS[args.backend].model is None:
                raise ValidatorError(f"--policy is required with a trace for backend "
                                     f"{args.backend} (or give a compare results.json)")
            report = validate(args.input, args.policy, args.backend, profile, args.capacity,
                              patterns=patterns)
    if args.out:
        print_written(report.write(args.out), to_stderr=True)
    if args.json:
        json.dump(report.to_json_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(report.text())
    return 0 if report.passed else 1
