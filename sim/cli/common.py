"""Options every trace-taking command shares, in one place: ``--strict`` and
``--device-index``, and loading a trace with them."""

from __future__ import annotations

import argparse

from allocsim.traces import Trace, formats


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
