"""The ``allocsim`` command: a thin shell over the Python API.

Every user mistake (bad file, bad spec, bad size) ends in ONE line on stderr starting with
``allocsim: error:`` and exit status 2; a traceback means a bug in allocsim.

    allocsim compare [TRACE ...] [--policies P ...] [--device NAME | --capacity SIZE] [--out DIR] [--json]
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
    allocsim policies | allocsim devices
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from allocsim.errors import UserInputError
from allocsim.policies import (
    DEFAULT_POLICIES,
    PolicySpecError,
    describe_policies,
    format_size,
    parse_size,
)
from allocsim.policies.registry import alloc_conf_spec
from allocsim.sim.cli.common import add_reading_options, load_trace
from allocsim.sim.kernel.device import DEFAULT_PROFILE, PROFILES, resolve_device
from allocsim.sim.output.figures import plot_share
from allocsim.sim.output.files import write_json
from allocsim.sim.output.results_dir import write_comparisons
from allocsim.sim.output.tables import comparison_text, format_table, share_text
from allocsim.sim.questions.capacity import min_capacities
from allocsim.sim.questions.compare import (
    DEFAULT_MAX_SLOWDOWN,
    Comparison,
    compare,
    normalize_spec,
    trace_facts,
)
from allocsim.sim.questions.regress import check_baseline, make_baseline
from allocsim.sim.questions.share import (
    expand_processes,
    parse_share_spec,
    share,
    share_json,
)
from allocsim.traces import Trace, TraceError, formats, synth
from allocsim.traces.bundled import DEFAULT_TRACE_NAME, load_bundled_traces, load_default_trace
from allocsim.traces.summary import summarize


class UserError(UserInputError):
    """A mistake in what the user gave; printed as one line."""


def _progress_printer(enabled: bool):
    """A progress line on stderr for long replays (only when stderr is a terminal)."""
    if not enabled:
        return None

    def show(policy: str, done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        sys.stderr.write(f"\r  {policy}: {done:,}/{total:,} events ({done / max(total, 1):.0%})"
                         + end)
        sys.stderr.flush()
    return show


_load_trace = load_trace
_add_reading_options = add_reading_options


def cmd_compare(args: argparse.Namespace) -> int:
    device = resolve_device(args.device, args.capacity, args.device_profile)
    policies = [str(normalize_spec(p)) for p in (args.policies or DEFAULT_POLICIES)]
    policies += [str(alloc_conf_spec(text)) for text in args.alloc_conf or []]
    traces = ([_load_trace(p, args) for p in args.traces] if args.traces
              else load_bundled_traces())
    progress = _progress_printer(sys.stderr.isatty() and not args.json)
    comparisons: list[Comparison] = []
    for trace in traces:
        comparisons.append(compare(trace, policies, device, progress=progress,
                                   max_slowdown=None if args.max_slowdown == float("inf")
                                   else args.max_slowdown))
    if args.out:
        written = write_comparisons(comparisons, args.out)
        if not args.json:
            print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    for index, comparison in enumerate(comparisons):
        if not args.json:
            if index:
                print()
            print(comparison_text(comparison))
    if args.json:
        data = [c.to_json_dict() for c in comparisons]
        json.dump(data[0] if len(data) == 1 else data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


def _trace_or_default(path: str, args: argparse.Namespace) -> Trace:
    return load_default_trace() if path == "default" else _load_trace(path, args)


def cmd_min_capacity(args: argparse.Namespace) -> int:
    device = resolve_device(args.device, None, args.device_profile)
    trace = _trace_or_default(args.trace, args)
    policies = [str(normalize_spec(p)) for p in (args.policies or DEFAULT_POLICIES)]
    resolution = parse_size(args.resolution)
    show = None
    if sys.stderr.isatty() and not args.json:
        show = lambda policy: print(f"  searching {policy} ...", file=sys.stderr)
    answers = min_capacities(trace, policies, device, resolution=resolution, progress=show)
    data = {"trace": trace_facts(trace), "device": device.name, "resolution": resolution,
            "answers": [a.to_json_dict() for a in answers]}
    if args.out:
        write_json(data, Path(args.out) / "min_capacity.json")
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    rows = []
    for a in answers:
        rows.append([a.policy,
                     "never" if a.min_capacity is None else format_size(a.min_capacity),
                     format_size(a.lower_bound),
                     "-" if a.headroom is None else f"{format_size(a.headroom)} "
                                                    f"(+{a.headroom_ratio:.1%})",
                     "yes" if a.monotone else "NO: " + "; ".join(a.exceptions[:2]),
                     str(a.evaluations)])
    print(f"trace {trace.name}: peak live {format_size(trace.peak_live()[0])}; "
          f"resolution {format_size(resolution)}\n")
    print(format_table(rows, ["policy", "min capacity", "lower bound", "headroom",
                              "monotone", "runs"], left=(0, 4)))
    return 0


def cmd_share(args: argparse.Namespace) -> int:
    device = resolve_device(args.device, args.capacity, args.device_profile)
    specs = [parse_share_spec(text) for text in args.specs]
    traces = [_trace_or_default(spec.trace, args) for spec in specs]
    traces, specs = expand_processes(traces, specs)
    run = share(traces, specs, device)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json(share_json(run, specs, device), out / "share.json")
        plot_share(run, specs, device, out / "share.png")
    if args.json:
        json.dump(share_json(run, specs, device), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(share_text(run, specs, device))
    return 0 if all(r.completed for r in run.results) else 1


def cmd_baseline(args: argparse.Namespace) -> int:
    device = resolve_device(args.device, args.capacity, args.device_profile)
    document = make_baseline(args.traces, args.policies or DEFAULT_POLICIES, device, args.output)
    write_json(document, args.output)
    print(f"wrote {args.output}: {len(document['cells'])} cells "
          f"({len(args.traces)} traces × {len(document['policies'])} policies) on {device.name}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    text = args.tolerance.strip()
    tolerance = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    outcome = check_baseline(args.baseline, tolerance)
    print(outcome.text())
    return 0 if outcome.ok else 1


def cmd_record(args: argparse.Namespace) -> int:
    from allocsim.traces.record import run_script
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UserError("record: give the program after --, e.g. allocsim record -o run.npz -- python train.py")
    trace = run_script(command, args.output, log=args.log)
    peak, _ = trace.peak_live()
    print(f"wrote {args.output}: {len(trace):,} events, peak live {format_size(peak)}",
          file=sys.stderr)
    return 0


def cmd_export_snapshot(args: argparse.Namespace) -> int:
    from allocsim.sim.output.export import export_snapshot
    device = resolve_device(args.device, args.capacity, args.device_profile)
    trace = _trace_or_default(args.trace, args)
    path = export_snapshot(trace, args.policy, device, args.output)
    print(f"wrote {path}: open it at https://pytorch.org/memory_viz (drag and drop)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from allocsim.sim.output.html_report import load_results, write_report
    path = write_report(load_results(args.results), args.output, args.title)
    print(f"wrote {path}")
    return 0


def cmd_gen(args: argparse.Namespace) -> int:
    params = synth.parse_params(args.kind, args.params)
    trace = synth.generate(args.kind, seed=args.seed, **params)
    formats.save(trace, args.output)
    peak, _ = trace.peak_live()
    print(f"wrote {args.output}: {len(trace):,} events, peak live {format_size(peak)}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    trace = _load_trace(args.trace, args)
    facts = summarize(trace, top=args.top)
    if args.json:
        json.dump(facts, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{args.trace}: {trace.name} ({facts['source']})")
    print(f"  events      {facts['events']:,} ({facts['allocs']:,} allocs, {facts['frees']:,} frees)")
    print(f"  duration    {facts['duration_s']:.6g} s")
    print(f"  processes   {facts['processes']}")
    print("  streams     " + ", ".join(f"{stream}: {count:,} events"
                                      for stream, count in facts["events_per_stream"].items()))
    meta = trace.metadata
    if meta.get("devices"):
        chosen = f" (replaying device {meta.get('device')})" if "device" in meta else ""
        print("  devices     " + ", ".join(f"{d}: {n:,} events" for d, n in meta["devices"].items())
              + chosen)
    if meta.get("prologue_events"):
        print(f"  before rec. {meta['prologue_events']:,} buffers already live when recording "
              "started (added as allocations at the start)")
    if meta.get("synthetic_times"):
        print("  times       synthesised (the file has no timestamps)")
    print(f"  peak live   {format_size(facts['peak_live'])} after event {facts['peak_event']:,}")
    print(f"  still live  {facts['leaks']:,} buffers ({format_size(facts['leaked_bytes'])}) at the end")
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


def cmd_convert(args: argparse.Namespace) -> int:
    if Path(args.input).resolve() == Path(args.output).resolve():
        raise UserError(f"{args.output}: refusing to overwrite the input file")
    trace = _load_trace(args.input, args)
    formats.save(trace, args.output)
    print(f"wrote {args.output}: {len(trace):,} events")
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    print(describe_policies())
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    for name, profile in PROFILES.items():
        mark = " (default)" if name == DEFAULT_PROFILE else ""
        print(f"{name:12s} {format_size(profile.capacity):>10s}{mark}  — {profile.source}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="allocsim", description="Simulate GPU memory allocators on allocation traces.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compare", help="replay traces through policies and name the winner")
    p.add_argument("traces", nargs="*", help=f"trace files (default: the bundled traces, "
                                             f"{DEFAULT_TRACE_NAME} and the recorded samples)")
    p.add_argument("--policies", nargs="+", metavar="SPEC",
                   help=f"policy specs, e.g. bfc:allow_growth=false (default: {' '.join(DEFAULT_POLICIES)})")
    p.add_argument("--alloc-conf", action="append", metavar="CONF",
                   help="add the pytorch policy configured by a PYTORCH_CUDA_ALLOC_CONF string "
                        "as-is, e.g. 'max_split_size_mb:128,expandable_segments:True' (repeatable)")
    p.add_argument("--device", help=f"device profile (default {DEFAULT_PROFILE}; see `allocsim devices`)")
    p.add_argument("--capacity", help="device capacity, e.g. 24GiB (overrides the profile's)")
    p.add_argument("--device-profile", help="a device-profile JSON file (from `allocsim calibrate`)")
    p.add_argument("--max-slowdown", type=float, default=DEFAULT_MAX_SLOWDOWN, metavar="X",
                   help="a winner may make the run at most X times slower through allocator "
                        f"time (default {DEFAULT_MAX_SLOWDOWN}; inf = no budget)")
    p.add_argument("--out", help="directory for results.json and figures")
    p.add_argument("--json", action="store_true", help="print one JSON object (an array for several traces)")
    _add_reading_options(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("min-capacity", help="the smallest device each policy runs the trace on")
    p.add_argument("trace", help="trace file, or 'default' for the bundled one")
    p.add_argument("--policies", nargs="+", metavar="SPEC")
    p.add_argument("--resolution", default="1MiB", help="answer to this precision (default 1MiB)")
    p.add_argument("--device", help="device profile for costs and granularity")
    p.add_argument("--device-profile", help="a device-profile JSON file")
    p.add_argument("--out", help="directory for min_capacity.json")
    p.add_argument("--json", action="store_true")
    _add_reading_options(p)
    p.set_defaults(func=cmd_min_capacity)

    p = sub.add_parser("share", help="several processes sharing one device",
                       description="Each SPEC is TRACE[:POLICY][@START], e.g. run.npz:jax@2s "
                                   "(policy default: jax; TRACE 'default' = the bundled trace). "
                                   "Exit status 1 when some process runs out of memory.")
    p.add_argument("specs", nargs="+", metavar="SPEC")
    p.add_argument("--device", help=f"device profile (default {DEFAULT_PROFILE})")
    p.add_argument("--capacity", help="device capacity, e.g. 24GiB")
    p.add_argument("--device-profile", help="a device-profile JSON file")
    p.add_argument("--out", help="directory for share.json and share.png")
    p.add_argument("--json", action="store_true")
    _add_reading_options(p)
    p.set_defaults(func=cmd_share)

    p = sub.add_parser("baseline", help="record the figures of traces × policies for CI checks")
    p.add_argument("traces", nargs="+")
    p.add_argument("--policies", nargs="+", metavar="SPEC")
    p.add_argument("--device", help=f"device profile (default {DEFAULT_PROFILE})")
    p.add_argument("--capacity", help="device capacity, e.g. 24GiB")
    p.add_argument("--device-profile", help="a device-profile JSON file")
    p.add_argument("-o", "--output", required=True, help="baseline JSON to write")
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser("check", help="re-run a baseline; exit 1 if anything got worse")
    p.add_argument("baseline")
    p.add_argument("--tolerance", default="1%", help="relative slack, e.g. 1%% or 0.01 (default 1%%)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("record", help="run a Python program and record its CuPy allocations",
                       description="allocsim record -o run.npz -- python train.py args: installs a "
                                   "CuPy memory hook, runs the script, writes a native trace (time, "
                                   "size, stream, call site). From your own code: "
                                   "`with allocsim.traces.record.cupy('run.npz'): ...`.")
    p.add_argument("-o", "--output", required=True, help="trace file to write (.npz, .csv, ...)")
    p.add_argument("--log", help="also write the raw hook calls as a CuPy JSON-lines log")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- python script.py args")
    p.set_defaults(func=cmd_record)

    p = sub.add_parser("export-snapshot",
                       help="a policy's simulated run as a PyTorch memory snapshot (for memory_viz)")
    p.add_argument("trace", help="trace file, or 'default' for the bundled one")
    p.add_argument("--policy", default="pytorch", help="policy spec (default pytorch)")
    p.add_argument("--device", help=f"device profile (default {DEFAULT_PROFILE})")
    p.add_argument("--capacity", help="device capacity, e.g. 24GiB")
    p.add_argument("--device-profile", help="a device-profile JSON file")
    p.add_argument("-o", "--output", required=True, help="the .pickle to write")
    _add_reading_options(p)
    p.set_defaults(func=cmd_export_snapshot)

    p = sub.add_parser("report", help="one self-contained HTML page from results files")
    p.add_argument("results", nargs="+", help="results.json of compare --out, min_capacity.json")
    p.add_argument("-o", "--output", default="report.html")
    p.add_argument("--title", default="allocsim report")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("gen", help="generate a synthetic trace")
    p.add_argument("kind", help=f"one of: {', '.join(synth.GENERATORS)}")
    p.add_argument("params", nargs="*", metavar="key=value", help="generator parameters")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", required=True, help="file to write (.npz, .csv, .csv.gz, .jsonl)")
    p.set_defaults(func=cmd_gen)

    p = sub.add_parser("info", help="what a trace holds")
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=10, help="tags to list at the peak")
    p.add_argument("--json", action="store_true")
    _add_reading_options(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("convert", help="convert a trace between formats")
    p.add_argument("input")
    p.add_argument("output")
    _add_reading_options(p)
    p.set_defaults(func=cmd_convert)

    from allocsim.sim.sweeps.sweep import add_sweep_arguments, cmd_sweep
    p = sub.add_parser("sweep", help="a grid of traces × policies × devices × capacities, "
                                     "in parallel, resumable (local cores or a Dask cluster)")
    add_sweep_arguments(p)
    p.set_defaults(func=cmd_sweep)

    from allocsim.sim.questions.explain import add_explain_parser
    from allocsim.sim.questions.fidelity import add_fidelity_parser
    from allocsim.sim.validation.calibrate import add_calibrate_parser
    from allocsim.sim.validation.validator import add_validate_parser
    add_fidelity_parser(sub)
    add_explain_parser(sub)
    add_validate_parser(sub)
    add_calibrate_parser(sub)

    sub.add_parser("policies", help="list policies and parameters").set_defaults(func=cmd_policies)
    sub.add_parser("devices", help="list device profiles").set_defaults(func=cmd_devices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (TraceError, PolicySpecError, UserError) as err:
        print(f"allocsim: error: {err}", file=sys.stderr)
    except ValueError as err:  # sizes, device names, generator parameters
        print(f"allocsim: error: {err}", file=sys.stderr)
    except OSError as err:
        print(f"allocsim: error: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)
    except KeyboardInterrupt:
        print("allocsim: interrupted", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
