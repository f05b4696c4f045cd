"""``allocsim policies`` and ``allocsim devices``: what can be named on the command line."""

from __future__ import annotations

import argparse

from allocsim.policies import describe_policies, format_size
from allocsim.sim.cli.common import examples
from allocsim.sim.kernel.device import DEFAULT_PROFILE, PROFILES
from allocsim.sim.kernel.native import implementation, native_settings
from allocsim.sim.questions.offline import OFFLINE_NAME


def register_policies(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("policies", help="list policies and parameters",
                   epilog=examples("allocsim policies")).set_defaults(func=run_policies)


def register_devices(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("devices", help="list device profiles",
                   epilog=examples("allocsim devices",
                                   "allocsim compare default --device h100-80g")
                   ).set_defaults(func=run_devices)


def run_policies(args: argparse.Namespace) -> int:
    print(describe_policies())
    # Not an online policy (it needs the whole trace), but a name --policies accepts.
    print(f"{OFFLINE_NAME:12s} plan, not a policy — XLA buffer assignment's global "
          "decreasing-size best fit over the whole trace; shown beside the policies, never "
          "the winner")
    # Which settings the native core replays (the rest run on the Python models, with the
    # same answers; sim/kernel/native.py).
    print(f"\nnative core ({implementation()} in use here) replays:")
    for name, settings in native_settings().items():
        print(f"    {name:12s} {settings}")
    print("    (everything else, and runs that read a policy object, run on the Python models)")
    return 0


def run_devices(args: argparse.Namespace) -> int:
    for name, profile in PROFILES.items():
        mark = " (default)" if name == DEFAULT_PROFILE else ""
        print(f"{name:12s} {format_size(profile.capacity):>10s}  context "
              f"{format_size(profile.context_bytes):>8s}{mark}  — {profile.source}")
    return 0
