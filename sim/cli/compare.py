"""``allocsim compare``: replay traces through policies and name the winner."""

from __future__ import annotations

import argparse
from pathlib import Path

from allocsim.policies import DEFAULT_POLICIES
from allocsim.policies.registry import alloc_conf_spec
from allocsim.printable import printable
from allocsim.sim.cli.common import (
    JAX_SAMPLE,
    TORCH_SAMPLE,
    UserError,
    add_device_options,
    add_output_option,
    add_reading_options,
    check_output_folder,
    command_progress,
    device_for_traces,
    examples,
    float_argument,
    load_trace,
    max_slowdown_option,
    print_json,
    print_written,
    replay_reporter,
)
from allocsim.sim.output.next_step import does_not_fit, next_step
from allocsim.sim.output.ownership import guard
from allocsim.sim.output.results_dir import write_comparisons
from allocsim.sim.output.tables import comparison_text
from allocsim.sim.questions.compare import DEFAULT_MAX_SLOWDOWN, Comparison, compare, normalize_spec
from allocsim.sim.questions.framework_settings import (
    TPU_DEVICE,
    default_choice,
    generic_choice,
    tpu_profiles_only,
    with_alloc_confs,
)
from allocsim.traces.bundled import DEFAULT_TRACE_NAME, load_bundled_traces


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="replay traces through policies and name the winner",
                       epilog=examples(
                           "allocsim compare default --device a100-40g",
                           f"allocsim compare {TORCH_SAMPLE} --alloc-conf expandable_segments:True",
                           f"allocsim compare {JAX_SAMPLE} --capacity 64MiB -o results"))
    p.add_argument("traces", nargs="*", help=f"trace files (default: the bundled traces, "
                                             f"{DEFAULT_TRACE_NAME} and the recorded samples)")
    p.add_argument("--policies", nargs="+", metavar="SPEC",
                   help="policy specs, e.g. bfc:allow_growth=false (default: the recording's "
                        "own framework's settings — PyTorch's, JAX's, TensorFlow's, CuPy's or "
                        f"the TPU runtime; {' '.join(DEFAULT_POLICIES)} for a trace that names "
                        "no framework)")
    p.add_argument("--alloc-conf", action="append", metavar="CONF",
                   help="add the pytorch policy configured by a PYTORCH_CUDA_ALLOC_CONF string "
                        "as-is, e.g. 'max_split_size_mb:128,expandable_segments:True' "
                        "(repeatable)")
    add_device_options(p)
    p.add_argument("--max-slowdown", type=float_argument, default=DEFAULT_MAX_SLOWDOWN, metavar="X",
                   help="a winner may make the run at most X times slower through allocator "
                        f"time (default {DEFAULT_MAX_SLOWDOWN}; inf = no budget)")
    add_output_option(p, dest="out", metavar="DIR",
                      help="directory for results.json and report.html, its charts in the page "
                           "(default: write nothing)")
    p.add_argument("--figures", action="store_true",
                   help="with -o: also draw the PNG figures (memory_timeline.png, peaks.png, "
                        "fragmentation.png), in the folder and the report; slower")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (an array for several traces)")
    add_reading_options(p)
    p.set_defaults(func=run)


def _traces_after_policies(args: argparse.Namespace) -> None:
    """``compare --policies bfc run.npz``: argparse gives the trace to ``--policies``. An item
    that names an existing file or folder is a trace, not a policy spec; move it back."""
    specs = args.policies or []
    traces = [p for p in specs if Path(p).exists()]
    if traces:
        args.policies = [p for p in specs if p not in traces] or None
        args.traces = [*args.traces, *traces]


def _check_output(args: argparse.Namespace) -> None:
    """Before any trace is read (issue 56.15): ``--figures`` has somewhere to go, and the
    ``-o`` folder can be written, its results.json and report.html replaced if there."""
    if args.figures and not args.out:
        raise UserError("compare: --figures draws into the -o folder: give -o DIR (the PNG "
                        "figures go there and into its report.html)")
    if args.out:
        check_output_folder(args.out, folder=True)
        out = Path(args.out)
        guard(out / "results.json", "results")
        guard(out / "report.html")


def run(args: argparse.Namespace) -> int:
    _traces_after_policies(args)
    _check_output(args)
    budget = max_slowdown_option(args.max_slowdown)
    named = [str(normalize_spec(p)) for p in args.policies] if args.policies else None
    confs = [(text, str(alloc_conf_spec(text))) for text in args.alloc_conf or []]
    with command_progress("compare") as progress:
        traces = []
        for index, path in enumerate(args.traces):
            progress.update(f"reading {printable(path)} (trace {index + 1}/{len(args.traces)})")
            traces.append(load_trace(path, args))
        if not args.traces:
            progress.update("reading the bundled traces")
            traces = load_bundled_traces()
        if (tpu_profiles_only(traces) and args.device is None and args.capacity is None
                and args.device_profile is None):
            args.device = TPU_DEVICE     # a TPU profile's own chip, not a GPU's default
        device = device_for_traces(args, traces)
        comparisons: list[Comparison] = []
        for trace in traces:
            # The recording's own framework's settings, unless policies were named.
            choice = with_alloc_confs(generic_choice(named) if named else
                                      default_choice(trace, device), confs)
            comparisons.append(compare(
                trace, choice.specs, device, max_slowdown=budget, choice=choice,
                progress=replay_reporter(progress, printable(trace.name), len(choice.specs))))
        written = (write_comparisons(comparisons, args.out, traces=traces, figures=args.figures,
                                     progress=progress.update) if args.out else [])
    if written:
        print_written(written, to_stderr=True)
    # A trace whose peak live is over the card's memory fits under no policy: the next step.
    steps = [next_step(t, device) if does_not_fit(t, device) else None for t in traces]
    if args.json:
        data = [{**c.to_json_dict(), **({"next_step": s.to_json_dict()} if s else {})}
                for c, s in zip(comparisons, steps)]
        print_json(data[0] if len(data) == 1 else data)
        return 0
    for index, (comparison, step) in enumerate(zip(comparisons, steps)):
        if index:
            print()
        print(comparison_text(comparison))
        if step is not None:
            print("\n" + "\n".join(step.lines()))
    return 0
