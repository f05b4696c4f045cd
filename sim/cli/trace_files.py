"""``allocsim gen``, ``info`` and ``convert``: making, reading and converting trace files."""

from __future__ import annotations

import argparse
from pathlib import Path

from allocsim.atomic_files import refuse_overwriting_input
from allocsim.errors import UserInputError
from allocsim.policies import format_size
from allocsim.printable import printable
from allocsim.sim.cli.common import (
    TORCH_SAMPLE,
    UserError,
    add_output_option,
    add_reading_options,
    command_progress,
    ensure_parent,
    examples,
    int_argument,
    load_trace,
    print_json,
    print_written,
)
from allocsim.sim.output.ownership import claim_unless_foreign, is_allocsim_trace
from allocsim.sim.output.tables import format_table
from allocsim.traces import formats, synth
from allocsim.traces.formats.limits import MAX_INPUT_ENV, max_input_bytes
from allocsim.traces.formats.xla.dump import SeveralModules
from allocsim.traces.summary import summarize


def register_gen(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gen", help="generate a synthetic trace",
                       epilog=_generator_parameters() + "\n\n" + examples(
                           "allocsim gen transformer min_seq=64 max_seq=2048 steps=50 "
                           "-o varlen.npz",
                           "allocsim gen training --seed 3 -o training.csv.gz"))
    p.add_argument("kind", help=f"one of: {', '.join(synth.GENERATORS)}")
    p.add_argument("params", nargs="*", metavar="key=value", help="generator parameters")
    p.add_argument("--seed", type=int_argument, default=None,
                   help="random seed (default 0; the same as the parameter seed=N)")
    add_output_option(p, dest="output", metavar="FILE", required=True,
                      help="file to write (.npz, .csv, .csv.gz, .jsonl)")
    p.set_defaults(func=run_gen)


def _generator_parameters() -> str:
    """Every generator kind and its parameters with their defaults, for ``gen --help``."""
    lines = ["generators and their parameters (key=value; default in brackets):"]
    for name, info in synth.GENERATORS.items():
        lines.append(f"  {name}: {info.description}")
        for key, (kind, default, text) in info.params.items():
            lines.append(f"    {key} ({kind.__name__}) [{default}]  {text}")
    return "\n".join(lines)


def register_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="what a trace holds",
                       epilog=examples(
                           "allocsim info default",
                           f"allocsim info {TORCH_SAMPLE} --top 5",
                           "allocsim info tests/data/xplane/tf-cpu-default.xplane.pb --json"))
    p.add_argument("trace", help="trace file")
    p.add_argument("--top", type=int_argument, default=10,
                   help="tags to list at the peak (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_reading_options(p)
    p.set_defaults(func=run_info)


def register_convert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert a trace between formats",
                       epilog=examples(
                           f"allocsim convert {TORCH_SAMPLE} mlp.csv.gz",
                           "allocsim convert tests/data/xplane/tf-cpu-default.xplane.pb "
                           "-o tf.npz"))
    p.add_argument("input", help="trace file to read")
    p.add_argument("output_file", nargs="?", metavar="output",
                   help="file to write; the format follows its name (or give it as -o FILE)")
    add_output_option(p, dest="output", metavar="FILE",
                      help="file to write, as the second argument does")
    add_reading_options(p)
    p.set_defaults(func=run_convert)


def run_gen(args: argparse.Namespace) -> int:
    params = synth.parse_params(args.kind, args.params)
    # seed=N is one of every generator's parameters (gen --help lists it) and --seed N says
    # the same: either is the seed; both only when they agree.
    seed = params.pop("seed", None)
    if seed is not None and args.seed is not None and seed != args.seed:
        raise UserInputError(f"gen {args.kind}: the seed is given twice (seed={seed} and "
                             f"--seed {args.seed}); give one")
    seed = seed if seed is not None else (args.seed if args.seed is not None else 0)
    # checked and claimed before generating: a file written there meanwhile is not replaced
    claim = claim_unless_foreign(args.output, "a trace", is_allocsim_trace)
    if not args.output.lower().endswith(".npz"):
        trace = synth.generate(args.kind, seed=seed, **params)
    else:  # an .npz of a streamable kind past STREAM_ABOVE_EVENTS is written block by block
        made = synth.plan(args.kind, seed=seed, **params)
        if isinstance(made, synth.SynthPlan) and made.n_events > synth.STREAM_ABOVE_EVENTS:
            ensure_parent(args.output)
            facts = synth.save_streamed(made, claim)
            print_written([args.output], f"{facts.events:,} events, peak live "
                                         f"{format_size(facts.peak_live)} (streamed)")
            _note_input_limit(args.output)
            return 0
        trace = made.trace() if isinstance(made, synth.SynthPlan) else made
    ensure_parent(args.output)
    formats.save(trace, claim)
    peak, _ = trace.peak_live()
    print_written([args.output], f"{len(trace):,} events, peak live {format_size(peak)}")
    _note_input_limit(args.output)
    return 0


def _note_input_limit(path: str) -> None:
    """A file past the input limit cannot be read back without lifting it: say how."""
    size = Path(path).stat().st_size
    if size > max_input_bytes():
        print(f"note: {printable(path)} holds {format_size(size)}, past the input limit; "
              "read it with "
              f"{MAX_INPUT_ENV}={size} set")


def _list_modules(args: argparse.Namespace, several: SeveralModules) -> int:
    """``info DIR`` of a dump of several modules: each one's sizes; one is chosen by name."""
    lines = several.listing
    if args.json:  # info's JSON describes one trace (info.schema.json): the error lists them
        raise several
    print(f"{printable(args.trace)}: an XLA dump of {len(lines)} modules; choose one with "
          "--module NAME")
    for line in lines:
        print(f"  holds       {line}")
    return 0


def run_info(args: argparse.Namespace) -> int:
    if args.top < 0:
        raise UserInputError(f"--top: the number of tags to list must be >= 0, got {args.top}")
    with command_progress("info") as progress:   # a large recording reads for seconds
        progress.update(f"reading {printable(args.trace)}")
        try:
            trace = load_trace(args.trace, args)
        except SeveralModules as several:  # info lists them, the way to choose one
            return _list_modules(args, several)
        progress.update(f"summarizing {len(trace):,} events")
        facts = summarize(trace, top=args.top)
    if args.json:
        print_json(facts)
        return 0
    print(f"{printable(args.trace)}: {printable(trace.name)} ({printable(facts['source'])})")
    print(f"  events      {facts['events']:,} ({facts['allocs']:,} allocs, "
          f"{facts['frees']:,} frees)")
    print(f"  duration    {facts['duration_s']:.6g} s")
    print(f"  processes   {facts['processes']}")
    print("  streams     " + ", ".join(f"{stream}: {count:,} events"
                                      for stream, count in facts["events_per_stream"].items()))
    meta = trace.metadata
    if meta.get("devices"):
        chosen = f" (replaying device {meta.get('device')})" if "device" in meta else ""
        segments = meta.get("device_segments", {})
        print("  devices     " + ", ".join(
            f"{d}: {n:,} events" + (f" and {segments[d]:,} segments" if d in segments else "")
            for d, n in meta["devices"].items()) + chosen)
    if meta.get("prologue_events"):
        print(f"  before rec. {meta['prologue_events']:,} buffers already live when recording "
              "started (added as allocations at the start)")
    if meta.get("synthetic_times"):
        print("  times       synthesised (the file has no timestamps)")
    if facts.get("live_before_recording"):
        before = facts["live_before_recording"]
        span = (format_size(before["min"]) if before["min"] == before["max"]
                else f"{format_size(before['min'])}–{format_size(before['max'])}")
        reserved = (f"; the allocator had reserved up to "
                    f"{format_size(facts['reserved_max_recorded'])}"
                    if "reserved_max_recorded" in facts else "")
        print(f"  not in it   {span} live before recording started (the file's Total "
              f"Allocated minus the trace's live bytes){reserved}; --start-state unrecorded "
              "adds it as one buffer")
    for line in meta.get("listing") or []:
        # what the file holds besides the replayed part: an XLA dump's modules, a profile's
        # allocators (each importer writes its lines; the chosen one is marked)
        print(f"  holds       {line}")
    if meta.get("target") and meta.get("backing"):  # the PyTorch meta recorder
        choices = [f"SDPA {', '.join(f'{k} {v}' for k, v in meta['sdpa_backends'].items())}"
                   ] if meta.get("sdpa_backends") else []
        if meta.get("cublas_workspaces"):
            choices.append(f"cuBLAS workspace {format_size(meta['cublas_workspace_bytes'])} x "
                           f"{meta['cublas_workspaces']}")
        print(f"  recorded    on {meta['backing']} for {meta['target']} "
              f"({meta.get('target_capability', '?')}), kernels {meta.get('kernels')}"
              + (f": {'; '.join(choices)}" if choices else ""))
        if meta.get("partial"):
            print(f"  partial     {meta['partial']}")
        for line in meta.get("not_modelled") or []:
            print(f"  not modelled {line}")
    print(f"  peak live   {format_size(facts['peak_live'])} after event {facts['peak_event']:,}")
    print(f"  still live  {facts['leaks']:,} buffers ({format_size(facts['leaked_bytes'])}) "
          "at the end")
    if facts.get("validation"):
        print(f"  repairs     {facts['validation'].get('summary', facts['validation'])}")
    references = meta.get("reference_events") or []
    if references:
        actions: dict[str, int] = {}
        for entry in references:
            actions[entry.get("action", "?")] = actions.get(entry.get("action", "?"), 0) + 1
        print("  recorded allocator decisions: "
              + ", ".join(f"{a} {n:,}" for a, n in sorted(actions.items())))
    print("  sizes       " + ", ".join(
        f"{'<=' + format_size(b['upper'], 0)}: {b['count']:,}" for b in facts["size_histogram"]))
    if facts["top_live_at_peak"]:
        print("  largest live at the peak, by tag:")
        rows = [[t["tag"], f"{t['count']:,}", format_size(t["bytes"])]
                for t in facts["top_live_at_peak"]]
        print("    " + format_table(rows, ["tag", "buffers", "bytes"]).replace("\n", "\n    "))
    return 0


def run_convert(args: argparse.Namespace) -> int:
    if args.output and args.output_file:
        raise UserError("convert: give the output file once, as the second argument or as -o")
    args.output = args.output or args.output_file
    if not args.output:
        raise UserError("convert: no output file: allocsim convert INPUT OUTPUT (or -o OUTPUT)")
    refuse_overwriting_input(args.output, [args.input])   # hard and soft links included
    claim = claim_unless_foreign(args.output, "a trace", is_allocsim_trace)
    trace = load_trace(args.input, args)
    ensure_parent(args.output)
    formats.save(trace, claim)
    print_written([args.output], f"{len(trace):,} events")
    return 0
