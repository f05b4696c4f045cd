"""The ``allocsim`` command: a thin shell over the Python API, one module per command
(``register`` adds its parser, ``run`` handles it); this module assembles them and keeps the
error boundary.

Every user mistake (bad file, bad spec, bad size) ends in ONE line on stderr starting with
``allocsim: error:`` and exit status 2; a traceback means a bug in allocsim.

    allocsim compare [TRACE ...] [--policies P ...] [--device NAME | --capacity SIZE]
                     [--out DIR] [--json]
    allocsim gen KIND [key=value ...] -o FILE
    allocsim info TRACE
    allocsim convert IN OUT
    allocsim min-capacity TRACE [--policies ...] [--resolution 1MiB]
    allocsim share TRACE[:POLICY][@START] ... [--device NAME | --capacity SIZE]
    allocsim sweep FILE.toml [--executor dask://HOST:PORT]
    allocsim baseline TRACES... -o baseline.json ; allocsim check baseline.json [--tolerance 1%]
    allocsim fidelity SNAPSHOT ; allocsim explain-oom TRACE [--policy P --capacity SIZE]
    allocsim validate TRACE --policy P [--backend B] ; allocsim calibrate [-o FILE]
    allocsim record -o run.npz -- python train.py ; allocsim report RESULTS... -o report.html
    allocsim export-snapshot TRACE --policy P -o run.pickle   (open in pytorch.org/memory_viz)
    allocsim tune TRACE --framework pytorch|jax|tensorflow|cupy [--device NAME | --capacity SIZE]
    allocsim policies | allocsim devices
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from allocsim import __version__
from allocsim.errors import UserInputError
from allocsim.sim.cli import (
    baseline,
    calibrate,
    capacity,
    compare,
    explain,
    export,
    fidelity,
    listing,
    record,
    report,
    share,
    sweep,
    trace_files,
    tune,
    validate,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="allocsim", description="Simulate GPU memory allocators on allocation traces.")
    parser.add_argument("--version", action="version", version=f"allocsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    compare.register(sub)
    capacity.register(sub)
    share.register(sub)
    baseline.register(sub)
    record.register(sub)
    export.register(sub)
    report.register(sub)
    trace_files.register_gen(sub)
    trace_files.register_info(sub)
    trace_files.register_convert(sub)
    sweep.register(sub)
    fidelity.register(sub)
    explain.register(sub)
    validate.register(sub)
    calibrate.register(sub)
    tune.register(sub)
    listing.register_policies(sub)
    listing.register_devices(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a user's mistake ends in one line on stderr and exit status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UserInputError as err:  # a mistake in what the user gave; anything else is a bug
        print(f"allocsim: error: {err}", file=sys.stderr)
    except OSError as err:
        print(f"allocsim: error: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)
    except KeyboardInterrupt:
        print("allocsim: interrupted", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
