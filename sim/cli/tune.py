"""``allocsim tune``: the setting to paste, for a job and a card (one trace), or per-job
limits under which several jobs share a card (several traces)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from allocsim.errors import UserInputError
from allocsim.sim.cli.common import (
    JAX_SAMPLE,
    TORCH_SAMPLE,
    UserError,
    add_device_options,
    add_framework_option,
    add_output_option,
    add_reading_options,
    device_from_args,
    examples,
    float_argument,
    int_argument,
    load_trace,
    max_slowdown_option,
    plain_progress,
    print_json,
    print_written,
    workers_option,
)
from allocsim.sim.kernel.device import DeviceProfile, resolve_device
from allocsim.sim.kernel.device_buffers import is_tpu
from allocsim.sim.output.display_text import shown
from allocsim.sim.output.next_step import does_not_fit
from allocsim.sim.questions.compare import DEFAULT_MAX_SLOWDOWN
from allocsim.sim.questions.tune.recommend import tune
from allocsim.sim.questions.tune.share import tune_share
from allocsim.sim.questions.tune.space import FRAMEWORKS
from allocsim.traces.model import Trace


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="the allocator setting to paste for a job and a card "
                                    "(or per-job limits for several jobs on one card)",
                       epilog=examples(
                           f"allocsim tune {JAX_SAMPLE} --framework jax --capacity 32MiB",
                           f"allocsim tune {TORCH_SAMPLE} --framework pytorch --device rtx4090-24g",
                           f"allocsim tune default {JAX_SAMPLE} --framework jax --capacity 2GiB"))
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help="trace file ('default' for the bundled one); several: jobs sharing "
                        "one card (needs --device or --capacity)")
    add_framework_option(p, FRAMEWORKS, required=True,
                         help="whose settings to search (torch and tf are taken too)")
    add_device_options(p, purpose=" (the card to fit; without --device or --capacity: the "
                                  "smallest card)")
    p.add_argument("--max-slowdown", type=float_argument, default=DEFAULT_MAX_SLOWDOWN, metavar="X",
                   help=f"slowdown budget as compare's (default {DEFAULT_MAX_SLOWDOWN}; inf: "
                        "none)")
    p.add_argument("--current", metavar="SETTING",
                   help="the setting the job runs with now, as for the framework (e.g. "
                        "'PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128' or "
                        "'XLA_PYTHON_CLIENT_MEM_FRACTION=.5'): replayed and reported")
    p.add_argument("--seed", type=int_argument, default=0,
                   help="seed of the checks below a fraction's answer (default 0)")
    p.add_argument("--executor", metavar="WHERE",
                   help="run the replays on the sweeps' executors: 'local' (a process pool) "
                        "or dask://HOST:PORT (default: in this process)")
    p.add_argument("--workers", type=int_argument, metavar="N", help="local pool size")
    p.add_argument("--any-trace", action="store_true",
                   help="tune a trace recorded from another framework (the assumption is "
                        "stated in the output)")
    add_output_option(p, dest="out", metavar="DIR",
                      help="folder for tune.json, tune.png, tune-results.json, report.html")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_reading_options(p)
    p.set_defaults(func=run)


def _card(args: argparse.Namespace) -> bool:
    return args.device is not None or args.capacity is not None or args.device_profile is not None


# Measured on a v5e (experiments/tpu/README.md): the TPU runtime takes all of HBM whatever
# XLA_PYTHON_CLIENT_* say, so the settings tune searches do not exist there.
TPU_HAS_NO_SETTINGS = (
    "tune: on a TPU ({device}) no allocator setting changes memory: the runtime ignores "
    "XLA_PYTHON_CLIENT_* (measured on a v5e, experiments/tpu/README.md); the program does "
    "(donation, remat: compile each with compile_for(target=\"tpu-v5e\") and compare); for the "
    "memory a trace needs, run: allocsim min-capacity TRACE --device {device} --policies tpu")


def run(args: argparse.Namespace) -> int:
    budget = max_slowdown_option(args.max_slowdown)
    workers = workers_option(args.workers)
    card = _card(args)
    device = device_from_args(args) if card else resolve_device(None, None, args.device_profile)
    if is_tpu(device):
        raise UserInputError(TPU_HAS_NO_SETTINGS.format(device=device.name))
    traces = [load_trace(path, args) for path in args.traces]
    if len(traces) > 1:
        return _run_share(args, traces, device, card, budget)
    trace = traces[0]
    if card and does_not_fit(trace, device):
        return _nothing_fits(args, trace, device)
    evaluate = None
    if args.executor is not None:
        if not card:
            raise UserError("--executor runs replays on one card: give --device or --capacity "
                            "(the smallest-card search runs here)")
        from allocsim.sim.sweeps.tune_runner import sweep_evaluator
        evaluate = sweep_evaluator(args.traces[0], args.executor, workers)
    with plain_progress("tune", enabled=True) as log:
        def show(done: int, stage: str) -> None:
            if sys.stderr.isatty() and not args.json:
                print(f"  {stage} (after {done} replays)", file=sys.stderr)
            else:
                log.update(f"{stage} (after {done} replays)")
        try:
            result = tune(trace, args.framework, device, card=card, max_slowdown=budget,
                          seed=args.seed, current=args.current, any_trace=args.any_trace,
                          evaluate=evaluate, progress=show)
        finally:
            close = getattr(evaluate, "close", None)
            if close is not None:
                close()
    from allocsim.sim.output.tune_output import text, write_files
    written = write_files(result, trace, Path(args.out)) if args.out else []
    if args.json:
        print_json(result.to_json_dict())
    else:
        print(text(result))
    if written:
        if not args.json:
            print()
        print_written(written, to_stderr=args.json)
    return 0


def _nothing_fits(args: argparse.Namespace, trace: Trace, device: DeviceProfile) -> int:
    """Peak live over the card's memory: no setting fits. Say who holds the peak and what a
    smaller batch, remat or bf16 would need; exit status 1 (a finding, as share's)."""
    from allocsim.sim.output.next_step import next_step
    from allocsim.sim.questions.compare import trace_facts
    step = next_step(trace, device)
    if args.json:
        print_json({"schema": 1, "kind": "allocsim-tune-nothing-fits",
                    "trace": trace_facts(trace), "framework": args.framework,
                    "device": {"name": device.label, "capacity": device.capacity,
                               "context_bytes": device.context_bytes},
                    "next_step": step.to_json_dict()})
    else:
        print(f"tune {shown(trace.name)} as {args.framework} on card {shown(device.label)}\n")
        print("\n".join(step.lines()))
    return 1


def _run_share(args: argparse.Namespace, traces: list[Trace], device: DeviceProfile,
               card: bool, budget: float | None) -> int:
    if not card:
        raise UserError("several traces share one card: give --device or --capacity")
    if args.current or args.executor:
        raise UserError("--current and --executor take one trace")
    answer = tune_share(traces, list(args.traces), args.framework, device,
                        any_trace=args.any_trace)
    from allocsim.sim.output.files import write_json
    written = Path(args.out) / "tune-share.json" if args.out else None
    if written is not None:
        write_json(answer.to_json_dict(), written, kind="tune")
    if args.json:
        print_json(answer.to_json_dict())
    else:
        print(answer.text())
    if written is not None:
        print_written([written], to_stderr=args.json)
    return 0
