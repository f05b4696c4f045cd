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
import errno
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from allocsim import __version__
from allocsim.errors import UserInputError
from allocsim.interrupts import ending_on_signals, exit_status, signal_name
from allocsim.printable import PrintableStream, printable
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
    size,
    sweep,
    trace_files,
    tune,
    validate,
)
from allocsim.sim.cli.common import JAX_SAMPLE, examples
from allocsim.sim.kernel.native import implementation


class KeepIndentedLines(argparse.HelpFormatter):
    """argparse's help, wrapped as usual, except that an indented line of a description or
    epilog is printed as written: the examples every page ends with (and ``gen``'s list of
    generators) stay one command a line, ready to copy."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        blocks: list[str] = []
        prose: list[str] = []

        def flush() -> None:
            if prose:
                blocks.append(super(KeepIndentedLines, self)._fill_text(
                    " ".join(prose), width, indent))
                prose.clear()
        for line in text.splitlines():
            if line[:1].isspace() or not line.strip():
                flush()
                blocks.append(indent + line)
            else:
                prose.append(line)
        flush()
        return "\n".join(blocks)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a mistake on the command line is one line, as every other mistake: a bad
    type or choice (``--top abc``, ``--backend nosuch``) prints ``allocsim: error: ...`` and
    where to find the usage, not the usage itself. ``--help`` is unchanged. Subcommand parsers
    are made of the same class (``add_subparsers`` uses the parent's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", KeepIndentedLines)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        first = printable(message.splitlines()[0]) if message else "bad arguments"
        self.exit(2, f"allocsim: error: {first} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="allocsim", description="Simulate GPU memory allocators on allocation traces.",
        epilog=examples("allocsim compare", "allocsim info default",
                        f"allocsim tune {JAX_SAMPLE} --framework jax --capacity 32MiB")
        + "\n\nallocsim COMMAND --help: what a command takes, and its own examples")
    # Which implementation replays the runs the native core can take (sim/kernel/native.py).
    parser.add_argument("--version", action="version",
                        version=f"allocsim {__version__} ({implementation()})")
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
    size.register(sub)
    return parser


# What an interrupted command says after "allocsim: interrupted (SIGINT); ". A command with a
# better hint sets ``on_interrupt`` in its parser's defaults (sweep: how to resume).
INTERRUPTED = ("nothing half-written is left (every output is written whole or not at all); "
               "run the same command again")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a user's mistake ends in one line on stderr and exit status 2;
    Ctrl-C or SIGTERM in one line and exit status 128 + the signal (130, 143)."""
    with ending_on_signals():     # SIGTERM raises Terminated, a KeyboardInterrupt
        try:
            return _run_command(argv)
        except KeyboardInterrupt as interrupt:    # while the parser was being built
            return _interrupted(interrupt, None)


def _interrupted(interrupt: BaseException, args: argparse.Namespace | None) -> int:
    hint = getattr(args, "on_interrupt", None) or INTERRUPTED
    print(f"allocsim: interrupted ({signal_name(interrupt)}); {hint}", file=sys.stderr)
    return exit_status(interrupt)


# Errors of writing that name no file: every file allocsim writes names itself when a write
# fails (allocsim.atomic_files, the sweep's results file), so one of these is standard output
# redirected to a file (``--json > out.json`` on a full disk, under ``ulimit -f``).
_WRITE_ERRORS = {errno.EFBIG, errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _unnamed_write(err: OSError) -> str | None:
    """What a write error without a file name was writing: standard output, by the name of
    the file it goes to where there is one."""
    if err.errno not in _WRITE_ERRORS:
        return None
    try:
        target = os.readlink(f"/proc/self/fd/{sys.stdout.fileno()}")
    except (OSError, ValueError, AttributeError):
        return "standard output"
    return f"standard output ({target})" if target.startswith("/") else "standard output"


@contextmanager
def _printable_stdout(wanted: bool = True) -> Iterator[None]:
    """Standard output written through :class:`allocsim.printable.PrintableStream` while a
    command runs: whatever name a command prints (a trace's, a tag's, a device profile's, a
    shape's), no escape sequence, bell or bidi override reaches the terminal raw (issue 56,
    item 13); the displays escape names themselves too, this is the rule over all of them."""
    stream = sys.stdout
    if not wanted or stream is None or isinstance(stream, PrintableStream):
        yield
        return
    sys.stdout = PrintableStream(stream)
    try:
        yield
    finally:
        if isinstance(sys.stdout, PrintableStream) and sys.stdout.wrapped is stream:
            sys.stdout = stream


def _run_command(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        # A recorded script's own output is the script's: written as it writes it.
        recording = getattr(args.func, "__module__", "").endswith(".cli.record")
        with _printable_stdout(not recording):
            status = int(args.func(args))
            sys.stdout.flush()  # a write error of the output's last bytes is reported here too
        return status
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UserInputError as err:  # a mistake in what the user gave; anything else is a bug
        print(f"allocsim: error: {printable(err)}", file=sys.stderr)
    except OSError as err:
        where = err.filename if err.filename else _unnamed_write(err)
        where = f"{printable(where)}: " if where else ""
        print(f"allocsim: error: {where}{printable(err.strerror or err)}", file=sys.stderr)
    except KeyboardInterrupt as interrupt:    # Ctrl-C, or SIGTERM (allocsim.interrupts)
        return _interrupted(interrupt, args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
