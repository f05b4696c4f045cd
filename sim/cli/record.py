"""``allocsim record``: run a Python program and record its allocations (CuPy, JAX, or PyTorch
on the meta device)."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from allocsim.atomic_files import OutputClaim
from allocsim.policies import format_size
from allocsim.printable import printable
from allocsim.sim.cli.common import (
    UserError,
    add_framework_option,
    add_output_option,
    check_framework,
    check_output_folder,
    examples,
    print_written,
)
from allocsim.sim.output.ownership import (
    claim_unless_foreign,
    is_allocsim_hook_log,
    is_allocsim_trace,
)

if TYPE_CHECKING:  # pragma: no cover - the trace type, for annotations only
    from allocsim.traces.model import Trace


# The frameworks record has a recorder for, by their canonical names (allocsim/frameworks.py).
RECORDED_FRAMEWORKS = ("pytorch", "jax", "cupy")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("record", help="run a Python program and record its allocations",
                       description="allocsim record -o run.npz -- python train.py args: runs "
                                   "the script and writes a native trace. --framework pytorch "
                                   "runs a PyTorch program's 'cuda' tensors on the meta device "
                                   "(no GPU, no memory) and records every storage they would "
                                   "hold on --target; --framework jax records the device "
                                   "buffers JAX holds (arrays, each execution's temp buffer, "
                                   "donation); --framework cupy installs a CuPy memory hook "
                                   "(time, size, stream, call site). Without --framework, the "
                                   "one the script imports (torch, jax or cupy; read, not run). "
                                   "From your own code: `with allocsim.traces.record.cupy("
                                   "'run.npz'): ...` or `with allocsim.traces.record.jax("
                                   "'run.npz'): ...`.",
                       epilog=examples(
                           "allocsim record -o run.npz -- python train.py",
                           "allocsim record --framework pytorch --target a100-40g -o run.npz "
                           "-- python train.py --batch 64",
                           "allocsim record --framework jax -o run.npz -- python -m app.train"))
    add_output_option(p, dest="output", metavar="FILE", required=True,
                      help="trace file to write (.npz, .csv, ...)")
    add_framework_option(p, RECORDED_FRAMEWORKS,
                         help="whose allocations to record (default: the one the script "
                              "imports; torch is taken for pytorch too)")
    p.add_argument("--target", metavar="DEVICE",
                   help="--framework pytorch: the GPU the recording stands for (allocsim "
                        "devices; default a100-80g): its SDPA kernel and cuBLAS workspace. "
                        "--framework jax: a TPU (tpu-v5e, ...): the script runs here on the "
                        "CPU and every program it runs is compiled for that TPU with libtpu; "
                        "the trace is what its runtime would hold")
    p.add_argument("--placeholder-values", action="store_true",
                   help="--framework pytorch: value reads (loss.item(), if x.any():) answer "
                        "zeros instead of stopping the program")
    p.add_argument("--prefer-cudnn-attention", action="store_true",
                   help="--framework pytorch: cuDNN attention first, as PyTorch does on "
                        "sm90/sm100 with cuDNN newer than 9.15.0")
    p.add_argument("--log", help="also write the raw hook calls as a CuPy JSON-lines log "
                                 "(--framework cupy)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- python script.py args")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UserError("record: give the program after --, e.g. "
                        "allocsim record -o run.npz -- python train.py")
    # Claimed before anything runs: absolute paths (the script may change its working folder),
    # and only the files checked here may be replaced (the script may write them itself).
    output = claim_unless_foreign(args.output, "a trace", is_allocsim_trace, keep_refused=True)
    log = None if not args.log else claim_unless_foreign(args.log, "a CuPy hook log",
                                                         is_allocsim_hook_log,
                                                         keep_refused=True)
    # The folders must take the files before the script runs, not after it has (issue 56.2):
    # a missing folder, a file where the folder should be, a read-only one.
    for path in filter(None, (args.output, args.log)):
        check_output_folder(path)
    if args.framework is None:    # read from the script's imports, before it runs
        from allocsim.traces.record.script_framework import program_framework
        args.framework = program_framework(command)
    check_framework(args.framework, RECORDED_FRAMEWORKS, "record")
    from allocsim.traces.record.script_args import interpreter_note
    note = interpreter_note(command)
    if note:
        print(f"allocsim: record: {note}", file=sys.stderr)

    if args.framework == "jax" and args.target is not None:
        from allocsim.traces.record.xla_tpu import TOPOLOGIES
        if args.target not in TOPOLOGIES:
            raise UserError(f"record: --framework jax --target {args.target}: a TPU only "
                            f"({', '.join(TOPOLOGIES)}); for a GPU compile the steps with "
                            "allocsim.traces.record.xla_gpu.compile_for (docs/jax.md)")
    torch_only = [flag for flag, given in (("--target", args.target is not None
                                            and args.framework != "jax"),
                                           ("--placeholder-values", args.placeholder_values),
                                           ("--prefer-cudnn-attention",
                                            args.prefer_cudnn_attention)) if given]
    if torch_only and args.framework != "pytorch":
        raise UserError(f"record: {torch_only[0]} is for --framework pytorch")
    if args.framework == "pytorch":
        if args.log:
            raise UserError("record: --log is for --framework cupy (CuPy's hook calls)")
        return _run_torch(command, args, output)
    if args.framework == "jax":
        if args.log:
            raise UserError("record: --log is for --framework cupy (CuPy's hook calls)")
        return _run_jax(command, output, args.output, args.target)
    from allocsim.traces.record import run_script  # imports the recorder only when recording
    trace = run_script(command, output, log=log, require_cupy=True)
    peak, _ = trace.peak_live()
    print_written([args.output], f"{len(trace):,} events, peak live {format_size(peak)}",
                  to_stderr=True)
    return 0


def _run_jax(command: list[str], claim: OutputClaim, name: str,
             target: str | None = None) -> int:
    """Record a JAX script into ``claim`` (``name`` as the user gave it); its failure's exit
    status is returned, its partial trace kept (a Ctrl-C or SIGTERM: 130 or 143;
    ``os._exit(n)``: n, said before the process ends)."""
    output = printable(name)
    from allocsim.traces.record.jax_recorder.script import record_script

    def summary(trace: Trace) -> str:
        return f"{len(trace):,} events, peak live {format_size(trace.peak_live()[0])}"

    def on_abrupt_end(trace: Trace, reason: str) -> None:
        print(f"allocsim: record: the script ended by {reason}; partial trace written to "
              f"{output} ({summary(trace)})", file=sys.stderr, flush=True)

    result = record_script(command, claim, on_abrupt_end=on_abrupt_end, target=target)
    trace = result.trace
    if result.error is None:
        if not len(trace):
            print(f"allocsim: record: warning: wrote {output} with 0 events: the program held "
                  "no JAX array on the recorded device (does it import jax?)", file=sys.stderr)
        else:
            print_written([name], summary(trace), to_stderr=True)
        return 0
    error = result.error
    if isinstance(error, KeyboardInterrupt):
        print(f"allocsim: record: {result.partial}; partial trace written to {output} "
              f"({summary(trace)})", file=sys.stderr)
        return result.exit_status
    if isinstance(error, SystemExit):
        if not isinstance(error.code, int) and error.code is not None:
            print(error.code, file=sys.stderr)  # as Python prints sys.exit("message")
    else:  # the script's own traceback, as Python would print it (the recorder's frames out)
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None and (
                tb.tb_frame.f_code.co_filename.endswith(("jax/recorder.py",
                                                         "jax/script.py"))
                or "runpy" in tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        traceback.print_exception(type(error), error, tb, file=sys.stderr)
    print(f"allocsim: record: the script exited with status {result.exit_status}; partial "
          f"trace written to {output} ({summary(trace)})", file=sys.stderr)
    return result.exit_status


def print_script_failure(error: BaseException, recorders_file: Callable[[str], bool]) -> None:
    """What Python prints when the script fails: ``sys.exit("message")``'s message, or the
    script's traceback without the frames of the recorder (``recorders_file(filename)``)
    and runpy above it."""
    if isinstance(error, SystemExit):
        if not isinstance(error.code, int) and error.code is not None:
            print(error.code, file=sys.stderr)
        return
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None and (
            recorders_file(tb.tb_frame.f_code.co_filename)
            or "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(type(error), error, tb, file=sys.stderr)


def _run_torch(command: list[str], args: argparse.Namespace, claim: OutputClaim) -> int:
    """Record a PyTorch script on the meta device; a failure keeps its partial trace (an
    ``os._exit(n)`` too: said before the process ends, as for JAX)."""
    from allocsim.traces.record.torch.meta_script import Terminated, record_script
    from allocsim.traces.record.torch.meta_targets import resolve_target
    resolve_target(args.target)  # an unknown target is refused before the script runs
    output = printable(args.output)

    def summary_of(trace: Trace) -> str:
        return (f"{len(trace):,} events, peak live {format_size(trace.peak_live()[0])} on "
                f"{trace.metadata.get('target')}")

    def on_abrupt_end(trace: Trace, reason: str) -> None:
        print(f"allocsim: record: the script ended by {reason}; partial trace written to "
              f"{output} ({summary_of(trace)})", file=sys.stderr, flush=True)

    result = record_script(command, claim, target=args.target,
                           values="placeholder" if args.placeholder_values else "error",
                           prefer_cudnn=args.prefer_cudnn_attention,
                           on_abrupt_end=on_abrupt_end)
    trace = result.trace
    summary = summary_of(trace)
    if result.error is None:
        print_written([args.output], summary, to_stderr=True)
        return 0
    error = result.error
    if result.explanation is not None:
        print(f"allocsim: record: {result.explanation}", file=sys.stderr)
    elif not isinstance(error, Terminated):
        print_script_failure(error, lambda filename: "allocsim" in filename)
    print(f"allocsim: record: the script exited with status {result.exit_status}; partial "
          f"trace written to {output} ({summary})", file=sys.stderr)
    return result.exit_status
