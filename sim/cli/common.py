"""What every command shares, in one place: the reading options (``--strict``,
``--device-index``) and loading a trace with them, the device options (``--device``,
``--capacity``, ``--device-profile``), progress lines and JSON on stdout."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from allocsim.errors import UserInputError
from allocsim.sim.kernel.device import DEFAULT_PROFILE, DeviceProfile, resolve_device
from allocsim.traces import Trace, formats
from allocsim.traces.bundled import load_default_trace


class UserError(UserInputError):
    """A mistake in what the user gave on the command line; printed as one line."""


def add_reading_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strict", action="store_true",
                        help="fail on the first anomaly in a recorded trace (default: repair "
                             "what can be repaired and report it)")
    parser.add_argument("--device-index", metavar="N",
                        help="which device of a multi-device recording (default: the one with "
                             "the most events)")


def load_trace(path: str, args: argparse.Namespace | None = None) -> Trace:
    """Load ``path`` with the reading options given on the command line."""
    strict = getattr(args, "strict", None) or None
    device_index = getattr(args, "device_index", None)
    if isinstance(device_index, str) and device_index.isdigit():
        device_index = int(device_index)  # "1" means device 1; "cpu" / "cuda:1" stay text
    return formats.load(path, strict=strict, device_index=device_index)


def trace_or_default(path: str, args: argparse.Namespace) -> Trace:
    """``default`` names the bundled training trace; anything else is a file."""
    return load_default_trace() if path == "default" else load_trace(path, args)


def add_device_options(parser: argparse.ArgumentParser, *, capacity: bool = True,
                       purpose: str = "") -> None:
    """``--device NAME``, ``--capacity SIZE`` (unless the command finds the capacity itself)
    and ``--device-profile FILE``, with the same names and help on every command."""
    parser.add_argument("--device", metavar="NAME",
                        help=f"device profile{purpose} (default {DEFAULT_PROFILE}; see "
                             "`allocsim devices`)")
    if capacity:
        parser.add_argument("--capacity", metavar="SIZE",
                            help="device capacity, e.g. 24GiB (overrides the profile's)")
    parser.add_argument("--device-profile", metavar="FILE",
                        help="a device-profile JSON file (from `allocsim calibrate`)")


def device_from_args(args: argparse.Namespace) -> DeviceProfile:
    """The device the options of :func:`add_device_options` name."""
    return resolve_device(args.device, getattr(args, "capacity", None), args.device_profile)


def progress_printer(enabled: bool) -> Callable[[str, int, int], None] | None:
    """A progress line on stderr for long replays (only when stderr is a terminal)."""
    if not enabled:
        return None

    def show(policy: str, done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        sys.stderr.write(f"\r  {policy}: {done:,}/{total:,} events ({done / max(total, 1):.0%})"
                         + end)
        sys.stderr.flush()
    return show


def print_json(data: Any) -> None:
    """One JSON document on stdout, keys in schema order, as every ``--json`` prints."""
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")
